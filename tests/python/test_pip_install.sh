#!/usr/bin/env bash
# `pip install .` of the kiln package, offline, into a fresh virtual environment that sees
# Debian's packages (README "Python"): setup.py reuses the build tree (KILN_BUILD_DIR), the wheel
# holds kiln, libkiln.so and the runtime headers; then, outside the source tree and without
# PYTHONPATH, the installed package compiles a model (a fresh code cache: the compiler finds its
# headers inside the package) and its outputs match numpy's (rtol 1e-4, atol 1e-5).
# Arguments: $1 = build directory, $2 = source directory, $3 = scratch directory.
set -euo pipefail
BUILD="$(realpath "$1")"
SOURCE="$(realpath "$2")"
SCRATCH="$3"
PYTHON=/usr/bin/python3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH" && SCRATCH="$(realpath "$SCRATCH")"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$PYTHON" -m venv --system-site-packages "$SCRATCH/venv" || fail "python3 -m venv"
(cd "$SOURCE" && KILN_BUILD_DIR="$BUILD" "$SCRATCH/venv/bin/pip" install --no-build-isolation \
  --no-index --quiet .) >"$SCRATCH/pip.log" 2>&1 || { cat "$SCRATCH/pip.log"; fail "pip install ."; }

cd "$SCRATCH"
env -u PYTHONPATH KILN_CACHE_DIR="$SCRATCH/cache" KILN_TESTS_PYTHON="$SOURCE/tests/python" \
  "$SCRATCH/venv/bin/python" - <<'PY' || fail "the installed package"
import os
import sys

import numpy as np

import kiln

package = os.path.dirname(kiln.__file__)
assert package.startswith(sys.prefix), f"kiln imported from {package}, not the venv {sys.prefix}"
for part in ("lib/libkiln.so.0.1", "bin/kiln", "share/kiln/runtime/kiln_rt.h",
             "include/kiln/runtime.h"):
    assert os.path.exists(os.path.join(package, part)), f"the package lacks {part}"
sys.path.insert(0, os.environ["KILN_TESTS_PYTHON"])
import models  # noqa: E402

model = kiln.compile(models.make_classifier(os.getcwd()))
assert not model.compile_info["cache_hit"]
x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
outputs = model.run({"x": x})
expected = models.reference_classifier(x)
np.testing.assert_allclose(outputs["probs"], expected["probs"], rtol=1e-4, atol=1e-5)
np.testing.assert_array_equal(outputs["label"], expected["label"])
print("pip-installed kiln", kiln.__version__, "from", package, "ok")
PY
echo "PASS"
