#!/usr/bin/env bash
# `kiln run --autotune max` on a model with a MatMul -> Add -> Relu (a constant weight) and a
# Conv (3x3, stride 2, constant weight and bias) -> Relu: the first compile benchmarks the GEMM
# and the convolution choices and prints an AUTOTUNE table for each; a second compile with the
# same caches benchmarks nothing (its choice comes from the autotune cache); `--autotune off`
# prints no table. Every run's output matches numpy (rtol 1e-4, atol 1e-5).
# Arguments: $1 = kiln binary, $2 = scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON=/usr/bin/python3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$PYTHON" - "$SCRATCH" <<'PY' || fail "could not write the model"
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
out = sys.argv[1]
rng = np.random.default_rng(7)
w = rng.uniform(-1, 1, (96, 80)).astype(np.float32)
b = rng.uniform(-1, 1, 80).astype(np.float32)
x = rng.uniform(-1, 1, (33, 96)).astype(np.float32)
k = rng.uniform(-1, 1, (7, 5, 3, 3)).astype(np.float32)
kb = rng.uniform(-1, 1, 7).astype(np.float32)
c = rng.uniform(-1, 1, (1, 5, 11, 13)).astype(np.float32)
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
     helper.make_node("Relu", ["a"], ["y"]),
     helper.make_node("Conv", ["c", "k", "kb"], ["v"], pads=[1, 1, 1, 1], strides=[2, 2]),
     helper.make_node("Relu", ["v"], ["z"])], "autotune",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [33, 96]),
     helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 5, 11, 13])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [33, 80]),
     helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 7, 6, 7])],
    [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
     numpy_helper.from_array(k, "k"), numpy_helper.from_array(kb, "kb")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
onnx.save(model, f"{out}/model.onnx")
np.save(f"{out}/x.npy", x)
np.save(f"{out}/y.npy", np.maximum(x.astype(np.float64) @ w + b, 0).astype(np.float32))
np.save(f"{out}/c.npy", c)
padded = np.pad(c.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
z = np.zeros((1, 7, 6, 7))
for i in range(6):
    for j in range(7):
        window = padded[0, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
        z[0, :, i, j] = np.tensordot(k, window, axes=([1, 2, 3], [0, 1, 2])) + kb
np.save(f"{out}/z.npy", np.maximum(z, 0).astype(np.float32))
PY

export KILN_AUTOTUNE_CACHE="$SCRATCH/autotune.json"
run() {  # run NAME MODE
  "$KILN" run "$SCRATCH/model.onnx" --input "x=$SCRATCH/x.npy" --input "c=$SCRATCH/c.npy" --output-dir "$SCRATCH/$1" \
    --cache-dir "$SCRATCH/cache" --autotune "$2" >"$SCRATCH/$1.stdout" 2>"$SCRATCH/$1.stderr" ||
    { cat "$SCRATCH/$1.stderr"; fail "$1: kiln run failed"; }
  "$PYTHON" "$HERE/../models/compare.py" "$SCRATCH/y.npy" "$SCRATCH/$1/y.npy" ||
    fail "$1: output y differs from numpy"
  "$PYTHON" "$HERE/../models/compare.py" "$SCRATCH/z.npy" "$SCRATCH/$1/z.npy" ||
    fail "$1: output z differs from numpy"
}
run off off
grep -q "AUTOTUNE" "$SCRATCH/off.stderr" && fail "--autotune off benchmarked"
run max1 max
cat "$SCRATCH/max1.stderr"
grep -q "AUTOTUNE matmul(33x96, 96x80)" "$SCRATCH/max1.stderr" ||
  fail "the first --autotune max compile printed no AUTOTUNE table"
grep -q "AUTOTUNE conv(1x5x11x13, 7x5x3x3, s2, p1)" "$SCRATCH/max1.stderr" ||
  fail "the first --autotune max compile printed no convolution AUTOTUNE table"
[ -s "$SCRATCH/autotune.json" ] || fail "no autotune cache written"
run max2 max
grep -q "AUTOTUNE" "$SCRATCH/max2.stderr" && fail "the second --autotune max compile benchmarked"
echo ok
