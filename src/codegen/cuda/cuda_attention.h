#pragma once
/// Scaled dot-product attention on the GPU (ir::AttentionCall under --device cuda; the pattern
/// lower/attention_fusion.h recognizes) as one kernel of Kiln's own, kiln_attention_f32: the
/// score matrix never goes to memory. A block takes 8 query rows of one batch element (2 per
/// warp) and walks the keys in tiles of 32: each tile's K^T and V go to shared memory, lane j
/// computes key j's score for the warp's rows in float32, and an online softmax (running max
/// and sum per row, the output rescaled when the max grows) accumulates P V in registers, lane
/// l holding output columns l, l + 32, l + 64, l + 96. D and Dv are at most 128 (the fusion
/// is refused for CUDA otherwise). Float32 arithmetic throughout, whatever --precision says
/// (the kernel uses no tensor cores).

#include <string>

#include "ir/buffer.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

/// The largest D and Dv the kernel takes.
constexpr int64_t kCudaAttentionMaxHead = 128;

/// The kernel's CUDA C++ source (NVRTC, after the kernels' prelude), defining
/// kiln_attention_f32 and the device side of kiln_cuda::AttentionParams.
const std::string& cuda_attention_source();

/// Writes the call computing `buffer`, an AttentionCall on the GPU: its operands as
/// kiln_cuda::AttentionParams and RunState::attention's launch of the module's kernel number
/// `kernel` (a constant the wrapper defines); `label` names the call in a profiled run, which
/// waits for it.
void write_cuda_attention(IndentedBuffer& out, const ir::Buffer& buffer, const std::string& kernel,
                          const std::string& label);

}  // namespace kiln::codegen
