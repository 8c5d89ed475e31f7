#!/usr/bin/env bash
# The demo: `kiln info` on the bundled example model, then a ResNet-18-shaped CNN (random
# weights, built by examples/make_resnet18.py) compiled and run with `kiln run`: the kernels Kiln
# generated, the compile time and the latency. The code cache lives in BUILD_DIR/demo-cache, so
# the first demo shows a cold compile and the next ones a warm start (delete it to see the cold
# compile again). Usage: scripts/demo.sh [BUILD_DIR]   (KILN_DEMO_REPEAT: timed runs, default 10;
# KILN_DEMO_CACHE: the code cache instead of BUILD_DIR/demo-cache, relative to the repository root)
set -euo pipefail
BUILD_DIR="${1:-build}"
cd "$(dirname "$0")/.."

KILN="$BUILD_DIR/bin/kiln"
DEMO_DIR="$BUILD_DIR/demo"
MODEL="$DEMO_DIR/resnet18.onnx"
CACHE_DIR="${KILN_DEMO_CACHE:-$BUILD_DIR/demo-cache}"
GENERATOR=examples/make_resnet18.py
REPEAT="${KILN_DEMO_REPEAT:-10}"
PYTHON=/usr/bin/python3  # Debian's python3, which has python3-onnx and python3-numpy

show() {
  echo "\$ $*"
  "$@"
}

# The model, rebuilt only when missing or when the generator changed (its hash is the stamp);
# written under a temporary name and renamed, so an interrupted demo never leaves half a model.
mkdir -p "$DEMO_DIR"
stamp="$(sha256sum "$GENERATOR" | cut -d' ' -f1)"
if [ ! -f "$MODEL" ] || [ "$(cat "$MODEL.stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "demo: building $MODEL with $GENERATOR"
  tmp="$(mktemp "$MODEL.XXXXXX")"
  trap 'rm -f "$tmp" "$tmp.tmp"' EXIT
  "$PYTHON" "$GENERATOR" "$tmp"
  mv -f "$tmp" "$MODEL"
  echo "$stamp" >"$MODEL.stamp.tmp" && mv -f "$MODEL.stamp.tmp" "$MODEL.stamp"
fi

echo "== kiln info: the bundled example model"
show "$KILN" info examples/models/mlp.onnx
echo

echo "== kiln run: ResNet-18-shaped CNN (224x224, width 64, random weights), batch 1"
if [ -d "$CACHE_DIR" ] && [ -n "$(ls -A "$CACHE_DIR" 2>/dev/null)" ]; then
  echo "(code cache $CACHE_DIR has entries: expect a warm start; delete it for a cold compile)"
else
  echo "(code cache $CACHE_DIR is empty: a cold compile, the C++ compiler runs; under a minute)"
fi
start=$(date +%s%N)
show "$KILN" run "$MODEL" --dim batch=1 --cache-dir "$CACHE_DIR" --output-dir "$DEMO_DIR" \
  --print-kernels --repeat "$REPEAT"
end=$(date +%s%N)
echo "kiln run took $(((end - start) / 100000000 / 10)).$(((end - start) / 100000000 % 10)) s in all" \
  "(import, compile or code cache lookup, 1 + $REPEAT runs)"
echo

echo "== kiln compile: the same CNN as a self-contained library with a C API, then kiln bench on it"
show "$KILN" compile "$MODEL" -o "$DEMO_DIR/resnet18.so" --cache-dir "$CACHE_DIR"
show "$KILN" bench "$DEMO_DIR/resnet18.so" --iters "$REPEAT" --warmup 2 --shape input=1x3x224x224 \
  --profile "$DEMO_DIR/resnet18-trace.json"
echo "(load $DEMO_DIR/resnet18-trace.json in chrome://tracing or Perfetto: one event per call)"
