"""Writes the two models of bench/load/run.sh (random weights, batch 1) into OUT_DIR:
  mlp.onnx          issue 14's tiny MLP: input float32[1, 34, 96] -> Flatten -> Gemm 3264x256 ->
                    Relu -> Gemm 256x128 -> Relu -> Gemm 128x32 -> Relu -> Softmax -> [1, 32]
  mlp.input.npy     the input: uniform [-1, 1)
  resnet18.onnx     a ResNet-18-shaped CNN (basic blocks 2, 2, 2, 2; Conv + BatchNormalization +
                    Relu, bench/ort/make_models.py's conv_bn): input float32[1, 3, 224, 224] ->
                    logits float32[1, 1000]
  resnet18.input.npy  the input: uniform [-1, 1)
"""
import argparse
import os
import sys

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ort"))
from make_models import Builder, conv_bn, save  # noqa: E402  (bench/ort/make_models.py)


def mlp():
    b = Builder(seed=14)
    x = b.node("Flatten", ["input"], "flatten", axis=1)
    width = 34 * 96
    for out in (256, 128, 32):
        w = b.normal("w", (width, out), 1.0 / np.sqrt(width))
        bias = b.normal("b", (out,), 0.01)
        x = b.node("Relu", [b.node("Gemm", [x, w, bias], "gemm")], "relu")
        width = out
    b.nodes.append(helper.make_node("Softmax", [x], ["probs"], name="softmax", axis=1))
    return b.model(
        "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 34, 96])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 32])])


def basic_block(b, x, cin, cout, stride):
    y = conv_bn(b, x, cin, cout, 3, stride)
    y = conv_bn(b, y, cout, cout, 3, 1, relu=False)
    shortcut = x if stride == 1 and cin == cout else conv_bn(b, x, cin, cout, 1, stride, relu=False)
    return b.node("Relu", [b.node("Add", [y, shortcut], "add")], "relu")


def resnet18(classes=1000, image=224):
    b = Builder(seed=18)
    x = conv_bn(b, "input", 3, 64, 7, 2)
    x = b.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage in range(4):
        cout = 64 * 2 ** stage
        for i in range(2):
            x = basic_block(b, x, cin, cout, 2 if i == 0 and stage > 0 else 1)
            cin = cout
    x = b.node("GlobalAveragePool", [x], "gap")
    x = b.node("Flatten", [x], "flatten", axis=1)
    w = b.normal("fc_w", (classes, cin), 1.0 / np.sqrt(cin))
    fc_b = b.normal("fc_b", (classes,), 0.01)
    b.nodes.append(helper.make_node("Gemm", [x, w, fc_b], ["logits"], name="fc", transB=1))
    return b.model(
        "resnet18",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(14)
    save(mlp(), os.path.join(args.out_dir, "mlp.onnx"))
    np.save(os.path.join(args.out_dir, "mlp.input.npy"),
            rng.uniform(-1, 1, (1, 34, 96)).astype(np.float32))
    save(resnet18(), os.path.join(args.out_dir, "resnet18.onnx"))
    np.save(os.path.join(args.out_dir, "resnet18.input.npy"),
            rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32))
