#pragma once
/// The epilogue of a GEMM template kernel (autotune/gemm_template.h) written from the pointwise
/// body fused into it (sched/template_epilogue.h): one C++ expression over `v` (the product's
/// element at row m, column n), `m`, `n` and the buffers the body loads, which become the
/// kernel's extra pointer arguments (named e0, e1, ... so that equal epilogues read the same).
/// The expression is an immediately
/// invoked lambda holding one statement per op of the body. Where every op has one, the same
/// body is also written a vector at a time (TemplateEpilogue::vector_expr), which the GEMM
/// template applies in registers.

#include <optional>
#include <string>
#include <vector>

#include "autotune/gemm_template.h"
#include "ir/buffer.h"

namespace kiln::codegen {

struct EpilogueCode {
  autotune::TemplateEpilogue epilogue;  // its pointer arguments are named e0, e1, ...
  std::vector<std::string> buffers;     // the buffer each argument points to
};

/// Why `consumer`, the only reader of the GEMM or convolution choice call `product`, cannot be
/// its epilogue, or "" when it can: the one rule (CppBackend::template_epilogue_refusal gives
/// it to the scheduler). An epilogue is a float32 pointwise body over the product's shape and
/// loops, reading the product elementwise, with static inner batch dims, unmasked affine loads
/// of float32 buffers, one contiguous store and ops with a scalar C++ form.
std::string epilogue_refusal(const ir::Program& program, const ir::Buffer& product,
                             const ir::Buffer& consumer);

/// Why `producer` cannot be fused into `consumer`, the convolution choice call that reads it as
/// X, as its prologue (CppBackend::conv_prologue_refusal, sched/template_epilogue.h
/// fuse_conv_prologues), or "". A convolution choice call: the consumer's choice takes the
/// producer's (ConvChoice::prologue_refusal), the producer's epilogue reads no buffer and no
/// index (the fused function computes it a row at a time), and the producer's output is at least
/// kMinPrologueBytes (a smaller one stays in the caches between the two calls, and the fused
/// function computes a run's first rows twice). A pointwise buffer: see input_scale_operands.
std::string prologue_refusal(const ir::Program& program, const ir::Buffer& producer,
                             const ir::Buffer& consumer);

/// The operands of `buffer` when it is X times a per-channel scale of a channels-last image: a
/// float32 pointwise body over [N, H, W, C] that multiplies a load of x at its own element by a
/// load of s at n * C + c (a squeeze-excitation gate) and stores the product; nullopt otherwise.
/// prologue_refusal lets such a buffer into a pointwise convolution that reads it as X
/// (ConvChoice::takes_input_scale), for one image with at least 4 pixels per output channel.
struct InputScale {
  ir::View x, s;
};
std::optional<InputScale> input_scale_operands(const ir::Program& program,
                                               const ir::Buffer& buffer);

/// Rewrites `consumer`, the only reader of `product`, into `product`'s oneDNN convolution call
/// when it applies an activation to it (sched/conv_epilogue_match.h: Relu, Clip, Sigmoid, ...,
/// each an eltwise post-op of oneDNN's, applied in registers before the store). A residual Add
/// stays a kernel: oneDNN's binary add post-op runs 1.5-4.5x slower than the convolution plus a
/// separate kernel on its plain-layout path (bench/conv_block_bench.cpp). True when it did.
bool fuse_onednn_post_ops(const ir::Program& program, const ir::Buffer& product,
                          ir::Buffer& consumer);

/// `fused`: the buffer the template computes, with the bodies of its call's epilogue_chain, then
/// its own body, as its epilogue (each reads the previous one's value by the name in its call's
/// `product`). Each body passed epilogue_refusal when it fused; anything else is a bug.
EpilogueCode epilogue_code(const ir::Buffer& fused);

}  // namespace kiln::codegen
