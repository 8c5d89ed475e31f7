#!/usr/bin/env bash
# Embedding a compiled model (issue 6, item 5): installs Kiln from the build tree into a scratch
# prefix, moves the prefix elsewhere (the install is relocatable: the compiler finds its runtime
# headers beside itself), builds examples/embed against it with find_package(kiln), compiles a
# model with MatMul, Conv and a symbolic batch with the installed `kiln compile` (embedded and
# external weights), copies each library (and its .weights) to another directory, runs it there
# with embed_run, and compares with `kiln run` on the same inputs: floats within
# np.allclose(rtol=1e-5, atol=1e-6), integers equal (compare_outputs.py). Also: ldd shows no Kiln
# library in the model library or in embed_run, kiln::compile (embed_compile, libkiln.so) builds
# and runs the same model, and a bad model through kiln::compile is a kiln::Error.
# Arguments: $1 = build dir, $2 = source dir, $3 = scratch directory.
set -uo pipefail
BUILD="$1"
SOURCE="$2"
SCRATCH="$3"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON=/usr/bin/python3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
SCRATCH="$(cd "$SCRATCH" && pwd)"
CACHE="$SCRATCH/cache"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { echo "== $* ($SECONDS s)"; }

step "install into a scratch prefix, then move it"
cmake --install "$BUILD" --prefix "$SCRATCH/staging" >"$SCRATCH/install.log" 2>&1 ||
  { cat "$SCRATCH/install.log"; fail "cmake --install failed"; }
mv "$SCRATCH/staging" "$SCRATCH/prefix"
PREFIX="$SCRATCH/prefix"
for f in bin/kiln lib/libkiln.so include/kiln/runtime.h include/kiln/kiln.h \
  share/kiln/runtime/kiln_rt_api.h lib/cmake/kiln/kilnConfig.cmake \
  lib/cmake/kiln/kilnConfigVersion.cmake lib/cmake/kiln/kilnTargets.cmake; do
  [ -e "$PREFIX/$f" ] || fail "not installed: $f"
done
KILN="$PREFIX/bin/kiln"

step "build examples/embed against the installed package"
cmake -S "$SOURCE/examples/embed" -B "$SCRATCH/embed-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" >"$SCRATCH/embed-configure.log" 2>&1 ||
  { cat "$SCRATCH/embed-configure.log"; fail "configuring examples/embed failed"; }
cmake --build "$SCRATCH/embed-build" >"$SCRATCH/embed-build.log" 2>&1 ||
  { cat "$SCRATCH/embed-build.log"; fail "building examples/embed failed"; }
grep -q "warning" "$SCRATCH/embed-build.log" && { cat "$SCRATCH/embed-build.log"; fail "warnings"; }
EMBED_RUN="$SCRATCH/embed-build/embed_run"
EMBED_COMPILE="$SCRATCH/embed-build/embed_compile"
# grep without -q below: it reads all of ldd's output, where grep -q may exit at its first match
# while ldd still writes, and ldd's SIGPIPE then fails the pipeline under pipefail.
ldd "$EMBED_RUN" | grep libkiln >/dev/null && { ldd "$EMBED_RUN"; fail "embed_run links a Kiln library"; }
ldd "$EMBED_COMPILE" | grep "libkiln.so.* => $PREFIX/lib/" >/dev/null ||
  { ldd "$EMBED_COMPILE"; fail "embed_compile does not load the installed libkiln.so"; }

"$PYTHON" "$HERE/make_embed_model.py" "$SCRATCH/model" || fail "make_embed_model.py failed"
MODEL="$SCRATCH/model/model.onnx"

step "kiln run (the reference), batch 3 and 1"
for b in 3 1; do
  "$KILN" run "$MODEL" --input "x=$SCRATCH/model/x_b$b.npy" --output-dir "$SCRATCH/ref_b$b" \
    --cache-dir "$CACHE" --autotune off >"$SCRATCH/ref_b$b.log" 2>&1 ||
    { cat "$SCRATCH/ref_b$b.log"; fail "kiln run failed"; }
