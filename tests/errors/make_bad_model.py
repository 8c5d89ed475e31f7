#!/usr/bin/python3
"""Writes one deliberately broken ONNX model for the command-line error tests.

Usage: /usr/bin/python3 make_bad_model.py CASE OUT.onnx
Cases: checker, undefined, cycle, opset29, e8m0_round_down, valid. Models are written without onnx.checker so that
Kiln (not this script) is the one to refuse them.
"""
import sys

from onnx import TensorProto, helper


def tensor(name):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])


def model(nodes, inputs, outputs, opset=13):
    graph = helper.make_graph(nodes, "bad", [tensor(n) for n in inputs], [tensor(n) for n in outputs])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def build(case):
    if case == "valid":
        return model([helper.make_node("Relu", ["x"], ["y"], name="relu")], ["x"], ["y"])
    if case == "checker":
        # Relu takes exactly one input: the ONNX checker refuses the node.
        return model([helper.make_node("Relu", ["x", "x"], ["y"], name="bad_relu")], ["x"], ["y"])
    if case == "undefined":
        nodes = [helper.make_node("Relu", ["x"], ["a"], name="n1"),
                 helper.make_node("Add", ["a", "ghost"], ["y"], name="n3")]
        return model(nodes, ["x"], ["y"])
    if case == "cycle":
        nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="add_a"),
                 helper.make_node("Relu", ["a"], ["b"], name="relu_b"),
                 helper.make_node("Neg", ["b"], ["c"], name="neg_c")]
        return model(nodes, ["x"], ["c"])
    if case == "custom_op":
        # A valid model with an op of a domain Kiln has no lowering for.
        node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="com.example")
        m = model([node], ["x"], ["y"])
        m.opset_import.append(helper.make_opsetid("com.example", 1))
        return m
    if case == "opset29":
        return model([helper.make_node("Relu", ["x"], ["y"], name="relu")], ["x"], ["y"], opset=29)
    if case == "e8m0_round_down":
        # Cast-24 to float8e8m0 (code 24) rounding down: Kiln implements round_mode 'up' only.
        node = helper.make_node("Cast", ["x"], ["y"], name="to_e8m0", to=24, round_mode="down")
        m = model([node], ["x"], [], opset=25)
        m.graph.output.append(helper.make_tensor_value_info("y", 24, [2]))
        m.ir_version = 11
        return m
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    with open(sys.argv[2], "wb") as f:
        f.write(build(sys.argv[1]).SerializeToString())
