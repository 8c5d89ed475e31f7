#pragma once
// The graph-level mixed-precision pass of `--precision fp16|bf16` on CUDA (as autocast does):
// float32 activations stored as float16 or bfloat16, float32 weights converted when compiling,
// the model's inputs and outputs float32 at the boundary. docs/cuda.md ("Half precision") lists
// which ops run in which precision.

#include <optional>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace kiln::lower {

/// What the pass changed, for tests and the compile report.
struct MixedPrecisionReport {
  std::vector<std::string> half_values;  // values now stored in the half type, in node order
  int casts = 0;                         // Cast nodes inserted
  int converted_weights = 0;             // float32 initializers converted when compiling
  int folded_batch_norms = 0;            // BatchNormalizations folded into the Conv before them
  std::string skipped;                   // why the model was left as it is ("" when it was not)
};

/// The model with its float32 compute in `half` (kFloat16 or kBFloat16):
/// - MatMul, Gemm, Conv and ConvTranspose take every float32 input in `half` (the library calls
///   accumulate in float32);
/// - data-movement and simple pointwise ops (Relu, Add, Mul, Reshape, Transpose, Concat,
///   MaxPool, ...) run in `half` when every float input that is not a weight already is, else
///   in float32 (autocast's "widest type");
/// - every other op (reductions, Softmax, normalizations, Exp/Log/Pow/Erf/Sqrt, ops with
///   integer or shape semantics, ops not known to the pass) reads float32: a half input is cast
///   back first, and its outputs stay float32.
/// A BatchNormalization (inference) right after a Conv with float32 weights folds into the
/// convolution's weight and bias first, in float32. Integer, bool and float64 values are never
/// touched. A Cast to float32 is inserted before each
/// model output that became half, so the outputs keep their names and types. Models with
/// control flow (If, Loop, Scan) are not converted: nullopt, with report->skipped saying why.
/// Values whose dtype is unknown (no declared type and none derived by the pass) are left as
/// they are, and the ops reading them compute in their original precision.
std::optional<graph::Model> to_mixed_precision(const graph::Model& model, graph::DType half,
                                               MixedPrecisionReport* report = nullptr);

}  // namespace kiln::lower
