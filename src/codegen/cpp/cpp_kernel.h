#pragma once
/// The CPU backend: C++ kernels (OpenMP + AVX2) for the scheduler's kernel items, and the
/// scheduler hooks of the CPU.
///
/// Accepts: a ScheduleItem of kind kKernel (its KernelGroup and members) and the Program it came
/// from. Produces: one `extern "C"` function per item (kernel.h): outer loops parallel with
/// OpenMP (a runtime `if` on the work size), the innermost contiguous loop vectorized with
/// kiln::vec::VecF32 when every access there is contiguous or broadcast float32 (else scalar
/// loops), reductions with vector accumulators, kernel-local buffers kept in registers, scalars
/// or per-thread scratch. The code needs cpp_kernel_prelude() once at the top of its translation
/// unit and the runtime headers (src/runtime) on the include path; link -lsleef and -fopenmp.
/// Tested in tests/unit/codegen/cpp_kernel_test.cpp (compiles and runs the kernels).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "codegen/common/kernel.h"
#include "ir/buffer.h"
#include "sched/schedule.h"
#include "sched/scheduler.h"

namespace kiln::codegen {

struct CppKernelOptions {
  /// Loops run in parallel only when their total work (elements) exceeds this, decided at run
  /// time because sizes are symbolic.
  int64_t parallel_threshold = 4096;
  /// Use explicit AVX2 vectors for eligible float32 loops.
  bool vectorize = true;
};

/// Generates the kernel of `item` (kind kKernel).
GeneratedKernel generate_cpp_kernel(const sched::ScheduleItem& item, const ir::Program& program,
                                    const CppKernelOptions& options = {});

/// The includes and helpers every translation unit of generated kernels starts with, once.
/// Runtime headers are included as "kiln_vec.h" etc.: put cpp_runtime_include_dir() on the
/// include path.
std::string cpp_kernel_prelude();

/// The folder holding the runtime headers the kernels include: PREFIX/share/kiln/runtime for an
/// installed Kiln (PREFIX/bin/kiln or PREFIX/lib/libkiln.so), else src/runtime of the checkout
/// it was built from.
std::filesystem::path cpp_runtime_include_dir();

/// Kiln's public headers (kiln/runtime.h), which a model library's C API unit includes:
/// PREFIX/include when installed, else the checkout's include/.
std::filesystem::path cpp_public_include_dir();

/// The scheduler hooks of the CPU backend: kernel names "cpp_fused_...", the (P, R) group key,
/// and vetoes for fusions the CPU kernels cannot run well.
class CppBackend final : public sched::Backend {
 public:
  std::string_view kernel_prefix() const override { return "cpp"; }
  std::optional<std::string> can_fuse_vertical(const sched::NodeInfo& node1,
                                               const sched::NodeInfo& node2,
                                               const sched::KernelGroup& fused) const override;
  std::optional<std::string> can_fuse_horizontal(const sched::NodeInfo& node1,
                                                 const sched::NodeInfo& node2,
                                                 const sched::KernelGroup& fused) const override;
  /// cpp_epilogue.h's epilogue_refusal: the GEMM and convolution templates render the epilogue.
  std::string template_epilogue_refusal(const ir::Program& program, const ir::Buffer& product,
                                        const ir::Buffer& consumer) const override;
  bool fuse_library_epilogue(const ir::Program& program, const ir::Buffer& product,
                             ir::Buffer& consumer) const override;
  /// cpp_epilogue.h's prologue_refusal.
  std::string conv_prologue_refusal(const ir::Program& program, const ir::Buffer& producer,
                                    const ir::Buffer& consumer) const override;
};

}  // namespace kiln::codegen
