#pragma once
/// Convolution algorithm selection, after lowering (so that BatchNormalization has folded into the
/// convolution's weight and bias, lower/norm.cpp) and before template epilogue fusion: every
/// float32 2-D convolution of group 1 or depthwise (group == C) with static sizes, a contiguous
/// input and a constant weight and bias gets a ConvChoice (autotune/conv_choice.h) through
/// select_conv, in the options' autotune mode. A oneDNN choice leaves the call as it was (the
/// runtime's ConvSite, with Relu post-ops). Any other choice's prepared weight (and bias) becomes a
/// new constant, the call's inputs become [X, prepared], and the choice itself goes into the call
/// (ir::ConvCall::choice): its problem and config say what the wrapper renders and how the
/// interpreter reads the prepared weight; the template's epilogues then fuse into it
/// (sched/template_epilogue.h). Other grouped, 1-D and 3-D convolutions stay with oneDNN.
///
/// Tests: tests/golden (Conv -> BatchNormalization -> Relu -> Add as one call; the template at
/// awkward sizes against a reference).

#include "ir/buffer.h"
#include "lower/lowering.h"

namespace kiln::lower {

/// Rewrites `program`'s top-level convolutions in place; returns how many got a choice other
/// than oneDNN.
int select_conv_choices(ir::Program& program, const LoweringOptions& options);

}  // namespace kiln::lower
