#!/usr/bin/env bash
# A node reading a value nothing defines: one line naming file, node, op and value.
source "$(dirname "$0")/lib.sh"
make_model undefined "$SCRATCH/undefined.onnx"
expect_error 2 '^kiln: error: ' "undefined\.onnx" "node 'n3' \(Add\)" "input 'ghost' is not defined" -- \
  info "$SCRATCH/undefined.onnx"
