#!/usr/bin/env bash
# `kiln run --input` naming an input the model does not have, or a file that does not exist:
# exit 2, one line naming the unknown input and listing the model's inputs, or naming the file.
source "$(dirname "$0")/run_lib.sh"
run_model add_relu "$SCRATCH/m.onnx"  # x: float32[2, 3], s: float32[3]
make_array "$SCRATCH/x.npy" "np.ones((2, 3), np.float32)"
expect_error 2 '^kiln: error: ' "'?nope'?" 'no input' 'x, s' -- \
  run "$SCRATCH/m.onnx" --input "nope=$SCRATCH/x.npy" --output-dir "$SCRATCH" --cache-dir "$CACHE"
expect_error 2 '^kiln: error: ' 'missing\.npy' 'No such file' -- \
  run "$SCRATCH/m.onnx" --input "x=$SCRATCH/missing.npy" --output-dir "$SCRATCH" \
  --cache-dir "$CACHE"
expect_error 2 '^kiln: error: ' "--input" "'x'" 'NAME=VALUE' -- \
  run "$SCRATCH/m.onnx" --input "x" --output-dir "$SCRATCH" --cache-dir "$CACHE"
