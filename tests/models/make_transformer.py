#!/usr/bin/python3
"""Writes a small transformer block exported by hand at ai.onnx opset 20 (IR version 10), with
seeded weights and input, and its expected output computed here in plain numpy (float64, then
rounded to float32), for tests/models/test_models.sh. Written with the ops of opsets 18-20 a
current exporter writes: LayerNormalization, Split with num_outputs (Split-18), Gelu (Gelu-20),
reductions with axes as an input (ReduceMean-18, ReduceMax-18), and a model-local function with
an attribute reference and a default (RmsScale, domain "local"), called twice.

Usage: /usr/bin/python3 make_transformer.py OUT_DIR
Writes OUT_DIR/model.onnx, x.npy (float32[2, 4, 8]) and the expected outputs y.npy
(float32[2, 4, 8]) and m.npy (float32[2, 8], the maximum of y over its second axis).
"""
import math
import os
import sys

import numpy as np
from onnx import AttributeProto, TensorProto, helper, numpy_helper

SEED = 20261124
B, T, D, F = 2, 4, 8, 16


def attribute_ref(name, ref, attr_type):
    """An attribute of a function body node taking the caller's attribute `ref`."""
    attr = AttributeProto()
    attr.name = name
    attr.ref_attr_name = ref
    attr.type = attr_type
    return attr


def rms_scale_function():
    """local.RmsScale(x; eps) = x / sqrt(ReduceMean(x * x, axes=[-1]) + eps), eps defaulting
    to 1e-6 (FunctionProto.attribute_proto, written as raw field 11: ONNX 1.12's Python package
    does not know it)."""
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("Constant", [], ["axes"], value_ints=[-1]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Constant", [], ["eps_t"]),
        helper.make_node("Add", ["ms", "eps_t"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["rms"]),
        helper.make_node("Div", ["x", "rms"], ["y"]),
    ]
    nodes[3].attribute.append(attribute_ref("value_float", "eps", AttributeProto.FLOAT))
    function = helper.make_function("local", "RmsScale", ["x"], ["y"], nodes,
                                    [helper.make_opsetid("", 20)], ["eps"])
    default = helper.make_attribute("eps", 1e-6)
    raw = function.SerializeToString() + _field(11, default.SerializeToString())
    function.ParseFromString(raw)
    return function


def _field(number, payload):
    """A length-delimited protobuf field."""
    def varint(n):
        out = b""
        while True:
            byte = n & 0x7F
            n >>= 7
            out += bytes([byte | (0x80 if n else 0)])
            if not n:
                return out
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g + b


def gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def rms_scale(x, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def main(out):
    rng = np.random.default_rng(SEED)
    w = {
        "g1": 1 + 0.1 * rng.standard_normal(D), "b1": 0.1 * rng.standard_normal(D),
        "wqkv": rng.standard_normal((D, 3 * D)) / math.sqrt(D),
        "bqkv": 0.1 * rng.standard_normal(3 * D),
        "wo": rng.standard_normal((D, D)) / math.sqrt(D), "bo": 0.1 * rng.standard_normal(D),
        "g2": 1 + 0.1 * rng.standard_normal(D), "b2": 0.1 * rng.standard_normal(D),
        "w1": rng.standard_normal((D, F)) / math.sqrt(D), "c1": 0.1 * rng.standard_normal(F),
        "w2": rng.standard_normal((F, D)) / math.sqrt(F), "c2": 0.1 * rng.standard_normal(D),
    }
    w = {k: v.astype(np.float32) for k, v in w.items()}
    x = rng.standard_normal((B, T, D)).astype(np.float32)

    nodes = [
        helper.make_node("LayerNormalization", ["x", "g1", "b1"], ["h"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["h", "wqkv"], ["qkv0"]),
        helper.make_node("Add", ["qkv0", "bqkv"], ["qkv"]),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=-1, num_outputs=3),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Constant", [], ["scale"], value_float=1 / math.sqrt(D)),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["a"]),
        helper.make_node("MatMul", ["a", "wo"], ["o0"]),
        helper.make_node("Add", ["o0", "bo"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["x1"]),
        helper.make_node("LayerNormalization", ["x1", "g2", "b2"], ["h2"], axis=-1),
        helper.make_node("MatMul", ["h2", "w1"], ["f0"]),
        helper.make_node("Add", ["f0", "c1"], ["f1"]),
        helper.make_node("Gelu", ["f1"], ["f2"]),
        helper.make_node("MatMul", ["f2", "w2"], ["f3"]),
        helper.make_node("Add", ["f3", "c2"], ["f4"]),
        helper.make_node("Add", ["x1", "f4"], ["x2"]),
        helper.make_node("RmsScale", ["x2"], ["r1"], domain="local", eps=1e-2),
        helper.make_node("RmsScale", ["r1"], ["y"], domain="local"),
        helper.make_node("Constant", [], ["pool_axes"], value_ints=[1]),
        helper.make_node("ReduceMax", ["y", "pool_axes"], ["m"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "transformer_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, [B, D])],
        [numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("local", 1)],
        functions=[rms_scale_function()], producer_name="make_transformer.py")
    model.ir_version = 10

    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    x64 = x.astype(np.float64)
    h = layer_norm(x64, w64["g1"], w64["b1"])
    q, k, v = np.split(h @ w64["wqkv"] + w64["bqkv"], 3, axis=-1)
    p = softmax(q @ k.transpose(0, 2, 1) / math.sqrt(D))
    x1 = x64 + (p @ v) @ w64["wo"] + w64["bo"]
    h2 = layer_norm(x1, w64["g2"], w64["b2"])
    x2 = x1 + gelu(h2 @ w64["w1"] + w64["c1"]) @ w64["w2"] + w64["c2"]
    y = rms_scale(rms_scale(x2, 1e-2), 1e-6)

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    np.save(os.path.join(out, "x.npy"), x)
    np.save(os.path.join(out, "y.npy"), y.astype(np.float32))
    np.save(os.path.join(out, "m.npy"), y.max(1).astype(np.float32))


if __name__ == "__main__":
    main(sys.argv[1])
