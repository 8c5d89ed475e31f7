#pragma once
/// Template epilogue fusion (as Inductor's scheduler fuses epilogues into templates): a pointwise
/// buffer that is the only reader of a GEMM call's product (extern "gemm": the C++ template, or a
/// library choice that applies the epilogue in a pass of its own), reads it elementwise and has its
/// shape becomes the call itself: its body is the call's epilogue, which the template applies
/// to each element of the product in registers before the one store (MatMul -> Add -> Gelu is
/// one kernel call, with no pass over the product in memory). Chains fuse one after another. The
/// fused buffer keeps its name; the product's buffer is gone. The other buffers the epilogue loads
/// become inputs of the call.
///
/// Tests: tests/golden (MatMul -> Add -> Gelu as one call), the ONNX suite.

#include "ir/buffer.h"
#include "sched/scheduler.h"

namespace kiln::sched {

/// Rewrites `program` in place; returns how many epilogues were fused. `backend` says which
/// readers its templates take as epilogues (Backend::template_epilogue_refusal).
int fuse_template_epilogues(ir::Program& program, const Backend& backend);

/// Convolution prologue fusion: a convolution choice call or a pointwise buffer whose only
/// reader is a convolution choice call, reading it as X with its layout, becomes that call's
/// prologue (ExternCall::prologue) where the backend takes the pair
/// (Backend::conv_prologue_refusal). On the CPU: a channels-last expansion (with its epilogue)
/// and the depthwise convolution after it become one function that never stores the expanded
/// activation; a squeeze-excitation gate's multiply before a 1x1 convolution scales its weight
/// instead of its input. Runs after fuse_template_epilogues, so the calls carry their epilogues.
/// Rewrites `program` in place; returns how many fused.
///
/// Tests: tests/models (MobileNet's blocks), tests/unit/autotune/nhwc_conv_template_test.cpp.
int fuse_conv_prologues(ir::Program& program, const Backend& backend);

/// The element index of `layout` at `body`'s loop variables, simplified under their ranges as
/// lowering simplified the body's own indices (a size-1 dim's variable drops out): a load at
/// it reads the element the body's iteration computes.
sym::Expr elementwise_index(const ir::Program& program, const ir::Layout& layout,
                            const ir::LoopBody& body);

}  // namespace kiln::sched
