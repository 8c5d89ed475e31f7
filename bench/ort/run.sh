#!/usr/bin/env bash
# Kiln against ONNX Runtime 1.30 (onnxruntime-node, CPU execution provider) on ResNet-18- and
# ResNet-50-shaped CNNs, a MobileNetV2-shaped CNN, a BERT-base-shaped encoder stack, issue 17's small encoder (4
# layers, d 256, seq 128) and a GPT-style causal decoder (4 blocks, vocab 8192, seq 128, tied
# embeddings) (make_models.py, random weights, batch 1): checks once
# that both give the same outputs on the same input, then times them in alternating rounds (Kiln
# with `kiln bench --json`, ONNX Runtime with ort_bench.js; the same thread count, warm-up and
# timed runs), and prints per model both p50s, their ratio ORT / Kiln (above 1: Kiln is faster)
# and Kiln's cold (empty code cache) and warm (same cache again) compile times. It prints; it
# asserts nothing.
#
# Usage: bench/ort/run.sh [BUILD_DIR]   (`make bench-ort` builds kiln and runs it)
# Environment: BENCH_ORT_THREADS (2), BENCH_ORT_ROUNDS (3), BENCH_ORT_ITERS (timed runs per round,
# 20), BENCH_ORT_WARMUP (5), BENCH_ORT_BERT_LAYERS (12), BENCH_ORT_MODELS ("resnet18 resnet50 mobilenet_v2
# resnext50 bert encoder decoder"), BENCH_ORT_VARIANT ("cpu": the variant of Kiln's library this CPU
# selects; "v3": the x86-64-v3 variant forced, see below).
# Everything it writes is under BUILD_DIR/bench-ort/ (onnxruntime-node, models, code cache,
# outputs, results.jsonl).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR="$(realpath "${1:-build}")"
HERE=bench/ort
KILN="$BUILD_DIR/bin/kiln"
WORK="$BUILD_DIR/bench-ort"
ORT_DIR="$WORK/onnxruntime-node"
ORT_VERSION=1.30.0
PYTHON=/usr/bin/python3  # Debian's python3 with python3-onnx and python3-numpy
THREADS="${BENCH_ORT_THREADS:-2}"
ROUNDS="${BENCH_ORT_ROUNDS:-3}"
ITERS="${BENCH_ORT_ITERS:-20}"
WARMUP="${BENCH_ORT_WARMUP:-5}"
BERT_LAYERS="${BENCH_ORT_BERT_LAYERS:-12}"
MODELS="${BENCH_ORT_MODELS:-resnet18 resnet50 mobilenet_v2 resnext50 bert encoder decoder}"
CACHE="$WORK/cache"  # the code cache of every Kiln run after the cold compile
# With "v3", Kiln's loader assumes a CPU with only x86-64-v3's features (KILN_CPU_FEATURES), so it
# loads the AVX2 variant, and oneDNN, which dispatches on the CPU itself, is held to AVX2
# (DNNL_MAX_CPU_ISA; ONEDNN_MAX_CPU_ISA is its newer name) and OpenBLAS to its Haswell kernels
# (OPENBLAS_CORETYPE): what an AVX2 machine runs. Without the caps, oneDNN's convolutions would
# still run AVX-512 code. Exported for the whole run, the compiles too; ONNX Runtime ignores
# them (it reads CPUID): see ORT_NODE below for how it is held to AVX2.
VARIANT="${BENCH_ORT_VARIANT:-cpu}"
case "$VARIANT" in
  cpu) ;;
  v3) export KILN_CPU_FEATURES=avx,avx2,fma,bmi,bmi2,f16c DNNL_MAX_CPU_ISA=AVX2 \
    ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ;;
  *) echo "bench-ort: BENCH_ORT_VARIANT is cpu or v3, not '$VARIANT'" >&2; exit 1 ;;
esac
mkdir -p "$WORK"
[ -x "$KILN" ] || { echo "bench-ort: no $KILN; build it first (make build)" >&2; exit 1; }
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "bench-ort: needs $tool (Node.js) on PATH" >&2; exit 1; }
done

# --- ONNX Runtime from npm ---------------------------------------------------------------------
# Its install script downloads more binaries, which fails offline; the package itself carries the
# Linux x64 CPU build, so the script is skipped (npm may also skip it as not yet approved).
installed="$(cat "$ORT_DIR/node_modules/onnxruntime-node/package.json" 2>/dev/null |
  "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["version"])' 2>/dev/null || true)"
