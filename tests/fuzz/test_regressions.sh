#!/usr/bin/env bash
# The fuzzers' findings (tests/fuzz/regressions/<target>/), each run through the `kiln` command a
# user would run on such a file: each must end in a clean user error (exit 2, one line on stderr
# naming the file) rather than a crash, a hang or an internal error.
#   onnx_import/*.onnx        kiln info FILE
#   npy/*.npy                 kiln run mlp.onnx --input x=FILE
#   tensor_pb/*.pb            kiln run with FILE as a tensor, a sequence and an optional input
#   external_data/*/          kiln info DIR/model.onnx (its initializer's data in DIR/data.bin)
#   weights_file/*.weights    kiln bench on a library compiled with --weights external, FILE as
#                             its weights file
# Arguments: the kiln binary, a scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
HERE="$(cd "$(dirname "$0")" && pwd)"
REGRESSIONS="$HERE/regressions"
MLP="$HERE/../../examples/models/mlp.onnx"
NODE=/usr/share/libonnx-testdata/data/node
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
CACHE="$SCRATCH/cache"
checked=0

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# expect_clean_error FILE ARGS...: kiln ARGS exits 2 with one line on stderr, within 60 s.
expect_clean_error() {
  local file="$1"
  shift
  timeout 60 "$KILN" "$@" >"$SCRATCH/stdout" 2>"$SCRATCH/stderr"
  local got=$?
  echo "kiln $*  -> exit $got: $(head -c 300 "$SCRATCH/stderr")"
  [ "$got" -eq 2 ] || fail "$file: expected exit status 2, got $got"
  [ "$(wc -l <"$SCRATCH/stderr")" -eq 1 ] || fail "$file: expected one line on stderr"
  grep -q '^kiln: error: ' "$SCRATCH/stderr" || fail "$file: not a kiln user error"
  checked=$((checked + 1))
}

for f in "$REGRESSIONS"/onnx_import/*.onnx; do
  [ -e "$f" ] || continue
  expect_clean_error "$f" info "$f"
done

for f in "$REGRESSIONS"/npy/*.npy; do
  [ -e "$f" ] || continue
  expect_clean_error "$f" run "$MLP" --input "x=$f" --cache-dir "$CACHE" --output-dir "$SCRATCH"
done

for f in "$REGRESSIONS"/tensor_pb/*.pb; do
  [ -e "$f" ] || continue
  expect_clean_error "$f" run "$MLP" --input "x=$f" --cache-dir "$CACHE" --output-dir "$SCRATCH"
  expect_clean_error "$f" run "$NODE/test_sequence_insert_at_back/model.onnx" \
    --input "sequence=$f" --input "tensor=$NODE/test_sequence_insert_at_back/test_data_set_0/input_1.pb" \
    --cache-dir "$CACHE" --output-dir "$SCRATCH"
  expect_clean_error "$f" run "$NODE/test_optional_get_element_sequence/model.onnx" \
    --input "optional_input=$f" --cache-dir "$CACHE" --output-dir "$SCRATCH"
done

for d in "$REGRESSIONS"/external_data/*/; do
  [ -e "$d/model.onnx" ] || continue
  expect_clean_error "$d" info "$d/model.onnx"
done

weights=("$REGRESSIONS"/weights_file/*.weights)
if [ -e "${weights[0]}" ]; then
  "$KILN" compile "$MLP" -o "$SCRATCH/mlp.so" --weights external --cache-dir "$CACHE" \
    >/dev/null || fail "kiln compile --weights external failed"
  for f in "${weights[@]}"; do
    cp "$f" "$SCRATCH/mlp.weights"
    expect_clean_error "$f" bench "$SCRATCH/mlp.so" --iters 1 --warmup 0
  done
fi

[ "$checked" -gt 0 ] || fail "no regression inputs found under $REGRESSIONS"
echo "ok: $checked regression runs ended in a clean error"
