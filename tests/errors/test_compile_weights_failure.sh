#!/usr/bin/env bash
# `kiln compile --weights external` whose last step (building the model's library) fails: the C++
# compiler is a script that fails only the model_api unit, after the kernels have built and the
# weights have been written. kiln exits 2, and neither a weights file nor its temporary is left
# beside the output; a library and weights from an earlier compile stay as they were, and still
# load and run.
source "$(dirname "$0")/run_lib.sh"
run_model gather "$SCRATCH/m.onnx"
make_array "$SCRATCH/x.npy" "np.array([0, 2, 4], dtype=np.int64)"
cat >"$SCRATCH/fake-cxx" <<'SH'
#!/bin/sh
for arg in "$@"; do
  case "$arg" in
    *model_api*)
      echo "model_api.cpp:1:1: error: fake failure injected by test_compile_weights_failure" >&2
      exit 1
      ;;
  esac
done
exec g++ "$@"
SH
chmod +x "$SCRATCH/fake-cxx"
out="$SCRATCH/out"
mkdir -p "$out"
CXX="$SCRATCH/fake-cxx" "$KILN" compile "$SCRATCH/m.onnx" --weights external -o "$out/m.so" \
  --cache-dir "$CACHE" >"$SCRATCH/stdout" 2>"$SCRATCH/stderr"
status=$?
cat "$SCRATCH/stderr"
[ "$status" -eq 2 ] || fail "expected exit status 2, got $status"
grep -q 'fake failure injected' "$SCRATCH/stderr" || fail "the compiler's error is not quoted"
leftover=$(ls -A "$out")
[ -z "$leftover" ] || fail "a failed compile left files: $leftover"

# An earlier, good compile, then a failing one: the good library and weights are untouched.
"$KILN" compile "$SCRATCH/m.onnx" --weights external -o "$out/m.so" --cache-dir "$CACHE" \
  >/dev/null || fail "the model does not compile with the real compiler"
before=$(cksum "$out/m.so" "$out/m.weights")
CXX="$SCRATCH/fake-cxx" "$KILN" compile "$SCRATCH/m.onnx" --weights external -o "$out/m.so" \
  --cache-dir "$CACHE/other" >/dev/null 2>&1 && fail "the second compile should have failed"
[ "$(cksum "$out/m.so" "$out/m.weights")" = "$before" ] || fail "a failed compile changed the files"
[ "$(ls -A "$out" | sort | tr '\n' ' ')" = "m.so m.weights " ] ||
  fail "unexpected files: $(ls -A "$out")"
"$KILN" run "$out/m.so" --input "idx=$SCRATCH/x.npy" --output-dir "$SCRATCH/y" >/dev/null ||
  fail "the earlier library does not run beside its weights"
echo ok
