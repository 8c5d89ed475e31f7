#!/usr/bin/python3
"""Writes a model at ai.onnx opset 21 that rounds through the small element types inside one
graph, and its expected output computed here, for tests/models/test_models.sh. Kiln computes
these types in float32 / int32 and rounds where a buffer stores them, so a cast to float8 or
int4 that a consumer would otherwise inline must still round: this model's chains check it.

  a = Cast(Cast(x, float8e4m3fn), float)        (saturate=1: clamps to +-448, nearest even)
  b = Cast(Cast(x, int4), float)                (truncates toward zero, then wraps to [-8, 7])
  d = DequantizeLinear(QuantizeLinear(x, 0.5, float8e4m3fn 0), 0.5, 0)
  y = Concat(a, b, d)

numpy has no float8: the reference rounds to the nearest of the format's values, enumerated from
its definition (bias 7, 3 mantissa bits, no infinities, 0x7F NaN), ties to the even code; it
shares no code with Kiln's conversions.

Usage: /usr/bin/python3 make_small_types.py OUT_DIR
Writes OUT_DIR/model.onnx, x.npy (float32[16]) and y.npy (float32[48]).
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper

FLOAT8E4M3FN, INT4 = 17, 22  # TensorProto codes (ONNX 1.12's Python package lacks the names)
X = np.array([0.3, 1.0625, 1.1875, 500.0, -3.3, 9.7, -9.2, 17.0, 0.01, 100.5, -0.6, 7.5,
              250.0, 3.14159, -1000.0, 2.5], dtype=np.float32)


def e4m3fn_values():
    """(code, value) of every finite non-negative float8e4m3fn code."""
    out = []
    for code in range(0x7F):
        exponent, mantissa = code >> 3, code & 7
        if exponent == 0:
            value = mantissa / 8 * 2.0 ** -6
        else:
            value = (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        out.append((code, value))
    return out


def round_e4m3fn_saturating(v):
    magnitude = min(abs(float(v)), 448.0)
    best = min(e4m3fn_values(), key=lambda cv: (abs(cv[1] - magnitude), cv[0] % 2))
    return float(np.copysign(best[1], v))


def wrap_int4(v):
    return ((int(np.trunc(v)) + 8) % 16) - 8


def value_info(name, elem_type, dims):
    return helper.make_tensor_value_info(name, elem_type, dims)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    zero_point = TensorProto(name="zp", data_type=FLOAT8E4M3FN, dims=[], raw_data=b"\x00")
    nodes = [
        helper.make_node("Cast", ["x"], ["x8"], to=FLOAT8E4M3FN),
        helper.make_node("Cast", ["x8"], ["a"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["x"], ["x4"], to=INT4),
        helper.make_node("Cast", ["x4"], ["b"], to=TensorProto.FLOAT),
        helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["d"]),
        helper.make_node("Concat", ["a", "b", "d"], ["y"], axis=0),
    ]
    graph = helper.make_graph(
        nodes, "small_types", [value_info("x", TensorProto.FLOAT, [16])],
        [value_info("y", TensorProto.FLOAT, [48])],
        initializer=[helper.make_tensor("scale", TensorProto.FLOAT, [], [0.5]), zero_point])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    with open(os.path.join(out_dir, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    a = [round_e4m3fn_saturating(v) for v in X]
    b = [float(wrap_int4(v)) for v in X]
    d = [round_e4m3fn_saturating(v / 0.5) * 0.5 for v in X]
    np.save(os.path.join(out_dir, "x.npy"), X)
    np.save(os.path.join(out_dir, "y.npy"), np.array(a + b + d, dtype=np.float32))


if __name__ == "__main__":
    main()
