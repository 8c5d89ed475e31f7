#pragma once
/// Scaled dot-product attention on the GPU (ir::AttentionCall under --device cuda; the pattern
/// lower/attention_fusion.h recognizes) as one kernel of Kiln's own, kiln_attention_f32_d<D>_v<Dv>:
/// the score matrix never goes to memory. A block takes 8 query rows of one batch element (2 per
/// warp) and walks the keys in tiles of 32: each tile's K^T and V go to shared memory, lane j
/// computes key j's score for the warp's rows in float32, and an online softmax (running max
/// and sum per row, the output rescaled when the max grows) accumulates P V in registers, lane
/// l holding output columns l, l + 32, l + 64, l + 96. D and Dv are known when compiling and at
/// most 128 (the fusion is refused for CUDA otherwise): one kernel per pair, its loops unrolled.
/// Made only with LoweringOptions::cuda_fused_attention (kiln compile --cuda-fused-attention):
/// at BERT-base's sequence 128 cuBLASLt and a Softmax kernel measured faster (lowering.h).
/// Float32 arithmetic throughout, whatever --precision says (the kernel uses no tensor cores).

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "ir/buffer.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

/// The largest D and Dv the kernel takes.
constexpr int64_t kCudaAttentionMaxHead = 128;

/// The name of the kernel for heads of D = `d` and Dv = `dv` (the loops over them unroll).
std::string cuda_attention_kernel_name(int64_t d, int64_t dv);

/// D and Dv of an attention call, when known.
std::optional<std::pair<int64_t, int64_t>> cuda_attention_heads(const ir::ExternCall& call);

/// The kernels' CUDA C++ source (NVRTC, after the kernels' prelude): the device side of
/// kiln_cuda::AttentionParams, the kernel template, and one kernel per (D, Dv) of `heads`.
std::string cuda_attention_source(const std::set<std::pair<int64_t, int64_t>>& heads);

/// Writes the call computing `buffer`, an AttentionCall on the GPU: its operands as
/// kiln_cuda::AttentionParams and RunState::attention's launch of the module's kernel for its
/// heads (numbered by the wrapper's constant k_<kernel name>); `label` names the call in a
/// profiled run, which waits for it.
void write_cuda_attention(IndentedBuffer& out, const ir::Buffer& buffer, const std::string& label);

}  // namespace kiln::codegen
