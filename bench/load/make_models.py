"""Writes the two models of bench/load/run.sh (random weights, batch 1) into OUT_DIR:
  mlp.onnx          issue 14's tiny MLP: input float32[1, 34, 96] -> Flatten -> Gemm 3264x256 ->
                    Relu -> Gemm 256x128 -> Relu -> Gemm 128x32 -> Relu -> Softmax -> [1, 32]
  mlp.input.npy     the input: uniform [-1, 1)
  resnet18.onnx     bench/ort/make_models.py's ResNet-18-shaped CNN: input float32[1, 3, 224, 224]
                    -> logits float32[1, 1000]
  resnet18.input.npy  the input: uniform [-1, 1)
"""
import argparse
import os
import sys

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ort"))
from make_models import Builder, resnet18, save  # noqa: E402  (bench/ort/make_models.py)


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
