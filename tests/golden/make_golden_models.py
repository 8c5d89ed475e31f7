#!/usr/bin/python3
"""Writes the small models of the golden tests (tests/golden/golden_test.cpp).

Usage: /usr/bin/python3 make_golden_models.py NAME OUT.onnx
Every model is float32 with static shapes; weights are deterministic (no random state).
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def weight(name, shape, seed):
    n = int(np.prod(shape))
    data = ((np.arange(n, dtype=np.float32) * 0.37 + seed) % 1.0 - 0.5) * (2.0 / np.sqrt(shape[0]))
    return numpy_helper.from_array(data.reshape(shape).astype(np.float32), name)


def scalar(name, value):
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


def model(nodes, inputs, outputs, initializers, opset=17):
    graph = helper.make_graph(nodes, "golden", inputs, outputs, initializers)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                          producer_name="kiln-golden")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def tensor(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def add_relu_mul():
    """Relu(Add(x, y)) * 2."""
    nodes = [
        helper.make_node("Add", ["x", "y"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "two"], ["out"], name="mul"),
    ]
    return model(nodes, [tensor("x", [8, 100]), tensor("y", [8, 100])], [tensor("out", [8, 100])],
                 [scalar("two", 2.0)])


def layernorm_gelu():
    """LayerNormalization over the last axis, then Gelu as x * 0.5 * (1 + Erf(x / sqrt(2)))."""
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln",
                         axis=-1, epsilon=1e-5),
        helper.make_node("Div", ["ln", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["a"], name="add"),
        helper.make_node("Mul", ["ln", "half"], ["h"], name="mul_half"),
        helper.make_node("Mul", ["h", "a"], ["out"], name="mul"),
    ]
    inits = [weight("gamma", [64], 0.1), weight("beta", [64], 0.7), scalar("sqrt2", np.sqrt(2.0)),
             scalar("one", 1.0), scalar("half", 0.5)]
    return model(nodes, [tensor("x", [4, 64])], [tensor("out", [4, 64])], inits)


def softmax_decomposed():
    """Softmax over the last axis written out; opset 13: ReduceMax takes axes as an attribute,
    ReduceSum as an input (an initializer)."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], name="rmax", axes=[-1], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["s"], name="sub"),
        helper.make_node("Exp", ["s"], ["e"], name="exp"),
        helper.make_node("ReduceSum", ["e", "axes"], ["z"], name="rsum", keepdims=1),
        helper.make_node("Div", ["e", "z"], ["out"], name="div"),
    ]
    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")
    return model(nodes, [tensor("x", [4, 32])], [tensor("out", [4, 32])], [axes], opset=13)


def outputs_kernel_then_extern():
    """out_a is computed by a kernel and read later by a MatMul; every buffer is [16, 16]."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"], name="mm0"),
        helper.make_node("Relu", ["h0"], ["out_a"], name="relu0"),
        helper.make_node("MatMul", ["out_a", "w1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="mm2"),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r2", "w3"], ["h3"], name="mm3"),
        helper.make_node("Relu", ["h3"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "w4"], ["h4"], name="mm4"),
        helper.make_node("Relu", ["h4"], ["r4"], name="relu4"),
        helper.make_node("MatMul", ["r4", "w5"], ["h5"], name="mm5"),
        helper.make_node("Relu", ["h5"], ["out_b"], name="relu5"),
    ]
    inits = [weight(f"w{i}", [16, 16], 0.1 * i) for i in range(6)]
    return model(nodes, [tensor("x", [16, 16])], [tensor("out_a", [16, 16]),
                                                   tensor("out_b", [16, 16])], inits)


def outputs_extern_then_kernel():
    """out_a is computed by a MatMul and read later by a pointwise kernel (an in-place
    candidate); every buffer is [16, 16]."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["out_a"], name="mm0"),
        helper.make_node("Relu", ["out_a"], ["r0"], name="relu0"),
        helper.make_node("MatMul", ["r0", "w1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="mm2"),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r2", "w3"], ["h3"], name="mm3"),
        helper.make_node("Relu", ["h3"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "w4"], ["h4"], name="mm4"),
        helper.make_node("Relu", ["h4"], ["r4"], name="relu4"),
        helper.make_node("MatMul", ["r4", "w5"], ["out_b"], name="mm5"),
    ]
    inits = [weight(f"w{i}", [16, 16], 0.1 * i) for i in range(6)]
    return model(nodes, [tensor("x", [16, 16])], [tensor("out_a", [16, 16]),
                                                   tensor("out_b", [16, 16])], inits)


def matmul_chain():
    """10 blocks of MatMul -> Add(bias) -> Relu, each with its own weight and bias."""
    nodes, inits, cur = [], [], "x"
    for i in range(10):
        out = "out" if i == 9 else f"r{i}"
        nodes += [
            helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"a{i}"], [out], name=f"relu{i}"),
        ]
        inits += [weight(f"w{i}", [32, 32], 0.05 * i), weight(f"b{i}", [32], 0.3 + 0.05 * i)]
        cur = out
    return model(nodes, [tensor("x", [8, 32])], [tensor("out", [8, 32])], inits)


