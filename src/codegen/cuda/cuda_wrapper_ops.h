#pragma once
/// The wrapper's CUDA operations (codegen/common/device_codegen.h WrapperOps), for the runtime
/// of kiln_rt_cuda.h: the kernels of all graphs compiled by NVRTC into cubins embedded in the
/// wrapper (one per target architecture, nvrtc_compile.h), matrix products through cuBLASLt
/// (cuda_matmul.h), a launch function per kernel that
/// evaluates its LaunchSpec and queues the kernel on the run state's stream, and storage in
/// device memory: the planned arena, a workspace (stream-ordered allocations), inputs copied in
/// when a run starts, constants uploaded once per run state, outputs copied back to the host
/// when it ends. Ops on the host-fallback list (host_fallback.h) run on the host with the CPU's
/// emission (cpp_wrapper_ops.h), inside a scope that declares host copies of exactly the
/// buffers the op reads (copied from the GPU; constants are read from the host's copy) and
/// writes (copied back after it): each copy is explicit in the wrapper. Control flow (If, Loop,
/// Scan) runs the same way, its subgraphs compiled for the CPU (CudaCodegen::subgraph_codegen)
/// and written by the host's operations (subgraph_ops). Index checks run on the GPU
/// and sizes read from data wait for it; nothing else does until the outputs.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codegen/common/device_codegen.h"
#include "codegen/cuda/cuda_gemm_template.h"

namespace kiln::codegen {

class CudaWrapperOps final : public WrapperOps {
 public:
  /// `host` writes the library calls on the host (the CPU's WrapperOps); `prelude` starts the
  /// CUDA unit; cubins are cached under `cache_dir`/cuda; `precision` is that of the matrix
  /// products; `library`: cubins for cuda_library_archs() plus PTX (else for this machine's GPU);
  /// `tune_libraries`: the run state times cuDNN's engines and cuBLASLt's algorithms at each
  /// plan's first run; `cached_library_choices`: library calls take the choice the autotune
  /// cache (default_autotune_cache_path(cache_dir)) holds for their problem (cuda_choice.h).
  CudaWrapperOps(std::unique_ptr<WrapperOps> host, std::string prelude,
                 std::filesystem::path cache_dir, ir::Precision precision, bool library,
                 bool tune_libraries = false, bool cached_library_choices = true)
      : host_(std::move(host)),
        prelude_(std::move(prelude)),
        cache_dir_(std::move(cache_dir)),
        precision_(precision),
        library_(library),
        tune_libraries_(tune_libraries),
        cached_library_choices_(cached_library_choices) {}

