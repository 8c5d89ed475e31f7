#pragma once
/// Matrix products on the GPU (ir::MatMulCall under --device cuda) through cuBLASLt: the
/// pointwise consumers the backend fuses into the call as a cuBLASLt epilogue, and the
/// wrapper's call of kiln_rt_cuda.h's RunState::matmul. Lowering (lower/nn.cpp) gives every
/// float32/float64 MatMul and Gemm on CUDA as a MatMulCall over views cuBLASLt reads: a
/// transposed operand is the op's flag, broadcast batch dims a stride of 0.

#include <optional>
#include <string>
#include <vector>

#include "ir/buffer.h"
#include "ir/device.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

/// Rewrites `consumer`, the only reader of the matrix product `product`, into the product with
/// the consumer as its cuBLASLt epilogue when the consumer's body is one that cuBLASLt
/// computes: the product plus a bias vector over the last dim (Gemm's C of shape [N], MatMul
/// then Add) and/or a residual matrix of the product's shape (a transformer's Add of the
/// layer's input: cuBLASLt's C with beta 1, the output D apart), then nothing, a Relu or the
/// tanh form of Gelu (cuBLASLt's BIAS, RELU, RELU_BIAS, GELU, GELU_BIAS). Float32 only.
/// Returns false and leaves both alone otherwise.
bool fuse_matmul_epilogue(const ir::Program& program, const ir::Buffer& product,
                          ir::Buffer& consumer);

/// Writes the call computing `buffer`, a MatMulCall on the GPU. `site` numbers the call in the
/// wrapper (the run state keeps a plan per site); `precision` picks the compute type of float32
/// products; `label` names the call in a profiled run, which waits for it.
void write_cuda_matmul(IndentedBuffer& out, const ir::Buffer& buffer, int site,
                       ir::Precision precision, const std::string& label);

/// "1,128,768": integer dims joined by commas (kiln_rt_cuda.h's join_dims), or nothing when one
/// is symbolic: the dims of a problem text.
std::optional<std::string> integer_dims(const std::vector<sym::Expr>& dims);

/// A problem text's element and compute types (kiln_rt_cuda.h's element_text): "f32 tf32",
/// "f32 fp32", "f64 fp64", "f16 fp32" or "bf16 fp32".
std::string problem_element_text(graph::DType dtype, bool tf32);

/// The text that names `buffer`'s product (a MatMulCall on the GPU) in the autotune cache, as
/// kiln_rt_cuda.h's matmul_problem_text writes it at run time (autotune/cuda_choice.h), or
/// nothing when a size or stride is symbolic.
std::optional<std::string> cuda_matmul_problem(const ir::Buffer& buffer, ir::Precision precision);

}  // namespace kiln::codegen
