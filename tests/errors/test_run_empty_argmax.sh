#!/usr/bin/env bash
# A batch of 0 where the model cannot take it: ArgMax over the batch axis has no answer when the
# axis is empty (numpy raises, ONNX defines none), so `kiln run` should exit 2 naming the node
# rather than return an index. Models that can take an empty batch are run in
# tests/models/test_models.sh (the MLP at batch 0) and test_run_gather_index.sh (no indices).
source "$(dirname "$0")/run_lib.sh"
run_model argmax "$SCRATCH/m.onnx"  # y = ArgMax(x float32[batch, 4], axis=0, keepdims=0)
make_array "$SCRATCH/x.npy" "np.array([[0, 5, 1, 2], [3, 1, 1, 7], [1, 2, 9, 0]], np.float32)"
make_array "$SCRATCH/x0.npy" "np.zeros((0, 4), np.float32)"
"$KILN" run "$SCRATCH/m.onnx" --input "x=$SCRATCH/x.npy" --output-dir "$SCRATCH" \
  --cache-dir "$CACHE" || fail "a run at batch 3 failed"
expect_array "$SCRATCH/y.npy" "np.array([1, 0, 2, 1], np.int64)"
rm -f "$SCRATCH/y.npy"
expect_error 2 '^kiln: error: ' "node 'argmax_batch' \(ArgMax\)" 'empty|size 0|zero' -- \
  run "$SCRATCH/m.onnx" --input "x=$SCRATCH/x0.npy" --output-dir "$SCRATCH" --cache-dir "$CACHE"
