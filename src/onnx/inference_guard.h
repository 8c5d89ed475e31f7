#pragma once
/// A schema registry for ONNX shape inference that checks, before an op's own inference function
/// runs, the preconditions ONNX 1.12's functions assume without checking: a stride of 0 divides
/// by zero in the convolution and pooling inference, a data input of the wrong rank indexes past
/// its dims (Conv, QLinearConv, Gemm, STFT, ...). Found by fuzzing the importer
/// (tests/fuzz/onnx_import_fuzzer.cpp; the inputs are in tests/fuzz/regressions/onnx_import/).
///
/// The importer passes guarded_schema_registry() to onnx::shape_inference::InferShapes. A
/// refused node stops its own inference (ONNX records the error and goes on, as with any
/// inference error in non-strict mode); take_guard_failure() then returns the first refusal
/// of this thread, which the importer reports as a UserError.
/// Tests: tests/unit/onnx/importer_test.cpp (InferenceGuard*), tests/fuzz/test_regressions.sh.

#include <onnx/defs/schema.h>

#include <optional>
#include <string>

namespace kiln::onnx {

/// What the guard refused: the op type and why ("attribute 'strides' holds 0 ...").
struct GuardFailure {
  std::string op_type;
  std::string problem;
};

/// The registry of every ONNX schema, each op the guard knows given an inference function that
/// checks its preconditions first. A default-domain node whose inference fails leaves its outputs'
/// types unknown (ONNX 1.12 would keep what the function wrote before failing). Thread-safe; lives
/// for the process.
const ::onnx::ISchemaRegistry* guarded_schema_registry();

/// The first refusal since the last call on this thread, if any, and forgets it.
std::optional<GuardFailure> take_guard_failure();

}  // namespace kiln::onnx
