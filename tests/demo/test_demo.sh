#!/usr/bin/env bash
# The whole demo (scripts/demo.sh, what `make demo` runs after building) against the test build,
# with a fresh code cache named by a relative path, as `make demo` names build/demo-cache: it
# must exit 0 and show that the library was built, loaded and benchmarked.
# Arguments: $1 = build directory, $2 = repository root, $3 = scratch directory.
set -uo pipefail
BUILD_DIR="$(realpath "$1")"
ROOT="$(realpath "$2")"
SCRATCH="$3"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
SCRATCH="$(realpath "$SCRATCH")"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
expect_line() {  # expect_line PATTERN: some line of the demo's output matches (grep -E)
  grep -qE -- "$1" "$SCRATCH/demo.txt" || fail "no line of the demo's output matches '$1'"
}

# demo.sh works from the repository root; the cache is named relative to it.
CACHE="$(realpath --relative-to="$ROOT" "$SCRATCH/demo cache")"
KILN_DEMO_CACHE="$CACHE" KILN_DEMO_REPEAT=2 bash "$ROOT/scripts/demo.sh" "$BUILD_DIR" \
  >"$SCRATCH/demo.txt" 2>&1
status=$?
cat "$SCRATCH/demo.txt"
[ "$status" -eq 0 ] || fail "scripts/demo.sh exited with $status"
expect_line "code cache .* is empty: a cold compile"
expect_line "^compiled .*resnet18\.onnx: [0-9]+ kernels, [0-9]+ library calls, built"
expect_line "^first run \(warm-up\) [0-9.]+ ms; 2 timed runs"
expect_line "^library: .*resnet18\.so \(target auto\)"
expect_line "^weights: .* embedded"
expect_line "^loaded: the library .*resnet18\.so"
expect_line "^latency: min [0-9.]+ ms, p50"
expect_line "^profile: one run, [0-9]+ events"
[ -n "$(ls -A "$SCRATCH/demo cache")" ] || fail "the relative cache directory was not used"
echo "demo passed"
