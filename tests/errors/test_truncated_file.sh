#!/usr/bin/env bash
# A valid model cut in half: a user error naming the file.
source "$(dirname "$0")/lib.sh"
make_model valid "$SCRATCH/full.onnx"
size=$(stat -c %s "$SCRATCH/full.onnx")
head -c $((size / 2)) "$SCRATCH/full.onnx" >"$SCRATCH/truncated.onnx"
expect_error 2 '^kiln: error: ' "truncated\.onnx" 'not a valid ONNX model' -- \
  info "$SCRATCH/truncated.onnx"
