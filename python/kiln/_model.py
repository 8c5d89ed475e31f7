"""kiln.compile, kiln.load and kiln.Model: a compiled model run on numpy arrays."""

import os
import shutil
import tempfile

import numpy as np

from . import _kiln
from ._errors import KilnError, KilnUserError

# Kiln's dtype codes (ONNX TensorProto's) and onnxruntime's spelling of each as a tensor type.
_ONNX_TYPE_NAMES = {
    1: "float",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "double",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
    17: "float8e4m3fn",
    18: "float8e4m3fnuz",
    19: "float8e5m2",
    20: "float8e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4e2m1",
    24: "float8e8m0",
    25: "uint2",
    26: "int2",
}


class ValueInfo:
    """An input or output of a model: `name`, `dtype` (a numpy dtype; None for bfloat16, float8,
    float4 and the 4- and 2-bit integers, which numpy lacks), `shape` (a tuple of ints, with the symbol's name as a str where a dim is
    symbolic) and `type` (onnxruntime's spelling: "tensor(float)")."""

    __slots__ = ("name", "dtype", "shape", "type", "_type_name")

    def __init__(self, name, code, dims, dim_names):
        self.name = name
        numpy_name = _kiln.dtype_name(code)
        self.dtype = np.dtype(numpy_name) if numpy_name else None
        self.shape = tuple(n if d < 0 else d for d, n in zip(dims, dim_names))
        self.type = f"tensor({_ONNX_TYPE_NAMES.get(code, 'unknown')})"
        self._type_name = _ONNX_TYPE_NAMES.get(code, "unknown")

    def __repr__(self):
        dims = ", ".join(str(d) for d in self.shape)
        dtype = self.dtype.name if self.dtype is not None else self._type_name
        return f"ValueInfo({self.name!r}, {dtype}[{dims}])"


def _check_threads(threads):
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise KilnUserError(f"threads: expected a positive int or None, got {threads!r}")
    return threads


def _as_array(name, value, info):
    """`value` as a C-contiguous array in native byte order: a numpy array that already is one
    as it is, anything with __array_interface__ / __array__ or DLPack (a CPU torch tensor)
    converted, a Python scalar or list as the input's dtype."""
    if isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "__dlpack__") and not hasattr(value, "__array_interface__"):
        try:
            array = np.from_dlpack(value)
        except (TypeError, RuntimeError, BufferError) as e:
            # numpy's DLPack lacks some dtypes (bool before numpy 1.25): try __array__.
            if not hasattr(value, "__array__"):
                raise KilnUserError(f"input '{name}': cannot read it through DLPack ({e}); "
                                    "a CPU tensor or a numpy array is expected") from None
            array = np.asarray(value)
    elif hasattr(value, "__array_interface__") or hasattr(value, "__array__"):
        array = np.asarray(value)
    else:
        try:
            array = np.asarray(value, dtype=info.dtype)
        except (TypeError, ValueError) as e:
            raise KilnUserError(f"input '{name}': cannot make a {info.type} array of "
                                f"{type(value).__name__} ({e})") from None
    kind = array.dtype.kind
    if kind not in "biuf" or kind == "f" and array.itemsize not in (2, 4, 8):
        raise KilnUserError(f"input '{name}': numpy dtype {array.dtype} is not a dtype Kiln "
                            f"supports (the model expects {info.type})")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)  # (not for every array: it makes 0-d ones 1-d)
    return array


