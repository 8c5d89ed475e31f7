#!/usr/bin/python3
"""Writes ResNet's blocks at awkward sizes, with seeded weights and inputs, and their expected
outputs computed here in numpy (float64, then rounded to float32), for tests/models/test_models.sh
and tests/aot/aot_test.cpp. Kiln runs such a network channels-last (lower/nn.cpp, ConvLayout's
kAuto): every convolution, the residual Adds, Relu, MaxPool and GlobalAveragePool read and write
[N, H, W, C] buffers. The sizes are off every register block:

- x float32[batch, 3, 37, 29] (a dynamic batch): odd heights and widths everywhere after;
- the 7x7 stride-2 stem to 19 channels (off the 8 and 16 of a vector), BatchNormalization, Relu,
  then MaxPool 3x3 stride 2 with pads 1: [batch, 19, 10, 8];
- a basic block (3x3, 3x3, the identity added), a strided one to 37 channels (3x3 stride 2, 3x3,
  and a 1x1 stride-2 shortcut Conv with a bias and no BatchNormalization) and a bottleneck
  (1x1 to 13, 3x3, 1x1 back to 37, the identity added);
- GlobalAveragePool and Flatten: y float32[batch, 37]; z is the last block's map
  float32[batch, 37, 5, 4], so that the channels-last values are checked pixel by pixel.

Usage: /usr/bin/python3 make_resnet.py OUT_DIR
Writes OUT_DIR/model.onnx, OUT_DIR/model_b2.onnx (the same network at a static batch of 2, whose
convolutions get the channels-last templates where they apply: oneDNN takes the dynamic ones)
and, for batch 2 and 1, x_b<N>.npy, y_b<N>.npy and z_b<N>.npy.
"""
import os
import sys

import numpy as np
from onnx import TensorProto, checker, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_models import batch_norm, conv2d, relu  # noqa: E402  (the same numpy references)

SEED = 20261127
H, W = 37, 29
# name, input channels, output channels, kernel, stride, with BatchNormalization (else a bias)
CONVS = (("stem", 3, 19, 7, 2, True),
         ("a1", 19, 19, 3, 1, True), ("a2", 19, 19, 3, 1, True),
         ("b1", 19, 37, 3, 2, True), ("b2", 37, 37, 3, 1, True), ("bs", 19, 37, 1, 2, False),
         ("c1", 37, 13, 1, 1, True), ("c2", 13, 13, 3, 1, True), ("c3", 13, 37, 1, 1, True))


def weights(rng):
    p = {}
    for name, cin, cout, k, _, bn in CONVS:
        p[name + ".w"] = (np.sqrt(2 / (cin * k * k)) *
                          rng.standard_normal((cout, cin, k, k))).astype(np.float32)
        if bn:
            p[name + ".scale"] = (1 + 0.2 * rng.standard_normal(cout)).astype(np.float32)
            p[name + ".bias"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
            p[name + ".mean"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
            p[name + ".var"] = rng.uniform(0.5, 1.5, cout).astype(np.float32)
        else:
            p[name + ".b"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    return p


def build(p, batch="batch"):
    nodes = []
    convs = {c[0]: c for c in CONVS}

    def conv(name, x, act=True):
        _, _, _, k, stride, bn = convs[name]
        inputs = [x, name + ".w"] if bn else [x, name + ".w", name + ".b"]
        out = name + ".c"
        nodes.append(helper.make_node("Conv", inputs, [out], kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4, name=name))
        if bn:
            nodes.append(helper.make_node(
                "BatchNormalization", [out] + [name + s for s in (".scale", ".bias", ".mean",
                                                                  ".var")],
                [name + ".n"], epsilon=1e-5, name=name + "_bn"))
            out = name + ".n"
        if act:
            nodes.append(helper.make_node("Relu", [out], [name + ".r"], name=name + "_relu"))
            out = name + ".r"
        return out

    def add_relu(name, a, b):
        nodes.append(helper.make_node("Add", [a, b], [name + ".s"], name=name + "_add"))
        nodes.append(helper.make_node("Relu", [name + ".s"], [name + ".o"], name=name + "_out"))
        return name + ".o"

    x = conv("stem", "x")
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1], name="pool"))
    a = add_relu("a", conv("a2", conv("a1", "pool"), act=False), "pool")
    b = add_relu("b", conv("b2", conv("b1", a), act=False), conv("bs", a, act=False))
    c = add_relu("c", conv("c3", conv("c2", conv("c1", b)), act=False), b)
    nodes.append(helper.make_node("Identity", [c], ["z"], name="map"))
    nodes.append(helper.make_node("GlobalAveragePool", [c], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["y"], name="flatten"))
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "resnet_blocks", [helper.make_tensor_value_info("x", f, [batch, 3, H, W])],
        [helper.make_tensor_value_info("y", f, [batch, 37]),
         helper.make_tensor_value_info("z", f, [batch, 37, 5, 4])],
        initializer=[numpy_helper.from_array(v, k) for k, v in p.items()])
    model = helper.make_model(graph, producer_name="kiln-tests",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    checker.check_model(model, full_check=True)
    return model


def max_pool_3x3_s2_p1(x):
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2, w + 2), -np.inf)
    xp[:, :, 1:h + 1, 1:w + 1] = x
    oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    y = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            y[:, :, i, j] = xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3))
    return y


def reference(p, x):
    p = {k: v.astype(np.float64) for k, v in p.items()}
    convs = {c[0]: c for c in CONVS}

    def conv(name, x, act=True):
        _, _, cout, k, stride, bn = convs[name]
        y = conv2d(x, p[name + ".w"], np.zeros(cout) if bn else p[name + ".b"],
                   pads=(k // 2,) * 4, strides=(stride, stride))
        if bn:
            y = batch_norm(y, p[name + ".scale"], p[name + ".bias"], p[name + ".mean"],
                           p[name + ".var"], 1e-5)
        return relu(y) if act else y

    pool = max_pool_3x3_s2_p1(conv("stem", x.astype(np.float64)))
    a = relu(conv("a2", conv("a1", pool), act=False) + pool)
    b = relu(conv("b2", conv("b1", a), act=False) + conv("bs", a, act=False))
    c = relu(conv("c3", conv("c2", conv("c1", b)), act=False) + b)
    return c.mean(axis=(2, 3)).astype(np.float32), c.astype(np.float32)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    p = weights(rng)
    with open(os.path.join(out_dir, "model.onnx"), "wb") as f:
        f.write(build(p).SerializeToString())
    with open(os.path.join(out_dir, "model_b2.onnx"), "wb") as f:
        f.write(build(p, 2).SerializeToString())
    for batch in (2, 1):
        x = rng.uniform(-1, 1, (batch, 3, H, W)).astype(np.float32)
        y, z = reference(p, x)
        np.save(os.path.join(out_dir, f"x_b{batch}.npy"), x)
        np.save(os.path.join(out_dir, f"y_b{batch}.npy"), y)
        np.save(os.path.join(out_dir, f"z_b{batch}.npy"), z)


if __name__ == "__main__":
    main(sys.argv[1])
