#!/usr/bin/env bash
# A generated source the C++ compiler refuses: CXX is a script that answers --version and
# -dumpmachine as g++ does (the code cache asks those first) and fails every real compile with a
# fake error. `kiln run` exits 2 (not 3, no crash) with a message that quotes the compiler's error
# and names the kept source, which exists and holds the generated code.
source "$(dirname "$0")/run_lib.sh"
run_model add_relu "$SCRATCH/m.onnx"
cat >"$SCRATCH/fake-cxx" <<'SH'
#!/bin/sh
for arg in "$@"; do
  case "$arg" in
    --version | -dumpmachine) exec g++ "$@" ;;
  esac
done
echo "kernel.cpp:3:7: error: fake failure injected by test_run_compiler_failure" >&2
exit 1
SH
chmod +x "$SCRATCH/fake-cxx"
CXX="$SCRATCH/fake-cxx" "$KILN" run "$SCRATCH/m.onnx" --output-dir "$SCRATCH" \
  --cache-dir "$CACHE" >"$SCRATCH/stdout" 2>"$SCRATCH/stderr"
status=$?
cat "$SCRATCH/stderr"
[ "$status" -eq 2 ] || fail "expected exit status 2, got $status"
head -n 1 "$SCRATCH/stderr" | grep -qE '^kiln: error: compiling generated code failed' ||
  fail "the first line does not say that compiling failed"
grep -q 'fake failure injected by test_run_compiler_failure' "$SCRATCH/stderr" ||
  fail "the compiler's error is not quoted"
kept="$(sed -nE 's/^source kept at (.*)$/\1/p' "$SCRATCH/stderr")"
[ -n "$kept" ] || fail "the message does not name the kept source"
case "$kept" in
  "$CACHE"/*) ;;
  *) fail "the kept source $kept is not in the cache $CACHE" ;;
esac
[ -f "$kept" ] || fail "the kept source $kept does not exist"
grep -q 'kiln_run' "$SCRATCH"/cache/*/*.failed/*.cpp || fail "no kept source defines kiln_run"
[ ! -e "$SCRATCH/y.npy" ] || fail "a failed compile wrote an output"
# With the real compiler the same model builds and runs.
"$KILN" run "$SCRATCH/m.onnx" --output-dir "$SCRATCH" --cache-dir "$CACHE" >/dev/null ||
  fail "the model does not run with the real compiler"
echo ok
