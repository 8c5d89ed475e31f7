#!/usr/bin/env bash
# Every path Kiln takes works relative, absolute, through a symlinked directory, and holding
# spaces, commas and non-ASCII letters: the model, `--input` files, `--cache-dir` (kiln run,
# kiln compile with embedded weights, which the assembler includes from the cache), `-o` (with
# embedded and external weights), `--dump`, `--output-dir`, `--profile` and KILN_CACHE_DIR. For
# each form it runs the bundled MLP (outputs checked against numpy), compiles it into libraries,
# benchmarks them with the input file, and checks that no temporary file is left behind.
# Arguments: $1 = kiln binary, $2 = scratch directory.
set -uo pipefail
KILN="$(realpath "$1")"
SCRATCH="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODEL="$HERE/../../examples/models/mlp.onnx"
PYTHON=/usr/bin/python3  # Debian's python3 with python3-onnx and numpy
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH/work" "$SCRATCH/elsewhere"
SCRATCH="$(realpath "$SCRATCH")"
cd "$SCRATCH/work" || exit 1
ln -s ../elsewhere linked  # a relative symlink to a directory outside the working directory
unset KILN_CACHE_DIR

fail() {
  echo "FAIL ($form): $*" >&2
  exit 1
}
# kiln ARGS...: runs kiln, shows the command and its output, fails on a non-zero exit.
kiln() {
  echo "\$ kiln $*"
  "$KILN" "$@" >"$SCRATCH/out.txt" 2>&1
  local status=$?
  cat "$SCRATCH/out.txt"
  [ "$status" -eq 0 ] || fail "kiln $1 exited with $status"
}

# The forms: a directory for each, as the options name it (relative ones relative to the
# working directory).
declare -A DIRS=(
  [relative]="./rel/a/../b"
  [absolute]="$SCRATCH/work/abs"
  [symlink]="linked/sub"
  [odd]="dir with spaces, commas é ü 日本/x y"
)
for form in relative absolute symlink odd; do
  D="${DIRS[$form]}"
  echo "== $form: '$D'"
  mkdir -p "$D" && cp "$MODEL" "$D/model.onnx" || fail "cannot set up '$D'"
  "$PYTHON" -c "import numpy as np, sys
np.save(sys.argv[1], np.random.default_rng(1).uniform(-1, 1, (3, 16)).astype(np.float32))" \
    "$D/x.npy" || fail "cannot write x.npy"

  # kiln run: model, input, cache, dump and output directory all in the form.
  kiln run "$D/model.onnx" --input "x=$D/x.npy" --cache-dir "$D/cache" --dump "$D/dump" \
    --output-dir "$D/out"
  "$PYTHON" "$HERE/mlp_reference.py" "$D/model.onnx" "$D/x.npy" "$D/out/y.npy" ||
    fail "kiln run's output is wrong"
  [ -f "$D/dump/5_wrapper.cpp" ] || fail "no dump in '$D/dump'"
  [ -n "$(ls -A "$D/cache")" ] || fail "nothing in the code cache '$D/cache'"

  # kiln compile with embedded weights (the assembler includes them from the cache), the cache
  # named by KILN_CACHE_DIR, and with external weights (beside -o), the cache by --cache-dir.
  KILN_CACHE_DIR="$D/envcache" kiln compile "$D/model.onnx" -o "$D/lib/m.so" --dump "$D/cdump"
  [ -f "$D/lib/m.so" ] && [ -f "$D/cdump/5_model_api.cpp" ] || fail "no library or dump"
  [ -d "$D/envcache" ] && [ -n "$(ls -A "$D/envcache")" ] || fail "KILN_CACHE_DIR not used"
  kiln compile "$D/model.onnx" -o "$D/lib/ext.so" --weights external --cache-dir "$D/cache"
  [ -f "$D/lib/ext.weights" ] || fail "no external weights beside the library"

  # kiln bench on both libraries with the input file and a profile.
  for lib in m ext; do
    kiln bench "$D/lib/$lib.so" --input "x=$D/x.npy" --iters 2 --warmup 0 \
      --profile "$D/trace-$lib.json"
    grep -q '^input x: given float32 \[3, 16\]$' "$SCRATCH/out.txt" || fail "input not given"
    [ -s "$D/trace-$lib.json" ] || fail "no trace written"
  done

  leftovers="$(find "$D/" -name '*.tmp*' -o -name '*.XXXXXX')"
  [ -z "$leftovers" ] || fail "temporary files left: $leftovers"
done
# Nothing was written outside the scratch directory's forms (e.g. into a literal './rel' elsewhere).
[ -z "$(find "$SCRATCH" -maxdepth 1 -newer "$SCRATCH/work" ! -name work ! -name elsewhere \
  ! -name out.txt ! -path "$SCRATCH")" ] || fail "files written outside the forms' directories"
echo "all path forms passed"
