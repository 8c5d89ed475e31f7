# Helpers of the `kiln run` error tests (tests/errors/test_run_*.sh), sourced after lib.sh's
# arguments: $1 = kiln binary, $2 = scratch directory. Every test compiles into a fresh code cache
# inside its scratch directory.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CACHE="$SCRATCH/cache"

run_model() {  # run_model CASE OUT.onnx (see make_run_model.py)
  "$PYTHON" "$HERE/make_run_model.py" "$1" "$2" || fail "could not generate model '$1'"
}

make_array() {  # make_array OUT.npy NUMPY_EXPRESSION
  "$PYTHON" "$HERE/make_run_model.py" array "$1" "$2" || fail "could not write array $1"
}

# expect_array FILE NUMPY_EXPRESSION: the .npy file holds exactly that array (dtype, shape,
# values).
expect_array() {
  "$PYTHON" - "$1" "$2" <<'PY' || fail "$1 does not hold $2"
import sys
import numpy as np
got, want = np.load(sys.argv[1]), np.asarray(eval(sys.argv[2], {"np": np}))
print(f"{sys.argv[1]}: {got.dtype}{list(got.shape)}")
sys.exit(0 if got.dtype == want.dtype and np.array_equal(got, want) else 1)
PY
}
