#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/*_fuzzer.cpp) from the ONNX backend
suite: OUT/<target>/ for each target. Deterministic; files over 64 KiB are left out (libFuzzer
works best on small inputs).

  onnx_import    the suite's model.onnx files
  tensor_pb      the suite's input_*.pb and output_*.pb files (tensors, sequences, optionals)
  npy            the suite's tensors as .npy (written by numpy; C and Fortran order)
  external_data  the suite's tensors moved to external data (the fuzzer's input layout: a 4-byte
                 length, the TensorProto, the data file), at aligned and misaligned offsets
  weights_file   weights files (the layout of src/runtime/kiln_rt_weights.h) of the suite's tensors

Usage: make_seeds.py DATA_DIR OUT_DIR
"""
import hashlib
import io
import struct
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

MAX_BYTES = 64 * 1024
MASK = (1 << 64) - 1


def weights_checksum(data: bytes) -> int:
    """kiln_rt::weights_checksum, in Python (the same 64-bit arithmetic)."""
    p1, p2 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F

    def rotl(x, r):
        return ((x << r) | (x >> (64 - r))) & MASK

    def mix(acc, word):
        return (rotl((acc + word * p2) & MASK, 31) * p1) & MASK

    lane = [(p1 + p2) & MASK, p2, 0, (0 - p1) & MASK]
    i = 0
    n = len(data)
    while i + 32 <= n:
        for k in range(4):
            (word,) = struct.unpack_from("<Q", data, i + 8 * k)
            lane[k] = mix(lane[k], word)
        i += 32
    h = (rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18)) & MASK
    while i < n:
        h = (rotl(h ^ ((data[i] * p1) & MASK), 11) * p2) & MASK
        i += 1
    h ^= n
    h ^= h >> 33
    h = (h * p2) & MASK
    h ^= h >> 29
    return h


def weights_file(payload: bytes) -> bytes:
    header = b"KILNWTS1" + struct.pack("<QQ", len(payload), weights_checksum(payload))
    return header + b"\0" * (64 - len(header)) + payload


class Writer:
    def __init__(self, out: Path):
        self.out = out
        self.seen = set()

    def put(self, target: str, data: bytes):
        if len(data) > MAX_BYTES:
            return
        digest = hashlib.sha1(data).hexdigest()
        if (target, digest) in self.seen:
            return
        self.seen.add((target, digest))
        d = self.out / target
        d.mkdir(parents=True, exist_ok=True)
        (d / digest).write_bytes(data)


def external_seed(proto: onnx.TensorProto, offset: int, with_length: bool) -> bytes:
    raw = proto.raw_data
    ext = onnx.TensorProto()
    ext.CopyFrom(proto)
    ext.ClearField("raw_data")
    ext.name = "w"
    ext.data_location = onnx.TensorProto.EXTERNAL
    for key, value in [("location", "data.bin"), ("offset", str(offset))] + (
        [("length", str(len(raw)))] if with_length else []
    ):
        entry = ext.external_data.add()
        entry.key, entry.value = key, value
    meta = ext.SerializeToString()
    return struct.pack("<I", len(meta)) + meta + b"\x5a" * offset + raw


def main():
    data_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    w = Writer(out)
    for model in sorted(data_dir.rglob("*.onnx")):
        w.put("onnx_import", model.read_bytes())
    weights_payload = b""
    for pb in sorted(data_dir.rglob("*.pb")):
        data = pb.read_bytes()
        if len(data) > MAX_BYTES:
            continue
        w.put("tensor_pb", data)
        proto = onnx.TensorProto()
        try:
            proto.ParseFromString(data)
            array = numpy_helper.to_array(proto)
        except Exception:  # sequences, optionals, types numpy lacks
            continue
        if array.dtype.kind not in "biuf" or array.dtype.byteorder == ">":
            continue
        buffer = io.BytesIO()
        np.save(buffer, array)
        w.put("npy", buffer.getvalue())
        if array.ndim > 1:
            buffer = io.BytesIO()
            np.save(buffer, np.asfortranarray(array))
            w.put("npy", buffer.getvalue())
        flat = onnx.TensorProto()
        flat.CopyFrom(numpy_helper.from_array(array))
        if flat.raw_data:
            w.put("external_data", external_seed(flat, 0, True))
            w.put("external_data", external_seed(flat, 3, False))
            if len(weights_payload) < 16 * 1024:
                weights_payload += flat.raw_data + b"\0" * (-len(flat.raw_data) % 64)
                w.put("weights_file", weights_file(weights_payload))
    w.put("weights_file", weights_file(b""))


if __name__ == "__main__":
    main()
