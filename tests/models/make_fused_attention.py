#!/usr/bin/python3
"""Writes a model of four attentions in the forms lower/attention_fusion.h fuses into one kernel
(runtime/kiln_rt_attention.h), at sizes off the kernel's blocks, with seeded inputs and expected
outputs computed here in numpy (float64, then rounded to float32); and checks Kiln's outputs.

The inputs are q, k, v float32[batch, 2, seq, 20] (2 heads of 20, batch and seq dynamic) and
w float32[batch, 2, seq, 12]. Outputs:
  a  Softmax(Q K^T / sqrt(20)) V: a Div scale, no mask, K^T through Transpose;
  b  Softmax(Where(causal, Q K^T * 0.25, -1e9)) W: a causal bool mask input [1, 1, seq, seq],
     V of head dim 12 (key tiles above the diagonal are skipped);
  c  Softmax(Where(pad, -inf, 0.3 * Q K^T)) V: the fill where the mask is true, a padding mask
     [batch, 1, 1, seq] that hides the last keys; batch element 1 has every key hidden, so its
     rows are -inf throughout and give NaN, as the unfused Softmax does;
  d  Softmax(Q K^T + M) V: an additive float mask M [seq, seq] (0 or -10000, and -inf on one
     column), K^T through a second Transpose of K^T's transpose;
  e  b's attention with its mask a Slice of a [1, 1, 160, 160] constant tril: the scores'
     shape becomes [batch, 2, min(seq, 160), min(seq, 160)], which is not provably the
     product's, so this one is not fused and runs node by node (test_models.sh checks the log).
Usage: make_fused_attention.py OUT_DIR          writes OUT_DIR/model.onnx and, for each of the
                                                 cases below, <case>_{q,k,v,w,causal,pad,addmask,a,b,c,d,e}.npy
       make_fused_attention.py --check EXPECTED.npy ACTUAL.npy
                                                 passes when NaNs sit at the same places and the
                                                 other values agree within rtol 1e-4, atol 1e-5

Cases (batch, seq): s67 (2, 67) more than one 64-key tile and a 3-row last query block;
s130 (2, 130) three key tiles, five query blocks; s5 (1, 5) shorter than a vector; s0 (2, 0).
"""
import math
import os
import sys

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper

SEED = 20261127
HEADS, HEAD, HEAD_W = 2, 20, 12
MAX_SEQ = 160
CASES = {"s67": (2, 67), "s130": (2, 130), "s5": (1, 5), "s0": (2, 0)}
RTOL, ATOL = 1e-4, 1e-5


def build():
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, out, **attrs):
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    const("sqrt_head", np.array(math.sqrt(HEAD), np.float32))
    const("quarter", np.array(0.25, np.float32))
    const("c03", np.array(0.3, np.float32))
    const("neg", np.array(-1e9, np.float32))
    const("ninf", np.array(-np.inf, np.float32))
    const("tril", np.tril(np.ones((1, 1, MAX_SEQ, MAX_SEQ), bool)))
    const("zero1", np.array([0], np.int64))
    const("axes23", np.array([2, 3], np.int64))
    const("zeros2", np.array([0, 0], np.int64))
    const("axis2", np.array([2], np.int64))

    kt = node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2])
    # a: Div scale, no mask.
    s = node("Div", [node("MatMul", ["q", kt], "qk_a"), "sqrt_head"], "s_a")
    node("MatMul", [node("Softmax", [s], "p_a", axis=-1), "v"], "a")
    # b: Where(causal, s * 0.25, -1e9), V of head dim 12.
    s = node("Mul", [node("MatMul", ["q", kt], "qk_b"), "quarter"], "s_b")
    s = node("Where", ["causal", s, "neg"], "m_b")
    node("MatMul", [node("Softmax", [s], "p_b", axis=-1), "w"], "b")
    # e: b with the mask sliced from a constant (not fused).
    seq = node("Gather", [node("Shape", ["q"], "q_shape"), "axis2"], "seq")
    seq2 = node("Concat", [seq, seq], "seq2", axis=0)
    tril = node("Slice", ["tril", "zeros2", seq2, "axes23"], "tril_seq")
    s = node("Mul", [node("MatMul", ["q", kt], "qk_e"), "quarter"], "s_e")
    s = node("Where", [tril, s, "neg"], "m_e")
    node("MatMul", [node("Softmax", [s], "p_e", axis=-1), "w"], "e")
    # c: Where(pad, -inf, 0.3 * s) (scale first), pad [batch, 1, 1, seq].
    s = node("Mul", ["c03", node("MatMul", ["q", kt], "qk_c")], "s_c")
    s = node("Where", ["pad", "ninf", s], "m_c")
    node("MatMul", [node("Softmax", [s], "p_c", axis=-1), "v"], "c")
    # d: Q (K^T)^T^T + additive mask [seq, seq].
    ktt = node("Transpose", [node("Transpose", [kt], "k_again", perm=[0, 1, 3, 2])], "ktt",
               perm=[0, 1, 3, 2])
    s = node("Add", [node("MatMul", ["q", ktt], "qk_d"), "addmask"], "s_d")
    node("MatMul", [node("Softmax", [s], "p_d", axis=-1), "v"], "d")

    def io(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtype, shape)

    graph = helper.make_graph(
        nodes, "fused_attention",
        [io("q", TensorProto.FLOAT, ["batch", HEADS, "seq", HEAD]),
         io("k", TensorProto.FLOAT, ["batch", HEADS, "seq", HEAD]),
         io("v", TensorProto.FLOAT, ["batch", HEADS, "seq", HEAD]),
         io("w", TensorProto.FLOAT, ["batch", HEADS, "seq", HEAD_W]),
         io("causal", TensorProto.BOOL, [1, 1, "seq", "seq"]),
         io("pad", TensorProto.BOOL, ["batch", 1, 1, "seq"]),
         io("addmask", TensorProto.FLOAT, ["seq", "seq"])],
        [io(n, TensorProto.FLOAT, ["batch", HEADS, "seq", HEAD_W if n in "be" else HEAD])
         for n in "abcde"], inits)
    model = helper.make_model(graph, producer_name="kiln-tests",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    checker.check_model(model, full_check=True)
    return model


def attention(q, kt, v, mask_fn, scale):
    s = q @ kt * scale
    s = mask_fn(s)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True)) if s.shape[-1] else s
        p = p / p.sum(-1, keepdims=True)
    return p @ v


