#!/bin/bash
# `make bench-cuda`: on a machine with an NVIDIA GPU, PyTorch, onnx and onnxruntime, for
# bench/ort's ResNet-50-shaped CNN and BERT-base-shaped encoder (bench/ort/make_models.py):
#   1. Kiln's latency at --precision fp32 and tf32: `kiln run --device cuda --repeat` (the
#      median, a host input to a host output) and the model as a library (`kiln compile
#      --device cuda`, CUDA graphs on, bin/kiln_cuda_library_check: kiln_model_run from host
#      buffers, and pinned buffers queued on the caller's stream), next to PyTorch eager,
#      torch.compile (mode "default") and torch.compile mode="reduce-overhead" (CUDA graphs) on
#      the same GPU and the same graph (bench/cuda/torch_bench.py), with TF32 disallowed (fp32)
#      and allowed for matmuls and convolutions (tf32), printed as ratios;
#   2. Kiln's outputs against onnxruntime's on the CPU: max |diff| / max |reference| within
#      1e-4 at fp32 and 2e-3 at tf32 (shared/CUDA-DESIGN.md's per-model TF32 tolerance), and the
#      same top-1 class for the CNN;
#   3. the fused pointwise and row-reduction kernels' bandwidth as a fraction of the GPU's
#      device-to-device copy (kiln_cuda_pointwise_bench; the target is 85 %);
#   4. compute-sanitizer memcheck on one run of each model (fp32).
# PRECISIONS=fp16 (or bf16) runs part 1 at Kiln's --precision fp16 against PyTorch under
# torch.autocast(dtype=float16) with TF32 allowed, checked against onnxruntime within 3e-2
# (bf16: 1.5e-1) and the same top-1.
# Run from a build tree or from the bundle of scripts/device_bundle.sh (its run.sh with
# STAGES=bench), which puts this script and the Python files beside the case lists:
#   scripts/device_bench_cuda.sh [BIN_DIR] [OUT_DIR]
# BIN_DIR defaults to build/bin, OUT_DIR to $OUT/bench-cuda, else /tmp/kiln-bench-cuda. Each
# stage is bounded by a timeout; it prints as it goes and writes its logs under OUT_DIR.
# PARTS (default "models pointwise sanitize") picks the parts: 1-2, 3, 4. PRECISIONS (default
# "fp32 tf32") and TORCH_MODES (default "eager,compile,reduce-overhead") narrow part 1;
# LIB_AUTOTUNE (default "max": cuDNN engines timed on this GPU) is the library's --autotune.
# MODELS (default "resnet50 bert") narrows parts 1, 2 and 4 to some of the models (a machine
# with several GPUs can run one model per GPU at once).
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
[[ $parts == *" models "* || $parts == *" sanitize "* ]] && model_list=${MODELS:-resnet50 bert}
if [ -n "$model_list" ] &&
  ! timeout 120 "$py" "$make_models" "$models" >"$out/make_models.log" 2>&1; then
  echo "make_models.py failed:"
  tail -5 "$out/make_models.log"
  exit 1
fi

