#!/usr/bin/env bash
# Three nodes feeding each other in a loop: one line naming the file and the cycle.
source "$(dirname "$0")/lib.sh"
make_model cycle "$SCRATCH/cycle.onnx"
expect_error 2 '^kiln: error: ' "cycle\.onnx" "cycle" "'add_a' -> 'relu_b' -> 'neg_c' -> 'add_a'" -- \
  info "$SCRATCH/cycle.onnx"
