#!/usr/bin/env bash
# A 20,000-node elementwise chain on a float32[2, 3] tensor compiles (cold code cache) and runs
# well within the ctest timeout of 60 s: lowering cuts the chain into bodies of a bounded size
# and the scheduler bounds the compute ops of one fused kernel (SchedulerOptions::max_fusion_ops),
# so Kiln's passes and the C++ compiler take time linear in the chain's length (an unbounded
# kernel took minutes at 4,000 nodes). The chain cycles through Neg, Abs, Add and Relu
# (make_chain.py --ops mixed); its output is compared with numpy's, which applies the same float32
# operations in order (compare.py: rtol 1e-4, atol 1e-5; the ops are exact or correctly
# rounded, so the values agree to the last bit unless the chain is cut or joined wrongly).
# Arguments: $1 = kiln binary, $2 = scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON=/usr/bin/python3  # Debian's python3 with python3-onnx and numpy, not a pyenv one
NODES=20000
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$PYTHON" "$HERE/make_chain.py" "$SCRATCH/chain.onnx" --nodes "$NODES" --shape 2,3 --ops mixed \
  --input "$SCRATCH/x.npy" --expected "$SCRATCH/y.npy" || fail "make_chain.py failed"

start=$(date +%s%N)
"$KILN" run "$SCRATCH/chain.onnx" --input "x=$SCRATCH/x.npy" --output-dir "$SCRATCH/out" \
  --cache-dir "$SCRATCH/cache" --print-kernels >"$SCRATCH/stdout" 2>"$SCRATCH/stderr"
status=$?
end=$(date +%s%N)
cat "$SCRATCH/stdout"
cat "$SCRATCH/stderr"
[ "$status" -eq 0 ] || fail "kiln run exited $status"
echo "kiln run took $(((end - start) / 1000000)) ms for $NODES nodes"
grep -q "built" "$SCRATCH/stdout" || fail "expected a cold compile (a fresh code cache)"
"$PYTHON" "$HERE/../models/compare.py" "$SCRATCH/y.npy" "$SCRATCH/out/y.npy" ||
  fail "the chain's output differs from numpy"

# The chain is cut into many kernel calls, each holding a bounded stretch of it (the stretches
# repeat, so few distinct kernels are compiled: --print-kernels gives each one's call count).
calls=$(awk '/^kernels \(/ { on = 1; next } on && /^  / { n += ($2 == "(called") ? $3 : 1; next }
             { on = 0 } END { print n + 0 }' "$SCRATCH/stdout")
[ "$calls" -ge $((NODES / 512)) ] || fail "$calls kernel calls for $NODES nodes: the chain was not cut"
echo "$calls kernel calls"
echo ok
