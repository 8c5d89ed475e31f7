#!/usr/bin/python3
"""Turns an input of the external_data fuzzer (a 4-byte little-endian length n, n bytes of a
TensorProto, then the bytes of data.bin) into what `kiln info` reads: OUT_DIR/model.onnx, whose
one initializer 'w' is that TensorProto with external data (also the graph's output), and
OUT_DIR/data.bin. Used to keep the fuzzer's findings as regression inputs
(tests/fuzz/regressions/external_data/).

Usage: external_input_to_model.py INPUT OUT_DIR
"""
import struct
import sys
from pathlib import Path

import onnx
from onnx import helper


def main():
    data = Path(sys.argv[1]).read_bytes()
    out = Path(sys.argv[2])
    (n,) = struct.unpack_from("<I", data, 0)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data[4:4 + n])
    tensor.name = "w"
    tensor.data_location = onnx.TensorProto.EXTERNAL
    elem_type = tensor.data_type if onnx.TensorProto.DataType.Name(tensor.data_type) else 1
    graph = helper.make_graph([], "external_data", [],
                              [helper.make_tensor_value_info("w", elem_type, None)], [tensor])
    model = helper.make_model(graph, producer_name="kiln-fuzz",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.onnx").write_bytes(model.SerializeToString())
    (out / "data.bin").write_bytes(data[4 + n:])


if __name__ == "__main__":
    main()
