#pragma once
/// The CUDA backend behind the DeviceCodegen interface: the scheduler hooks of CudaBackend,
/// CUDA kernels of cuda_kernel.h (compiled by NVRTC when the wrapper is written), matrix
/// products through cuBLASLt with its epilogues (cuda_matmul.h), and the wrapper's CUDA
/// operations (cuda_wrapper_ops.h). The generated units are host C++ built with
/// g++ like the CPU's: the wrapper loads the CUDA driver at run time, so building needs no GPU.

#include <filesystem>
#include <memory>
#include <string>

#include "codegen/common/device_codegen.h"
#include "codegen/cpp/cpp_codegen.h"
#include "codegen/cuda/cuda_kernel.h"

namespace kiln::codegen {

class CudaCodegen final : public DeviceCodegen {
 public:
  /// Fails with a clear error when this Kiln was built without the CUDA toolkit. Cubins are
  /// cached under `cache_dir` (the compile's code cache).
  /// `precision`: the compute type of the cuBLASLt matrix products. `library`: kernels for
  /// cuda_library_archs() plus PTX (a model library for other machines), else for this
  /// machine's GPU (cuda_target_archs()).
  CudaCodegen(std::filesystem::path cache_dir, ir::Precision precision, bool library = false,
              bool tune_libraries = false, bool cached_library_choices = true);
  ir::Device device() const override { return ir::Device::kCuda; }
  const sched::Backend& scheduling() const override { return backend_; }
  /// Kernel groups, inputs and constants; library calls on the host-fallback list
  /// (host_fallback.h) run on the host.
  bool supports(const ir::Buffer& buffer) const override;
  GeneratedKernel generate_kernel(const sched::ScheduleItem& item,
                                  const ir::Program& program) const override;
  std::string prelude() const override;
  std::unique_ptr<WrapperOps> wrapper_ops() const override;
  /// Control-flow subgraphs run on the host (host_fallback.h): the CPU's kernels.
  const DeviceCodegen& subgraph_codegen() const override { return host_; }
  codecache::CompilerConfig build_config(const BuildNeeds& needs) const override;

 private:
  CudaBackend backend_;
  CppCodegen host_;  // library calls and the host build
  std::filesystem::path cache_dir_;
  ir::Precision precision_;
  bool library_;
  bool tune_libraries_;          // --autotune max: library candidates timed at their first run
  bool cached_library_choices_;  // not --autotune off: the autotune cache's library choices
};

}  // namespace kiln::codegen
