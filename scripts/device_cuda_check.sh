#!/bin/bash
# Runs ONNX suite cases with --device cuda on a machine with an NVIDIA GPU and compares every
# output with the suite's expected one (the runner's tolerances: the core cases' stricter ones),
# printing per op and in total how many passed. Run from a Kiln build tree or from the bundle
# of scripts/device_bundle.sh (which puts this script beside the case lists):
#   scripts/device_cuda_check.sh [BUILD_DIR] [CASES_FILE] [DATA_DIR] [NODE_SUITE]
# SHARD=K/N runs every N-th case from the K-th (the runner's --shard), so that a suite too long
# for one session on the GPU machine can be run in parts that together cover it.
# BUILD_DIR defaults to build, CASES_FILE to the core cases, DATA_DIR to the ONNX 1.12 suite's,
# NODE_SUITE (the ONNX 1.23 node suite, whose cases the lists' node/ names) to
# ../shared/onnx-node-suite beside the checkout; "" runs DATA_DIR's node/ instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lists=$here
[ -f "$lists/exclusions.txt" ] || lists=$here/../tests/onnx
build=${1:-$here/../build}
cases=${2:-$lists/core_cases.txt}
data=${3:-/usr/share/libonnx-testdata/data}
node_suite=${4-$here/../../shared/onnx-node-suite}
node_flags=()
[ -n "$node_suite" ] && [ -d "$node_suite/node" ] && node_flags=(--node-suite "$node_suite")
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device"
  exit 0
fi
nvidia-smi -L
"$build/bin/kiln_onnx_runner" "$data" "$cache" --cases "$cases" --core "$lists/core_cases.txt" \
  --exclusions "$lists/exclusions.txt" --refusals "$lists/cuda_refusals.txt" "${node_flags[@]}" \
  --device cuda --jobs "$(nproc)" ${SHARD:+--shard "$SHARD"}
