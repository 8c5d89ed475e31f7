#!/usr/bin/python3
"""Writes a model whose every name is one that real exporters write and C++ cannot take as is, with
inputs and numpy references, for tests/names/test_names.sh.

Usage: /usr/bin/python3 make_names_model.py OUT_DIR

The names (dims, inputs, outputs, initializers, nodes and the values of an If subgraph) cover:
paddle2onnx's dotted dims, ':', '/', '.', '-', spaces, leading digits, non-ASCII letters, quotes,
backslashes (one at the end of a name, which must not continue a generated comment onto the next
line), control characters (a newline, a tab, 0x01), '..', names that would leave the output
directory ('../up', '/abs'), an empty node name, C++ keywords and Kiln-looking identifiers
('int', 'i0', 'buf0'), names that differ only in case ('Data' and 'data'), and names that collide
once sanitized ('a.b', 'a-b', 'a_b').

The model: for inputs X (float32[B, T]), Y (float32[B, T]) and a float32 scalar C (a float, so
that `kiln run --input` does not specialize the condition and the If stays a run-time branch),
  sum  = X + W                 (W an initializer of shape [T], T = 5 fixed in the file)
  prod = Y * sum
  out1 = If(C > 0) then Relu(prod) else prod - 1 (the subgraph's values have odd names too)
  out2 = ReduceSum(prod, axis 1, keepdims 0)      float32[B]
  out3 = sum (a second output reading the same value)
  out4 = -Z - max(-Z, axis 1)  (Z: float32[D1, D2], dims named with a trailing backslash and a
                                newline, which reach generated comments through expressions)

Files written: model.onnx, names.json (the inputs' and outputs' names, in model order, so the
shell test needs no escaping of its own), inputs/<k>.npy, expected/<cond>/<k>.npy for cond in
true/false.
"""
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = sys.argv[1]

# Dim params: paddle2onnx's, a colon and slash, a leading digit and non-ASCII, a keyword.
DIM_B = "p2o.DynamicDimension.0"
DIM_T = 5
DIM_D1 = "tail\\"
DIM_D2 = "new\nline \"dim\""

X = "input:0/tokens.ids"      # ':', '/', '.'
Y = "1st input-é ü 日本"        # leading digit, '-', spaces, non-ASCII
C = "cond\\"                    # a backslash at the end
W = "weight \"quoted\" 'x'"     # quotes
SUM = "a.b"                     # collides with "a-b" and "a_b" once sanitized
PROD = "a-b"
OUT1 = "../up"                  # would leave the output directory
OUT2 = "Data"                   # differs from "data" only in case
OUT3 = "data"
Z = "z\x01"
OUT4 = "*/ out"
SUB_T = "int"                   # a C++ keyword (then branch's value)
SUB_E = "i0"                    # looks like a kernel's index variable (else branch's value)
ONE = "a_b"
ZERO = "zero/ü"
COND = "cond\nvalue"            # a newline
AXES = "axes:\x7f"             # DEL, a control character
NODES = ["", "node\nwith newline\tand tab\x01", "/model/If_0\\", "..", "buf0", "int"]


def main():
    os.makedirs(os.path.join(OUT, "inputs"), exist_ok=True)
    rng = np.random.default_rng(20261124)
    w = rng.uniform(-1, 1, DIM_T).astype(np.float32)

    then_graph = helper.make_graph(
        [helper.make_node("Relu", [PROD], [SUB_T], name="then:relu/é")], "then \"branch\"", [],
        [helper.make_tensor_value_info(SUB_T, TensorProto.FLOAT, [DIM_B, DIM_T])])
    else_graph = helper.make_graph(
        [helper.make_node("Sub", [PROD, ONE], [SUB_E], name="else\\")], "else", [],
        [helper.make_tensor_value_info(SUB_E, TensorProto.FLOAT, [DIM_B, DIM_T])])

    nodes = [
        helper.make_node("Add", [X, W], [SUM], name=NODES[0]),
        helper.make_node("Mul", [Y, SUM], [PROD], name=NODES[1]),
        helper.make_node("Greater", [C, ZERO], [COND], name=NODES[5]),
        helper.make_node("If", [COND], [OUT1], name=NODES[2], then_branch=then_graph,
                         else_branch=else_graph),
        helper.make_node("ReduceSum", [PROD, AXES], [OUT2], name=NODES[3], keepdims=0),
        helper.make_node("Identity", [SUM], [OUT3], name=NODES[4]),
        helper.make_node("Neg", [Z], ["neg"], name="neg */"),
        helper.make_node("ReduceMax", ["neg"], ["max\\"], name="max", axes=[1], keepdims=1),
        helper.make_node("Sub", ["neg", "max\\"], [OUT4], name="sub"),
    ]
    graph = helper.make_graph(
        nodes, "graph/with:odd name", [
            helper.make_tensor_value_info(X, TensorProto.FLOAT, [DIM_B, DIM_T]),
            helper.make_tensor_value_info(Y, TensorProto.FLOAT, [DIM_B, DIM_T]),
            helper.make_tensor_value_info(C, TensorProto.FLOAT, []),
            helper.make_tensor_value_info(Z, TensorProto.FLOAT, [DIM_D1, DIM_D2]),
        ], [
            helper.make_tensor_value_info(OUT1, TensorProto.FLOAT, [DIM_B, DIM_T]),
            helper.make_tensor_value_info(OUT2, TensorProto.FLOAT, [DIM_B]),
            helper.make_tensor_value_info(OUT3, TensorProto.FLOAT, [DIM_B, DIM_T]),
            helper.make_tensor_value_info(OUT4, TensorProto.FLOAT, [DIM_D1, DIM_D2]),
        ], [numpy_helper.from_array(w, W), numpy_helper.from_array(np.float32(1.0), ONE),
        numpy_helper.from_array(np.float32(0.0), ZERO),
        numpy_helper.from_array(np.array([1], np.int64), AXES)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(OUT, "model.onnx"))

    batch = 3
    x = rng.uniform(-1, 1, (batch, DIM_T)).astype(np.float32)
    y = rng.uniform(-1, 1, (batch, DIM_T)).astype(np.float32)
    z = rng.uniform(-1, 1, (2, 7)).astype(np.float32)
    inputs = [X, Y, C, Z]
    np.save(os.path.join(OUT, "inputs", "3.npy"), z)
    np.save(os.path.join(OUT, "inputs", "0.npy"), x)
    np.save(os.path.join(OUT, "inputs", "1.npy"), y)
    s = x.astype(np.float64) + w
    p = y.astype(np.float64) * s
    for cond in (True, False):
        folder = os.path.join(OUT, "expected", "true" if cond else "false")
        os.makedirs(folder, exist_ok=True)
        np.save(os.path.join(OUT, "inputs", ("c_true" if cond else "c_false") + ".npy"),
                np.array(1.0 if cond else -1.0, np.float32))
        out1 = np.maximum(p, 0) if cond else p - 1
        out4 = -z - (-z).max(axis=1, keepdims=True)
        for k, v in enumerate([out1, p.sum(axis=1), s, out4]):
            np.save(os.path.join(folder, f"{k}.npy"), v.astype(np.float32))
    with open(os.path.join(OUT, "names.json"), "w", encoding="utf-8") as f:
        json.dump({"inputs": inputs, "outputs": [OUT1, OUT2, OUT3, OUT4],
                   "dims": [DIM_B, DIM_D1, DIM_D2],
                   "batch": batch}, f, ensure_ascii=True)


if __name__ == "__main__":
    main()
