#!/bin/bash
# A model with 2.5 GiB of external weights, end to end: make_model.py writes it (five float32
# 11585 x 11585 MatMul/Gemm weights in two external files, one of them at an offset past 2^32),
# then `kiln compile --weights external` and `kiln run` on the library, each under
# /usr/bin/time -v. The output is checked against numpy's, and each step's peak resident memory
# is printed with its ratio to the weights' bytes; the script fails when a ratio is above 1.3.
#
# Outside `make test`: it needs about 2.5 GiB of disk for the model, 5 GiB for the weights file
# (the library holds the weights prepacked for each of its two ISA variants) and, while
# compiling, up to 5 GiB of prepacked weights in unlinked temporary files of the code cache.
# It takes a few minutes.
#
# Usage: tests/bigmodel/run.sh [KILN] [WORKDIR]
#   KILN     the kiln binary (default: build/bin/kiln)
#   WORKDIR  scratch directory, removed afterwards (default: a new one under ${TMPDIR:-/tmp})
# Environment: BIGMODEL_WIDTH and BIGMODEL_LAYERS change the model's size (a quick try:
# BIGMODEL_WIDTH=2048); BIGMODEL_KEEP=1 keeps WORKDIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
kiln=$(realpath "${1:-$here/../../build/bin/kiln}")
work=${2:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-bigmodel-XXXXXX")}
width=${BIGMODEL_WIDTH:-11585}
layers=${BIGMODEL_LAYERS:-5}
max_ratio=1.3
python=/usr/bin/python3

mkdir -p "$work"
cleanup() { [ "${BIGMODEL_KEEP:-0}" = 1 ] || rm -rf "$work"; }
trap cleanup EXIT
cd "$work"
# A code cache of its own: a cold compile, and its temporary files deleted with it.
export KILN_CACHE_DIR="$work/cache"

echo "== writing the model (width $width, $layers layers) in $work"
"$python" "$here/make_model.py" . --width "$width" --layers "$layers" | tee make.log
weights=$(awk '/^weights_bytes/ {print $2}' make.log)
output=$(awk '/^output/ {print $2}' make.log)
ls -ls big.onnx big_a.bin big_b.bin

# Runs a command under /usr/bin/time -v (its report in STEP.time) and records its peak resident
# memory in bytes ("Maximum resident set size (kbytes)") and its wall time.
declare -A peaks walls
measure() {
  local step=$1
  shift
  /usr/bin/time -v -o "$step.time" "$@"
  peaks[$step]=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 * 1024}' "$step.time")
  walls[$step]=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$step.time")
}

echo "== kiln compile big.onnx --weights external -o big.so"
measure compile "$kiln" compile big.onnx --weights external -o big.so
ls -ls big.so big.weights

echo "== kiln run big.so --input x=x.npy"
measure run "$kiln" run big.so --input x=x.npy --output-dir out

echo "== checking the output against numpy"
"$python" - "out/$output.npy" expected.npy <<'EOF'
import sys
import numpy as np
got, want = np.load(sys.argv[1]), np.load(sys.argv[2])
# float32 accumulation over 11585-long dot products against numpy's float64 reference.
scale = np.abs(want).max()
err = np.abs(got - want).max() / scale
print(f"output {got.shape}: max |kiln - numpy| / max |numpy| = {err:.2e} (tolerance 1e-4)")
sys.exit(0 if got.shape == want.shape and err <= 1e-4 else 1)
EOF

echo "== peak resident memory (/usr/bin/time -v), weights $weights bytes ($(awk -v w="$weights" 'BEGIN {printf "%.0f", w / 1048576}') MiB)"
status=0
for step in compile run; do
  ratio=$(awk -v p="${peaks[$step]}" -v w="$weights" 'BEGIN {printf "%.3f", p / w}')
  verdict=ok
  if awk -v r="$ratio" -v m="$max_ratio" 'BEGIN {exit !(r > m)}'; then
    verdict="FAIL (above $max_ratio)"
    status=1
  fi
  printf '%-8s peak RSS %6.0f MiB = %s x the weights (wall %s): %s\n' "$step" \
    "$(awk -v p="${peaks[$step]}" 'BEGIN {print p / 1048576}')" "$ratio" "${walls[$step]}" \
    "$verdict"
done
exit $status
