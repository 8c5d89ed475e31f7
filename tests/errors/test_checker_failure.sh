#!/usr/bin/env bash
# A node the ONNX checker refuses (Relu with two inputs): one line naming file, node and op.
source "$(dirname "$0")/lib.sh"
make_model checker "$SCRATCH/checker.onnx"
expect_error 2 '^kiln: error: ' "checker\.onnx" "node 'bad_relu' \(Relu\)" -- \
  info "$SCRATCH/checker.onnx"
