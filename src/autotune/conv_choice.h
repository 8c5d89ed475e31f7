#pragma once
/// Convolution choices: the candidate implementations of one 2-D float32 convolution
/// (autotune/conv_template.h's ConvProblem) behind one interface, as GemmChoice is for GEMM
/// (Inductor's ChoiceCaller). A choice prepares the constant weight and bias once at compile time
/// (prepare) and renders one self-contained C++17 translation unit defining
///
///   extern "C" void <function_name>(const float* X, const float* Wprepared, float* Y
///                                   [, const float* <epilogue argument>]...);
///
/// X [N, C, H, W] and Y [N, M, OH, OW] contiguous; the epilogue (TemplateEpilogue) sees v (the
/// biased sum), m = (b * M + oc) * OH + oh and n = ow (a channels-last problem: X [N, H, W, C],
/// Y [N, OH, OW, M], m = (b * OH + oh) * OW + ow and n = oc). The choices:
///   onednn    oneDNN convolution_forward (weights reordered into its blocked layout on the
///             first call and kept), the epilogue in a pass over Y after the call
///   im2col    im2col into a per-thread buffer (none for 1x1 stride-1 unpadded convolutions, which
///             are a GEMM on X as is) + OpenBLAS sgemm per image, bias and epilogue in a pass
///   template  the direct convolution template at each config of conv_configs, the bias and the
///             epilogue fused
///   depthwise the depthwise template (autotune/depthwise_template.h) for group == C, the bias
///             and the epilogue fused; W as it is
///   pointwise-nhwc, depthwise-nhwc  the channels-last templates (autotune/nhwc_conv_template.h)
///             for a channels-last problem, whose other choice is oneDNN on nhwc
///   winograd, winograd-nhwc  the Winograd F(4x4, 3x3) template (autotune/winograd_template.h)
///             for 3x3 stride-1 convolutions on NCHW or channels-last activations, the bias and
///             the epilogue fused; W as it is (transformed on the first call); winograd-f2 and
///             winograd-f2-nhwc the same template's F(2x2, 3x3)
/// Tested in tests/unit/autotune/conv_template_test.cpp.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autotune/choice.h"
#include "autotune/conv_template.h"

namespace kiln::autotune {

/// One candidate implementation of a convolution problem.
class ConvChoice {
 public:
  virtual ~ConvChoice() = default;

  /// Unique among the choices of a problem: "onednn", "im2col-openblas",
  /// "template avx512_oc32x14_ic64".
  virtual std::string name() const = 0;

  /// "extern" for library calls, "template" for generated kernels.
  virtual std::string backend() const = 0;

  /// The SHA-256 of the name, backend, rendered source and linkage (as GemmChoice::hash_key).
  std::string hash_key() const;

  /// The weight argument from W [M, C, KH, KW] and the bias [M] (nullptr: none).
  virtual std::vector<float> prepare(const float* w, const float* bias) const = 0;

  /// The source of one translation unit defining `function_name`.
  virtual std::string render(const std::string& function_name,
                             const TemplateEpilogue& epilogue = {}) const = 0;

  virtual ChoiceLinkage linkage() const { return {}; }

  /// Where prepare() puts W[m, t] (t < problem().depth(), the weight row's index) and the bias of
  /// output channel m in the prepared weight: the template's blocked panels, else W as it is.
  /// The pointwise and depthwise channels-last choices override them.
  virtual int64_t weight_offset(int64_t m, int64_t t) const;
  virtual int64_t bias_offset(int64_t m) const;

  /// The template config of a template choice; nullptr for the others.
  virtual const ConvConfig* template_config() const { return nullptr; }

  /// Whether the rendered function writes each output element once, by the store that applies
  /// the epilogue, having read nothing of Y before: an epilogue input read only at the element
  /// being stored (a residual) may then share Y's storage (sched/lifetimes.cpp). The channels-last
  /// direct template (sums in registers over every tap) and the pointwise one over a single K
  /// block; not a library call (its epilogue is a pass over Y after the call) nor a template that
  /// keeps partial sums in Y.
  virtual bool stores_once() const { return false; }

  /// Why this choice cannot take `producer`, the choice of the convolution that computes its X,
  /// as its prologue (the two as one function, X never stored), or "" when it can: the
  /// channels-last depthwise template takes a pointwise-template expansion
  /// (nhwc_expand_depthwise_applies), the pointwise template a depthwise-template convolution
  /// (nhwc_depthwise_project_applies).
  virtual std::string prologue_refusal(const ConvChoice& producer) const;

  /// Whether, with a prologue, this choice's epilogue may read buffers (a residual): not where
  /// it then runs a row at a time, its epilogue seeing the row's pixels from 0.
  virtual bool epilogue_reads_buffers_with_prologue() const { return true; }

  /// The source of one translation unit defining `function_name` as
  ///   extern "C" void <function_name>(const float* X, const float* Wproducer,
  ///                                   const float* Wprepared, float* Y
  ///                                   [, const float* <epilogue argument>]...);
  /// with X the producer's input and `producer_epilogue` (reading no buffers) applied to the
  /// producer's values. Only where prologue_refusal(producer) is "".
  virtual std::string render_with_prologue(const ConvChoice& producer,
                                           const TemplateEpilogue& producer_epilogue,
                                           const std::string& function_name,
                                           const TemplateEpilogue& epilogue) const;

  /// Whether the choice can multiply X by a per-channel scale computed at run time (a
  /// squeeze-excitation gate) as part of its call: the pointwise template for one image.
  virtual bool takes_input_scale() const { return false; }

  /// The source of one translation unit defining `function_name` as
  ///   extern "C" void <function_name>(const float* X, const float* Wprepared, const float* S,
  ///                                   float* Y [, const float* <epilogue argument>]...);
  /// the convolution of X [1, H, W, C] with its channel c multiplied by S[c]. Only where
  /// takes_input_scale().
  virtual std::string render_with_input_scale(const std::string& function_name,
                                              const TemplateEpilogue& epilogue) const;

  /// The problem the choice was built for.
  virtual const ConvProblem& problem() const = 0;
};

using ConvChoicePtr = std::shared_ptr<const ConvChoice>;

ConvChoicePtr make_conv_onednn_choice(const ConvProblem& problem);
ConvChoicePtr make_conv_im2col_choice(const ConvProblem& problem);
ConvChoicePtr make_conv_template_choice(const ConvConfig& config, const ConvProblem& problem);

/// Every choice for `problem` on `threads` threads with template configs for `isa` (a library
/// built for an older CPU than this host's passes its ISA): first the heuristic one (Winograd for
/// 3x3 stride-1 convolutions with 784 or more output pixels and 32 or more channels in and out;
/// else the template at conv_default_config; oneDNN for 1x1 convolutions with 784 or
/// more output pixels, or when no config fits), then the other of the two, im2col + OpenBLAS,
/// Winograd where it applies and the other template configs. A grouped problem has the depthwise
/// template first (when it is depthwise) and oneDNN. A channels-last problem has the pointwise,
/// depthwise or direct template first (Winograd for 3x3 stride-1 convolutions with 196 or more
/// output pixels, 32 or more channels in and out and at most 4 MiB of transformed weights, 16 MiB
/// for AVX2), then oneDNN and the other configs.
std::vector<ConvChoicePtr> conv_choices(const ConvProblem& problem, int threads,
                                        TemplateIsa isa = host_template_isa());

/// Rebuilds the choice named `name` (as lowering recorded it: the name, and the config text of a
/// template). Throws InternalError for an unknown name.
ConvChoicePtr make_conv_choice(const std::string& name, const ConvProblem& problem);

}  // namespace kiln::autotune
