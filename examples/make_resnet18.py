#!/usr/bin/python3
"""Builds a ResNet-18-shaped CNN with random weights as ONNX (opset 17, dynamic batch).

Usage: make_resnet18.py OUT.onnx [--image 224] [--width 64]
Run with Debian's python3 (python3-onnx, python3-numpy). Deterministic: fixed seed.
"""
import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.count = 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def weight(self, prefix, shape, scale):
        name = self.name(prefix)
        data = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(data, name))
        return name

    def node(self, op, inputs, prefix, **attrs):
        out = self.name(prefix)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv_bn(self, x, cin, cout, k, stride, relu=True):
        fan_in = cin * k * k
        w = self.weight("w", (cout, cin, k, k), np.sqrt(2.0 / fan_in))
        y = self.node("Conv", [x, w], "conv", kernel_shape=[k, k], strides=[stride, stride],
                      pads=[k // 2] * 4)
        scale = self.weight("gamma", (cout,), 0.1)
        self.inits[-1] = numpy_helper.from_array(
            (1.0 + self.rng.standard_normal(cout) * 0.1).astype(np.float32), scale)
        bias = self.weight("beta", (cout,), 0.1)
        mean = self.weight("mean", (cout,), 0.1)
        var = self.name("var")
        self.inits.append(numpy_helper.from_array(
            (1.0 + np.abs(self.rng.standard_normal(cout)) * 0.1).astype(np.float32), var))
        y = self.node("BatchNormalization", [y, scale, bias, mean, var], "bn", epsilon=1e-5)
        return self.node("Relu", [y], "relu") if relu else y

    def basic_block(self, x, cin, cout, stride):
        y = self.conv_bn(x, cin, cout, 3, stride)
        y = self.conv_bn(y, cout, cout, 3, 1, relu=False)
        shortcut = x if stride == 1 and cin == cout else self.conv_bn(x, cin, cout, 1, stride, relu=False)
        y = self.node("Add", [y, shortcut], "add")
        return self.node("Relu", [y], "relu")


def build(image, width, classes=1000):
    b = Builder()
    x = b.conv_bn("input", 3, width, 7, 2)
    x = b.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, blocks in enumerate([2, 2, 2, 2]):
        cout = width * (2 ** stage)
        for i in range(blocks):
            x = b.basic_block(x, cin, cout, 2 if i == 0 and stage > 0 else 1)
            cin = cout
    x = b.node("GlobalAveragePool", [x], "gap")
    x = b.node("Flatten", [x], "flatten", axis=1)
    w = b.weight("fc_w", (classes, cin), 1.0 / np.sqrt(cin))
    fc_b = b.weight("fc_b", (classes,), 0.01)
    b.nodes.append(helper.make_node("Gemm", [x, w, fc_b], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(
        b.nodes, "resnet18",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="kiln-examples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    model = build(args.image, args.width)
    tmp = args.out + ".tmp"
    onnx.save(model, tmp)
    import os
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
