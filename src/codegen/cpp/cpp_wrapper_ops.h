#pragma once
/// The wrapper's CPU operations (codegen/common/device_codegen.h WrapperOps): the runtime
/// headers, a run state holding the arena and the oneDNN convolution sites, host storage
/// (kiln_rt::Arena, kiln_rt::Workspace), direct calls of the
/// kernel functions timed with kiln_rt::ProfileScope, and the C++ of library calls
/// (ir/library_call.h): one emitter per kind, chosen by std::visit over the LibraryCall variant
/// (a new kind fails to compile here until it has one). GEMM and convolution choices call
/// functions defined in translation units of their own. Control flow (If, Loop, Scan and their
/// results) is the wrapper's own, not a library call.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "codegen/common/device_codegen.h"
#include "ir/buffer.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

class CppWrapperOps final : public WrapperOps {
 public:
  /// `kernel_prelude` starts every choice's translation unit.
  explicit CppWrapperOps(std::string kernel_prelude) : kernel_prelude_(std::move(kernel_prelude)) {}

  void note(const ir::ExternCall& call) override;
  void write_includes(IndentedBuffer& out, bool uses_control) override;
  void write_run_state_members(IndentedBuffer& out) override;
  void write_workspace(IndentedBuffer& out) override;
  void write_input_data(IndentedBuffer& out, size_t k, const std::string& ctype,
                        const std::string& pointer) override;
  void write_constant_data(IndentedBuffer& out, size_t index, const std::string& ctype,
                           const std::string& pointer, size_t bytes) override;
  void write_arena(IndentedBuffer& out, const std::string& bytes) override;
  void write_allocation(IndentedBuffer& out, const Allocation& allocation) override;
  void write_index_check(IndentedBuffer& out, const std::string& pointer, const std::string& count,
                         const std::string& size, bool has_ignored, int64_t ignored,
                         const std::string& node) override;
  void write_size_read(IndentedBuffer& out, const std::string& identifier,
                       const std::string& pointer, const std::string& element) override;
  void write_release(IndentedBuffer& out, const std::string& pointer) override;
  void write_take_over(IndentedBuffer& out, const std::string& results) override;
  void write_hand_over(IndentedBuffer& out, const std::string& pointer) override;
  void write_finish_output(IndentedBuffer& out, size_t k, const std::string& data,
                           const std::string& dtype, const std::string& rank,
                           const std::string& dims, const std::string& element_size,
                           const std::string& name) override;
  void write_timing_support(IndentedBuffer& out) override;
  void write_declarations(IndentedBuffer& out,
                          const std::vector<const GeneratedKernel*>& kernels) override;
  void write_timing_mark(IndentedBuffer& out, const std::string& label,
                         const std::string& kind) override;
  void write_kernel_call(IndentedBuffer& out, const std::string& label, const std::string& function,
                         const std::string& args) override;
  void write_library_call(IndentedBuffer& out, const ir::Buffer& buffer,
                          const ir::Program& program) override;
  std::vector<std::pair<std::string, std::string>> take_units() override;
  BuildNeeds needs() const override { return needs_; }

 private:
  struct Call;
  friend struct Call;
  std::string kernel_prelude_;
  BuildNeeds needs_;
  bool uses_library_ = false;    // kiln_rt_library.h kernels (TopK, RNN, NMS, ...)
  bool uses_attention_ = false;  // kiln_rt_attention.h's fused attention
  int conv_sites_ = 0;           // RunState holds kiln_rt::ConvSite conv[conv_sites_]
  /// Declarations of the choice functions, and their translation units, in order.
  std::vector<std::string> declarations_;
  std::vector<std::pair<std::string, std::string>> units_;
  std::map<std::string, std::string> choice_functions_;  // kind, choice, problem, epilogue -> name
  std::map<std::string, int> choice_counts_;             // kind -> functions so far
};

}  // namespace kiln::codegen
