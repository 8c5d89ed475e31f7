#!/usr/bin/python3
"""Writes the bundled example models into examples/models/ (run with Debian's /usr/bin/python3,
which has python3-onnx and numpy).

mlp.onnx: a small multi-layer perceptron, x: float32[batch, 16] -> y: float32[batch, 4], with a
symbolic batch dimension: MatMul + Add + Relu twice, then MatMul + Add + Softmax. Weights are
seeded, so the file is the same on every run.
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def make_mlp(sizes=(16, 32, 32, 4), seed=0):
    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    current = "x"
    layers = len(sizes) - 1
    for i in range(layers):
        fan_in, fan_out = sizes[i], sizes[i + 1]
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        b = (0.1 * rng.standard_normal(fan_out)).astype(np.float32)
        initializers += [numpy_helper.from_array(w, f"fc{i}.weight"),
                         numpy_helper.from_array(b, f"fc{i}.bias")]
        nodes.append(helper.make_node("MatMul", [current, f"fc{i}.weight"], [f"fc{i}.mm"],
                                      name=f"fc{i}_matmul"))
        nodes.append(helper.make_node("Add", [f"fc{i}.mm", f"fc{i}.bias"], [f"fc{i}.out"],
                                      name=f"fc{i}_add"))
        current = f"fc{i}.out"
        if i + 1 < layers:
            nodes.append(helper.make_node("Relu", [current], [f"fc{i}.relu"], name=f"fc{i}_relu"))
            current = f"fc{i}.relu"
    nodes.append(helper.make_node("Softmax", [current], ["y"], axis=-1, name="softmax"))
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializer=initializers)
    model = helper.make_model(graph, producer_name="kiln-examples",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = os.path.join(HERE, "models", "mlp.onnx")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    onnx.save_model(make_mlp(), out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
