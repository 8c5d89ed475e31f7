#!/usr/bin/env bash
# A model importing ai.onnx opset 29, newer than Kiln knows: one line naming file and versions.
source "$(dirname "$0")/lib.sh"
make_model opset29 "$SCRATCH/opset29.onnx"
expect_error 2 '^kiln: error: ' "opset29\.onnx" "model uses opset 29; Kiln supports up to 28" -- \
  info "$SCRATCH/opset29.onnx"
