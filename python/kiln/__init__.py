"""Kiln, an ahead-of-time compiler for ONNX models, from Python.

    import kiln
    model = kiln.compile("model.onnx")            # or bytes, or an onnx.ModelProto
    outputs = model.run({"x": x})                 # numpy in, numpy out
    model.export("model.so")                      # a library for kiln.load and the C API

kiln.InferenceSession offers onnxruntime's most used calls: `import kiln as ort` runs scripts
written for onnxruntime unchanged. Errors are kiln.KilnError (kiln.KilnUserError, also a
ValueError, for bad models, inputs and options) with Kiln's message.
"""

from ._errors import KilnError, KilnNotSupportedError, KilnUserError
from ._kiln import version as __version__
from ._model import Model, ValueInfo, compile, load
from ._onnxruntime import (
    GraphOptimizationLevel,
    InferenceSession,
    ModelMetadata,
    NodeArg,
    SessionOptions,
    get_available_providers,
    get_device,
)

__all__ = [
    "GraphOptimizationLevel",
    "InferenceSession",
    "KilnError",
    "KilnNotSupportedError",
    "KilnUserError",
    "Model",
    "ModelMetadata",
    "NodeArg",
    "SessionOptions",
    "ValueInfo",
    "compile",
    "get_available_providers",
    "get_device",
    "load",
]



def __getattr__(name):
    # Parts of onnxruntime's module API kiln does not offer fail by name (still an AttributeError,
    # so hasattr() and introspection work).
    if name.startswith("__"):
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    raise KilnNotSupportedError(f"kiln.{name} is not supported by kiln (of onnxruntime's API it "
                                "offers InferenceSession, SessionOptions, GraphOptimizationLevel, "
                                "get_available_providers and get_device)")
