"""The exceptions of the kiln package."""


class KilnError(Exception):
    """An error from Kiln: its message, and `code`, the status code of Kiln's C API
    (include/kiln/runtime.h: 1 invalid argument, 2 bad input, 3 load, 4 ABI, 5 unsupported CPU,
    6 out of memory, 7 internal), or None for an error of the Python layer."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class KilnUserError(KilnError, ValueError):
    """A KilnError that is the caller's to fix (a bad model, input, option or file); also a
    ValueError."""


class KilnNotSupportedError(KilnError, AttributeError):
    """A part of onnxruntime's API that kiln does not offer; also an AttributeError, so that
    hasattr() answers False."""