  /// Matrix products run on cuBLASLt and convolutions on cuDNN (no OpenBLAS or oneDNN to link);
  /// the other calls' needs are the host's.
  void note(const ir::ExternCall& call) override;
  void write_includes(IndentedBuffer& out, bool uses_control) override;
  void write_run_state_members(IndentedBuffer& out) override;
  /// The model's constants on the GPU, one copy for all its run states.
  void write_model_state_members(IndentedBuffer& out) override;
  void write_workspace(IndentedBuffer& out) override;
  void write_input_data(IndentedBuffer& out, size_t k, const std::string& ctype,
                        const std::string& pointer) override;
  std::string host_input_data(const std::string& pointer) const override;
  void write_constant_data(IndentedBuffer& out, size_t index, const std::string& ctype,
                           const std::string& pointer, size_t bytes) override;
  void write_index_check(IndentedBuffer& out, const std::string& pointer, const std::string& count,
                         const std::string& size, bool has_ignored, int64_t ignored,
                         const std::string& node) override;
  void write_size_read(IndentedBuffer& out, const std::string& identifier,
                       const std::string& pointer, const std::string& element) override;
  void write_arena(IndentedBuffer& out, const std::string& bytes) override;
  void write_allocation(IndentedBuffer& out, const Allocation& allocation) override;
  void write_release(IndentedBuffer& out, const std::string& pointer) override;
  void write_take_over(IndentedBuffer& out, const std::string& results) override;
  void write_hand_over(IndentedBuffer& out, const std::string& pointer) override;
  void write_finish_output(IndentedBuffer& out, size_t k, const std::string& data,
                           const std::string& dtype, const std::string& rank,
                           const std::string& dims, const std::string& element_size,
                           const std::string& name) override;
  void write_timing_support(IndentedBuffer& out) override { host_->write_timing_support(out); }
  /// Compiles the kernels with NVRTC and writes the cubins, the kernel names and the launch
  /// functions; the host's kernels (those of control-flow subgraphs, without a launch) are
  /// declared by the host's operations.
  void write_declarations(IndentedBuffer& out,
                          const std::vector<const GeneratedKernel*>& kernels) override;
  void write_timing_mark(IndentedBuffer& out, const std::string& label,
                         const std::string& kind) override {
    host_->write_timing_mark(out, label, kind);
  }
  void write_kernel_call(IndentedBuffer& out, const std::string& label, const std::string& function,
                         const std::string& args) override;
  void write_library_call(IndentedBuffer& out, const ir::Buffer& buffer,
                          const ir::Program& program) override;
  /// If, Loop and Scan run on the host like the calls of the host-fallback list: copies of what
  /// they read from the GPU, then their results (host storage the subgraph allocated) copied to
  /// the GPU.
  void write_control_flow(IndentedBuffer& out, const ir::Buffer& buffer, const ir::Program& program,
                          int64_t results, const std::function<void()>& write_call) override;
  /// Kernels and the GPU's library calls (cuBLASLt, cuDNN, Kiln's attention) queue work without
  /// waiting: they may run on the run state's side stream.
  bool runs_concurrently(const sched::ScheduleItem& item) const override;
  void note_streams(size_t /*forks*/, bool side_library_calls) override {
    side_library_calls_ = side_library_calls;
  }
  /// `const bool fork<k> = state.cuda.fork(...)` (false: the run stays on one stream), and
  /// state.cuda.side / join on it.
  void write_fork(IndentedBuffer& out, size_t k, const std::string& what) override;
  void write_side(IndentedBuffer& out, size_t k, bool enter) override;
  void write_join(IndentedBuffer& out, size_t k) override;
  /// state.cuda.size_known: the graph segments after it are keyed by the value too.
  void write_size_known(IndentedBuffer& out, const std::string& identifier) override;
  /// Subgraphs run on the host: the CPU's operations write their functions.
  WrapperOps& subgraph_ops() override { return *host_; }
  bool kernels_in_host_units() const override { return false; }
  /// kiln_check_device (what the machine must have, checked when a library loads),
  /// kiln_run_cuda (a run on the caller's stream, with device or host buffers) and the pinned
  /// host memory of the C API (kiln_cuda_host_alloc).
  void write_entry_points(IndentedBuffer& out) override;
  /// The run through kiln_cuda::run_retrying (again without a CUDA graph when its capture
  /// failed).
  std::string run_call() const override {
    return "run->cuda.share_constants(&static_cast<ModelState*>(state)->cuda_constants);\n"
           "        run->cuda.count_graphs(&static_cast<ModelState*>(state)->cuda_graph_stats);\n"
           "        kiln_cuda::run_retrying(run->cuda, [&] { run_impl(inputs, outputs, constants, "
           "*run, profile); });";
  }
  /// The CUDA source NVRTC compiled ("kernels.cu").
  std::vector<std::pair<std::string, std::string>> take_device_sources() override {
    return std::move(device_sources_);
  }
  std::vector<std::pair<std::string, std::string>> take_units() override {
    return host_->take_units();
  }
  BuildNeeds needs() const override { return host_->needs(); }

 private:
  /// Writes `write_call` (host code) in a scope where the buffers `buffer` reads are host
  /// copies (constants: the host's own), and, when `writes`, `buffer` host storage that
  /// `host.finish()` copies to the GPU after the scope.
  void write_on_host(IndentedBuffer& out, const ir::Buffer& buffer, const ir::Program& program,
                     bool writes, const std::function<void()>& write_call);

  std::unique_ptr<WrapperOps> host_;
  std::string prelude_;
  std::filesystem::path cache_dir_;
  ir::Precision precision_;
  bool library_;
  bool tune_libraries_;
  bool cached_library_choices_;
  std::string autotune_gpu_;  // cuda_autotune_gpu(), read at the first library call

  /// Writes state.cuda.library_choice for call `site` of `library` ("cublaslt", "cudnn") when
  /// the autotune cache holds a choice for its `problem`.
  void write_library_choice(IndentedBuffer& out, const std::string& library, int site,
                            const std::optional<std::string>& problem);
  /// Notes the precision of a matrix product for Kiln's GEMM template when its kernels go into
  /// the module (gemm_precisions_).
  void note_gemm_template(const ir::ExternCall& call);
  std::optional<bool> template_wanted_;          // tuning, or a cache with template choices
  std::set<CudaGemmPrecision> gemm_precisions_;  // the template's, in the module
  bool uses_blas_ = false;                       // a matrix product on cuBLASLt
  bool uses_dnn_ = false;                        // a convolution on cuDNN
  bool conv_epilogue_ = false;  // one with a bias, residual or Relu (conv_epilogue_source)
  /// (D, Dv) of the fused attentions: Kiln's kernel for each, in the module.
  std::set<std::pair<int64_t, int64_t>> attention_heads_;
  bool uses_workspace_ = false;
  bool side_library_calls_ = false;  // a library call among them: a second library workspace
  bool waits_ = false;    // the run waits for the GPU midway (a host fallback, a size from data)
  int matmul_sites_ = 0;  // matrix product calls written so far
  int conv_sites_ = 0;    // convolution calls written so far
  std::vector<std::pair<std::string, std::string>> device_sources_;
  /// Model input buffers: (index, element type).
  std::map<std::string, std::pair<size_t, std::string>> inputs_;
  /// Constant buffers: their index in the wrapper's `constants` (host data).
  std::map<std::string, size_t> constants_;
};

}  // namespace kiln::codegen
