#pragma once
/// GEMM choices: the candidate implementations algorithm selection picks from, behind one
/// interface (Inductor's ChoiceCaller). A choice is built for one problem (N and K fixed, M a
/// run-time argument) and computes, for float32 row-major contiguous matrices,
///
///   C[M, N] = epilogue(A[M, K] @ B[K, N])          B a constant weight
///
/// A choice prepares B once at compile time (prepare: the template prepacks it, the libraries keep
/// it as is) and renders one self-contained C++17 translation unit defining
///
///   extern "C" void <function_name>(int64_t M, const float* A, const float* Bprepared, float* C
///                                   [, const float* <epilogue argument>]...);
///
/// which a compiled model can include as is, compiled with the include directories and libraries
/// of linkage(). The choices: OpenBLAS cblas_sgemm, oneDNN matmul (a primitive per M, created on
/// first use and cached in a function-local static) on B as is or ("onednn-packed") on B
/// reordered once into the blocked layout the primitive prefers, and the C++ template
/// (gemm_template.h) at
/// each config of gemm_configs. Library choices apply an epilogue in a pass over C after the
/// call; the template fuses it. Tested in tests/unit/autotune/choice_test.cpp.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autotune/gemm_template.h"

namespace kiln::autotune {

/// What a choice's rendered source needs to compile and link (besides Kiln's JIT flags).
struct ChoiceLinkage {
  /// -I directories.
  std::vector<std::string> include_dirs;
  /// Libraries: a name ("dnnl" -> -ldnnl) or a path to a library file.
  std::vector<std::string> libraries;
};

/// One candidate implementation of a GEMM problem.
class GemmChoice {
 public:
  virtual ~GemmChoice() = default;

  /// A short name, unique among the choices of one problem: "openblas", "onednn",
  /// "template avx2_6x16_mc96_nc768_kc256_nr-outer_mn".
  virtual std::string name() const = 0;

  /// "extern" for library calls, "template" for generated kernels (Inductor's backend).
  virtual std::string backend() const = 0;

  /// Identifies the code this choice runs: the SHA-256 of its name, its rendered source and its
  /// linkage. Cached timings are valid only for the same hash key.
  std::string hash_key() const;

  /// The weight as the rendered kernel reads it, from the row-major K x N matrix `b`.
  virtual std::vector<float> prepare(const float* b, int64_t k, int64_t n) const = 0;

  /// The source of one translation unit defining `function_name` (see the file comment).
  virtual std::string render(const std::string& function_name,
                             const TemplateEpilogue& epilogue = {}) const = 0;

  /// What render()'s source needs to compile and link.
  virtual ChoiceLinkage linkage() const { return {}; }

  /// The template config of a template choice; nullptr for the others.
  virtual const GemmConfig* template_config() const { return nullptr; }

  /// Whether the rendered function writes each element of C once, by the store that applies the
  /// epilogue, having read nothing of C before (as ConvChoice::stores_once): the template over a
  /// single K block; not a library call, whose epilogue is a pass over C after it.
  virtual bool stores_once() const { return false; }
};

using GemmChoicePtr = std::shared_ptr<const GemmChoice>;

/// OpenBLAS cblas_sgemm (Debian's OpenMP build).
GemmChoicePtr make_openblas_choice(const GemmProblem& problem);

/// oneDNN matmul with B in plain row-major layout, or with `packed` in the layout the primitive
/// prefers (reordered on the first call).
GemmChoicePtr make_onednn_choice(const GemmProblem& problem, bool packed = false);

/// The C++ template at `config`.
GemmChoicePtr make_template_choice(const GemmConfig& config, const GemmProblem& problem);

/// Every choice for a problem of about `m_hint` rows on `threads` threads with template configs
/// for `isa` (a library built for an older CPU than this host's passes its ISA): first the
/// heuristic one (the template's gemm_default_config), then OpenBLAS, oneDNN and the other
/// template configs of gemm_configs.
std::vector<GemmChoicePtr> gemm_choices(int64_t m_hint, const GemmProblem& problem, int threads,
                                        TemplateIsa isa = host_template_isa());

/// The C++ statements of an epilogue applied in place to every element of the row-major
/// M x N matrix C after a library call (empty when `epilogue` is empty): an OpenMP loop over
/// rows that reads v = C[m * N + n] and stores the epilogue's value.
std::string render_epilogue_pass(const GemmProblem& problem, const TemplateEpilogue& epilogue);

/// Replaces every "@KEY@" of `text` by its value (the library sources are C++ with many braces,
/// which fmt would need doubled).
std::string substitute_placeholders(std::string text,
                                    const std::vector<std::pair<std::string, std::string>>& values);

}  // namespace kiln::autotune
