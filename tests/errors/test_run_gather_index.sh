#!/usr/bin/env bash
# A Gather whose indices are a model input, given an index out of range of its axis of 5: exit 2,
# one line naming the Gather node, the index and the axis size. Covers small index inputs (which
# `kiln run` specializes at compile time) and larger ones (checked only at run time), too-large
# and too-negative indices, and a valid run with a negative index.
source "$(dirname "$0")/run_lib.sh"
run_model gather "$SCRATCH/m.onnx"  # y = Gather(data float32[5, 3], idx int64[n], axis=0)
make_array "$SCRATCH/small.npy" "np.array([1, 7], np.int64)"
make_array "$SCRATCH/large.npy" "np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 7, 1], np.int64)"
make_array "$SCRATCH/negative.npy" "np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4, -6, 1], np.int64)"
make_array "$SCRATCH/valid.npy" "np.array([4, 0, 1, 2, 3, 4, 0, 1, 2, 3, -5, -1], np.int64)"
for case in small large; do
  expect_error 2 '^kiln: error: ' "node 'gather_rows' \(Gather\)" 'index 7' 'size 5' -- \
    run "$SCRATCH/m.onnx" --input "idx=$SCRATCH/$case.npy" --output-dir "$SCRATCH" \
    --cache-dir "$CACHE"
done
expect_error 2 '^kiln: error: ' "node 'gather_rows' \(Gather\)" 'index -6' 'size 5' -- \
  run "$SCRATCH/m.onnx" --input "idx=$SCRATCH/negative.npy" --output-dir "$SCRATCH" \
  --cache-dir "$CACHE"
[ ! -e "$SCRATCH/y.npy" ] || fail "a failed run wrote an output"
"$KILN" run "$SCRATCH/m.onnx" --input "idx=$SCRATCH/valid.npy" --output-dir "$SCRATCH" \
  --cache-dir "$CACHE" || fail "a run with valid indices failed"
expect_array "$SCRATCH/y.npy" \
  "np.arange(15, dtype=np.float32).reshape(5, 3)[[4, 0, 1, 2, 3, 4, 0, 1, 2, 3, -5, -1]]"
# No indices at all (n = 0): an empty result, not an error.
make_array "$SCRATCH/empty.npy" "np.zeros(0, np.int64)"
"$KILN" run "$SCRATCH/m.onnx" --input "idx=$SCRATCH/empty.npy" --output-dir "$SCRATCH" \
  --cache-dir "$CACHE" || fail "a run with no indices failed"
expect_array "$SCRATCH/y.npy" "np.zeros((0, 3), np.float32)"
