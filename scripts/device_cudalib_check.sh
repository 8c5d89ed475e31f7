#!/bin/bash
# CUDA model libraries (`kiln compile --device cuda`) on a machine with an NVIDIA GPU, through
# the C API alone (bin/kiln_cuda_library_check, tests/aot/cuda_library_check.cpp):
#   1. the libraries of LIBS_DIR, built on a machine without a GPU (scripts/device_bundle.sh
#      compiles the ONNX suite cases of tests/onnx/cudalib_cases.txt there: CASE.so, with the
#      case's inputs as CASE.inputs/NAME.npy and its model as CASE.onnx);
#   2. bench/ort's ResNet-50-shaped CNN and BERT-base-shaped encoder (make_models.py, too large
#      to carry), compiled here with the GPU hidden (CUDA_VISIBLE_DEVICES=""), at tf32;
# each: loaded and run with host, device and pinned buffers on the caller's streams, 8 threads
# x 100 runs (outputs bit-identical to the first run), the median latency of 50 runs; all that
# once with CUDA graphs off (KILN_CUDA_GRAPHS=0) and once on (the default); then the outputs of
# both against `kiln run --device cuda` on the same inputs: max |diff| / max |reference| within
# 1e-5 (fp32) or 1e-4 (tf32: the two may pick other cuBLASLt/cuDNN algorithms).
#   scripts/device_cudalib_check.sh [PREFIX] [LIBS_DIR] [OUT_DIR]
# PREFIX holds bin/kiln and bin/kiln_cuda_library_check (a build tree or the bundle's install
# prefix); LIBS_DIR defaults to PREFIX/share/kiln/check/cudalib; OUT_DIR to $OUT/cudalib, else
# /tmp/kiln-cudalib. MODELS (default "bench suite") picks the parts.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prefix=$(cd "${1:-$here/../build}" && pwd)
libs=${2:-$prefix/share/kiln/check/cudalib}
out=${3:-${OUT:+$OUT/cudalib}}
out=${out:-/tmp/kiln-cudalib}
mkdir -p "$out"
py=${PYTHON:-python3}
make_models=$here/make_models.py
[ -f "$make_models" ] || make_models=$here/../bench/ort/make_models.py
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device"
  exit 0
fi
nvidia-smi -L
cache=$out/cache
failures=0

# check NAME LIBRARY MODEL PRECISION [NAME=FILE.npy ...]
check() {
  local name=$1 library=$2 model=$3 precision=$4
  shift 4
  local dir=$out/$name
  rm -rf "$dir"
  mkdir -p "$dir"
  echo "== $name ($precision)"
  echo "-- CUDA graphs off"
  KILN_CUDA_GRAPHS=0 timeout 300 "$prefix/bin/kiln_cuda_library_check" "$library" "$dir/nographs" "$@" 2>&1 |
    tee "$dir/check-nographs.log" | grep -v '^$'
  [ "${PIPESTATUS[0]}" -eq 0 ] || failures=$((failures + 1))
  echo "-- CUDA graphs on"
  timeout 300 "$prefix/bin/kiln_cuda_library_check" "$library" "$dir" "$@" 2>&1 | tee "$dir/check.log" |
    grep -v '^$'
  [ "${PIPESTATUS[0]}" -eq 0 ] || failures=$((failures + 1))
  local inputs=()
  while IFS= read -r line; do inputs+=(--input "$line"); done <"$dir/inputs.txt"
  if ! timeout 300 "$prefix/bin/kiln" run "$model" --device cuda --precision "$precision" \
    "${inputs[@]}" --cache-dir "$cache" --output-dir "$dir/run" >"$dir/run.log" 2>&1; then
    echo "kiln run failed:"
    tail -5 "$dir/run.log"
    failures=$((failures + 1))
    return
  fi
  "$py" - "$dir" "$precision" <<'EOF' || failures=$((failures + 1))
import os, sys
import numpy as np
d, precision = sys.argv[1:3]
tolerance = 1e-5 if precision == "fp32" else 1e-4
worst, bad = 0.0, []
for sub in ("nographs/outputs", "outputs"):
    for name in sorted(os.listdir(os.path.join(d, sub))):
        lib = np.load(os.path.join(d, sub, name))
        path = os.path.join(d, "run", name)
        if not os.path.exists(path):
            bad.append(f"{sub}/{name}: kiln run wrote no such output")
            continue
        run = np.load(path)
        if lib.shape != run.shape:
            bad.append(f"{sub}/{name}: shape {lib.shape} against kiln run's {run.shape}")
            continue
        if lib.size == 0:
            continue
        scale = max(float(np.abs(run.astype(np.float64)).max()), 1e-30)
        err = float(np.abs(lib.astype(np.float64) - run.astype(np.float64)).max()) / scale
        worst = max(worst, err)
        if not err <= tolerance:
            bad.append(f"{sub}/{name}: max |diff| / max |ref| = {err:.2e}")
print(f"graphs off and on, against kiln run --device cuda: max |diff| / max |ref| = "
      f"{worst:.2e} (tolerance {tolerance:g}): {'ok' if not bad else 'OUT OF TOLERANCE'}")
for line in bad:
    print("  " + line)
sys.exit(1 if bad else 0)
EOF
}

parts=" ${MODELS:-bench suite} "
if [[ $parts == *" bench "* ]]; then
  models=$out/models
  if ! timeout 120 "$py" "$make_models" "$models" >"$out/make_models.log" 2>&1; then
    echo "make_models.py failed:"
    tail -5 "$out/make_models.log"
    exit 1
  fi
  for model in resnet50 bert; do
    case $model in resnet50) input=input ;; bert) input=hidden ;; esac
    echo "== kiln compile --device cuda $model.onnx (GPU hidden: CUDA_VISIBLE_DEVICES=\"\")"
    if ! CUDA_VISIBLE_DEVICES="" timeout 600 "$prefix/bin/kiln" compile "$models/$model.onnx" \
      --device cuda --precision tf32 -o "$out/$model.so" --cache-dir "$cache" \
      >"$out/$model.compile.log" 2>&1; then
      echo "kiln compile failed:"
      tail -5 "$out/$model.compile.log"
      failures=$((failures + 1))
      continue
    fi
    cat "$out/$model.compile.log"
    echo "ldd $model.so:"
    ldd "$out/$model.so" | sed 's/^/  /'
    check "$model" "$out/$model.so" "$models/$model.onnx" tf32 "$input=$models/$model.input.npy"
  done
  rm -rf "$models"
fi
if [[ $parts == *" suite "* ]]; then
  for library in "$libs"/*.so; do
    [ -f "$library" ] || continue
    name=$(basename "$library" .so)
    given=()
    for npy in "$libs/$name.inputs"/*.npy; do
      [ -f "$npy" ] && given+=("$(basename "$npy" .npy)=$npy")
    done
    check "$name" "$library" "$libs/$name.onnx" "$(cat "$libs/$name.precision" 2>/dev/null || echo fp32)" "${given[@]}"
  done
fi

rm -rf "$cache"
echo "cudalib checks: $failures failed"
[ "$failures" -eq 0 ]
