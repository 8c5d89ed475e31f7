#!/usr/bin/python3
"""Writes the valid models and input arrays of the `kiln run` error tests (tests/errors/test_run_*).

Usage:
  /usr/bin/python3 make_run_model.py CASE OUT.onnx
  /usr/bin/python3 make_run_model.py array OUT.npy NUMPY_EXPRESSION   (np is numpy)

Cases:
  add_relu   x: float32[2, 3], s: float32[3] -> y = Relu(x + s): float32[2, 3]
  gather     idx: int64[n] -> y = Gather(data, idx, axis=0) named 'gather_rows', where data is
             an initializer float32[5, 3]; y: float32[n, 3]
  argmax     x: float32[batch, 4] -> y = ArgMax(x, axis=0, keepdims=0) named 'argmax_batch':
             int64[4] (an ArgMax over an empty axis has no answer)
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def info(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "run_errors", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(graph, producer_name="kiln-tests",
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def build(case):
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    if case == "add_relu":
        nodes = [helper.make_node("Add", ["x", "s"], ["t"], name="add"),
                 helper.make_node("Relu", ["t"], ["y"], name="relu")]
        return model(nodes, [info("x", f32, [2, 3]), info("s", f32, [3])], [info("y", f32, [2, 3])])
    if case == "gather":
        data = np.arange(15, dtype=np.float32).reshape(5, 3)
        nodes = [helper.make_node("Gather", ["data", "idx"], ["y"], axis=0, name="gather_rows")]
        return model(nodes, [info("idx", i64, ["n"])], [info("y", f32, ["n", 3])],
                     [numpy_helper.from_array(data, "data")])
    if case == "argmax":
        nodes = [helper.make_node("ArgMax", ["x"], ["y"], axis=0, keepdims=0,
                                  name="argmax_batch")]
        return model(nodes, [info("x", f32, ["batch", 4])], [info("y", i64, [4])])
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "array":
        np.save(sys.argv[2], np.asarray(eval(sys.argv[3], {"np": np})))
    elif len(sys.argv) == 3:
        with open(sys.argv[2], "wb") as f:
            f.write(build(sys.argv[1]).SerializeToString())
    else:
        raise SystemExit(__doc__)
