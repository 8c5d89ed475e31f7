#!/usr/bin/python3
"""Writes models whose If branches give outputs of different ranks or dtypes, with inputs and the
outputs numpy computes for them (tests/if_types).

Usage: /usr/bin/python3 make_if_type_models.py OUT_DIR

The ONNX checker wants a shape for every graph output; those whose rank is known only after a
run declare the then branch's. Each If's condition is `sr > 16000` for a float32 scalar input `sr` (a sample rate choosing one
of two front ends); OUT_DIR/<model>/sr_hi.npy (22050) and sr_lo.npy (8000) take either branch,
and <model>/<output>_hi.npy, <output>_lo.npy are numpy's outputs for them.

  rank.onnx   x[2, 3] -> If: then 2 * x ([2, 3]), else Unsqueeze(3 * x, 2) ([2, 3, 1]) -> Relu
              -> y = Relu + 1 (rank known after a run) and s = ReduceSum(Relu) (a scalar)
  loop.onnx   a Loop of 3 iterations carrying acc[3] (from x[3]); its body's If gives
              Unsqueeze(2 * acc, 0) ([1, 3]) or acc + 1 ([3]); the body adds x and reshapes to
              [3] -> y = the final acc
  dtype.onnx  x[2, 3] -> If: then Cast(10 * x, int32), else x -> y = v + v (int32 or float32)
              and z = Cast(v * v, float32)
  chain.onnx  x[2] -> If1 (sr > 16000): Unsqueeze(x, 0) or x -> If2 (sr2 > 0): Unsqueeze(., 0)
              or . -> y (rank 1 to 3) and s = ReduceSum(y); inputs sr2_pos.npy / sr2_neg.npy,
              outputs y_<hi|lo>_<pos|neg>.npy
  loop_bad.onnx  loop.onnx without the Reshape: a body output whose rank the If decides (an
              error)
  limit.onnx  a chain of 5 such Ifs read by a ReduceSum: more than Kiln specializes
Nothing here depends on Kiln.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
OPSET = 13


def save(graph, path):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def const(name, values, dtype=np.float32):
    array = np.array(values, dtype=dtype)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def condition(nodes, sr="sr", threshold=16000.0, out="cond"):
    nodes.append(const(out + "_t", threshold))
    nodes.append(helper.make_node("Greater", [sr, out + "_t"], [out]))


def branch(name, nodes, output, dtype=F):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(output, dtype, None)])


def write(directory, **arrays):
    os.makedirs(directory, exist_ok=True)
    for name, array in arrays.items():
        np.save(os.path.join(directory, name + ".npy"), array)


def rank_model(out, x):
    nodes = []
    condition(nodes)
    then_branch = branch("then", [const("two", 2.0), helper.make_node("Mul", ["x", "two"], ["t"])],
                         "t")
    else_branch = branch("else", [
        const("three", 3.0), const("axes", [2], np.int64),
        helper.make_node("Mul", ["x", "three"], ["e0"]),
        helper.make_node("Unsqueeze", ["e0", "axes"], ["e"])
    ], "e")
    nodes += [
        helper.make_node("If", ["cond"], ["v"], name="front_end", then_branch=then_branch,
                         else_branch=else_branch),
        helper.make_node("Relu", ["v"], ["r"], name="relu"),
        const("one", 1.0),
        helper.make_node("Add", ["r", "one"], ["y"], name="plus_one"),
        helper.make_node("ReduceSum", ["r"], ["s"], name="total", keepdims=0),
    ]
    graph = helper.make_graph(nodes, "rank", [
        helper.make_tensor_value_info("x", F, [2, 3]),
        helper.make_tensor_value_info("sr", F, [])
    ], [helper.make_tensor_value_info("y", F, [2, 3]),
        helper.make_tensor_value_info("s", F, [])])
    save(graph, os.path.join(out, "model.onnx"))
    for tag, v in (("hi", 2 * x), ("lo", (3 * x)[:, :, None])):
        r = np.maximum(v, 0)
        write(out, **{"y_" + tag: (r + 1).astype(np.float32),
                      "s_" + tag: np.array(r.sum(), np.float32)})


def loop_model(out, x, reshape=True):
    then_branch = branch("then", [
        const("two", 2.0), const("axes", [0], np.int64),
        helper.make_node("Mul", ["acc_in", "two"], ["t0"]),
        helper.make_node("Unsqueeze", ["t0", "axes"], ["t"])
    ], "t")
    else_branch = branch("else", [const("one", 1.0), helper.make_node("Add", ["acc_in", "one"], ["e"])],
                         "e")
    body_nodes = [
        helper.make_node("If", ["cond"], ["v"], name="body_if", then_branch=then_branch,
                         else_branch=else_branch),
        helper.make_node("Add", ["v", "x"], ["w" if reshape else "acc_out"], name="add_x"),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    if reshape:
        body_nodes += [
            const("shape", [3], np.int64),
            helper.make_node("Reshape", ["w", "shape"], ["acc_out"], name="flatten"),
        ]
    body = helper.make_graph(body_nodes, "body", [
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
        helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        helper.make_tensor_value_info("acc_in", F, [3])
    ], [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
        helper.make_tensor_value_info("acc_out", F, [3])])
    nodes = []
    condition(nodes)
    nodes += [
        const("trips", 3, np.int64),
        helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body),
    ]
    graph = helper.make_graph(nodes, "loop", [
        helper.make_tensor_value_info("x", F, [3]),
        helper.make_tensor_value_info("sr", F, [])
    ], [helper.make_tensor_value_info("y", F, [3])])
    save(graph, os.path.join(out, "model.onnx"))
    if not reshape:
        return
    for tag, hi in (("hi", True), ("lo", False)):
        acc = x.copy()
        for _ in range(3):
            acc = ((2 * acc) if hi else (acc + 1)) + x
        write(out, **{"y_" + tag: acc.astype(np.float32)})


def dtype_model(out, x):
    nodes = []
    condition(nodes)
    then_branch = branch("then", [
        const("ten", 10.0),
        helper.make_node("Mul", ["x", "ten"], ["t0"]),
        helper.make_node("Cast", ["t0"], ["t"], to=TensorProto.INT32)
    ], "t", TensorProto.INT32)
    else_branch = branch("else", [helper.make_node("Identity", ["x"], ["e"])], "e")
    nodes += [
        helper.make_node("If", ["cond"], ["v"], name="quantize", then_branch=then_branch,
                         else_branch=else_branch),
        helper.make_node("Add", ["v", "v"], ["y"], name="double"),
        helper.make_node("Mul", ["v", "v"], ["sq"], name="square"),
        helper.make_node("Cast", ["sq"], ["z"], name="to_float", to=F),
    ]
    graph = helper.make_graph(nodes, "dtype", [
        helper.make_tensor_value_info("x", F, [2, 3]),
        helper.make_tensor_value_info("sr", F, [])
    ], [helper.make_tensor_value_info("y", F, [2, 3]),
        helper.make_tensor_value_info("z", F, [2, 3])])
    save(graph, os.path.join(out, "model.onnx"))
    q = np.trunc(10 * x).astype(np.int32)
    write(out, y_hi=q + q, z_hi=(q * q).astype(np.float32), y_lo=x + x, z_lo=x * x)


def unsqueeze_or_not(name, source, cond, out):
    """An If giving Unsqueeze(source, 0) or source itself."""
    then_branch = branch(name + "_then", [
        const(name + "_axes", [0], np.int64),
        helper.make_node("Unsqueeze", [source, name + "_axes"], [name + "_t"])
    ], name + "_t")
    else_branch = branch(name + "_else", [helper.make_node("Identity", [source], [name + "_e"])],
                         name + "_e")
    return helper.make_node("If", [cond], [out], name=name, then_branch=then_branch,
                            else_branch=else_branch)


def chain_model(out, x):
    nodes = []
    condition(nodes)
    condition(nodes, sr="sr2", threshold=0.0, out="cond2")
    nodes += [
        unsqueeze_or_not("first", "x", "cond", "v1"),
        unsqueeze_or_not("second", "v1", "cond2", "y"),
        helper.make_node("ReduceSum", ["y"], ["s"], name="total", keepdims=0),
    ]
    graph = helper.make_graph(nodes, "chain", [
        helper.make_tensor_value_info("x", F, [2]),
        helper.make_tensor_value_info("sr", F, []),
        helper.make_tensor_value_info("sr2", F, [])
    ], [helper.make_tensor_value_info("y", F, [1, 1, 2]),
        helper.make_tensor_value_info("s", F, [])])
    save(graph, os.path.join(out, "model.onnx"))
    write(out, sr2_pos=np.array(1.0, np.float32), sr2_neg=np.array(-1.0, np.float32))
    for tag1, hi in (("hi", True), ("lo", False)):
        for tag2, pos in (("pos", True), ("neg", False)):
            y = x[None] if hi else x
            y = y[None] if pos else y
            write(out, **{f"y_{tag1}_{tag2}": y, f"s_{tag1}_{tag2}": np.array(y.sum(), np.float32)})


def limit_model(out):
    nodes = []
    condition(nodes)
    source = "x"
    for k in range(1, 6):
        nodes.append(unsqueeze_or_not(f"if{k}", source, "cond", f"v{k}"))
        source = f"v{k}"
    nodes.append(helper.make_node("ReduceSum", [source], ["s"], name="total", keepdims=0))
    graph = helper.make_graph(nodes, "limit", [
        helper.make_tensor_value_info("x", F, [2]),
        helper.make_tensor_value_info("sr", F, [])
    ], [helper.make_tensor_value_info("s", F, [])])
    save(graph, os.path.join(out, "model.onnx"))


def main():
    root = sys.argv[1]
    rng = np.random.default_rng(13)
    for name in ("rank", "loop", "loop_bad", "dtype", "chain", "limit"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        write(os.path.join(root, name), sr_hi=np.array(22050.0, np.float32),
              sr_lo=np.array(8000.0, np.float32))
    x23 = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    x3 = rng.uniform(-1, 1, (3,)).astype(np.float32)
    x2 = rng.uniform(-1, 1, (2,)).astype(np.float32)
    write(os.path.join(root, "rank"), x=x23)
    rank_model(os.path.join(root, "rank"), x23)
    write(os.path.join(root, "loop"), x=x3)
    loop_model(os.path.join(root, "loop"), x3)
    write(os.path.join(root, "loop_bad"), x=x3)
    loop_model(os.path.join(root, "loop_bad"), x3, reshape=False)
    write(os.path.join(root, "dtype"), x=x23)
    dtype_model(os.path.join(root, "dtype"), x23)
    write(os.path.join(root, "chain"), x=x2)
    chain_model(os.path.join(root, "chain"), x2)
    write(os.path.join(root, "limit"), x=x2)
    limit_model(os.path.join(root, "limit"))


if __name__ == "__main__":
    main()
