#!/usr/bin/env bash
# make test-sanitize: Kiln under the sanitizers, the code it generates included.
#
# 1. build-asan: Kiln built with -fsanitize=address,undefined (KILN_SANITIZE, no recovery: any
#    report aborts and fails its test); every test of `make test` but the slow or install-based ones
#    (the full ONNX suite, embed.install, demo.script, chains.long_chain, the bench tests, the
#    Python tests: see below), then a
#    220-case sample of the ONNX suite covering every op (tests/onnx/sanitize_cases.txt). The
#    environment sets KILN_SANITIZE=address,undefined, so the generated kernels, wrappers and
#    model libraries are compiled with the same sanitizers.
# 2. build-tsan: ThreadSanitizer over the code cache's tests (parallel compiles, processes) and
#    over model libraries compiled with KILN_SANITIZE=thread, run from several threads at once
#    (tests/sanitize/concurrent_runs.cpp).
# Each code cache is fresh (under the build directory), so every kernel is compiled sanitized.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
JOBS="${JOBS:-$(nproc)}"
DATA=/usr/share/libonnx-testdata/data
SUPPRESS="$ROOT/tests/sanitize"

# -O1 -g (and assertions on): the usual sanitizer build, quicker to compile than -O2.
configure() {  # configure DIR SANITIZERS
  if [ ! -f "$1/build.ninja" ]; then
    cmake -S "$ROOT" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DKILN_SANITIZE="$2"
  fi
}

# --- AddressSanitizer + UndefinedBehaviorSanitizer ------------------------------------------
ASAN_DIR="$ROOT/build-asan"
configure "$ASAN_DIR" address,undefined
# Every target: a list of test executables here went stale as tests were added.
cmake --build "$ASAN_DIR" -j "$JOBS"
export KILN_SANITIZE=address,undefined
# Leaks are checked too (tests/sanitize/lsan.supp would name any allocation to ignore).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
# intercept_tls_get_addr=0: GCC 12's LeakSanitizer crashes at exit ("Tracer caught signal 11")
# on a dlopen'ed library's dynamic TLS block that glibc malloc'ed at a page offset of 16; see
# tests/sanitize/lsan.supp for the evidence. Dynamic TLS is then not scanned for pointers.
export LSAN_OPTIONS="suppressions=$SUPPRESS/lsan.supp:print_suppressions=0:intercept_tls_get_addr=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export KILN_CACHE_DIR="$ASAN_DIR/test-tmp/sanitize-cache"
rm -rf "$KILN_CACHE_DIR"
# python.*: the Python module would be loaded into an uninstrumented interpreter, which the
# ASan runtime refuses (it must come first in the process); the module's C++ is the C API's,
# which the aot, api and names tests cover here.
(cd "$ASAN_DIR" && ctest --output-on-failure -j "$JOBS" \
  -E '^(onnx\.suite|embed\.install|demo\.script|chains\.long_chain|bench\.|python\.)')
rm -rf "$ASAN_DIR/test-tmp/sanitize-suite-cache"
# node/ cases from the ONNX 1.23 node suite beside the tree (skipped, with a line saying so,
# where it is absent), as `make test` runs them.
"$ASAN_DIR/bin/kiln_onnx_runner" "$DATA" "$ASAN_DIR/test-tmp/sanitize-suite-cache" \
  --node-suite "$ROOT/../shared/onnx-node-suite" \
  --cases "$ROOT/tests/onnx/sanitize_cases.txt" --core "$ROOT/tests/onnx/core_cases.txt" \
  --jobs "$JOBS" | tail -n 40

# --- ThreadSanitizer -----------------------------------------------------------------------
# The compiler's own threads (parallel compiles, process spawning: the code cache tests) and
# model libraries run from several threads at once (kiln_concurrent_runs on two libraries
# compiled with KILN_SANITIZE=thread by build-asan's kiln; autotuning off, since its benchmark
# helper, an ASan process, cannot load ThreadSanitizer code).
TSAN_DIR="$ROOT/build-tsan"
configure "$TSAN_DIR" thread
cmake --build "$TSAN_DIR" -j "$JOBS" --target kiln_codecache_tests kiln_concurrent_runs
unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
export KILN_SANITIZE=thread  # what the code cache tests compile is loaded into a TSan process
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$SUPPRESS/tsan.supp"
MODELS="$TSAN_DIR/test-tmp/concurrent-runs"
rm -rf "$MODELS" && mkdir -p "$MODELS"
/usr/bin/python3 "$ROOT/tests/aot/make_aot_models.py" "$MODELS" >/dev/null
for model in "$MODELS/conv_matmul.onnx" "$ROOT/examples/models/mlp.onnx"; do
  library="$MODELS/$(basename "$model" .onnx).so"
  env -u TSAN_OPTIONS "$ASAN_DIR/bin/kiln" compile "$model" -o "$library" \
    --autotune off --cache-dir "$MODELS/cache" >/dev/null
  for run_threads in 1 2; do
    "$TSAN_DIR/bin/kiln_concurrent_runs" "$library" "$run_threads"
  done
done
(cd "$TSAN_DIR" && ctest --output-on-failure -j "$JOBS" -R '^codecache\.')
echo "test-sanitize: all passed"
