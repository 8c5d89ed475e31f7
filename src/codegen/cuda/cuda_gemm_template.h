#pragma once
/// Kiln's own tensor-core GEMM (issue 19, item 4): a CUDA C++ template emitted into a model's
/// NVRTC module beside its generated kernels, an autotune choice against cuBLASLt for the same
/// product and epilogue (kiln_rt_cuda.h RunState::matmul, autotune/cuda_choice.h).
///
/// out[b] = act(alpha * A[b] @ B[b] + bias + residual[b]) with A row-major (K contiguous), B
/// either [K, N] (N contiguous, "kn") or [N, K] (K contiguous, "nk": a Gemm's transB weight),
/// out row-major; any M, N, K (tiles past the edges are zero-filled); one strided batch dim
/// (grid z). Precisions: TF32 (float operands rounded to TF32, mma.sync m16n8k8) and float16 /
/// bfloat16 (mma.sync m16n8k16), accumulated in float32 and the epilogue computed in float32 in
/// registers before the store. A block computes a BM x BN tile of out with its warps in a
/// warps_m x warps_n grid; the K loop streams BK-deep slices of A and B through `stages` buffers
/// of shared memory filled by cp.async (16-byte copies when the operands' rows and bases are
/// 16-byte aligned, else element loads through registers).
///
/// Split-K: with splits > 1 each block sums one piece of K into a float32 workspace (the
/// library workspace of the arena), and kiln_gemm_reduce_<precision> adds the pieces in a fixed
/// order and applies the epilogue: results are reproducible run to run.
///
/// Kernels: kiln_gemm_<precision>_c<config>_<kn|nk> and kiln_gemm_reduce_<precision>, each
/// taking one kiln_gemm::Params by value (kiln_rt_cuda.h's GemmParams, field for field).

#include <set>
#include <string>
#include <vector>

namespace kiln::codegen {

/// A tile configuration of the template (kiln_rt_cuda.h's kGemmConfigs holds the same table).
struct CudaGemmConfig {
  int bm, bn, bk;        // the block's tile of out, and the depth of one K slice
  int warps_m, warps_n;  // the warps' grid over the tile
  int stages;            // shared-memory buffers in flight
};

/// The configurations, in the order their kernels are numbered (c0, c1, ...).
const std::vector<CudaGemmConfig>& cuda_gemm_configs();

/// The template's precisions: "tf32" (float operands), "f16", "bf16".
enum class CudaGemmPrecision { kTf32, kF16, kBf16 };

/// "tf32", "f16" or "bf16": the kernels' name part.
const char* cuda_gemm_precision_name(CudaGemmPrecision precision);

/// The name of configuration `config`'s kernel at `precision`, for B [N, K] (`b_nk`) or [K, N].
std::string cuda_gemm_kernel_name(CudaGemmPrecision precision, int config, bool b_nk);

/// The CUDA source of the template and its kernels at each of `precisions` (every
/// configuration, both layouts of B, and the split-K reduction): to append to a module that
/// starts with cuda_kernel_prelude(). Deterministic: the same text for every model.
std::string cuda_gemm_template_source(const std::set<CudaGemmPrecision>& precisions);

}  // namespace kiln::codegen
