#!/usr/bin/env bash
# Kiln's and ONNX Runtime's time per layer of one of bench-ort's models (bench/ort/layers.py
# prints them side by side): where Kiln loses or wins against ONNX Runtime.
#
# Usage: bench/ort/layers.sh [BUILD_DIR] MODEL [KILN_RUNS]
# MODEL is one of run.sh's (resnet18, resnet50, mobilenet_v2, resnext50, bert, encoder,
# decoder); run.sh must have built its model and library under BUILD_DIR/bench-ort (make
# bench-ort, or run.sh with BENCH_ORT_MODELS=MODEL). ONNX Runtime profiles 5 warm-up and 20 timed runs in one
# process; Kiln profiles one run per `kiln bench --profile`, KILN_RUNS (7) times, and each layer
# takes the median. KILN_CPU_FEATURES picks Kiln's variant as in run.sh's BENCH_ORT_VARIANT=v3;
# with it set, ONNX Runtime is held to AVX2 as run.sh holds it (hold_avx2.sh). LAYERS_FASTEST=1
# reads each layer's fastest run instead of the median (layers.py --fastest; for noisy hosts).
# Writes the traces under BUILD_DIR/bench-ort/profiles/.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ge 2 ] && [ -d "$1" ]; then
  BUILD_DIR="$(realpath "$1")"
  shift
else
  BUILD_DIR="$(realpath build)"
fi
MODEL="${1:?usage: bench/ort/layers.sh [BUILD_DIR] MODEL [KILN_RUNS]}"
RUNS="${2:-7}"
WORK="$BUILD_DIR/bench-ort"
LIB="$WORK/lib/$MODEL.so"
ONNX="$WORK/models/$MODEL.onnx"
for f in "$LIB" "$ONNX"; do
  [ -f "$f" ] || { echo "layers.sh: no $f; run bench/ort/run.sh (BENCH_ORT_MODELS=$MODEL) first" >&2; exit 1; }
done
case "$MODEL" in
  bert | encoder) input=hidden ;;
  decoder) input=tokens ;;
  *) input=input ;;
esac
INPUT="$input=$WORK/models/$MODEL.input.npy"
OUT="$WORK/profiles"
mkdir -p "$OUT"
rm -f "$OUT/$MODEL".ort_*.json "$OUT/$MODEL".kiln.*.json
export NODE_PATH="$WORK/onnxruntime-node/node_modules"
ORT_NODE=(node)
if [ -n "${KILN_CPU_FEATURES:-}" ]; then
  source bench/ort/hold_avx2.sh
  hold_ort_to_avx2 "$WORK"
  echo "ONNX Runtime runs $ORT_ISA" >&2
fi
"${ORT_NODE[@]}" bench/ort/ort_bench.js "$ONNX" --threads 2 --iters 20 --warmup 5 --input "$INPUT" \
  --profile "$OUT/$MODEL.ort" >/dev/null
kiln_profiles=()
for i in $(seq "$RUNS"); do
  "$BUILD_DIR/bin/kiln" bench "$LIB" --threads 2 --warmup 5 --iters 5 --input "$INPUT" \
    --profile "$OUT/$MODEL.kiln.$i.json" >/dev/null
  kiln_profiles+=("$OUT/$MODEL.kiln.$i.json")
done
fastest=()
[ "${LAYERS_FASTEST:-0}" = 1 ] && fastest=(--fastest)
/usr/bin/python3 bench/ort/layers.py "${fastest[@]}" "$(ls -t "$OUT/$MODEL".ort_*.json | head -1)" \
  "${kiln_profiles[@]}"
