#!/usr/bin/env bash
# `kiln run` with an input of the wrong shape: exit 2, one line naming the input and the expected
# and actual shapes. A correct run first shows the model itself works.
source "$(dirname "$0")/run_lib.sh"
run_model add_relu "$SCRATCH/m.onnx"  # x: float32[2, 3], s: float32[3]
make_array "$SCRATCH/x.npy" "np.arange(6, dtype=np.float32).reshape(2, 3) - 3"
make_array "$SCRATCH/s.npy" "np.array([1, -1, 0.5], np.float32)"
make_array "$SCRATCH/x32.npy" "np.zeros((3, 2), np.float32)"
make_array "$SCRATCH/s23.npy" "np.zeros((2, 3), np.float32)"
"$KILN" run "$SCRATCH/m.onnx" --input "x=$SCRATCH/x.npy" --input "s=$SCRATCH/s.npy" \
  --output-dir "$SCRATCH" --cache-dir "$CACHE" || fail "a correct run failed"
expect_array "$SCRATCH/y.npy" "np.array([[0, 0, 0], [1, 0, 2.5]], np.float32)"  # Relu(x + s)
expect_error 2 '^kiln: error: ' "input 'x'" 'expected shape \[2, 3\]' 'got \[3, 2\]' -- \
  run "$SCRATCH/m.onnx" --input "x=$SCRATCH/x32.npy" --input "s=$SCRATCH/s.npy" \
  --output-dir "$SCRATCH" --cache-dir "$CACHE"
# A rank mismatch on the second input.
expect_error 2 '^kiln: error: ' "input 's'" 'expected shape \[3\]' 'got \[2, 3\]' -- \
  run "$SCRATCH/m.onnx" --input "x=$SCRATCH/x.npy" --input "s=$SCRATCH/s23.npy" \
  --output-dir "$SCRATCH" --cache-dir "$CACHE"
