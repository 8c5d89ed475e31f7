#!/usr/bin/env bash
# `kiln bench` on the bundled MLP (x: float32[batch, 16]): the text report names the threads, the
# compile (built, then from the code cache), the inputs with the --shape given, and prints every
# latency percentile and the throughput; --json prints one object holding every field, with
# min <= p50 <= p90 <= p99 and samples/s = runs/s x batch; --wait-ms sleeps before each run
# (the JSON says how long; 7 runs with a 40 ms wait take at least 0.28 s) and rejects a negative wait;
# --against times a second model in alternation and prints both and their per-round ratios.
# Arguments: $1 = kiln binary, $2 = scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MODEL="$HERE/../../examples/models/mlp.onnx"
PYTHON=/usr/bin/python3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
CACHE="$SCRATCH/cache"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
expect_line() {  # expect_line FILE PATTERN: some line of FILE matches PATTERN (grep -E)
  grep -qE -- "$2" "$1" || fail "no line of $1 matches '$2'"
}

"$KILN" bench "$MODEL" --iters 5 --warmup 2 --threads 2 --shape x=8x16 --cache-dir "$CACHE" \
  >"$SCRATCH/text.txt" || fail "kiln bench failed"
cat "$SCRATCH/text.txt"
NUM='[0-9]+\.[0-9]{3}'
expect_line "$SCRATCH/text.txt" "^kiln bench .*mlp\.onnx: 2 OpenMP threads$"
expect_line "$SCRATCH/text.txt" \
  "^compiled: [0-9]+ kernels, [0-9]+ library calls, built \([0-9]+\.[0-9]{2} s\)$"
expect_line "$SCRATCH/text.txt" "^input x: seeded random float32 \[8, 16\]$"
expect_line "$SCRATCH/text.txt" "^2 warm-up runs, 5 timed runs$"
expect_line "$SCRATCH/text.txt" \
  "^latency: min $NUM ms, p50 $NUM ms, p90 $NUM ms, p99 $NUM ms, mean $NUM ms$"
expect_line "$SCRATCH/text.txt" \
  "^throughput: [0-9.]+ runs/s, [0-9.]+ samples/s \(batch 8: the leading dim of input 'x'\)$"

# The same compile again: a code-cache hit. Symbolic dims not given are 1.
"$KILN" bench "$MODEL" --iters 5 --threads 2 --json --cache-dir "$CACHE" >"$SCRATCH/out.json" ||
  fail "kiln bench --json failed"
cat "$SCRATCH/out.json"
"$PYTHON" - "$SCRATCH/out.json" <<'PY' || fail "the --json output is not the expected object"
import json, sys
text = open(sys.argv[1]).read()
assert text.count("\n") == 1, "expected one line"
j = json.loads(text)
for key in ["model", "threads", "iters", "warmup", "compile_s", "cache_hit", "min_ms", "p50_ms",
            "p90_ms", "p99_ms", "mean_ms", "throughput_per_s", "batch", "samples_per_s"]:
    assert key in j, f"missing {key}"
assert j["model"].endswith("mlp.onnx"), j["model"]
assert j["threads"] == 2 and j["iters"] == 5 and j["warmup"] == 10 and j["batch"] == 1, j
assert j["cache_hit"] is True, "the second compile should come from the code cache"
assert 0 <= j["compile_s"] < 600
assert 0 < j["min_ms"] <= j["p50_ms"] <= j["p90_ms"] <= j["p99_ms"], j
assert j["min_ms"] <= j["mean_ms"] <= j["p99_ms"], j
assert abs(j["throughput_per_s"] * j["mean_ms"] - 1000) < 1e-6 * 1000, j
assert abs(j["samples_per_s"] - j["throughput_per_s"] * j["batch"]) < 1e-9 * j["samples_per_s"]
assert j["wait_ms"] == 0, j
print("json ok")
PY

# Paced runs (bench/load's server-like mode): a sleep before each warm-up and timed run, untimed.
start=$(date +%s.%N)
"$KILN" bench "$MODEL" --iters 5 --warmup 2 --threads 2 --wait-ms 40 --json --cache-dir "$CACHE" \
  >"$SCRATCH/wait.json" || fail "kiln bench --wait-ms failed"
