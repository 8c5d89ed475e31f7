#!/usr/bin/env bash
# A cast to float8e8m0 with round_mode 'down': one line naming the node, the attribute's value and
# the mode Kiln implements, and no output file.
source "$(dirname "$0")/lib.sh"
make_model e8m0_round_down "$SCRATCH/round_down.onnx"
expect_error 2 '^kiln: error: ' "node 'to_e8m0' \(Cast\)" "round_mode 'down'" "expected 'up'" -- \
  compile "$SCRATCH/round_down.onnx" -o "$SCRATCH/round_down.so"
[ ! -e "$SCRATCH/round_down.so" ] || fail "a refused compile left $SCRATCH/round_down.so"
echo ok
