#!/usr/bin/env python3
"""PyTorch's side of `make bench-cuda` (scripts/device_bench_cuda.sh), on the GPU machine.

Usage: python3 torch_bench.py MODEL.onnx INPUT.npy OUT_DIR [--runs N] [--precisions fp32,tf32]
                               [--modes eager,compile,reduce-overhead]

Runs the ONNX model node by node with PyTorch's CUDA ops (an interpreter over the graph: each
node becomes the torch call of the same meaning, weights taken from the initializers), so that
PyTorch runs exactly the model Kiln runs. It writes into OUT_DIR:
  reference.npy    onnxruntime's output on the CPU (the reference both are compared with)
  torch_fp32.npy   PyTorch eager's output with TF32 disallowed
and prints, for TF32 disallowed ("fp32") and allowed for matmuls and convolutions ("tf32"), the
median latency of PyTorch eager, of torch.compile (mode "default") and of torch.compile with
mode "reduce-overhead" (CUDA graphs), each run timed from a host input to a host output (copy
in, the model, copy out), as `kiln run --device cuda` and kiln_model_run are timed, over N runs
after warm-up, as lines
  torch <precision> <eager|compile|reduce-overhead> <median ms> <device-only median ms>
where device-only starts from an input already on the GPU and ends when the GPU is done.
Covers the ops of bench/ort/make_models.py's ResNet-50 and BERT models.
"""
import argparse
import os
import sys
import time

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


def attrs_of(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class OnnxAsTorch:
    """The graph as a Python function over torch tensors; int64 initializers (shapes) become
    Python tuples, so torch.compile sees constants."""

    def __init__(self, model, device):
        self.nodes = [(n.op_type, list(n.input), list(n.output), attrs_of(n)) for n in model.graph.node]
        self.consts = {}
        for init in model.graph.initializer:
            a = numpy_helper.to_array(init)
            if a.dtype == np.int64:
                self.consts[init.name] = tuple(int(v) for v in a.reshape(-1))
            else:
                self.consts[init.name] = torch.from_numpy(a.copy()).to(device)
        self.input = model.graph.input[0].name
        self.output = model.graph.output[0].name

    def __call__(self, x):
        env = dict(self.consts)
        env[self.input] = x
        for op, ins, outs, at in self.nodes:
            a = [env[i] if i else None for i in ins]
            env[outs[0]] = self.run(op, a, at)
        return env[self.output]

    @staticmethod
    def run(op, a, at):
        if op == "Conv":
            pads = at.get("pads", [0] * 4)
            assert pads[:2] == pads[2:], "asymmetric pads"
            return F.conv2d(a[0], a[1], a[2] if len(a) > 2 else None, stride=at.get("strides", 1),
                            padding=tuple(pads[:2]), dilation=at.get("dilations", 1),
                            groups=at.get("group", 1))
        if op == "BatchNormalization":
            return F.batch_norm(a[0], a[3], a[4], a[1], a[2], False, 0.0, at.get("epsilon", 1e-5))
        if op == "Relu":
            return F.relu(a[0])
        if op == "Add":
            return a[0] + a[1]
        if op == "Mul":
            return a[0] * a[1]
        if op == "Div":
            return a[0] / a[1]
        if op == "Erf":
            return torch.erf(a[0])
        if op == "MaxPool":
            pads = at.get("pads", [0] * 4)
            return F.max_pool2d(a[0], at["kernel_shape"], at.get("strides", 1), tuple(pads[:2]))
        if op == "GlobalAveragePool":
            return a[0].mean(dim=(2, 3), keepdim=True)
        if op == "Flatten":
            return torch.flatten(a[0], at.get("axis", 1))
        if op == "Gemm":
            assert at.get("transB", 0) == 1 and at.get("transA", 0) == 0
            return F.linear(a[0], a[1], a[2])
        if op == "MatMul":
            return torch.matmul(a[0], a[1])
        if op == "Reshape":
            return a[0].reshape(a[1])
        if op == "Transpose":
            return a[0].permute(*at["perm"])
        if op == "Softmax":
            return torch.softmax(a[0], dim=at.get("axis", -1))
        if op == "LayerNormalization":
            return F.layer_norm(a[0], a[1].shape, a[1], a[2], at.get("epsilon", 1e-5))
        if op == "Identity":
            return a[0]
        raise NotImplementedError(op)


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def under(precision, fn):
    """`fn` at `precision`: for fp16 and bf16 under torch.autocast (matmuls and convolutions in
    that type, reductions, softmax and normalizations in float32), the output as float32."""
    if precision not in ("fp16", "bf16"):
        return fn
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16

    def run(x):
        with torch.autocast("cuda", dtype=dtype):
            return fn(x).float()

    return run


def timed(fn, x_host, runs):
    """Median ms host -> host, and median ms with the input on the GPU (device only)."""
    with torch.inference_mode():
        for _ in range(10):
            fn(x_host.cuda()).cpu()
        host = []
        for _ in range(runs):
            start = time.perf_counter()
            fn(x_host.cuda()).cpu()
            host.append((time.perf_counter() - start) * 1e3)
        x = x_host.cuda()
        torch.cuda.synchronize()
        device = []
        for _ in range(runs):
            start = time.perf_counter()
            fn(x)
            torch.cuda.synchronize()
            device.append((time.perf_counter() - start) * 1e3)
    return float(np.median(host)), float(np.median(device))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("input")
    parser.add_argument("out_dir")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--precisions", default="fp32,tf32")
    parser.add_argument("--modes", default="eager,compile,reduce-overhead")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    model = onnx.load(args.model)
    x_np = np.load(args.input)

    import onnxruntime as ort
    session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    reference = session.run(None, {model.graph.input[0].name: x_np})[0]
    np.save(os.path.join(args.out_dir, "reference.npy"), reference)

    net = OnnxAsTorch(model, "cuda")
    x_host = torch.from_numpy(x_np)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    modes = args.modes.split(",")
    for precision in args.precisions.split(","):
        # fp16 and bf16: autocast, with TF32 allowed for what it leaves in float32 (Kiln's too).
        set_tf32(precision != "fp32")
        fn = under(precision, net)
        with torch.inference_mode():
            y = fn(x_host.cuda()).cpu().numpy()
        scale = float(np.abs(reference).max())
        print(f"torch {precision} eager vs onnxruntime: max |diff| / max |ref| = "
              f"{float(np.abs(y - reference).max()) / scale:.2e}", flush=True)
        if precision == "fp32":
            np.save(os.path.join(args.out_dir, "torch_fp32.npy"), y)
        if "eager" in modes:
            eager = timed(fn, x_host, args.runs)
            print(f"torch {precision} eager {eager[0]:.3f} {eager[1]:.3f}", flush=True)
        for mode in ("compile", "reduce-overhead"):
            if mode not in modes:
                continue
            torch._dynamo.reset()
            compiled = torch.compile(fn, mode="default" if mode == "compile" else mode)
            start = time.perf_counter()
            with torch.inference_mode():
                compiled(x_host.cuda()).cpu()
            print(f"  (torch.compile {precision} {mode}: first call "
                  f"{time.perf_counter() - start:.1f} s)", flush=True)
            comp = timed(compiled, x_host, args.runs)
            print(f"torch {precision} {mode} {comp[0]:.3f} {comp[1]:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
