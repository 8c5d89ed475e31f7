#pragma once
/// The CPU code of library calls (ir/library_call.h) in the wrapper: one emitter per kind,
/// chosen by std::visit over the LibraryCall variant (a new kind fails to compile here until it
/// has one), and what the calls share across one wrapper: the runtime headers and libraries
/// they need, the oneDNN convolution sites the run state keeps, and the functions of GEMM and
/// convolution choices, each in a translation unit of its own. Control flow (If, Loop, Scan and
/// their results) is the wrapper's own, not a library call's.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ir/buffer.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

/// What the wrapper's library calls need besides their call lines.
struct CppLibraryCode {
  bool uses_blas = false;     // kiln_rt_blas.h, OpenBLAS
  bool uses_dnnl = false;     // kiln_rt_conv.h, oneDNN
  bool uses_library = false;  // kiln_rt_library.h kernels (TopK, RNN, NMS, ...)
  int conv_sites = 0;         // RunState holds kiln_rt::ConvSite conv[conv_sites]
  /// Declarations of the choice functions, and their translation units, in order.
  std::vector<std::string> declarations;
  std::vector<std::pair<std::string, std::string>> units;
  /// What the choices' units need to compile and link (autotune::GemmLinkage).
  std::vector<std::string> include_dirs;
  std::vector<std::string> libraries;
};

class CppLibraryCallWriter {
 public:
  /// `kernel_prelude` starts every choice's translation unit.
  explicit CppLibraryCallWriter(std::string kernel_prelude)
      : kernel_prelude_(std::move(kernel_prelude)) {}

  /// Notes the runtime headers and libraries `call` needs; called for every call of every graph
  /// before the wrapper's header is written.
  void note(const ir::ExternCall& call);

  /// The statements of the library call that computes `buffer` (of `program`).
  void write(IndentedBuffer& out, const ir::Buffer& buffer, const ir::Program& program);

  CppLibraryCode& code() { return code_; }

 private:
  struct Call;
  std::string kernel_prelude_;
  CppLibraryCode code_;
  std::map<std::string, std::string> choice_functions_;  // kind, choice, problem, epilogue -> name
  std::map<std::string, int> choice_counts_;             // kind -> functions so far
  friend struct Call;
};

}  // namespace kiln::codegen