def matmul_add_gelu():
    """MatMul(x, w) + b, then Gelu as y * 0.5 * (1 + Erf(y / sqrt(2))): a transformer MLP's first
    half, with a weight of awkward size (K = 70, N = 45)."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "b"], ["y"], name="bias"),
        helper.make_node("Div", ["y", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["a"], name="add"),
        helper.make_node("Mul", ["y", "half"], ["h"], name="mul_half"),
        helper.make_node("Mul", ["h", "a"], ["out"], name="mul"),
    ]
    return model(nodes, [tensor("x", [13, 70])], [tensor("out", [13, 45])],
                 [weight("w", [70, 45], 0.1), weight("b", [45], 0.7), scalar("sqrt2", np.sqrt(2.0)),
                  scalar("one", 1.0), scalar("half", 0.5)])


def conv_bn_relu_add(residual=True):
    """Conv (3x3, pads 1, bias) -> BatchNormalization -> Relu -> Add(x): a residual block's tail
    (without the Add when not `residual`)."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"],
                         name="bn", epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r" if residual else "out"], name="relu"),
    ] + ([helper.make_node("Add", ["r", "x"], ["out"], name="add")] if residual else [])
    var = numpy_helper.from_array(
        (np.arange(8, dtype=np.float32) * 0.1 + 0.5).astype(np.float32), "var")
    return model(nodes, [tensor("x", [1, 8, 12, 12])], [tensor("out", [1, 8, 12, 12])],
                 [weight("w", [8, 8, 3, 3], 0.2), weight("cb", [8], 0.4), weight("gamma", [8], 0.6),
                  weight("beta", [8], 0.3), weight("mean", [8], 0.9), var])


def conv_bn_relu():
    return conv_bn_relu_add(residual=False)


def conv_bn_relu_add_relu():
    """A ResNet basic block's tail: Conv -> BatchNormalization -> Relu -> Add(x) -> Relu."""
    m = conv_bn_relu_add(residual=True)
    g = m.graph
    g.node[-1].output[0] = "s"
    g.node.append(helper.make_node("Relu", ["s"], ["out"], name="relu_out"))
    onnx.checker.check_model(m)
    return m


def conv_awkward():
    """Two convolutions at awkward sizes, batch 2: a 3x3 with strides (2, 1), asymmetric pads and
    dilations (1, 2), 13 output channels, then BatchNormalization -> Relu; a 1x1 to 7 channels,
    then Add(r) -> Sigmoid."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", strides=[2, 1],
                         pads=[1, 0, 2, 1], dilations=[1, 2]),
        helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["n1"],
                         name="bn", epsilon=1e-5),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Add", ["c2", "r"], ["a2"], name="add"),
        helper.make_node("Sigmoid", ["a2"], ["out"], name="sigmoid"),
    ]
    var = numpy_helper.from_array(
        (np.arange(13, dtype=np.float32) * 0.1 + 0.5).astype(np.float32), "var")
    return model(nodes, [tensor("x", [2, 5, 9, 11]), tensor("r", [2, 7, 5, 8])],
                 [tensor("out", [2, 7, 5, 8])],
                 [weight("w1", [13, 5, 3, 3], 0.2), weight("b1", [13], 0.4),
                  weight("gamma", [13], 0.6), weight("beta", [13], 0.3),
                  weight("mean", [13], 0.9), var, weight("w2", [7, 13, 1, 1], 0.7)])


def reduce_mul_chain():
    """10 blocks of y = x * ReduceSum(x, axes=[-1], keepdims=1): x stays [8, 32]."""
    nodes, cur = [], "x"
    for i in range(10):
        out = "out" if i == 9 else f"y{i}"
        nodes += [
            helper.make_node("ReduceSum", [cur, "axes"], [f"s{i}"], name=f"rsum{i}", keepdims=1),
            helper.make_node("Mul", [cur, f"s{i}"], [out], name=f"mul{i}"),
        ]
        cur = out
    axes = numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")
    return model(nodes, [tensor("x", [8, 32])], [tensor("out", [8, 32])], [axes])


def twin_chains():
    """Two identical, independent pointwise chains on two inputs of the same shape."""
    nodes = []
    for k in ("1", "2"):
        nodes += [
            helper.make_node("Sigmoid", ["x" + k], ["s" + k], name="sigmoid" + k),
            helper.make_node("Mul", ["x" + k, "s" + k], ["m" + k], name="mul" + k),
            helper.make_node("Add", ["m" + k, "c"], ["out" + k], name="add" + k),
        ]
    return model(nodes, [tensor("x1", [8, 64]), tensor("x2", [8, 64])],
                 [tensor("out1", [8, 64]), tensor("out2", [8, 64])], [scalar("c", 0.25)])


MODELS = {f.__name__: f for f in (add_relu_mul, layernorm_gelu, softmax_decomposed,
                                   outputs_kernel_then_extern, outputs_extern_then_kernel,
                                   matmul_chain, matmul_add_gelu, conv_bn_relu_add, conv_bn_relu,
                                   conv_bn_relu_add_relu, conv_awkward, reduce_mul_chain,
                                   twin_chains)}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in MODELS:
        sys.exit(f"usage: make_golden_models.py {{{','.join(MODELS)}}} OUT.onnx")
    onnx.save(MODELS[sys.argv[1]](), sys.argv[2])
