#!/usr/bin/python3
"""Checks a `kiln run` output of examples/models/mlp.onnx against numpy: computes the MLP from
the model's initializers (MatMul + Add, Relu between layers, Softmax at the end) on the input and
compares with the output file (float32: rtol 1e-5, atol 1e-6).

Usage: mlp_reference.py MODEL X.npy Y.npy
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def main(model_path, x_path, y_path):
    model = onnx.load(model_path)
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h = np.load(x_path).astype(np.float64)
    layers = sum(1 for n in model.graph.node if n.op_type == "MatMul")
    for i in range(layers):
        h = h @ weights[f"fc{i}.weight"] + weights[f"fc{i}.bias"]
        if i + 1 < layers:
            h = np.maximum(h, 0)
    e = np.exp(h - h.max(axis=-1, keepdims=True))
    expected = e / e.sum(axis=-1, keepdims=True)
    got = np.load(y_path)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
        sys.exit(f"{y_path}: differs from numpy (shape {got.shape} vs {expected.shape}, "
                 f"max diff {np.abs(got - expected).max() if got.shape == expected.shape else '-'})")


if __name__ == "__main__":
    main(*sys.argv[1:])
