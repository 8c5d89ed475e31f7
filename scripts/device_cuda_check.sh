#!/bin/bash
# Runs a sample of the ONNX node suite with --device cuda on a machine with an NVIDIA GPU and
# compares every output with the suite's expected one (the runner's tolerances), printing per
# case and in total how many passed. Run from a Kiln build tree:
#   scripts/device_cuda_check.sh [BUILD_DIR] [CASES_FILE] [DATA_DIR]
# BUILD_DIR defaults to build, CASES_FILE to the core cases, DATA_DIR to the suite's.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
cases=${2:-$here/tests/onnx/core_cases.txt}
data=${3:-/usr/share/libonnx-testdata/data}
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device"
  exit 0
fi
nvidia-smi -L
exec "$build/bin/kiln_onnx_runner" "$data" "$cache" --cases "$cases" --core "$cases" \
  --exclusions "$here/tests/onnx/exclusions.txt" --device cuda --jobs "$(nproc)"
