#!/usr/bin/env bash
# `kiln compile --device cuda` on this machine (no GPU needed): a bad --device or --precision is
# named; with NVRTC (a Kiln built with the CUDA toolkit) the library is built, the report names
# the modules of its kernels and what it loads at run time, ldd shows nothing of CUDA or Kiln,
# and `kiln run` on the library with KILN_CUDA_FAKE_DRIVER=none (or on a machine without a
# driver) fails with the driver's absence. Without NVRTC the compile says so.
source "$(dirname "$0")/run_lib.sh"
run_model gather "$SCRATCH/m.onnx"
"$KILN" compile "$SCRATCH/m.onnx" --device gpu -o "$SCRATCH/m.so" --cache-dir "$CACHE" \
  2>"$SCRATCH/stderr" && fail "--device gpu should fail"
grep -q -- '--device gpu: expected cpu or cuda' "$SCRATCH/stderr" || fail "$(cat "$SCRATCH/stderr")"
"$KILN" compile "$SCRATCH/m.onnx" --device cuda --precision fp8 -o "$SCRATCH/m.so" \
  --cache-dir "$CACHE" 2>"$SCRATCH/stderr" && fail "--precision fp8 should fail"
grep -q -- '--precision fp8: expected fp32, tf32, fp16 or bf16' "$SCRATCH/stderr" ||
  fail "$(cat "$SCRATCH/stderr")"
# The half types are for CUDA: the CPU computes float32.
"$KILN" compile "$SCRATCH/m.onnx" --precision fp16 -o "$SCRATCH/m.so" --cache-dir "$CACHE" \
  2>"$SCRATCH/stderr" && fail "--precision fp16 on the CPU should fail"
grep -q -- '--precision fp16 is for --device cuda' "$SCRATCH/stderr" || fail "$(cat "$SCRATCH/stderr")"
if ! "$KILN" compile "$SCRATCH/m.onnx" --device cuda -o "$SCRATCH/m.so" --cache-dir "$CACHE" \
  >"$SCRATCH/stdout" 2>"$SCRATCH/stderr"; then
  grep -q -e 'built without the CUDA toolkit' -e 'NVRTC' "$SCRATCH/stderr" || fail "$(cat "$SCRATCH/stderr")"
  echo "no NVRTC here: $(cat "$SCRATCH/stderr")"
  exit 0
fi
cat "$SCRATCH/stdout"
grep -q '^device: cuda (--precision tf32); kernels: sm_80, sm_90 and PTX for compute_80$' \
  "$SCRATCH/stdout" || fail "no device line"
grep -q '^loads at run time: libcuda.so.1 ' "$SCRATCH/stdout" || fail "no driver line"
ldd "$SCRATCH/m.so" | grep -E 'cuda|cublas|cudnn|nvrtc|kiln' && fail "the library links CUDA or Kiln"
KILN_CUDA_FAKE_DRIVER=none "$KILN" run "$SCRATCH/m.so" 2>"$SCRATCH/stderr" &&
  fail "a CUDA library should not load without a driver"
grep -q 'this model runs on CUDA, but the CUDA driver (libcuda.so.1) is not found' \
  "$SCRATCH/stderr" || fail "$(cat "$SCRATCH/stderr")"
exit 0
