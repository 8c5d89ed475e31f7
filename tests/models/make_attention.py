#!/usr/bin/python3
"""Writes a causal transformer block at awkward sizes, with seeded weights and inputs, and its
expected outputs computed here in numpy (float64, then rounded to float32), for
tests/models/test_models.sh and tests/aot/aot_test.cpp. It exercises the paths issue 17 made
fast for transformers, at sizes off their blocks:

- attention with 3 heads of 20 over a sequence of 67 (odd; more than one 64-column panel, a last
  block of rows shorter than the 6-row register block) and a dynamic batch: Q K^T and P V are
  batched MatMuls on kiln_rt_blas.h's small-product kernel, K^T read through its strides;
- the causal mask as Where(bool tril, scores, -1e9) before Softmax (a bool load in a vector loop);
- GEMM epilogues holding tanh (GPT-2's GELU), erf (GELU through Erf), exp, log and sigmoid
  (kiln_simd_math.h's vector forms);
- a head tied to a constant through Transpose (MatMul(e, Transpose(wte))).

model_separate.onnx is the same block with Q, K and V as three projections of the normalized
input (MatMul by a [60, 60] weight, Add of a bias: the columns of wqkv and bqkv), as exporters
write a torch Linear each, which Kiln computes as one product against the weights concatenated
again (lower_concatenated_projections); its outputs are the same.

Usage: /usr/bin/python3 make_attention.py OUT_DIR
Writes OUT_DIR/model.onnx and model_separate.onnx (input x float32[batch, 67, 60]; outputs y
float32[batch, 67, 50] and z float32[batch, 67, 36]) and, for batch 2, 1 and 0, x_b<N>.npy,
y_b<N>.npy and z_b<N>.npy.
"""
import math
import os
import sys

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper

SEED = 20261126
T, D, HEADS, F, E, V, Z = 67, 60, 3, 100, 44, 50, 36
HEAD = D // HEADS


def weights(rng):
    w = {}
    def normal(name, shape, scale, mean=0.0):
        w[name] = (mean + rng.standard_normal(shape) * scale).astype(np.float32)
    normal("ln1_s", (D,), 0.1, 1.0)
    normal("ln1_b", (D,), 0.1)
    normal("wqkv", (D, 3 * D), 1 / math.sqrt(D))
    normal("bqkv", (3 * D,), 0.1)
    normal("wo", (D, D), 1 / math.sqrt(D))
    normal("bo", (D,), 0.1)
    normal("ln2_s", (D,), 0.1, 1.0)
    normal("ln2_b", (D,), 0.1)
    normal("w1", (D, F), 1 / math.sqrt(D))
    normal("b1", (F,), 0.1)
    normal("w2", (F, D), 1 / math.sqrt(F))
    normal("b2", (D,), 0.1)
    normal("w3", (D, E), 1 / math.sqrt(D))
    normal("b3", (E,), 0.1)
    normal("wte", (V, E), 1 / math.sqrt(E))
    normal("w4", (D, Z), 1 / math.sqrt(D))
    normal("b4", (Z,), 0.1)
    return w


