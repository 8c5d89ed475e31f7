#!/usr/bin/python3
"""Writes OUT_DIR/model.onnx whose initializer 'w' (float32 [4, 4], values 0..15) is stored as
external data in OUT_DIR/weights.bin, the way onnx.save_model writes it. Used by importer_test.

Usage: /usr/bin/python3 make_external_data_model.py OUT_DIR
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), name="w")
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")],
    "external",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    initializer=[w],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
onnx.save_model(model, os.path.join(out_dir, "model.onnx"), save_as_external_data=True,
                all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
