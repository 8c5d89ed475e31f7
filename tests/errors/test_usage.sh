#!/usr/bin/env bash
# The happy path and usage: --help and --version exit 0, info on a valid model exits 0 and
# prints its inputs, a missing subcommand or unknown option exits 2.
source "$(dirname "$0")/lib.sh"
"$KILN" --help >"$SCRATCH/help" || fail "--help failed"
grep -q info "$SCRATCH/help" || fail "--help does not list info"
"$KILN" --version | grep -qE '^kiln [0-9]+\.[0-9]+' || fail "--version"
make_model valid "$SCRATCH/valid.onnx"
"$KILN" info "$SCRATCH/valid.onnx" >"$SCRATCH/info" || fail "info on a valid model failed"
cat "$SCRATCH/info"
grep -qE '^  x +float32\[2\]' "$SCRATCH/info" || fail "info does not show input x"
grep -q 'every op is supported' "$SCRATCH/info" || fail "info does not say Relu is supported"
make_model custom_op "$SCRATCH/custom.onnx"
"$KILN" info "$SCRATCH/custom.onnx" >"$SCRATCH/info_custom" || fail "info on a custom-op model failed"
grep -q 'not compilable yet.*com.example' "$SCRATCH/info_custom" || fail "info does not list unsupported ops"
"$KILN" >/dev/null 2>&1
[ $? -eq 2 ] || fail "no subcommand should exit 2"
"$KILN" info --no-such-option x.onnx >/dev/null 2>&1
[ $? -eq 2 ] || fail "an unknown option should exit 2"
echo ok
