#!/usr/bin/python3
"""Writes a long chain of elementwise ONNX nodes (opset 17) on one float32 tensor, for the
compile-time test of long chains (test_long_chain.sh) and the compile-time bench
(bench/compile_bench.py).

Usage: /usr/bin/python3 make_chain.py OUT.onnx --nodes N --shape D0,D1,...
                                      [--ops relu|mixed|distinct]
                                      [--input X.npy --expected Y.npy]
Run with Debian's python3 (python3-onnx, python3-numpy).

--ops relu (the default): N Relu nodes, x -> Relu -> Relu -> ... -> y.
--ops mixed: N nodes cycling through Neg, Abs, Add(y, c), Relu, with c = 2^-10 (a float32
    scalar initializer shared by every Add). Each cycle computes relu(|-y| + c), so the output is
    about |x| + c * (number of Adds): it depends on every input value and on every cycle, and a
    chain cut or joined wrongly gives a different value.
--ops distinct: N nodes alternating Add(y, c_k) and Relu, each Add with a scalar of its own
    (c_k = +-(k + 1) * 2^-24, the sign alternating), so no two stretches of the chain generate the same kernel
    text and Kiln's deduplication of identical kernels does not hide any compile time.
--input / --expected: a seeded input (uniform [-1, 1)) and the output computed by numpy, applying
    the same float32 operations in the same order (each one correctly rounded, so a compiled
    model agrees to the last bit unless it reorders them).
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
STEP = np.float32(2.0**-10)
MIXED = ["Neg", "Abs", "Add", "Relu"]


def chain_ops(nodes, ops):
    cycle = {"relu": ["Relu"], "mixed": MIXED, "distinct": ["Add", "Relu"]}[ops]
    return [cycle[k % len(cycle)] for k in range(nodes)]


def add_constant(ops, k):
    """The scalar node k adds."""
    return STEP if ops == "mixed" else np.float32((k + 1) * 2.0**-24 * (-1) ** (k // 2))


def chain_model(nodes, shape, ops="relu"):
    """The chain as an onnx.ModelProto with input 'x' and output 'y' of float32[shape]."""
    graph_nodes = []
    inits = []
    prev = "x"
    for k, op in enumerate(chain_ops(nodes, ops)):
        out = "y" if k == nodes - 1 else f"v{k}"
        inputs = [prev]
        if op == "Add":
            inputs.append("step" if ops == "mixed" else f"c{k}")
            if ops == "distinct":
                inits.append(numpy_helper.from_array(np.array(add_constant(ops, k)), f"c{k}"))
        graph_nodes.append(helper.make_node(op, inputs, [out], name=f"n{k}"))
        prev = out
    if ops == "mixed":
        inits.append(numpy_helper.from_array(np.array(STEP), "step"))
    graph = helper.make_graph(
        graph_nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, producer_name="kiln-chain",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def chain_reference(x, nodes, ops="relu"):
    """The chain's output for input x, in numpy float32."""
    y = x.astype(np.float32)
    for k, op in enumerate(chain_ops(nodes, ops)):
        if op == "Add":
            y = (y + add_constant(ops, k)).astype(np.float32)
        elif op == "Relu":
            y = np.maximum(y, np.float32(0))
        elif op == "Neg":
            y = -y
        else:
            y = np.abs(y)
    return y


def save_atomic(path, write):
    tmp = path + ".tmp"
    write(tmp)
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--shape", required=True, help="comma-separated dims, e.g. 2,3")
    parser.add_argument("--ops", choices=["relu", "mixed", "distinct"], default="relu")
    parser.add_argument("--input")
    parser.add_argument("--expected")
    args = parser.parse_args()
    shape = [int(d) for d in args.shape.split(",")]
    model = chain_model(args.nodes, shape, args.ops)
    save_atomic(args.out, lambda p: onnx.save(model, p))
    if args.input:
        x = np.random.default_rng(12).uniform(-1, 1, shape).astype(np.float32)
        save_atomic(args.input, lambda p: np.save(open(p, "wb"), x))
        if args.expected:
            y = chain_reference(x, args.nodes, args.ops)
            save_atomic(args.expected, lambda p: np.save(open(p, "wb"), y))


if __name__ == "__main__":
    main()
