# Shared helpers for tests/errors/test_*.sh (sourced). Each test gets $1 = kiln binary and
# $2 = scratch directory.
set -uo pipefail
KILN="$1"
SCRATCH="$2"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON=/usr/bin/python3  # Debian's python3 with python3-onnx, not a pyenv one
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

make_model() {  # make_model CASE OUT
  "$PYTHON" "$HERE/make_bad_model.py" "$1" "$2" || fail "could not generate model '$1'"
}

# expect_error STATUS PATTERN... -- ARGS: runs kiln ARGS, checks the exit status, that stderr is
# exactly one line, and that it matches every PATTERN (grep -E).
expect_error() {
  local status="$1"
  shift
  local patterns=()
  while [ "$1" != "--" ]; do
    patterns+=("$1")
    shift
  done
  shift
  "$KILN" "$@" >"$SCRATCH/stdout" 2>"$SCRATCH/stderr"
  local got=$?
  echo "kiln $*  -> exit $got"
  cat "$SCRATCH/stderr"
  [ "$got" -eq "$status" ] || fail "expected exit status $status, got $got"
  [ "$(wc -l <"$SCRATCH/stderr")" -eq 1 ] || fail "expected one line on stderr"
  for p in "${patterns[@]}"; do
    grep -qE -- "$p" "$SCRATCH/stderr" || fail "stderr does not match '$p'"
  done
  echo "ok"
}
