#!/usr/bin/python3
"""Writes the model and inputs of tests/embed/test_embed.sh.

Usage: /usr/bin/python3 make_embed_model.py OUT_DIR
OUT_DIR/model.onnx: x float32[N, 3, 8, 8] (N symbolic) -> Conv 3x3 (4 channels, pad 1, bias)
-> Relu -> Flatten -> MatMul [256, 10] -> Add bias = y float32[N, 10], and label = ArgMax(y,
axis 1) int64[N]: the extern convolution and GEMM calls, a generated kernel, two dtypes.
OUT_DIR/x_b3.npy and x_b1.npy: inputs at batch 3 and 1. Weights and inputs are seeded.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(6)
    w_conv = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    b_conv = rng.standard_normal(4).astype(np.float32) * 0.1
    w_fc = rng.standard_normal((256, 10)).astype(np.float32) * 0.1
    b_fc = rng.standard_normal(10).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w_conv", "b_conv"], ["c"], name="conv",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten", axis=1),
        helper.make_node("MatMul", ["f", "w_fc"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "b_fc"], ["y"], name="add"),
        helper.make_node("ArgMax", ["y"], ["label"], name="argmax", axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "embed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])],
        [numpy_helper.from_array(w_conv, "w_conv"), numpy_helper.from_array(b_conv, "b_conv"),
         numpy_helper.from_array(w_fc, "w_fc"), numpy_helper.from_array(b_fc, "b_fc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="kiln-embed-test")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "model.onnx"))
    for batch in (3, 1):
        x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
        np.save(os.path.join(out, f"x_b{batch}.npy"), x)


if __name__ == "__main__":
    main()
