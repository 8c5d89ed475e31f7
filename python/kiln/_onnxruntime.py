"""onnxruntime's Python API over Kiln, for the calls scripts use most: `import kiln as ort` and
code written for onnxruntime runs unchanged. InferenceSession compiles the model with Kiln on
construction (or finds it in the code cache); anything of onnxruntime's API not listed here raises
a KilnError naming it."""

import enum
import os
import warnings

from ._errors import KilnError, KilnNotSupportedError, KilnUserError
from ._model import compile as _compile
from ._model_proto import ProtoError, read_metadata

_CPU = "CPUExecutionProvider"


def get_available_providers():
    """The execution providers Kiln offers: the CPU one."""
    return [_CPU]


def get_device():
    return "CPU"


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's levels; Kiln accepts each and always compiles with all its optimizations."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


class SessionOptions:
    """onnxruntime.SessionOptions: intra_op_num_threads (the OpenMP threads of each run; 0: the
    default) and graph_optimization_level (accepted; Kiln always optimizes fully). Setting any
    other option raises KilnError."""

    _SUPPORTED = ("intra_op_num_threads", "graph_optimization_level")

    def __init__(self):
        object.__setattr__(self, "intra_op_num_threads", 0)
        object.__setattr__(self, "graph_optimization_level", GraphOptimizationLevel.ORT_ENABLE_ALL)

    def __setattr__(self, name, value):
        if name not in self._SUPPORTED:
            raise KilnError(f"SessionOptions.{name} is not supported by kiln (it supports "
                            f"{', '.join(self._SUPPORTED)})")
        if name == "intra_op_num_threads" and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise KilnUserError(f"SessionOptions.intra_op_num_threads: expected an int >= 0, got "
                                f"{value!r}")
        if name == "graph_optimization_level":
            try:
                value = GraphOptimizationLevel(value)
            except ValueError:
                raise KilnUserError(f"SessionOptions.graph_optimization_level: {value!r} is not "
                                    "a GraphOptimizationLevel") from None
        object.__setattr__(self, name, value)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise KilnNotSupportedError(f"SessionOptions.{name} is not supported by kiln (it "
                                    f"supports {', '.join(self._SUPPORTED)})")


class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (ints, with the symbol's name
    where a dim is symbolic) and type ("tensor(float)")."""

    def __init__(self, info):
        self.name = info.name
        self.shape = list(info.shape)
        self.type = info.type

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """onnxruntime.ModelMetadata: producer_name, graph_name, domain, description,
    graph_description, version and custom_metadata_map, read from the ModelProto."""

    def __init__(self, fields):
        for name, value in fields.items():
            setattr(self, name, value)


def _providers(providers):
    if providers is None:
        return
    names = [p[0] if isinstance(p, (tuple, list)) else p for p in providers]
    for name in names:
        if not isinstance(name, str):
            raise KilnUserError(f"providers: expected provider names, got {name!r}")
    if _CPU not in names:
        raise KilnError(f"providers {names}: kiln runs models with {_CPU} only (its CUDA backend "
                        "does not exist yet)")
    others = [n for n in names if n != _CPU]
    if others:
        warnings.warn(f"kiln: providers {others} are not available; using {_CPU}", stacklevel=3)


class InferenceSession:
    """onnxruntime.InferenceSession over Kiln: the model (a path or the bytes of a ModelProto)
    is compiled when the session is made. run(output_names, input_feed), get_inputs(),
    get_outputs(), get_modelmeta() and get_providers() behave as onnxruntime's."""

    def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None,
                 **kwargs):
        if kwargs:
            raise KilnError(f"InferenceSession: argument {sorted(kwargs)[0]!r} is not supported "
                            "by kiln")
        if provider_options:
            raise KilnError("InferenceSession: provider_options are not supported by kiln")
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise KilnUserError("InferenceSession: sess_options must be a kiln.SessionOptions, "
                                f"got {type(sess_options).__name__}")
        _providers(providers)
        threads = sess_options.intra_op_num_threads if sess_options is not None else 0
        if isinstance(path_or_bytes, (str, os.PathLike)):
            self._model_path = os.fspath(path_or_bytes)
            self._model_bytes = None
        elif isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            self._model_path = None
            self._model_bytes = bytes(path_or_bytes)
        else:
            raise KilnUserError("InferenceSession: expected a model path or the bytes of a "
                                f"ModelProto, got {type(path_or_bytes).__name__}")
        model = self._model_path if self._model_path is not None else self._model_bytes
        self._model = _compile(model, threads=threads or None)
        self._options = sess_options if sess_options is not None else SessionOptions()
        self._inputs = [NodeArg(i) for i in self._model.inputs]
        self._outputs = [NodeArg(o) for o in self._model.outputs]

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_providers(self):
        return [_CPU]

    def get_session_options(self):
        return self._options

    def get_modelmeta(self):
        data = self._model_bytes
        if data is None:
            with open(self._model_path, "rb") as f:
                data = f.read()
        try:
            return ModelMetadata(read_metadata(data))
        except ProtoError as e:
            raise KilnUserError(f"get_modelmeta: the model is not a readable ModelProto ({e})") \
                from None

    def run(self, output_names, input_feed, run_options=None):
        """Runs the model on input_feed (name -> array) and returns the outputs named by
        output_names (None or empty: all, in the model's order) as a list of numpy arrays."""
        if run_options is not None:
            raise KilnError("InferenceSession.run: run_options are not supported by kiln")
        names = [o.name for o in self._outputs]
        if output_names:
            for name in output_names:
                if name not in names:
                    raise KilnUserError(f"run: the model has no output {name!r} (its outputs: "
                                        f"{', '.join(names)})")
        else:
            output_names = names
        outputs = self._model.run(input_feed)
        return [outputs[name] for name in output_names]

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise KilnNotSupportedError(f"InferenceSession.{name} is not supported by kiln (it "
                                    "supports run, get_inputs, get_outputs, get_modelmeta, "
                                    "get_providers, get_session_options)")
