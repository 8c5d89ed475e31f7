#!/usr/bin/env bash
# `kiln bench --profile` on a library built by `kiln compile` and on the ONNX model itself: the
# trace loads as JSON (Trace Event Format) and holds one complete event per kernel or library
# call of one run: as many as the calls the generated wrapper times (KILN_TIMED lines; the bundled
# MLP has no control flow, so each runs once), with their names.
# Arguments: $1 = kiln binary, $2 = scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODEL="$HERE/../../examples/models/mlp.onnx"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
CACHE="$SCRATCH/cache"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$KILN" compile "$MODEL" -o "$SCRATCH/mlp.so" --dump "$SCRATCH/dump" --cache-dir "$CACHE" \
  --autotune off >"$SCRATCH/compile.txt" || fail "kiln compile failed"
CALLS=$(grep -c 'KILN_TIMED("' "$SCRATCH/dump/5_wrapper.cpp")
[ "$CALLS" -ge 4 ] || fail "expected at least 4 timed calls in the wrapper, found $CALLS"

check_trace() {  # check_trace TRACE: one event per timed call, each a complete event
  /usr/bin/python3 - "$1" "$SCRATCH/dump/5_wrapper.cpp" "$CALLS" <<'PY' || fail "bad trace $1"
import json, re, sys
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"]
timed = re.findall(r'KILN_TIMED\("((?:[^"\\]|\\.)*)", "(kernel|call)"\)', open(sys.argv[2]).read())
assert len(events) == int(sys.argv[3]) == len(timed), (len(events), sys.argv[3], len(timed))
assert sorted(e["name"] for e in events) == sorted(n for n, _ in timed), (events, timed)
for e in events:
    assert e["ph"] == "X" and e["cat"] in ("kernel", "call"), e
    assert e["dur"] >= 0 and e["ts"] >= 0 and e["pid"] == 1, e
starts = [e["ts"] for e in events]
assert starts == sorted(starts), "events in call order"
print(f"{sys.argv[1]}: {len(events)} events")
PY
}

cp "$SCRATCH/mlp.so" "$SCRATCH/copy.so"
"$KILN" bench "$SCRATCH/copy.so" --iters 3 --warmup 1 --shape x=2x16 \
  --profile "$SCRATCH/so.json" >"$SCRATCH/so.txt" || fail "kiln bench of the library failed"
cat "$SCRATCH/so.txt"
grep -qE "^profile: one run, $CALLS events \([0-9]+ kernel calls, [0-9]+ library calls\)" \
  "$SCRATCH/so.txt" || fail "no profile line"
check_trace "$SCRATCH/so.json"

"$KILN" bench "$MODEL" --iters 3 --warmup 1 --cache-dir "$CACHE" --profile "$SCRATCH/onnx.json" \
  >"$SCRATCH/onnx.txt" || fail "kiln bench of the model failed"
check_trace "$SCRATCH/onnx.json"
echo "ok"
