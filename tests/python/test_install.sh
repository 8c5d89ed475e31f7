#!/usr/bin/env bash
# The kiln package installed the two ways README "Python" gives, each then used outside the source
# tree without PYTHONPATH pointing into the build: the installed package compiles a model (the
# compiler finds its runtime headers beside the installed libkiln.so) and its outputs match
# numpy's (rtol 1e-4, atol 1e-5).
#   make install: `cmake --install` into a scratch prefix (what `make install` runs after
#     building); the package in PREFIX/lib/python3.X/dist-packages finds PREFIX/lib/libkiln.so.
#   pip install .: offline, into a fresh virtual environment that sees Debian's packages; setup.py
#     reuses this build tree (KILN_BUILD_DIR); the package holds kiln, libkiln.so and the headers.
# Arguments: $1 = build directory, $2 = source directory, $3 = scratch directory.
set -euo pipefail
BUILD="$(realpath "$1")"
SOURCE="$(realpath "$2")"
SCRATCH="$3"
PYTHON=/usr/bin/python3
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH" && SCRATCH="$(realpath "$SCRATCH")"
SITE="lib/python$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')/dist-packages"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# check_installed PYTHON PACKAGE_PREFIX [ENV...]: imports kiln with PYTHON (from a scratch folder)
# and checks that it comes from PACKAGE_PREFIX, then compiles and runs the test classifier.
check_installed() {
  local python="$1" where="$2"
  shift 2
  mkdir -p "$SCRATCH/run" && cd "$SCRATCH/run"
  env -u PYTHONPATH KILN_CACHE_DIR="$SCRATCH/cache" KILN_TESTS_PYTHON="$SOURCE/tests/python" \
    KILN_EXPECTED_PACKAGE="$where" "$@" "$python" - <<'PY'
import os
import sys

import numpy as np

import kiln

package = os.path.dirname(kiln.__file__)
assert package.startswith(os.environ["KILN_EXPECTED_PACKAGE"]), \
    f"kiln imported from {package}, expected under {os.environ['KILN_EXPECTED_PACKAGE']}"
sys.path.insert(0, os.environ["KILN_TESTS_PYTHON"])
import models  # noqa: E402

model = kiln.compile(models.make_classifier(os.getcwd()))
x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
outputs = model.run({"x": x})
expected = models.reference_classifier(x)
np.testing.assert_allclose(outputs["probs"], expected["probs"], rtol=1e-4, atol=1e-5)
np.testing.assert_array_equal(outputs["label"], expected["label"])
print("installed kiln", kiln.__version__, "from", package, "ok")
PY
}

# --- make install ----------------------------------------------------------------------------
PREFIX="$SCRATCH/prefix"
cmake --install "$BUILD" --prefix "$PREFIX" >"$SCRATCH/install.log" 2>&1 ||
  { cat "$SCRATCH/install.log"; fail "cmake --install"; }
[ -f "$PREFIX/$SITE/kiln/__init__.py" ] || fail "no package in $PREFIX/$SITE/kiln"
check_installed "$PYTHON" "$PREFIX/$SITE/kiln" PYTHONPATH="$PREFIX/$SITE" ||
  fail "the package make install installs"

# --- pip install . ---------------------------------------------------------------------------
"$PYTHON" -m venv --system-site-packages "$SCRATCH/venv" || fail "python3 -m venv"
(cd "$SOURCE" && KILN_BUILD_DIR="$BUILD" "$SCRATCH/venv/bin/pip" install --no-build-isolation \
  --no-index --quiet .) >"$SCRATCH/pip.log" 2>&1 || { cat "$SCRATCH/pip.log"; fail "pip install ."; }
VENV_PACKAGE="$SCRATCH/venv/$(sed 's/dist-packages/site-packages/' <<<"$SITE")/kiln"
for part in lib/libkiln.so.0.1 bin/kiln share/kiln/runtime/kiln_rt.h include/kiln/runtime.h; do
  [ -e "$VENV_PACKAGE/$part" ] || fail "the pip-installed package lacks $part"
done
rm -rf "$SCRATCH/cache"  # a cold compile: the headers must come from the package
check_installed "$SCRATCH/venv/bin/python" "$VENV_PACKAGE" || fail "the pip-installed package"
echo "PASS"
