#!/usr/bin/env bash
# Installs the Debian packages Kiln needs to build and test. Idempotent and quick when all is
# present: it asks dpkg first and only calls apt-get for what is missing. With --fuzz it also
# installs what `make fuzz` needs.
set -euo pipefail

packages=(
  g++ cmake ninja-build make pkg-config
  libonnx-dev libprotobuf-dev protobuf-compiler
  libopenblas-openmp-dev libdnnl-dev libsleef-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libonnx-testdata python3-numpy python3-onnx
  python3-dev pybind11-dev python3-pybind11 python3-pytest
  python3-venv python3-pip python3-setuptools python3-wheel
)
# `make fuzz` (scripts/fuzz.sh) builds with clang and links libFuzzer from clang's runtime
# libraries (its CMake configure also needs clang's OpenMP, libomp-dev); `make test-sanitize`
# needs nothing more (g++ brings its sanitizer runtimes).
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-dev libomp-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
