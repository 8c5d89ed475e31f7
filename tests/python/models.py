"""The ONNX models of the Python tests, built with seeded weights, each with a numpy reference.

Each make_* function writes DIR/<name>.onnx (when missing) and returns its path; the matching
reference_* function computes its expected outputs in numpy from the same weights."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _save(graph, path, producer="kiln-python-tests", metadata=None, **fields):
    """Writes the model through a temporary file and a rename (tests may run in parallel)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=producer, **fields)
    model.ir_version = 8
    if metadata:
        helper.set_model_props(model, metadata)
    onnx.checker.check_model(model)
    tmp = f"{path}.{os.getpid()}.tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)
    return path


# --- a classifier: MatMul, Add, Relu, Softmax; dynamic batch ---------------------------------

def classifier_weights():
    rng = np.random.default_rng(21)
    return {
        "w1": (rng.standard_normal((16, 32)) * 0.3).astype(np.float32),
        "b1": (rng.standard_normal(32) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((32, 5)) * 0.3).astype(np.float32),
        "b2": (rng.standard_normal(5) * 0.1).astype(np.float32),
    }


def make_classifier(directory):
    """x float32[batch, 16] -> logits float32[batch, 5], probs float32[batch, 5] (Softmax),
    label int64[batch] (ArgMax)."""
    path = os.path.join(directory, "classifier.onnx")
    if os.path.exists(path):
        return path
    w = classifier_weights()
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["h"], name="relu"),
        helper.make_node("MatMul", ["h", "w2"], ["l0"], name="fc2"),
        helper.make_node("Add", ["l0", "b2"], ["logits"], name="bias2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
        helper.make_node("ArgMax", ["logits"], ["label"], name="argmax", axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 5]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
        doc_string="a two-layer classifier")
    return _save(graph, path, producer="kiln-python-tests", domain="org.kiln.tests",
                 model_version=3, doc_string="the classifier of tests/python",
                 metadata={"author": "kiln", "purpose": "tests"})


def reference_classifier(x):
    w = classifier_weights()
    h = np.maximum(x.astype(np.float64) @ w["w1"] + w["b1"], 0)
    logits = h @ w["w2"] + w["b2"]
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return {"logits": logits, "probs": e / e.sum(axis=1, keepdims=True),
            "label": logits.argmax(axis=1).astype(np.int64)}


# --- every dtype: one input and one output of each ---------------------------------------------

# numpy dtype -> (ONNX type, the op applied: Add(x, x) for numbers, Not(x) for bool).
DTYPES = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
    np.int8: TensorProto.INT8,
    np.int16: TensorProto.INT16,
    np.int32: TensorProto.INT32,
    np.int64: TensorProto.INT64,
    np.uint8: TensorProto.UINT8,
    np.uint16: TensorProto.UINT16,
    np.uint32: TensorProto.UINT32,
    np.uint64: TensorProto.UINT64,
    np.bool_: TensorProto.BOOL,
}


def dtype_name(dtype):
    return np.dtype(dtype).name


def make_dtypes(directory):
    """For each dtype D: x_D D[n, 3] -> y_D = Add(x_D, x_D) (Not for bool), one model."""
    path = os.path.join(directory, "dtypes.onnx")
    if os.path.exists(path):
        return path
    nodes, inputs, outputs = [], [], []
    for dtype, onnx_type in DTYPES.items():
        name = dtype_name(dtype)
        if dtype is np.bool_:
            nodes.append(helper.make_node("Not", [f"x_{name}"], [f"y_{name}"], name=f"not_{name}"))
        else:
            nodes.append(helper.make_node("Add", [f"x_{name}", f"x_{name}"], [f"y_{name}"],
                                          name=f"add_{name}"))
        inputs.append(helper.make_tensor_value_info(f"x_{name}", onnx_type, ["n", 3]))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", onnx_type, ["n", 3]))
    return _save(helper.make_graph(nodes, "dtypes", inputs, outputs), path)


def dtype_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    for dtype in DTYPES:
        name = dtype_name(dtype)
        if dtype is np.bool_:
            value = rng.integers(0, 2, size=(n, 3)) == 1
        elif np.issubdtype(dtype, np.floating):
            value = rng.uniform(-4, 4, size=(n, 3)).astype(dtype)
        else:
            info = np.iinfo(dtype)
            low, high = max(info.min, -50), min(info.max, 50)
            value = rng.integers(low, high + 1, size=(n, 3)).astype(dtype)
        feeds[f"x_{name}"] = value
    return feeds


def reference_dtypes(feeds):
    out = {}
    for key, value in feeds.items():
        name = "y_" + key[2:]
        out[name] = np.logical_not(value) if value.dtype == np.bool_ else value + value
    return out


# --- dynamic dims ------------------------------------------------------------------------------

def make_dynamic(directory):
    """x float32[batch, seq, 4], s float32[4] -> y = Relu(x) * s [batch, seq, 4],
    total = ReduceSum(y, axis 1) [batch, 4]."""
    path = os.path.join(directory, "dynamic.onnx")
    if os.path.exists(path):
        return path
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "s"], ["y"], name="scale"),
        helper.make_node("ReduceSum", ["y", "axes"], ["total"], name="sum", keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch", 4])],
        [axes])
    return _save(graph, path)


def reference_dynamic(x, s):
    y = np.maximum(x.astype(np.float64), 0) * s
    return {"y": y, "total": y.sum(axis=1)}


# --- a reduction over a large input (zero-copy and GIL tests) ----------------------------------

def make_reduce(directory):
    """x float32[rows, cols] -> total = ReduceSum(x) over both axes, keepdims 0: a scalar."""
    path = os.path.join(directory, "reduce.onnx")
    if os.path.exists(path):
        return path
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=0)]
    graph = helper.make_graph(
        nodes, "reduce",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", "cols"])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [])])
    return _save(graph, path)


# --- a matrix product of two inputs (a long single run: the GIL test) -------------------------

def make_matmul(directory):
    """a float32[m, k], b float32[k, n] -> c = MatMul(a, b) float32[m, n]."""
    path = os.path.join(directory, "matmul.onnx")
    if os.path.exists(path):
        return path
    nodes = [helper.make_node("MatMul", ["a", "b"], ["c"], name="matmul")]
    graph = helper.make_graph(
        nodes, "matmul",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", "k"]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["k", "n"])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["m", "n"])])
    return _save(graph, path)


# --- a model Kiln cannot compile: an op of an unknown domain -----------------------------------

def unsupported_model_bytes():
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="mystery", domain="com.example")
    graph = helper.make_graph(
        [node], "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    return model.SerializeToString()
