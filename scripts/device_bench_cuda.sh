#!/bin/bash
# `make bench-cuda`: on a machine with an NVIDIA GPU, PyTorch, onnx and onnxruntime, for
# bench/ort's ResNet-50-shaped CNN and BERT-base-shaped encoder (bench/ort/make_models.py):
#   1. Kiln's latency (`kiln run --device cuda --repeat`, the median, a host input to a host
#      output) at --precision fp32 and tf32, next to PyTorch eager and torch.compile on the same
#      GPU and the same graph (bench/cuda/torch_bench.py) with TF32 disallowed (fp32) and allowed
#      for matmuls and convolutions (tf32);
#   2. Kiln's outputs against onnxruntime's on the CPU: max |diff| / max |reference| within
#      1e-4 at fp32 and 2e-3 at tf32 (shared/CUDA-DESIGN.md's per-model TF32 tolerance), and the
#      same top-1 class for the CNN;
#   3. the fused pointwise and row-reduction kernels' bandwidth as a fraction of the GPU's
#      device-to-device copy (kiln_cuda_pointwise_bench; the target is 85 %);
#   4. compute-sanitizer memcheck on one run of each model (fp32).
# Run from a build tree or from the bundle of scripts/device_bundle.sh (its run.sh with
# STAGES=bench), which puts this script and the Python files beside the case lists:
#   scripts/device_bench_cuda.sh [BIN_DIR] [OUT_DIR]
# BIN_DIR defaults to build/bin, OUT_DIR to $OUT/bench-cuda, else /tmp/kiln-bench-cuda. Each
# stage is bounded by a timeout; it prints as it goes and writes its logs under OUT_DIR.
# PARTS (default "models pointwise sanitize") picks the parts: 1-2, 3, 4.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${1:-$here/../build/bin}" && pwd)
out=${2:-${OUT:+$OUT/bench-cuda}}
out=${out:-/tmp/kiln-bench-cuda}
mkdir -p "$out"
py=${PYTHON:-python3}
files=$here
[ -f "$files/torch_bench.py" ] || files=$here/../bench/cuda
make_models=$here/make_models.py
[ -f "$make_models" ] || make_models=$here/../bench/ort/make_models.py
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device"
  exit 0
fi
nvidia-smi -L
parts=" ${PARTS:-models pointwise sanitize} "
models=$out/models
cache=$out/cache
model_list=
[[ $parts == *" models "* || $parts == *" sanitize "* ]] && model_list="resnet50 bert"
if [ -n "$model_list" ] &&
  ! timeout 120 "$py" "$make_models" "$models" >"$out/make_models.log" 2>&1; then
  echo "make_models.py failed:"
  tail -5 "$out/make_models.log"
  exit 1
fi

[[ $parts == *" models "* ]] || model_list=
for model in $model_list; do
  case $model in resnet50) input=input output=logits ;; bert) input=hidden output=output ;; esac
  dir=$out/$model
  mkdir -p "$dir"
  echo "== $model"
  timeout 300 "$py" "$files/torch_bench.py" "$models/$model.onnx" "$models/$model.input.npy" \
    "$dir" >"$dir/torch.log" 2>&1
  echo "torch_bench exit status: $?"
  grep -v '^torch [ft][p3]' "$dir/torch.log" | grep -v '^ *$' | tail -8
  for precision in fp32 tf32; do
    timeout 240 "$bin/kiln" run "$models/$model.onnx" --device cuda --precision "$precision" \
      --input "$input=$models/$model.input.npy" --repeat 50 --cache-dir "$cache" \
      --output-dir "$dir/kiln_$precision" >"$dir/kiln_$precision.log" 2>&1
    status=$?
    [ $status -eq 0 ] || { echo "kiln run ($precision) failed ($status):"; tail -5 "$dir/kiln_$precision.log"; }
  done
  "$py" - "$dir" "$output" "$model" <<'EOF'
import os, re, sys
import numpy as np
d, output, model = sys.argv[1:4]
ref = np.load(os.path.join(d, "reference.npy"))
scale = float(np.abs(ref).max())
torch_ms = {}
for line in open(os.path.join(d, "torch.log")):
    f = line.split()
    if len(f) == 5 and f[0] == "torch" and f[1] in ("fp32", "tf32"):
        torch_ms[(f[1], f[2])] = (float(f[3]), float(f[4]))
print(f"{model}: median ms, host input to host output (device-only in brackets for PyTorch)")
print(f"  {'precision':<9} {'Kiln':>8} {'eager':>16} {'compile':>16}  Kiln/eager Kiln/compile  "
      "Kiln vs onnxruntime (CPU)")
for p, tol in (("fp32", 1e-4), ("tf32", 2e-3)):
    log = open(os.path.join(d, f"kiln_{p}.log")).read()
    m = re.search(r"median ([0-9.]+) ms", log)
    kiln = float(m.group(1)) if m else float("nan")
    path = os.path.join(d, f"kiln_{p}", output + ".npy")
    if os.path.exists(path):
        y = np.load(path)
        err = float(np.abs(y - ref).max()) / scale
        verdict = "ok" if err <= tol else "OUT OF TOLERANCE"
        if model == "resnet50":
            same = int(np.argmax(y)) == int(np.argmax(ref))
            verdict += ", same top-1" if same else ", TOP-1 DIFFERS"
        check = f"{err:.1e} (tolerance {tol:g}): {verdict}"
    else:
        check = "no output"
    e = torch_ms.get((p, "eager"), (float("nan"),) * 2)
    c = torch_ms.get((p, "compile"), (float("nan"),) * 2)
    print(f"  {p:<9} {kiln:8.3f} {e[0]:8.3f} [{e[1]:5.3f}] {c[0]:8.3f} [{c[1]:5.3f}]  "
          f"{kiln / e[0]:10.2f} {kiln / c[0]:12.2f}  {check}")
EOF
done

if [[ $parts != *" pointwise "* ]]; then
  :
elif [ -x "$bin/kiln_cuda_pointwise_bench" ]; then
  echo "== kiln_cuda_pointwise_bench"
  KILN_CACHE_DIR=$cache timeout 240 "$bin/kiln_cuda_pointwise_bench" 2>&1 | tee "$out/pointwise.log"
else
  echo "kiln_cuda_pointwise_bench: not built (needs the CUDA toolkit)"
fi

sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [[ $parts != *" sanitize "* ]]; then
  :
elif [ -z "$sanitizer" ]; then
  echo "compute-sanitizer: not found on this machine"
else
  echo "== compute-sanitizer memcheck, one fp32 run of each model"
  for model in resnet50 bert; do
    case $model in resnet50) input=input ;; bert) input=hidden ;; esac
    mkdir -p "$out/$model"
    timeout 240 "$sanitizer" --tool memcheck --error-exitcode 9 --print-limit 20 \
      "$bin/kiln" run "$models/$model.onnx" --device cuda --precision fp32 \
      --input "$input=$models/$model.input.npy" --cache-dir "$cache" \
      --output-dir "$out/$model/sanitized" >"$out/$model-sanitizer.log" 2>&1
    status=$?
    echo "$model: exit status $status; $(grep -E 'ERROR SUMMARY' "$out/$model-sanitizer.log" | tail -1)"
    grep -E '========= (Invalid|Program hit)' "$out/$model-sanitizer.log" | head -5
  done
fi
rm -rf "$models" "$cache"