def case_inputs(rng, batch, seq):
    shape = (batch, HEADS, seq, HEAD)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    w = rng.standard_normal((batch, HEADS, seq, HEAD_W)).astype(np.float32)
    pad = np.zeros((batch, 1, 1, seq), bool)
    pad[0, ..., seq - seq // 3:] = True  # the last third of the keys hidden
    if batch > 1:
        pad[1] = True  # every key hidden: NaN rows
    addmask = np.where(rng.random((seq, seq)) < 0.3, -10000.0, 0.0).astype(np.float32)
    if seq > 1:
        addmask[:, 1] = -np.inf
    causal = np.tril(np.ones((1, 1, seq, seq), bool))
    return dict(q=q, k=k, v=v, w=w, causal=causal, pad=pad, addmask=addmask)


def reference(x):
    q, k, v, w = (x[n].astype(np.float64) for n in "qkvw")
    kt = k.swapaxes(-1, -2)
    seq = q.shape[2]
    tril = np.tril(np.ones((seq, seq), bool))
    out = {
        "a": attention(q, kt, v, lambda s: s, 1 / np.float64(np.float32(math.sqrt(HEAD)))),
        "b": attention(q, kt, w, lambda s: np.where(tril, s, -1e9), 0.25),
        "c": attention(q, kt, v, lambda s: np.where(x["pad"], -np.inf, s), np.float32(0.3)),
        "d": attention(q, kt, v, lambda s: s + x["addmask"], 1.0),
    }
    out["e"] = out["b"]
    return {n: a.astype(np.float32) for n, a in out.items()}


def check(expected_path, actual_path):
    expected, actual = np.load(expected_path), np.load(actual_path)
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        print(f"{actual_path}: {actual.dtype}{list(actual.shape)}, expected "
              f"{expected.dtype}{list(expected.shape)}")
        return 1
    nan = np.isnan(expected)
    if (np.isnan(actual) != nan).any():
        print(f"{actual_path}: NaN at {np.argwhere(np.isnan(actual) != nan)[:5].tolist()} "
              f"differs from numpy")
        return 1
    close = np.isclose(actual[~nan], expected[~nan], rtol=RTOL, atol=ATOL)
    if not close.all():
        bad = np.argwhere(~close)
        print(f"{actual_path}: {len(bad)} of {close.size} values differ")
        return 1
    err = np.abs(actual[~nan].astype(np.float64) - expected[~nan])
    print(f"{actual_path}: {close.size} values within rtol={RTOL} atol={ATOL} "
          f"(max abs error {err.max() if err.size else 0:.3g}), {nan.sum()} NaN as numpy")
    return 0


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "model.onnx"), "wb") as f:
        f.write(build().SerializeToString())
    rng = np.random.default_rng(SEED)
    for name, (batch, seq) in CASES.items():
        x = case_inputs(rng, batch, seq)
        for n, a in list(x.items()) + list(reference(x).items()):
            np.save(os.path.join(out_dir, f"{name}_{n}.npy"), a)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