done

# compile_and_ship WEIGHTS: compiles with the installed kiln, copies the library (and weights)
# to a fresh directory, removes the originals, runs embed_run there at batch 3 and 1, compares.
compile_and_ship() {
  local weights="$1"
  local built="$SCRATCH/built-$weights" ship="$SCRATCH/ship-$weights"
  step "kiln compile --weights $weights, copied to another directory"
  KILN_LOG=compile "$KILN" compile "$MODEL" -o "$built/model.so" --weights "$weights" \
    --cache-dir "$CACHE" --autotune off >"$built.log" 2>&1 ||
    { cat "$built.log"; fail "kiln compile --weights $weights failed"; }
  # The installed compiler uses the headers installed beside it, not the source tree's.
  grep -q "runtime headers: $PREFIX/share/kiln/runtime" "$built.log" ||
    { cat "$built.log"; fail "the installed kiln does not use $PREFIX/share/kiln/runtime"; }
  grep -q "public headers: $PREFIX/include" "$built.log" ||
    { cat "$built.log"; fail "the installed kiln does not use $PREFIX/include"; }
  mkdir -p "$ship"
  cp "$built/model.so" "$ship/"
  if [ "$weights" = external ]; then
    [ -f "$built/model.weights" ] || fail "no model.weights beside the library"
    cp "$built/model.weights" "$ship/"
  fi
  rm -rf "$built"
  if ldd "$ship/model.so" | grep libkiln >/dev/null; then
    ldd "$ship/model.so"
    fail "the model library ($weights weights) depends on a Kiln library"
  fi
  for b in 3 1; do
    (cd "$ship" && "$EMBED_RUN" ./model.so "out_b$b" "x=$SCRATCH/model/x_b$b.npy") \
      >"$ship/run_b$b.log" 2>&1 || { cat "$ship/run_b$b.log"; fail "embed_run failed"; }
    "$PYTHON" "$HERE/compare_outputs.py" "$SCRATCH/ref_b$b" "$ship/out_b$b" ||
      fail "embed_run ($weights weights, batch $b) differs from kiln run"
  done
  # The signature, symbolic batch by name.
  grep -q "input  x: float32\[N, 3, 8, 8\]" "$ship/run_b3.log" &&
    grep -q "output y: float32\[N, 10\]" "$ship/run_b3.log" &&
    grep -q "output label: int64\[N\]" "$ship/run_b3.log" ||
    { cat "$ship/run_b3.log"; fail "embed_run printed an unexpected signature"; }
}
compile_and_ship embed
compile_and_ship external

step "kiln::compile through libkiln.so (embed_compile)"
"$EMBED_COMPILE" --cache-dir "$CACHE" --autotune off "$MODEL" "$SCRATCH/api/model.so" \
  "$SCRATCH/api/out" "x=$SCRATCH/model/x_b3.npy" >"$SCRATCH/api.log" 2>&1 ||
  { cat "$SCRATCH/api.log"; fail "embed_compile failed"; }
"$PYTHON" "$HERE/compare_outputs.py" "$SCRATCH/ref_b3" "$SCRATCH/api/out" ||
  fail "kiln::compile's model differs from kiln run"
ldd "$SCRATCH/api/model.so" | grep libkiln >/dev/null && fail "kiln::compile's library depends on Kiln"

step "kiln::compile of a bad model"
echo "not a model" >"$SCRATCH/bad.onnx"
"$EMBED_COMPILE" --cache-dir "$CACHE" "$SCRATCH/bad.onnx" "$SCRATCH/bad.so" "$SCRATCH/bad" \
  >"$SCRATCH/bad.log" 2>&1 && fail "embed_compile accepted a bad model"
grep -q "error (kiln status 1): .*bad.onnx" "$SCRATCH/bad.log" ||
  { cat "$SCRATCH/bad.log"; fail "expected KILN_ERROR_INVALID_ARGUMENT naming bad.onnx"; }

step "PASS"
