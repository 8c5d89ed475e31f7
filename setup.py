"""Builds the kiln Python package for `pip install .` (pyproject.toml) with CMake.

The package is self-contained: kiln/ holds the Python half, the extension _kiln, and kiln itself
as CMake installs it (bin/kiln, lib/libkiln.so, share/kiln/runtime, include/kiln), which
libkiln.so finds beside itself. The CMake build tree is $KILN_BUILD_DIR when set (an existing
build, such as `make`'s build/, is reused as it is), else build/pip; $KILN_JOBS sets the
parallel jobs (default: every core) and $KILN_CMAKE_ARGS adds arguments to a new build's
configuration (such as -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)."""
import os
import shlex
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

SOURCE = os.path.dirname(os.path.abspath(__file__))


class BinaryDistribution(Distribution):
    """The wheel holds compiled code: tag it for this platform and Python."""

    def has_ext_modules(self):
        return True


def _cmake(*args):
    print("setup.py: cmake", " ".join(args), flush=True)
    subprocess.run(["cmake", *args], check=True)


def _tidy(package):
    """Leaves one copy of libkiln.so under its SONAME (what _kiln links) and drops what only
    serves C++ projects (the CMake package, the development symlink): wheels store symlinks as
    copies."""
    lib = os.path.join(package, "lib")
    shutil.rmtree(os.path.join(lib, "cmake"), ignore_errors=True)
    for name in sorted(os.listdir(lib)):
        path = os.path.join(lib, name)
        if not os.path.islink(path):
            continue
        target = os.path.realpath(path)
        os.unlink(path)
        if name.count(".so.") == 1 and name.split(".so.")[1].count(".") == 1:  # libkiln.so.X.Y
            shutil.copy2(target, path)
    for name in sorted(os.listdir(lib)):
        path = os.path.join(lib, name)
        if name.count(".so.") == 1 and name.split(".so.")[1].count(".") == 2:  # libkiln.so.X.Y.Z
            os.unlink(path)


class CMakeBuild(build_ext):
    """Builds and installs everything with CMake (the package declares no setuptools extensions:
    `build` runs build_ext because BinaryDistribution says it has some)."""

    def run(self):
        build_dir = os.environ.get("KILN_BUILD_DIR") or os.path.join(SOURCE, "build", "pip")
        build_dir = os.path.abspath(build_dir)
        jobs = os.environ.get("KILN_JOBS") or str(os.cpu_count() or 1)
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            _cmake("-S", SOURCE, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                   *shlex.split(os.environ.get("KILN_CMAKE_ARGS", "")))
        _cmake("--build", build_dir, "-j", jobs, "--target", "kiln", "kiln_shared", "kiln_python")
        package = os.path.join(os.path.abspath(self.build_lib), "kiln")
        shutil.rmtree(package, ignore_errors=True)
        _cmake("--install", build_dir, "--prefix", package, "--component", "Unspecified")
        _cmake("--install", build_dir, "--prefix", package, "--component", "python_bundle")
        _tidy(package)


os.makedirs(os.path.join(SOURCE, "build", "setuptools"), exist_ok=True)
setup(
    distclass=BinaryDistribution,
    cmdclass={"build_ext": CMakeBuild},
    packages=[],
    # setuptools' own build folder stays apart from CMake's build/lib.
    options={"build": {"build_base": os.path.join("build", "setuptools")},
             "egg_info": {"egg_base": os.path.join("build", "setuptools")}},
)