def build(w, separate=False):
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in w.items()
                        if not (separate and k in ("wqkv", "bqkv"))]

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, out, **attrs):
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    heads_shape = const("heads_shape", np.array([0, T, HEADS, HEAD], np.int64))
    model_shape = const("model_shape", np.array([0, T, D], np.int64))
    const("split", np.array([D, D, D], np.int64))
    const("scale", np.array(1 / math.sqrt(HEAD), np.float32))
    const("causal", np.tril(np.ones((1, 1, T, T), bool)))
    const("neg", np.array(-1e9, np.float32))
    for name, value in [("half", 0.5), ("one", 1.0), ("c044", 0.044715),
                        ("sqrt_2_pi", math.sqrt(2 / math.pi)), ("sqrt2", math.sqrt(2.0)),
                        ("quarter", 0.25)]:
        const(name, np.array(value, np.float32))

    h = node("LayerNormalization", ["x", "ln1_s", "ln1_b"], "ln1", axis=-1, epsilon=1e-5)
    if separate:
        for i, name in enumerate("qkv"):
            const(f"w{name}", w["wqkv"][:, i * D:(i + 1) * D])
            const(f"b{name}", w["bqkv"][i * D:(i + 1) * D])
            node("Add", [node("MatMul", [h, f"w{name}"], f"{name}_mm"), f"b{name}"], name)
    else:
        qkv = node("Add", [node("MatMul", [h, "wqkv"], "qkv_mm"), "bqkv"], "qkv")
        nodes.append(helper.make_node("Split", [qkv, "split"], ["q", "k", "v"], name="split3",
                                      axis=-1))
    q = node("Transpose", [node("Reshape", ["q", heads_shape], "q_r")], "q_t", perm=[0, 2, 1, 3])
    k = node("Transpose", [node("Reshape", ["k", heads_shape], "k_r")], "k_t", perm=[0, 2, 3, 1])
    v = node("Transpose", [node("Reshape", ["v", heads_shape], "v_r")], "v_t", perm=[0, 2, 1, 3])
    s = node("Mul", [node("MatMul", [q, k], "qk"), "scale"], "scores")
    s = node("Where", ["causal", s, "neg"], "masked")
    p = node("Softmax", [s], "probs", axis=-1)
    c = node("Transpose", [node("MatMul", [p, v], "pv")], "ctx_t", perm=[0, 2, 1, 3])
    c = node("Reshape", [c, model_shape], "ctx")
    x1 = node("Add", ["x", node("Add", [node("MatMul", [c, "wo"], "o_mm"), "bo"], "o")], "x1")
    f = node("LayerNormalization", [x1, "ln2_s", "ln2_b"], "ln2", axis=-1, epsilon=1e-5)
    g = node("Add", [node("MatMul", [f, "w1"], "f1_mm"), "b1"], "f1")
    # GPT-2's GELU: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))).
    cube = node("Mul", [node("Mul", [g, g], "g2"), g], "g3")
    inner = node("Add", [g, node("Mul", [cube, "c044"], "g3c")], "inner")
    t = node("Tanh", [node("Mul", [inner, "sqrt_2_pi"], "inner_s")], "tanh")
    gelu = node("Mul", [node("Mul", [g, "half"], "g_half"), node("Add", [t, "one"], "t1")], "gelu")
    x2 = node("Add", [x1, node("Add", [node("MatMul", [gelu, "w2"], "f2_mm"), "b2"], "f2")], "x2")
    # GELU through Erf, then the head tied to wte.
    e = node("Add", [node("MatMul", [x2, "w3"], "e_mm"), "b3"], "e_pre")
    erf = node("Erf", [node("Div", [e, "sqrt2"], "e_s")], "erf")
    e = node("Mul", [node("Mul", [e, "half"], "e_half"), node("Add", [erf, "one"], "erf1")], "e")
    node("MatMul", [e, node("Transpose", ["wte"], "wte_t", perm=[1, 0])], "y")
    # Exp, Log and Sigmoid in one epilogue: log(1 + sigmoid(t)) + exp(t / 4).
    t4 = node("Add", [node("MatMul", [x2, "w4"], "z_mm"), "b4"], "t4")
    lg = node("Log", [node("Add", [node("Sigmoid", [t4], "sig"), "one"], "sig1")], "lg")
    node("Add", [lg, node("Exp", [node("Mul", [t4, "quarter"], "t4q")], "ex")], "z")

    graph = helper.make_graph(
        nodes, "attention_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", T, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", T, V]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", T, Z])], inits)
    model = helper.make_model(graph, producer_name="kiln-tests",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    checker.check_model(model, full_check=True)
    return model


def reference(w, x):
    w = {k: v.astype(np.float64) for k, v in w.items()}
    x = x.astype(np.float64)
    b = x.shape[0]

    def ln(a, s, o):
        mu = a.mean(-1, keepdims=True)
        var = ((a - mu) ** 2).mean(-1, keepdims=True)
        return (a - mu) / np.sqrt(var + 1e-5) * s + o

    qkv = ln(x, w["ln1_s"], w["ln1_b"]) @ w["wqkv"] + w["bqkv"]
    q, k, v = (qkv[..., i * D:(i + 1) * D].reshape(b, T, HEADS, HEAD).transpose(0, 2, 1, 3)
               for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HEAD)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -1e9)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    c = (p @ v).transpose(0, 2, 1, 3).reshape(b, T, D)
    x1 = x + c @ w["wo"] + w["bo"]
    g = ln(x1, w["ln2_s"], w["ln2_b"]) @ w["w1"] + w["b1"]
    gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    x2 = x1 + gelu @ w["w2"] + w["b2"]
    e = x2 @ w["w3"] + w["b3"]
    erf = np.vectorize(math.erf)(e / math.sqrt(2.0)) if e.size else e
    y = (0.5 * e * (1 + erf)) @ w["wte"].T
    t4 = x2 @ w["w4"] + w["b4"]
    z = np.log(1 + 1 / (1 + np.exp(-t4))) + np.exp(t4 / 4)
    return y.astype(np.float32), z.astype(np.float32)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    w = weights(rng)
    with open(os.path.join(out_dir, "model.onnx"), "wb") as f:
        f.write(build(w).SerializeToString())
    with open(os.path.join(out_dir, "model_separate.onnx"), "wb") as f:
        f.write(build(w, separate=True).SerializeToString())
    for batch in (2, 1, 0):
        x = rng.standard_normal((batch, T, D)).astype(np.float32)
        y, z = reference(w, x)
        np.save(os.path.join(out_dir, f"x_b{batch}.npy"), x)
        np.save(os.path.join(out_dir, f"y_b{batch}.npy"), y)
        np.save(os.path.join(out_dir, f"z_b{batch}.npy"), z)


if __name__ == "__main__":
    main(sys.argv[1])
