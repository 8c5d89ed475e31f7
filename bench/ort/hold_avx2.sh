# Sourced by run.sh and layers.sh: hold_ort_to_avx2 WORK_DIR sets ORT_NODE, the command that
# starts ONNX Runtime's Node.js process. Where the CPU can fault on CPUID (avx2_cpuid.c) it loads
# the shim that hides AVX-512 from the process, so ONNX Runtime runs the kernels of an AVX2
# machine, and ORT_ISA says so; elsewhere it is plain node and ONNX Runtime runs the host's ISA.
# V8's WebAssembly trap handler would take the shim's SIGSEGV, so Node.js runs without it.
hold_ort_to_avx2() {
  local shim="$1/avx2_cpuid.so"
  ORT_NODE=(node)
  ORT_ISA="the host's ISA (this CPU cannot fault on CPUID, so AVX-512 stays visible to it)"
  cc -O2 -shared -fPIC -o "$shim.tmp" "$(dirname "${BASH_SOURCE[0]}")/avx2_cpuid.c" &&
    mv "$shim.tmp" "$shim" || return 0
  if [ "$(AVX2_CPUID_CHECK=1 LD_PRELOAD="$shim" /bin/true 2>&1)" = "avx2_cpuid: AVX-512 hidden" ]; then
    ORT_NODE=(env LD_PRELOAD="$shim" node --disable-wasm-trap-handler)
    ORT_ISA="AVX2 (AVX-512 hidden from it by CPUID faulting, bench/ort/avx2_cpuid.c)"
  fi
}
