#!/usr/bin/env bash
# `kiln run` with an input of the wrong dtype: exit 2, one line naming the input and the expected
# and actual dtypes.
source "$(dirname "$0")/run_lib.sh"
run_model add_relu "$SCRATCH/m.onnx"  # x: float32[2, 3], s: float32[3]
make_array "$SCRATCH/x.npy" "np.ones((2, 3), np.float32)"
make_array "$SCRATCH/x_f64.npy" "np.ones((2, 3), np.float64)"
make_array "$SCRATCH/s.npy" "np.ones(3, np.float32)"
make_array "$SCRATCH/s_i64.npy" "np.ones(3, np.int64)"
expect_error 2 '^kiln: error: ' "input 'x'" 'expected dtype float32' 'got float64' -- \
  run "$SCRATCH/m.onnx" --input "x=$SCRATCH/x_f64.npy" --input "s=$SCRATCH/s.npy" \
  --output-dir "$SCRATCH" --cache-dir "$CACHE"
expect_error 2 '^kiln: error: ' "input 's'" 'expected dtype float32' 'got int64' -- \
  run "$SCRATCH/m.onnx" --input "x=$SCRATCH/x.npy" --input "s=$SCRATCH/s_i64.npy" \
  --output-dir "$SCRATCH" --cache-dir "$CACHE"
[ ! -e "$SCRATCH/y.npy" ] || fail "a failed run wrote an output"
