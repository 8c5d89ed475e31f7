#!/usr/bin/env bash
# The internal-error path (forced by a developer switch): exit status 3 and a message saying
# it is a bug.
source "$(dirname "$0")/lib.sh"
make_model valid "$SCRATCH/valid.onnx"
export KILN_DEBUG_INTERNAL_ERROR=1
expect_error 3 '^kiln: internal error \(a bug in Kiln, please report it\): ' -- \
  info "$SCRATCH/valid.onnx"
