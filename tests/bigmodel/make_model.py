#!/usr/bin/python3
"""Writes a model whose weights live in external data files, for tests/bigmodel/run.sh.

The model is a chain of layers on an input x[batch, width]: MatMul, Gemm (with a bias), and
between them Relu; each layer's weight is float32 [width, width] (width^2 * 4 bytes). The weights
go to two external files: most of them in big_a.bin one after another, the last one of that file
after a hole that puts its offset past 2^32 (a sparse file: the hole takes no disk), the rest in
big_b.bin. Each weight is written in slices of rows drawn from a seeded generator, so no more
than one slice is held in memory; the expected output is computed the same way (numpy reads the
weights back through np.memmap, a slice of rows at a time).

Usage: make_model.py DIR --layers N --width W [--batch B]
Writes DIR/big.onnx, DIR/big_a.bin, DIR/big_b.bin, DIR/x.npy and DIR/expected.npy, and prints
the weights' total bytes on its last line ("weights_bytes N").
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

ROWS_PER_SLICE = 512
HOLE_OFFSET = (1 << 32) + 4096  # past 2^32, page aligned (and 64-byte aligned)


def write_weight(f, offset, width, seed):
    """Writes a [width, width] float32 weight at `offset` of the open file `f`, a slice of rows
    at a time; returns its length in bytes."""
    rng = np.random.default_rng(seed)
    scale = np.float32(1.0 / np.sqrt(width))
    f.seek(offset)
    for start in range(0, width, ROWS_PER_SLICE):
        rows = min(ROWS_PER_SLICE, width - start)
        block = (rng.standard_normal((rows, width), dtype=np.float32) * scale).astype(np.float32)
        f.write(block.tobytes())
    return width * width * 4


def external(name, dims, location, offset, length):
    t = TensorProto()
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(dims)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = t.external_data.add()
        entry.key = key
        entry.value = value
    return t


def matmul_streamed(h, path, offset, width):
    """h @ W for the weight stored at `offset` of `path`, reading W a slice of rows at a time."""
    w = np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=(width, width))
    out = np.zeros((h.shape[0], width), dtype=np.float64)
    for start in range(0, width, ROWS_PER_SLICE):
        stop = min(width, start + ROWS_PER_SLICE)
        out += h[:, start:stop].astype(np.float64) @ np.asarray(w[start:stop], dtype=np.float64)
    del w
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--width", type=int, default=11585)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    width, layers = args.width, args.layers
    weight_bytes = width * width * 4
    in_a = max(1, layers - 1)  # the last layer's weight goes to big_b.bin

    placements = []  # (file, offset) per layer
    with open(os.path.join(args.dir, "big_a.bin"), "wb") as f:
        offset = 0
        for k in range(in_a):
            if k == in_a - 1 and in_a > 1 and offset < HOLE_OFFSET:
                offset = HOLE_OFFSET  # the last weight of this file lies past 2^32
            write_weight(f, offset, width, seed=100 + k)
            placements.append(("big_a.bin", offset))
            offset += (weight_bytes + 63) // 64 * 64
    bias = (np.arange(width, dtype=np.float32) % 7 - 3) * np.float32(0.01)
    with open(os.path.join(args.dir, "big_b.bin"), "wb") as f:
        f.write(bias.tobytes())  # the Gemm bias first, then the remaining weights
        offset = (bias.nbytes + 63) // 64 * 64
        for k in range(in_a, layers):
            write_weight(f, offset, width, seed=100 + k)
            placements.append(("big_b.bin", offset))
            offset += (weight_bytes + 63) // 64 * 64

    nodes, initializers = [], []
    initializers.append(external("bias", [width], "big_b.bin", 0, bias.nbytes))
    h = "x"
    for k, (location, offset) in enumerate(placements):
        w = f"w{k}"
        initializers.append(external(w, [width, width], location, offset, weight_bytes))
        out = f"h{k}"
        if k % 2 == 0:
            nodes.append(helper.make_node("MatMul", [h, w], [out], name=f"matmul{k}"))
        else:
            nodes.append(helper.make_node("Gemm", [h, w, "bias"], [out], name=f"gemm{k}"))
        if k + 1 < layers:
            nodes.append(helper.make_node("Relu", [out], [out + "_relu"], name=f"relu{k}"))
            out += "_relu"
        h = out
    graph = helper.make_graph(
        nodes, "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [args.batch, width])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, [args.batch, width])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    # Written as bytes: onnx.save would try to load and re-save the external data.
    with open(os.path.join(args.dir, "big.onnx"), "wb") as f:
        f.write(model.SerializeToString())

    x = np.random.default_rng(7).standard_normal((args.batch, width), dtype=np.float32)
    np.save(os.path.join(args.dir, "x.npy"), x)
    h = x.astype(np.float64)
    for k, (location, offset) in enumerate(placements):
        h = matmul_streamed(h, os.path.join(args.dir, location), offset, width)
        if k % 2 == 1:
            h += bias
        if k + 1 < layers:
            h = np.maximum(h, 0)
    np.save(os.path.join(args.dir, "expected.npy"), h.astype(np.float32))
    print(f"output {nodes[-1].output[0]}")
    print(f"weights_bytes {layers * weight_bytes + bias.nbytes}")


if __name__ == "__main__":
    main()
