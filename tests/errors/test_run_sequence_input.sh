#!/usr/bin/env bash
# A sequence input fixes its length when compiling: `kiln run` without its value exits 2 with one
# line naming the input and asking for the value; with a SequenceProto file it runs and writes
# one file per element.
source "$(dirname "$0")/lib.sh"
CASE=/usr/share/libonnx-testdata/data/node/test_sequence_insert_at_back
expect_error 2 '^kiln: error: ' "input 'sequence'" 'seq\(int64' 'give its value' -- \
  run "$CASE/model.onnx" --output-dir "$SCRATCH" --cache-dir "$SCRATCH/cache"
"$KILN" run "$CASE/model.onnx" --input "sequence=$CASE/test_data_set_0/input_0.pb" \
  --input "tensor=$CASE/test_data_set_0/input_1.pb" --output-dir "$SCRATCH/out" \
  --cache-dir "$SCRATCH/cache" || fail "kiln run with a sequence input failed"
[ -f "$SCRATCH/out/output_sequence[3].npy" ] || fail "expected four output elements"
echo ok