end=$(date +%s.%N)
cat "$SCRATCH/wait.json"
"$PYTHON" - "$SCRATCH/wait.json" "$start" "$end" <<'PY' || fail "--wait-ms: unexpected output"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["wait_ms"] == 40 and j["iters"] == 5, j
# Each of the 7 runs sleeps 40 ms first; the waits are not in the figures (an MLP run takes far
# less than 40 ms, so a timed wait would make min_ms at least 40).
assert float(sys.argv[3]) - float(sys.argv[2]) >= 7 * 0.040, "the waits did not happen"
assert j["min_ms"] < 40, j
print("wait ok")
PY
"$KILN" bench "$MODEL" --iters 1 --wait-ms -1 --cache-dir "$CACHE" >"$SCRATCH/neg.txt" 2>&1 &&
  fail "--wait-ms -1 was accepted"
expect_line "$SCRATCH/neg.txt" "wait-ms"

# --against: the MLP against itself, alternating in one process. Text: both latencies and the
# per-round ratios; JSON: the second model's figures and ordered quartiles of the ratios. A model
# with other inputs is refused (exit 2), as is --profile with it.
"$KILN" bench "$MODEL" --against "$MODEL" --iters 9 --warmup 2 --threads 2 --cache-dir "$CACHE" \
  >"$SCRATCH/against.txt" || fail "kiln bench --against failed"
cat "$SCRATCH/against.txt"
expect_line "$SCRATCH/against.txt" \
  "^against .*mlp\.onnx: compiled: [0-9]+ kernels, [0-9]+ library calls, from the code cache \("
expect_line "$SCRATCH/against.txt" \
  "^2 warm-up rounds, 9 timed rounds, each running both models \(in turn first\), each run after a 1 ms pause$"
expect_line "$SCRATCH/against.txt" \
  "^latency: min $NUM ms, p50 $NUM ms, p90 $NUM ms, p99 $NUM ms, mean $NUM ms$"
expect_line "$SCRATCH/against.txt" \
  "^against: min $NUM ms, p50 $NUM ms, p90 $NUM ms, p99 $NUM ms, mean $NUM ms$"
expect_line "$SCRATCH/against.txt" \
  "^against / model, per round: median $NUM \(quartiles $NUM - $NUM\); ratio of p50s $NUM$"
"$KILN" bench "$MODEL" --against "$MODEL" --iters 9 --warmup 0 --threads 2 --wait-ms 3 --json \
  --cache-dir "$CACHE" >"$SCRATCH/against.json" || fail "kiln bench --against --json failed"
cat "$SCRATCH/against.json"
"$PYTHON" - "$SCRATCH/against.json" <<'PY' || fail "--against --json: unexpected output"
import json, sys
j = json.load(open(sys.argv[1]))
a = j["against"]
assert a["model"].endswith("mlp.onnx") and a["pause_ms"] == 3, a
assert 0 < a["min_ms"] <= a["p50_ms"] <= a["p90_ms"] <= a["p99_ms"], a
assert 0 < a["ratio_p25"] <= a["ratio_p50"] <= a["ratio_p75"], a
# Both models time the same MLP: their medians cannot be orders of magnitude apart.
assert 0.01 < a["ratio_p50"] < 100, a
print("against ok")
PY
"$PYTHON" - "$SCRATCH/other.onnx" <<'PY' || fail "could not write other.onnx"
import sys
from onnx import TensorProto, helper, save
graph = helper.make_graph([helper.make_node("Relu", ["y"], ["z"])], "other",
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])])
save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY
"$KILN" bench "$MODEL" --against "$SCRATCH/other.onnx" --iters 1 --cache-dir "$CACHE" \
  >"$SCRATCH/other.txt" 2>&1
[ $? -eq 2 ] || fail "--against a model with other inputs did not exit 2"
expect_line "$SCRATCH/other.txt" \
  "--against .*other\.onnx: its inputs \(y float32\[4\]\) are not those of .*mlp\.onnx \(x float32\[batch, 16\]\)"
"$KILN" bench "$MODEL" --against "$MODEL" --profile "$SCRATCH/p.json" --cache-dir "$CACHE" \
  >"$SCRATCH/profile.txt" 2>&1 && fail "--against with --profile was accepted"
expect_line "$SCRATCH/profile.txt" "--profile profiles one model"
echo "ok"
