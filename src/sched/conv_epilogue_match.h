#pragma once
/// The epilogue a convolution library call can apply itself: a pointwise reader of a
/// convolution's product that computes product [+ residual] [then an activation] elementwise.
/// Both backends fold such a reader into the call when their library takes it: cuDNN's graph
/// (codegen/cuda/cuda_conv.h: residual and activation) and oneDNN's post-ops on the CPU
/// (codegen/cpp/cpp_epilogue.h: the activation).
///
/// Tests: tests/models (conv_act: each activation a oneDNN post-op, against numpy).

#include <optional>

#include "ir/buffer.h"

namespace kiln::sched {

/// What `match_conv_epilogue` found: a residual buffer of the product's layout added first
/// (nullptr: none), then an activation with its parameters (ir::ConvCall's fields).
struct ConvEpilogueMatch {
  const ir::Buffer* residual = nullptr;
  ir::ConvActivation activation = ir::ConvActivation::kNone;
  double alpha = 0, beta = 0;
};

/// When `consumer` (a pointwise buffer of `product`'s dtype and sizes, both contiguous) stores,
/// at each element, product [+ residual] then an activation of it, loading the product (and the
/// residual) at that element only: what it computes. The activation is recognized by its tree of
/// ops over the loaded values and float32 constants in the forms lower/activation.cpp builds
/// (Relu, Sigmoid, Tanh, Clip with either bound or both, LeakyRelu, Elu, Gelu in both forms;
/// Swish and SiLU as x * Sigmoid(alpha x)). nullopt for any other body, and for a body that
/// stores the product unchanged. HardSigmoid and HardSwish are not recognized.
std::optional<ConvEpilogueMatch> match_conv_epilogue(const ir::Program& program,
                                                     const ir::Buffer& product,
                                                     const ir::Buffer& consumer);

}  // namespace kiln::sched
