#!/usr/bin/env bash
# A model path that does not exist: a user error naming the file.
source "$(dirname "$0")/lib.sh"
expect_error 2 '^kiln: error: ' "$SCRATCH/nothing_here.onnx" 'no such file' -- \
  info "$SCRATCH/nothing_here.onnx"
