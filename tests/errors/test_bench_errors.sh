#!/usr/bin/env bash
# `kiln bench` with a bad --shape (wrong dims, unknown input, wrong rank, not dims, a symbol given
# two values) or a file named .so that is not a model library: exit 2, one line naming the
# argument. A correct --shape first shows the model itself runs.
source "$(dirname "$0")/run_lib.sh"
run_model argmax "$SCRATCH/m.onnx"  # x: float32[batch, 4]
run_model add_relu "$SCRATCH/two.onnx"  # x: float32[2, 3], s: float32[3]
"$KILN" bench "$SCRATCH/m.onnx" --iters 1 --shape x=3x4 --cache-dir "$CACHE" ||
  fail "a correct bench failed"
expect_error 2 '^kiln: error: --shape x=3x5: ' "input 'x' is float32\[batch, 4\]" \
  'does not match \[3, 5\]' -- bench "$SCRATCH/m.onnx" --shape x=3x5 --cache-dir "$CACHE"
expect_error 2 '^kiln: error: --shape y=3x4: ' "no input 'y' \(its inputs: x\)" -- \
  bench "$SCRATCH/m.onnx" --shape y=3x4 --cache-dir "$CACHE"
expect_error 2 '^kiln: error: --shape x=3: ' 'rank 2, got 1 dims' -- \
  bench "$SCRATCH/m.onnx" --shape x=3 --cache-dir "$CACHE"
expect_error 2 '^kiln: error: --shape x=3,4: ' "'3,4' is not a dim" -- \
  bench "$SCRATCH/m.onnx" --shape x=3,4 --cache-dir "$CACHE"
expect_error 2 '^kiln: error: --shape x=-3x4: ' "'-3' is not a dim" -- \
  bench "$SCRATCH/m.onnx" --shape x=-3x4 --cache-dir "$CACHE"
expect_error 2 "^kiln: error: --shape '3x4' is not of the form NAME=VALUE" -- \
  bench "$SCRATCH/m.onnx" --shape 3x4 --cache-dir "$CACHE"
expect_error 2 "^kiln: error: --shape x=2x3: input 'x' is given a shape twice" -- \
  bench "$SCRATCH/two.onnx" --shape x=2x3 --shape x=2x3 --cache-dir "$CACHE"
expect_error 2 '^kiln: error: --shape s=4: ' "input 's' is float32\[3\]" 'does not match \[4\]' -- \
  bench "$SCRATCH/two.onnx" --shape s=4 --cache-dir "$CACHE"
cp "$SCRATCH/m.onnx" "$SCRATCH/m.so"
expect_error 2 '^kiln: error: .*/m\.so: not a model library \(not a 64-bit ELF shared object\)$' \
  -- bench "$SCRATCH/m.so"
