#!/usr/bin/env bash
# make fuzz: builds the libFuzzer targets of tests/fuzz with clang (AddressSanitizer and
# UndefinedBehaviorSanitizer, in BUILD_DIR, default build-fuzz), writes their seed corpora from the
# ONNX suite (tests/fuzz/make_seeds.py) and fuzzes each target for FUZZ_SECONDS seconds (default
# 60), FUZZ_JOBS worker processes each (default 1). New inputs go to BUILD_DIR/corpus/<target>,
# crashing inputs to BUILD_DIR/crashes/<target>/. Exits 1 when any target found a crash; turn each
# crash into a regression input (tests/fuzz/regressions/README.md).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${1:-$ROOT/build-fuzz}"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
FUZZ_JOBS="${FUZZ_JOBS:-1}"
DATA=/usr/share/libonnx-testdata/data

bash "$ROOT/scripts/setup.sh" --fuzz
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CXX=clang++ cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKILN_SANITIZE=address,undefined -DKILN_FUZZ=ON
fi
cmake --build "$BUILD_DIR" --target kiln_fuzzers -j "${JOBS:-$(nproc)}"
if [ ! -f "$BUILD_DIR/seeds/.done" ]; then
  rm -rf "$BUILD_DIR/seeds"
  /usr/bin/python3 "$ROOT/tests/fuzz/make_seeds.py" "$DATA" "$BUILD_DIR/seeds"
  touch "$BUILD_DIR/seeds/.done"
fi

# A leak in one input is a finding too (libFuzzer's -detect_leaks, on by default).
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
found=0
for source in "$ROOT"/tests/fuzz/*_fuzzer.cpp; do
  target="$(basename "$source" _fuzzer.cpp)"
  binary="$BUILD_DIR/bin/kiln_${target}_fuzzer"
  corpus="$BUILD_DIR/corpus/$target"
  crashes="$BUILD_DIR/crashes/$target"
  mkdir -p "$corpus" "$crashes"
  echo "fuzz: $target for ${FUZZ_SECONDS}s, $FUZZ_JOBS job(s)"
  log="$BUILD_DIR/fuzz-$target.log"
  (cd "$crashes" && "$binary" -max_total_time="$FUZZ_SECONDS" -fork="$FUZZ_JOBS" \
    -ignore_crashes=1 -timeout=20 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -artifact_prefix="$crashes/" "$corpus" "$BUILD_DIR/seeds/$target") >"$log" 2>&1 || true
  grep -E "^#[0-9]+" "$log" | tail -1 || true  # the last status line: executions, coverage, crashes
  n=$(find "$crashes" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'oom-*' \
    -o -name 'timeout-*' \) | wc -l)
  echo "fuzz: $target: $n crashing input(s) in $crashes (log: $log)"
  [ "$n" -eq 0 ] || found=1
done
exit "$found"