class Model:
    """A model compiled by kiln.compile or loaded by kiln.load, ready to run. run() may be called
    from many Python threads at once (the GIL is released while the model runs)."""

    def __init__(self, native):
        self._native = native
        self._inputs = [ValueInfo(*v) for v in native.inputs]
        self._outputs = [ValueInfo(*v) for v in native.outputs]

    @property
    def inputs(self):
        """The inputs, in the model's order (a list of ValueInfo)."""
        return list(self._inputs)

    @property
    def outputs(self):
        """The outputs, in the model's order (a list of ValueInfo)."""
        return list(self._outputs)

    @property
    def path(self):
        """The model library this model runs from (in the code cache for a compiled model)."""
        return self._native.path

    @property
    def target(self):
        """The --target its library was compiled with ("auto", "x86-64-v3", ...)."""
        return self._native.target

    @property
    def variant(self):
        """The variant of its code this CPU runs: the ISA level it was built for ("x86-64-v4")."""
        return self._native.variant

    @property
    def compile_info(self):
        """How the model was made: seconds (compiling or loading it), cache_hit (the library came
        from the code cache), kernels and library_calls (0 for a loaded library)."""
        return dict(self._native.report)

    def _arrays(self, feeds, what="run"):
        if not isinstance(feeds, dict):
            raise KilnUserError(f"{what}: expected a dict of input name -> array, got "
                                f"{type(feeds).__name__}")
        names = [i.name for i in self._inputs]
        unknown = [n for n in feeds if n not in names]
        if unknown:
            raise KilnUserError(f"{what}: the model has no input {unknown[0]!r} "
                                f"(its inputs: {', '.join(names)})")
        missing = [n for n in names if n not in feeds]
        if missing:
            raise KilnUserError(f"{what}: input {missing[0]!r} is missing "
                                f"(the model's inputs: {', '.join(names)})")
        return [_as_array(i.name, feeds[i.name], i) for i in self._inputs]

    def run(self, feeds):
        """Runs the model on `feeds` (input name -> array) and returns a dict of output name ->
        numpy array; each output array owns its memory."""
        outputs = self._native.run(self._arrays(feeds))
        return {info.name: array for info, array in zip(self._outputs, outputs)}

    def __call__(self, feeds):
        return self.run(feeds)

    def random_inputs(self, dims=None, seed=0):
        """Inputs as `kiln bench` and `kiln run` make them: floats uniform in [-1, 1), integers
        in [0, 10), booleans at random; symbolic dims from `dims` (symbol -> size), else 1."""
        dims = dict(dims or {})
        rng = np.random.default_rng(seed)
        feeds = {}
        for info in self._inputs:
            if info.dtype is None:
                raise KilnUserError(f"input '{info.name}' is {info._type_name}, which numpy has "
                                    "no dtype for")
            shape = tuple(d if isinstance(d, int) else int(dims.get(d, 1)) for d in info.shape)
            if info.dtype.kind == "f":
                value = rng.uniform(-1, 1, size=shape)
            elif info.dtype.kind == "b":
                value = rng.integers(0, 2, size=shape) == 1
            else:
                value = rng.integers(0, 10, size=shape)
            feeds[info.name] = np.asarray(value, dtype=info.dtype)
        return feeds

    def bench(self, feeds=None, *, iters=100, warmup=10, dims=None, wait_ms=0):
        """Times the model as `kiln bench` does (warm-up runs, then `iters` timed runs, each after
        an untimed sleep of `wait_ms`, as `kiln bench --wait-ms`) on `feeds` or, when None, on
        random_inputs(dims); returns `kiln bench --json`'s figures: threads, iters, warmup,
        wait_ms, compile_s, cache_hit, min_ms, p50_ms, p90_ms, p99_ms, mean_ms,
        throughput_per_s, and batch and samples_per_s (the first input's leading dim)."""
        if feeds is None:
            feeds = self.random_inputs(dims)
        elif dims is not None:
            raise KilnUserError("bench: dims apply to random inputs; give feeds or dims, not both")
        for name, value in (("iters", iters), ("warmup", warmup)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise KilnUserError(f"bench: {name} must be an int, got {value!r}")
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or not wait_ms >= 0:
            raise KilnUserError(f"bench: wait_ms must be a number at least 0, got {wait_ms!r}")
        figures = self._native.bench(self._arrays(feeds, "bench"), iters, warmup, float(wait_ms))
        return {"model": self.path, **figures}

    def export(self, path):
        """Writes the model library to `path` (a library `kiln.load` and the C API load), through
        a temporary file and a rename; a weights file beside the library (`kiln compile --weights
        external`) is copied beside `path`, renamed to match."""
        path = os.fspath(path)
        source = self.path
        copies = [(source, path)]
        source_weights = os.path.splitext(source)[0] + ".weights"
        if os.path.exists(source_weights):
            copies.append((source_weights, os.path.splitext(path)[0] + ".weights"))
        for src, dst in copies:
            directory = os.path.dirname(os.path.abspath(dst))
            try:
                fd, temp = tempfile.mkstemp(prefix=".kiln-export-", dir=directory)
            except OSError as e:
                raise KilnUserError(f"export: cannot write {dst}: {e.strerror}") from None
            try:
                with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
                    shutil.copyfileobj(inp, out)
                os.chmod(temp, 0o755 if dst == path else 0o644)
                os.replace(temp, dst)
            except OSError as e:
                os.unlink(temp)
                raise KilnUserError(f"export: cannot write {dst}: {e.strerror}") from None

    def __repr__(self):
        ins = ", ".join(repr(i) for i in self._inputs)
        outs = ", ".join(repr(o) for o in self._outputs)
        return f"kiln.Model(inputs=[{ins}], outputs=[{outs}])"


_CUDA_DEVICES = ("cuda", "gpu")


def _check_device(device):
    if not isinstance(device, str):
        raise KilnUserError(f"device: expected a str such as 'cpu', got {device!r}")
    kind = device.split(":", 1)[0].lower()
    if kind == "cpu":
        return
    if kind in _CUDA_DEVICES:
        raise KilnError(f"device {device!r}: Kiln has no CUDA backend yet; it compiles for "
                        "device='cpu' only")
    raise KilnUserError(f"device {device!r}: unknown device (Kiln compiles for 'cpu')")


def _model_bytes(model):
    """(path, None) or (None, bytes) for a path, bytes-like or onnx.ModelProto."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model), None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return None, bytes(model)
    if hasattr(model, "SerializeToString"):
        return None, model.SerializeToString()
    raise KilnUserError("model: expected a path, bytes or an onnx.ModelProto, got "
                        f"{type(model).__name__}")


def compile(model, *, device="cpu", autotune="default", threads=None, cache_dir=None, dims=None):
    """Compiles an ONNX model (a path, bytes or an onnx.ModelProto) and returns a Model.

    device: "cpu" (the only backend so far). autotune: "off", "default" or "max" (GEMM and
    convolution algorithm selection, as `kiln run --autotune`). threads: OpenMP threads of each
    run (None: OMP_NUM_THREADS, else every core); the compile chooses algorithms for them.
    cache_dir: the code cache (None: KILN_CACHE_DIR, else ~/.cache/kiln). dims: a dict fixing
    symbolic input dims when compiling ({"batch": 8}); the model then runs those sizes only."""
    _check_device(device)
    if autotune not in ("off", "default", "max"):
        raise KilnUserError(f"autotune: expected 'off', 'default' or 'max', got {autotune!r}")
    threads = _check_threads(threads)
    cache_dir = "" if cache_dir is None else os.fspath(cache_dir)
    fixed = {}
    for name, value in (dims or {}).items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, int):
            raise KilnUserError(f"dims: expected symbol name -> int, got {name!r}: {value!r}")
        fixed[name] = value
    path, data = _model_bytes(model)
    if path is not None:
        native = _kiln.compile_path(path, autotune, threads, cache_dir, fixed)
    else:
        native = _kiln.compile_bytes(data, autotune, threads, cache_dir, fixed)
    return Model(native)


def load(path, *, threads=None):
    """Loads a model library built by `kiln compile` or Model.export."""
    return Model(_kiln.load(os.fspath(path), _check_threads(threads)))