if [ "$installed" != "$ORT_VERSION" ]; then
  echo "bench-ort: installing onnxruntime-node@$ORT_VERSION into $ORT_DIR"
  mkdir -p "$ORT_DIR"
  echo '{"name": "kiln-bench-ort", "private": true}' >"$ORT_DIR/package.json"
  ONNXRUNTIME_NODE_INSTALL=skip npm install --prefix "$ORT_DIR" --no-audit --no-fund \
    --loglevel=error "onnxruntime-node@$ORT_VERSION"
fi
export NODE_PATH="$ORT_DIR/node_modules"

# --- models ------------------------------------------------------------------------------------
# Rebuilt when missing or when the generator or the layer count changed (the stamp).
MODEL_DIR="$WORK/models"
stamp="$(sha256sum "$HERE/make_models.py" | cut -d' ' -f1) layers=$BERT_LAYERS"
if [ "$(cat "$MODEL_DIR/stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "bench-ort: building the models into $MODEL_DIR"
  rm -rf "$MODEL_DIR"
  "$PYTHON" "$HERE/make_models.py" "$MODEL_DIR" --bert-layers "$BERT_LAYERS"
  echo "$stamp" >"$MODEL_DIR/stamp"
fi
input_name() {
  case "$1" in
    resnet18 | resnet50 | mobilenet_v2 | resnext50) echo input ;;
    bert | encoder) echo hidden ;;
    decoder) echo tokens ;;
  esac
}
# Both engines are timed on make_models.py's input (the decoder's token ids must be in range).
input_arg() { echo "$(input_name "$1")=$MODEL_DIR/$1.input.npy"; }

kiln_bench() {  # kiln_bench MODEL CACHE_DIR ITERS WARMUP: one JSON line
  "$KILN" bench "$MODEL_DIR/$1.onnx" --json --threads "$THREADS" --iters "$3" --warmup "$4" \
    --cache-dir "$2" --input "$(input_arg "$1")"
}
# The timed runs are of the library `kiln compile` writes by default (every x86-64 variant in
# one .so, the one this CPU runs, or KILN_CPU_FEATURES's, chosen at load), as a user deploys it.
LIB_DIR="$WORK/lib"
kiln_bench_library() {  # kiln_bench_library MODEL ITERS WARMUP: one JSON line
  "$KILN" bench "$LIB_DIR/$1.so" --json --threads "$THREADS" --iters "$2" --warmup "$3" \
    --input "$(input_arg "$1")"
}
# With "v3", ONNX Runtime is held to AVX2 too where the CPU allows it (hold_avx2.sh): what an
# AVX2 machine runs on both sides.
ORT_NODE=(node)
if [ "$VARIANT" = v3 ]; then
  source "$HERE/hold_avx2.sh"
  hold_ort_to_avx2 "$WORK"
fi
ort_bench() {  # ort_bench MODEL ITERS WARMUP [ARGS...]: one JSON line
  local model="$1" iters="$2" warmup="$3"
  shift 3
  "${ORT_NODE[@]}" "$HERE/ort_bench.js" "$MODEL_DIR/$model.onnx" --threads "$THREADS" --iters "$iters" \
    --warmup "$warmup" --input "$(input_arg "$model")" "$@"
}
report() { "$PYTHON" "$HERE/report.py" "$@"; }  # see report.py
tag() { report tag "$@"; }  # tag ENGINE MODEL PHASE: the JSON line on stdin, tagged

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
echo "== Kiln $("$KILN" --version | cut -d' ' -f2) against ONNX Runtime $ORT_VERSION:" \
  "$THREADS threads each, $ROUNDS rounds of $WARMUP warm-up + $ITERS timed runs per model"
if [ "$VARIANT" = v3 ]; then
  echo "   Kiln's x86-64-v3 variant forced (KILN_CPU_FEATURES=$KILN_CPU_FEATURES)," \
    "oneDNN held to AVX2 (DNNL_MAX_CPU_ISA=$DNNL_MAX_CPU_ISA), OpenBLAS to Haswell"
  echo "   ONNX Runtime runs $ORT_ISA"
fi
echo "   CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) hardware threads;" \
  "OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}; $(cut -d' ' -f1-3 /proc/loadavg) load average"

