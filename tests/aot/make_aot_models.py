#!/usr/bin/python3
"""Writes the models of the model-library tests (tests/aot/aot_test.cpp) and numpy references.

Usage: /usr/bin/python3 make_aot_models.py OUT_DIR
  conv_matmul.onnx  x[batch, 3, 8, 8] -> Conv 3x3 (8 channels, pad 1) + bias -> Relu -> Flatten
                    -> f; y = f @ W[512, 10] + b (a GEMM with a constant weight) and
                    z = f @ f^T (a BLAS matrix product of two activations): oneDNN, the GEMM
                    template, OpenBLAS and generated kernels in one model
  x.npy, y.npy, z.npy  an input of batch 3 and the outputs numpy computes for it
  chain.onnx        x[64, 256] -> 20 x (MatMul [256, 256] -> Relu) -> y
Weights are seeded; nothing depends on Kiln.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def save(model, path):
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def conv2d(x, w, b, pad):
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((n, m, h, wd), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + h, j:j + wd]
            out += np.einsum("nchw,mc->nmhw", patch, w[:, :, i, j])
    return out + b.reshape(1, m, 1, 1)


def conv_matmul(out_dir, rng):
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b = (rng.standard_normal(8) * 0.1).astype(np.float32)
    wm = (rng.standard_normal((512, 10)) * 0.05).astype(np.float32)
    bm = (rng.standard_normal(10) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], axis=1, name="flatten"),
        helper.make_node("MatMul", ["f", "wm"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "bm"], ["y"], name="add"),
        helper.make_node("Transpose", ["f"], ["ft"], perm=[1, 0], name="transpose"),
        helper.make_node("MatMul", ["f", "ft"], ["z"], name="gram"),
    ]
    graph = helper.make_graph(
        nodes, "conv_matmul", [helper.make_tensor_value_info("x", F, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, ["batch", 10]),
         helper.make_tensor_value_info("z", F, ["batch", "batch"])],
        [numpy_helper.from_array(a, n) for a, n in [(w, "w"), (b, "b"), (wm, "wm"), (bm, "bm")]])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
         os.path.join(out_dir, "conv_matmul.onnx"))
    x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    r = np.maximum(conv2d(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1), 0)
    f = r.reshape(3, 512)
    y = f @ wm.astype(np.float64) + bm
    np.save(os.path.join(out_dir, "x.npy"), x)
    np.save(os.path.join(out_dir, "y.npy"), y.astype(np.float32))
    np.save(os.path.join(out_dir, "z.npy"), (f @ f.T).astype(np.float32))


def chain(out_dir, rng):
    nodes, inits, prev = [], [], "x"
    for k in range(20):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((256, 256)) * 0.06).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"], name=f"matmul{k}"))
        out = "y" if k == 19 else f"r{k}"
        nodes.append(helper.make_node("Relu", [f"m{k}"], [out], name=f"relu{k}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F, [64, 256])],
                              [helper.make_tensor_value_info("y", F, [64, 256])], inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
         os.path.join(out_dir, "chain.onnx"))


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(7)
    conv_matmul(out_dir, rng)
    chain(out_dir, rng)


if __name__ == "__main__":
    main()
