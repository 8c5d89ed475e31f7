"""Fixtures of the Python tests (tests/python, run by ctest as python.*: see tests/CMakeLists.txt).

The kiln package comes from PYTHONPATH (BUILD_DIR/python for the build tree). Scratch files and
the code cache live under $KILN_PYTHON_TEST_DIR (ctest: BUILD_DIR/test-tmp/python), else a pytest
temporary directory; KILN_CACHE_DIR points there so that sessions and compiles without a
cache_dir do not touch the user's cache."""
import os
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

SCRATCH = os.environ.get("KILN_PYTHON_TEST_DIR") or tempfile.mkdtemp(prefix="kiln-python-tests-")
os.makedirs(SCRATCH, exist_ok=True)
os.environ["KILN_CACHE_DIR"] = os.path.join(SCRATCH, "cache")

import models  # noqa: E402  (after sys.path)


@pytest.fixture(scope="session")
def scratch():
    return SCRATCH


@pytest.fixture(scope="session")
def model_dir():
    directory = os.path.join(SCRATCH, "models")
    os.makedirs(directory, exist_ok=True)
    return directory


@pytest.fixture(scope="session")
def classifier_path(model_dir):
    return models.make_classifier(model_dir)


@pytest.fixture(scope="session")
def classifier(classifier_path):
    import kiln
    return kiln.compile(classifier_path)


@pytest.fixture(scope="session")
def dynamic(model_dir):
    import kiln
    return kiln.compile(models.make_dynamic(model_dir))


@pytest.fixture(scope="session")
def reduce_model(model_dir):
    import kiln
    return kiln.compile(models.make_reduce(model_dir), threads=1)
