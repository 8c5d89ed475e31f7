#pragma once
/// The CUDA backend's kernels: CUDA C++ for the scheduler's kernel items, compiled by NVRTC
/// (nvrtc_compile.h) after cuda_kernel_prelude().
///
/// The members' bodies are the C++ backend's scalar emission (cpp_body.h: the same op table,
/// loads, stores and kernel-local storage); what differs is the structure around them:
/// - a pointwise kernel whose buffers are read or written at the flat index runs each thread
///   over 4 consecutive elements, those buffers as one 16-byte load or store each for
///   float32/int32, two for int64/float64, one 8-byte one for float16/bfloat16 (a scalar path
///   for the tail and unaligned pointers); one that reads a buffer contiguously
///   along another variable than the output's last (a transpose) goes through a shared-memory
///   tile; any other runs each thread over kPointwiseElements elements of its P space (a flat
///   index split into the group's variables), kPointwiseThreads apart so that each load of a
///   warp stays contiguous, in an unrolled loop (its loads in flight together);
/// - a reduction kernel is persistent: one warp (rows of at most 1024 elements known when
///   compiling, 4 rows to a block) or one block of up to 256 threads (longer or symbolic rows)
///   per output row (P). The row's threads take its R elements in turn, blockDim.x apart (a
///   looped reduction for rows longer than the block; the stride is a literal, so static rows'
///   loops unroll), each accumulating its share; then the
///   accumulators are combined by warp shuffles and, across a block's warps, through shared
///   memory (sums, extrema, Welford, arg-extrema with their tie rules), always lower lanes and
///   warps first, so every thread gets the same bits. Members over P x R keep per-element values
///   in dynamic shared memory (R elements per row). Every thread computes a row's results and
///   stores them (the same values), so a later member of the row reads a result its own thread
///   wrote: members need no barrier between them, and Softmax or LayerNormalization is one
///   kernel. A static row of at most 32 elements per thread is held in registers instead: each
///   thread loads its elements of the members' inputs once (16-byte vectors where the row is
///   contiguous), per-element values live in register arrays rather than shared memory, and
///   outputs leave in 16-byte stores; a warp of short rows takes up to 4 rows, loading all
///   their inputs before reducing the first. A reduction member that accumulates exactly what
///   an earlier one does (LayerNormalization's Welford mean and variance of the same row) takes
///   the earlier one's combined state instead of a pass of its own.
/// Few long rows are split into two reductions before scheduling (cuda_split_reduction.h).
///
/// A reduction's launch configuration (warp or block per row, threads, rows per warp, the row
/// in registers or not) comes from a heuristic, or from the autotune cache: the kernel carries
/// a problem text (GeneratedKernel::launch_problem: a digest of the heuristic's code, the
/// static row count and row length, the number of configurations; no names) and the number of
/// configurations Kiln generates for it. Under `--autotune max` the kernel also carries the
/// other configurations' kernels (GeneratedKernel::candidates), which the run state times at
/// the kernel's first run (kiln_rt_cuda.h RunState::launch_tuned, reported as library "kiln"),
/// and the next compile builds the cached choice alone (CudaCodegen::generate_kernel). Kernels
/// that write a buffer they read (in place) have one configuration: they cannot run twice.
/// Sizes are int64_t kernel arguments; the LaunchSpec gives grid and block as expressions of
/// them.

#include <optional>
#include <string>
#include <string_view>

#include "codegen/common/kernel.h"
#include "ir/buffer.h"
#include "sched/schedule.h"
#include "sched/scheduler.h"

namespace kiln::codegen {

/// How generate_cuda_kernel picks a reduction's launch configuration.
struct CudaLaunchOptions {
  /// --autotune max: the other configurations' kernels too (GeneratedKernel::candidates).
  bool candidates = false;
  /// The configuration's index (less than GeneratedKernel::launch_configs, from the autotune
  /// cache) instead of the heuristic's (0), noted in the kernel's comment.
  std::optional<size_t> config;
};

/// Generates the kernel of `item` (kind kKernel).
GeneratedKernel generate_cuda_kernel(const sched::ScheduleItem& item, const ir::Program& program,
                                     const CudaLaunchOptions& options = {});

/// What every unit of CUDA kernels starts with, once: the runtime's scalar helpers and the
/// block reductions (NVRTC-safe: the standard headers come from nvrtc_headers.h).
std::string cuda_kernel_prelude();

/// The scheduler hooks of the CUDA backend: kernel names "cuda_fused_...", the default group key,
/// and the C++ backend's vetoes (strings; reductions over differently shaped outer dims).
class CudaBackend final : public sched::Backend {
 public:
  std::string_view kernel_prefix() const override { return "cuda"; }
  std::optional<std::string> can_fuse_vertical(const sched::NodeInfo& node1,
                                               const sched::NodeInfo& node2,
                                               const sched::KernelGroup& fused) const override;
  std::optional<std::string> can_fuse_horizontal(const sched::NodeInfo& node1,
                                                 const sched::NodeInfo& node2,
                                                 const sched::KernelGroup& fused) const override;
  /// A bias and Relu or Gelu after a matrix product become its cuBLASLt epilogue
  /// (cuda_matmul.h).
  bool fuse_library_epilogue(const ir::Program& program, const ir::Buffer& product,
                             ir::Buffer& consumer) const override;
};

}  // namespace kiln::codegen