# --- compile times -----------------------------------------------------------------------------
# Cold: an empty code cache (the C++ compiler runs); warm: the same cache again (lowering,
# scheduling and code generation run, the library comes from the cache). One run each.
rm -rf "$CACHE"
for m in $MODELS; do
  for phase in cold warm; do  # tagged after the run, as the timed rounds below are
    json="$(kiln_bench "$m" "$CACHE" 1 0)"
    echo "$json" | tag kiln "$m" "$phase" >>"$RESULTS"
  done
done

# --- the libraries ------------------------------------------------------------------------------
# `kiln compile` with its defaults (the GEMM and convolution choices made for THREADS threads).
rm -rf "$LIB_DIR" && mkdir -p "$LIB_DIR"
for m in $MODELS; do
  OMP_NUM_THREADS="$THREADS" "$KILN" compile "$MODEL_DIR/$m.onnx" -o "$LIB_DIR/$m.so" \
    --cache-dir "$CACHE" >/dev/null
done
echo "   Kiln's libraries: kiln compile MODEL.onnx -o MODEL.so; variant loaded:" \
  "$("$KILN" bench "$LIB_DIR/${MODELS%% *}.so" --iters 1 --warmup 0 |
    sed -n 's/.*(target \(.*\)) .*/\1/p')"

# --- outputs agree -----------------------------------------------------------------------------
# The same input through both; outputs compared here (printed, not asserted).
echo "== outputs on the same input (make_models.py's <model>.input.npy)"
for m in $MODELS; do
  rm -rf "$WORK/out/$m" && mkdir -p "$WORK/out/$m/kiln" "$WORK/out/$m/ort"
  OMP_NUM_THREADS="$THREADS" "$KILN" run "$LIB_DIR/$m.so" \
    --input "$(input_arg "$m")" --output-dir "$WORK/out/$m/kiln" >/dev/null
  ort_bench "$m" 1 0 --output-dir "$WORK/out/$m/ort" >/dev/null
  report compare "$m" "$WORK/out/$m"
done

# --- timed rounds ------------------------------------------------------------------------------
# The libraries and outputs just written (a few hundred MB) are written back to disk by the
# kernel about 30 s after the write (vm.dirty_expire_centisecs), which is when round 1 starts:
# in 3 of 5 runs on a 2-core AMD EPYC the first model (or two) of round 1 ran 1.6-1.9x slower
# than in the other rounds, for whichever engine ran then; that writeback is the likely cause.
# Flush it before timing.
sync
# Kiln and ORT alternate model by model; even rounds start with ORT, so a drift in the machine's
# load falls on both.
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r of $ROUNDS ($(cut -d' ' -f1 /proc/loadavg) load)"
  for m in $MODELS; do
    order="kiln ort"
    [ $((r % 2)) -eq 0 ] && order="ort kiln"
    for engine in $order; do
      # The engine's JSON line is tagged after the engine exits: a tagger started beside it in a
      # pipe (python3 loading numpy, about 0.1 s of CPU) took a core from the timed runs of the
      # models that run in less than that. Kiln's MobileNetV2 (25 runs of 2.6 ms, the library
      # loaded in milliseconds) read p90s of 7.7-8.2 ms that way, against 2.7 alone; ONNX
      # Runtime's session takes longer to load than the tagger to start.
      if [ "$engine" = kiln ]; then
        json="$(kiln_bench_library "$m" "$ITERS" "$WARMUP")"
      else
        json="$(ort_bench "$m" "$ITERS" "$WARMUP")"
      fi
      line="$(echo "$json" | tag "$engine" "$m" "round$r")"
      echo "$line" >>"$RESULTS"
      echo "$line" | report row
    done
  done
done

# --- summary -----------------------------------------------------------------------------------
echo "== summary ($(cut -d' ' -f1-3 /proc/loadavg) load average at the end; results in $RESULTS)"
report summary "$RESULTS" $MODELS
# Without CPUID faulting the v3 columns time Kiln's AVX2 code against ONNX Runtime's AVX-512: not
# what an AVX2 machine runs (both at AVX2), and on a CPU with full-width AVX-512 units (Intel's
# Xeons, AMD's Zen 5) twice the peak of the AVX2 side.
if [ "$VARIANT" = v3 ] && [ "${#ORT_NODE[@]}" -eq 1 ] && grep -qw avx512f /proc/cpuinfo; then
  echo "   note: ONNX Runtime ran this CPU's AVX-512 against Kiln's AVX2 variant (no CPUID" \
    "faulting here), so these ratios are not an AVX2 machine's, where both run AVX2"
fi
