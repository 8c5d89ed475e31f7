#!/usr/bin/env bash
# Ifs whose branches give outputs of different ranks or dtypes, through `kiln run` and
# `kiln info` (make_if_type_models.py writes the models and numpy's outputs): each model is
# compiled once into a fresh code cache and run with a sample rate taking either branch
# (the second run must come from the code cache: both branches were compiled ahead of time);
# compare.py checks each output's dtype, shape and values (float32: rtol 1e-4, atol 1e-5;
# integers exactly). A Loop body output whose rank the If decides, and a model with more such
# Ifs than Kiln specializes, fail with errors naming the nodes.
# Arguments: $1 = kiln binary, $2 = scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON=/usr/bin/python3
CACHE="$SCRATCH/cache"
M="$SCRATCH/models"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$PYTHON" "$HERE/make_if_type_models.py" "$M" || fail "make_if_type_models.py failed"

# run_case MODEL TAG OUTPUTS [NAME=FILE ...]: runs MODEL with x and the given inputs, compares
# each of OUTPUTS (space-separated) with <output>_<TAG>.npy.
run_case() {
  local model="$1" tag="$2" outputs="$3"
  shift 3
  local out="$SCRATCH/out/${model}_$tag"
  local args=(--input "x=$M/$model/x.npy")
  for given in "$@"; do args+=(--input "$given"); done
  mkdir -p "$out"
  echo "== $model $tag"
  "$KILN" run "$M/$model/model.onnx" "${args[@]}" --output-dir "$out" --cache-dir "$CACHE" \
    >"$out/stdout" 2>"$out/stderr"
  local status=$?
  cat "$out/stdout" "$out/stderr"
  [ "$status" -eq 0 ] || fail "$model $tag: kiln run exited $status"
  for name in $outputs; do
    "$PYTHON" "$HERE/../models/compare.py" "$M/$model/${name}_$tag.npy" "$out/$name.npy" ||
      fail "$model $tag: output $name differs from numpy"
  done
}

for model in rank loop dtype; do
  case "$model" in
    rank) outputs="y s" ;;
    loop) outputs="y" ;;
    dtype) outputs="y z" ;;
  esac
  run_case "$model" hi "$outputs" "sr=$M/$model/sr_hi.npy"
  run_case "$model" lo "$outputs" "sr=$M/$model/sr_lo.npy"
  grep -q "from the code cache" "$SCRATCH/out/${model}_lo/stdout" ||
    fail "$model: the second condition should reuse the library compiled for the first"
done
for tag1 in hi lo; do
  for tag2 in pos neg; do
    run_case chain "${tag1}_$tag2" "y s" "sr=$M/chain/sr_$tag1.npy" "sr2=$M/chain/sr2_$tag2.npy"
  done
done

# kiln info: an output whose rank (or dtype) is known only after a run says so.
"$KILN" info "$M/rank/model.onnx" >"$SCRATCH/info_rank.txt" || fail "kiln info rank failed"
cat "$SCRATCH/info_rank.txt"
grep -Eq '^  y +float32\[2, 3\] or float32\[2, 3, 1\] \(known after a run\)$' \
  "$SCRATCH/info_rank.txt" || fail "kiln info: y should be float32[2, 3] or float32[2, 3, 1]"
grep -Eq '^  s +float32\[\]$' "$SCRATCH/info_rank.txt" || fail "kiln info: s should be float32[]"
"$KILN" info "$M/dtype/model.onnx" >"$SCRATCH/info_dtype.txt" || fail "kiln info dtype failed"
cat "$SCRATCH/info_dtype.txt"
grep -Eq '^  y +int32\[2, 3\] or float32\[2, 3\] \(known after a run\)$' \
  "$SCRATCH/info_dtype.txt" || fail "kiln info: y should be int32[2, 3] or float32[2, 3]"

# A Loop body output whose rank the If decides: a user error (exit 2) naming the Loop.
"$KILN" run "$M/loop_bad/model.onnx" --input "x=$M/loop_bad/x.npy" \
  --input "sr=$M/loop_bad/sr_hi.npy" --output-dir "$SCRATCH/out" --cache-dir "$CACHE" \
  >"$SCRATCH/loop_bad.out" 2>"$SCRATCH/loop_bad.err"
status=$?
cat "$SCRATCH/loop_bad.err"
[ "$status" -eq 2 ] || fail "loop_bad: expected exit 2, got $status"
grep -q "node 'loop' (Loop): body output 1 ('acc_out') has a rank or dtype known only at run time" \
  "$SCRATCH/loop_bad.err" || fail "loop_bad: the error should name the Loop and its output"

# Five chained Ifs of this kind: more than Kiln specializes, a user error (exit 2) naming them.
"$KILN" run "$M/limit/model.onnx" --input "sr=$M/limit/sr_hi.npy" --output-dir "$SCRATCH/out" \
  --cache-dir "$CACHE" >"$SCRATCH/limit.out" 2>"$SCRATCH/limit.err"
status=$?
cat "$SCRATCH/limit.err"
[ "$status" -eq 2 ] || fail "limit: expected exit 2, got $status"
for k in 1 2 3 4 5; do
  grep -q "node 'if$k' (If)" "$SCRATCH/limit.err" || fail "limit: the error should name if$k"
done
grep -q "at most 4 Ifs" "$SCRATCH/limit.err" || fail "limit: the error should state the limit"
echo "PASS"