[[ $parts == *" models "* ]] || model_list=
precisions=${PRECISIONS:-fp32 tf32}
for model in $model_list; do
  case $model in resnet50) input=input output=logits ;; bert) input=hidden output=output ;; esac
  dir=$out/$model
  mkdir -p "$dir"
  echo "== $model"
  timeout 400 "$py" "$files/torch_bench.py" "$models/$model.onnx" "$models/$model.input.npy" \
    "$dir" --precisions "$(echo $precisions | tr ' ' ,)" \
    --modes "${TORCH_MODES:-eager,compile,reduce-overhead}" >"$dir/torch.log" 2>&1
  echo "torch_bench exit status: $?"
  grep -vE '^torch (fp32|tf32|fp16|bf16) ' "$dir/torch.log" | grep -v '^ *$' | tail -8
  for precision in $precisions; do
    # The model as a shipped library: compiled, then run through the C API alone.
    timeout 240 "$bin/kiln" compile "$models/$model.onnx" --device cuda --precision "$precision" \
      --autotune "${LIB_AUTOTUNE:-max}" --cache-dir "$cache" -o "$dir/kiln_$precision.so" \
      >"$dir/lib_$precision.log" 2>&1 &&
      timeout 240 "$bin/kiln_cuda_library_check" "$dir/kiln_$precision.so" "$dir/lib_$precision" \
        "$input=$models/$model.input.npy" --threads 2 --runs 5 >>"$dir/lib_$precision.log" 2>&1 ||
      { echo "library ($precision) failed:"; tail -5 "$dir/lib_$precision.log"; }
    # The side stream of forks against KILN_CUDA_STREAMS=1 (kiln_cuda_library_check's part 5).
    grep -h '^side stream' "$dir/lib_$precision.log" | sed "s/^/$model $precision: /"
    timeout 240 "$bin/kiln" run "$models/$model.onnx" --device cuda --precision "$precision" \
      --input "$input=$models/$model.input.npy" --repeat 50 --cache-dir "$cache" \
      --output-dir "$dir/kiln_$precision" >"$dir/kiln_$precision.log" 2>&1
    status=$?
    [ $status -eq 0 ] || { echo "kiln run ($precision) failed ($status):"; tail -5 "$dir/kiln_$precision.log"; }
  done
  "$py" - "$dir" "$output" "$model" $precisions <<'EOF'
import os, re, sys
import numpy as np
d, output, model = sys.argv[1:4]
precisions = sys.argv[4:]
ref = np.load(os.path.join(d, "reference.npy"))
scale = float(np.abs(ref).max())
torch_ms = {}
for line in open(os.path.join(d, "torch.log")):
    f = line.split()
    if len(f) == 5 and f[0] == "torch" and f[1] in ("fp32", "tf32", "fp16", "bf16"):
        torch_ms[(f[1], f[2])] = (float(f[3]), float(f[4]))
nan = float("nan")
print(f"{model}: median ms, host input to host output (device-only in brackets: PyTorch from an "
      "input on the GPU; Kiln's library from pinned buffers queued on a stream)")
print(f"  {'precision':<9} {'kiln run':>8} {'Kiln .so':>16} {'eager':>16} {'compile':>16} "
      f"{'reduce-overhead':>16}  Kiln run vs onnxruntime (CPU)")
ratios = []
for p in precisions:
    # fp16 / bf16 (Kiln's mixed precision against torch.autocast): 11 and 8 significant bits
    # per stored activation through 50 layers; README.md's "Half precision" gives the reasoning.
    tol = {"fp32": 1e-4, "tf32": 2e-3, "fp16": 3e-2, "bf16": 1.5e-1}[p]
    log = open(os.path.join(d, f"kiln_{p}.log")).read()
    m = re.search(r"median ([0-9.]+) ms", log)
    kiln = float(m.group(1)) if m else nan
    lib_log = os.path.join(d, f"lib_{p}.log")
    m = re.search(r"CUDA graphs on\): kiln_model_run ([0-9.]+) ms, pinned buffers on the "
                  r"caller's stream ([0-9.-]+) ms", open(lib_log).read() if os.path.exists(lib_log) else "")
    lib = (float(m.group(1)), float(m.group(2))) if m else (nan, nan)
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
    t = {k: torch_ms.get((p, k), (nan, nan)) for k in ("eager", "compile", "reduce-overhead")}
    cells = "".join(f" {v[0]:8.3f} [{v[1]:5.3f}]" for v in (lib, t["eager"], t["compile"],
                                                            t["reduce-overhead"]))
    print(f"  {p:<9} {kiln:8.3f}{cells}  {check}")
    for k in ("eager", "compile", "reduce-overhead"):
        ratios.append(f"  {p} Kiln .so / torch {k}: {lib[0] / t[k][0]:.2f} host to host, "
                      f"{lib[1] / t[k][1]:.2f} device-only")
print("\n".join(ratios))
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
  for model in ${MODELS:-resnet50 bert}; do
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
