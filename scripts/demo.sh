#!/usr/bin/env bash
# The demo: what Kiln sees in the bundled example model. Usage: scripts/demo.sh [BUILD_DIR]
set -euo pipefail
BUILD_DIR="${1:-build}"
cd "$(dirname "$0")/.."
echo "\$ $BUILD_DIR/bin/kiln info examples/models/mlp.onnx"
"$BUILD_DIR/bin/kiln" info examples/models/mlp.onnx
