#!/usr/bin/env bash
# A file that is not protobuf at all, and an empty file: user errors naming the file.
source "$(dirname "$0")/lib.sh"
printf 'this is not an ONNX model, just some text\n\xff\xfe\x00\x01' >"$SCRATCH/garbage.onnx"
expect_error 2 '^kiln: error: ' "garbage\.onnx" 'not a valid ONNX model' -- \
  info "$SCRATCH/garbage.onnx"
: >"$SCRATCH/empty.onnx"
expect_error 2 '^kiln: error: ' "empty\.onnx" 'not a valid ONNX model' -- \
  info "$SCRATCH/empty.onnx"
