#!/usr/bin/env bash
# A model importing ai.onnx opset 18, newer than Kiln knows: one line naming file and versions.
source "$(dirname "$0")/lib.sh"
make_model opset18 "$SCRATCH/opset18.onnx"
expect_error 2 '^kiln: error: ' "opset18\.onnx" "model uses opset 18; Kiln supports up to 17" -- \
  info "$SCRATCH/opset18.onnx"
