#!/usr/bin/env bash
# `kiln bench --input NAME=FILE`: the given value is used in every run (a Reshape whose target
# shape is an input runs with the given one, fails with a random one), the file's shape binds the input's symbolic dims
# for the random inputs (of a model and of a library built by kiln compile), and misuse is a
# clean error (exit 2, one line): an unknown input, --shape for a given input, a wrong rank, a
# missing file.
# Arguments: $1 = kiln binary, $2 = scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
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
bench() {  # bench ARGS...: kiln bench, output in $SCRATCH/out.txt, must succeed
  echo "\$ kiln bench $*"
  "$KILN" bench "$@" >"$SCRATCH/out.txt" 2>&1
  local status=$?
  cat "$SCRATCH/out.txt"
  [ "$status" -eq 0 ] || fail "kiln bench exited with $status"
}
expect_error() {  # expect_error PATTERN ARGS...: kiln bench fails with exit 2, one line matching
  local pattern="$1"
  shift
  echo "\$ kiln bench $*"
  "$KILN" bench "$@" >"$SCRATCH/stdout" 2>"$SCRATCH/stderr"
  local status=$?
  cat "$SCRATCH/stderr"
  [ "$status" -eq 2 ] || fail "expected exit status 2, got $status"
  [ "$(wc -l <"$SCRATCH/stderr")" -eq 1 ] || fail "expected one line on stderr"
  grep -qE -- "$pattern" "$SCRATCH/stderr" || fail "stderr does not match '$pattern'"
}

"$PYTHON" - "$SCRATCH" <<'PY' || fail "cannot build the models"
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper
out = sys.argv[1]
def save(name, nodes, inputs, outputs):
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, f"{out}/{name}.onnx")
f = TensorProto.FLOAT
# y = Reshape(x, shape): only a shape of 6 elements is valid.
save("reshape", [helper.make_node("Reshape", ["x", "shape"], ["y"])],
     [helper.make_tensor_value_info("x", f, [6]),
      helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
     [helper.make_tensor_value_info("y", f, ["r0", "r1"])])
# c = a + b with a symbolic n shared by both inputs.
save("add", [helper.make_node("Add", ["a", "b"], ["c"])],
     [helper.make_tensor_value_info("a", f, ["n", 4]),
      helper.make_tensor_value_info("b", f, ["n", 1])],
     [helper.make_tensor_value_info("c", f, ["n", 4])])
np.save(f"{out}/shape.npy", np.array([3, 2], np.int64))
np.save(f"{out}/a.npy", np.ones((5, 4), np.float32))
np.save(f"{out}/a3.npy", np.ones((5, 4, 1), np.float32))
PY

# The value is used: the Reshape runs with the given target shape.
bench "$SCRATCH/reshape.onnx" --input "shape=$SCRATCH/shape.npy" --iters 3 --warmup 1 \
  --cache-dir "$CACHE"
expect_line "$SCRATCH/out.txt" "^input shape: given int64 \[2\]$"
expect_line "$SCRATCH/out.txt" "^input x: seeded random float32 \[6\]$"
bench "$SCRATCH/reshape.onnx" --input "shape=$SCRATCH/shape.npy" --iters 3 --json \
  --cache-dir "$CACHE"
expect_line "$SCRATCH/out.txt" '"p50_ms":'

# The file's shape binds n for the random input b, for the model and for its library.
bench "$SCRATCH/add.onnx" --input "a=$SCRATCH/a.npy" --iters 3 --warmup 1 --cache-dir "$CACHE"
expect_line "$SCRATCH/out.txt" "^input a: given float32 \[5, 4\]$"
expect_line "$SCRATCH/out.txt" "^input b: seeded random float32 \[5, 1\]$"
"$KILN" compile "$SCRATCH/add.onnx" -o "$SCRATCH/add.so" --cache-dir "$CACHE" >/dev/null ||
  fail "kiln compile failed"
bench "$SCRATCH/add.so" --input "a=$SCRATCH/a.npy" --iters 3 --warmup 1
expect_line "$SCRATCH/out.txt" "^input a: given float32 \[5, 4\]$"
expect_line "$SCRATCH/out.txt" "^input b: seeded random float32 \[5, 1\]$"

# Misuse. Without the input, the seeded random target shape cannot hold x's 6 elements.
expect_error "Reshape.*input 'shape'" "$SCRATCH/reshape.onnx" --iters 1 --cache-dir "$CACHE"
expect_error "--input nope.*no input of that name.*a, b" "$SCRATCH/add.onnx" \
  --input "nope=$SCRATCH/a.npy" --cache-dir "$CACHE"
expect_error "--shape a=5x4: input 'a' is given by --input a" "$SCRATCH/add.so" \
  --input "a=$SCRATCH/a.npy" --shape a=5x4
expect_error "--input a .*input 'a' is float32\[n, 4\] of rank 2, the file holds rank 3" \
  "$SCRATCH/add.so" --input "a=$SCRATCH/a3.npy"
expect_error "missing\.npy" "$SCRATCH/add.so" --input "a=$SCRATCH/missing.npy"
echo "bench --input passed"
