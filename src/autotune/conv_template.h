#pragma once
/// The C++ direct convolution template: renders, for one configuration (ConvConfig) and one fully
/// static problem (ConvProblem), the source of a float32 2-D convolution
///
///   Y[N, M, OH, OW] = epilogue(conv(X[N, C, H, W], W[M, C, KH, KW]) + bias[M])   (NCHW, group 1)
///
/// A register block of OCB output channels (OCB / VW vectors) by OWB output columns accumulates
/// over input channels and kernel taps: per tap it loads OCB weights (vectors) and broadcasts OWB
/// input values, so strides, padding and dilation cost nothing in the inner loop (padding: the
/// kernel rows outside the image are skipped, and only the column blocks at the image's edges take
/// the bounds-checked path). The weights are prepacked at compile time (prepack_conv_weights) into
/// [M / OCB][C][KH][KW][OCB] panels followed by the bias. Input channels are cache blocked by ICB
/// (the weight panel of one block stays in L1 while a row of outputs sweeps it), partial sums of
/// one output row live in a per-thread row buffer, and OpenMP threads share (image, channel block,
/// output row) tasks (channel blocks or rows outermost). After the last input channel block the
/// bias and the epilogue are applied while the row buffer is hot, and the row is stored: no pass
/// over Y after the call.
///
/// The rendered function is
///
///   extern "C" void <name>(const float* X, const float* Wp, float* Y
///                          [, const float* <epilogue argument>]...);
///
/// where the epilogue (TemplateEpilogue) sees v (the biased sum), m = (b * M + oc) * OH + oh and
/// n = ow, i.e. Y viewed as an [N * M * OH, OW] matrix. The ISA is turned on with
/// `#pragma GCC target` like the GEMM template's. Tested in
/// tests/unit/autotune/conv_template_test.cpp; benchmarked by bench/resnet_conv_bench.cpp.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autotune/gemm_template.h"

namespace kiln::autotune {

/// A 2-D float32 convolution with every size known, NCHW input and output. The direct template
/// takes group 1; a depthwise convolution (group == C, every output channel reading one input
/// channel) has templates of its own (autotune/depthwise_template.h).
struct ConvProblem {
  int64_t n = 1, c = 0, h = 0, w = 0;  ///< input
  int64_t m = 0;                       ///< output channels
  int64_t kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t group = 1;
  /// Channels-last activations: X [N, H, W, C] and Y [N, OH, OW, M] (nhwc_conv_template.h);
  /// else X [N, C, H, W] and Y [N, M, OH, OW].
  bool channels_last = false;

  int64_t oh() const {
    return (h + pad_top + pad_bottom - dilation_h * (kh - 1) - 1) / stride_h + 1;
  }
  int64_t ow() const {
    return (w + pad_left + pad_right - dilation_w * (kw - 1) - 1) / stride_w + 1;
  }
  /// Multiply-adds per output element (C / group * KH * KW), the length of a weight row.
  int64_t depth() const { return c / group * kh * kw; }
  /// Whether each output channel reads exactly one input channel (group == C).
  bool depthwise() const { return group > 1 && group == c; }
  /// 2 * N * M * OH * OW * depth().
  double flops() const;
  /// "conv(1x64x56x56, 64x64x3x3, s1, p1)", with ", g96" when grouped and ", nhwc" when
  /// channels-last: the problem as the AUTOTUNE log names it.
  std::string text() const;
  bool operator==(const ConvProblem&) const = default;
};

/// The 17 values of a problem in declaration order (N, C, H, W, M, KH, KW, strides, pads top,
/// left, bottom, right, dilations, group, channels_last as 0 or 1), as IR attributes and benchmark
/// requests carry it; and back (throws InternalError on a wrong count).
std::vector<int64_t> conv_problem_ints(const ConvProblem& problem);
ConvProblem conv_problem_from_ints(const std::vector<int64_t>& values);

/// Throws InternalError when `problem` has a non-positive size, an empty output, or a group that
/// does not divide C and M.
void check_conv_problem(const ConvProblem& problem);

/// The output columns per register block: all of `ow` when it fits, else the block in
/// [max_owb / 2, max_owb] that wastes the fewest lanes on the last block (the larger on ties).
int pick_owb(int64_t ow, int max_owb);

/// One point of the template's search space.
struct ConvConfig {
  TemplateIsa isa = TemplateIsa::kAvx2;
  /// Output channels per register block (a multiple of the vector width).
  int ocb = 16;
  /// Output columns per register block.
  int owb = 6;
  /// Input channels per cache block.
  int icb = 64;
  /// The order of the (image, channel block, output row) tasks: channel blocks outermost (false:
  /// a thread's rows share one block's weight panel, best when all weights are larger than L2),
  /// or rows outermost (true: a thread's channel blocks share one row's input rows, which stay in
  /// L2 while every block reads them; best when the weights fit L2).
  bool rows_outer = false;

  /// "avx512_oc32x14_ic64", with "_rows" when rows_outer.
  std::string name() const;
  bool operator==(const ConvConfig&) const = default;
};

/// Throws InternalError when `config` is inconsistent: OCB not a multiple of the vector width, more
/// registers than the ISA has, a non-positive block.
void check_conv_config(const ConvConfig& config);

/// Parses ConvConfig::name() back (for the "config" attribute of a lowered convolution).
ConvConfig decode_conv_config(const std::string& text);

/// The number of floats prepack_conv_weights produces.
int64_t packed_conv_weight_size(const ConvConfig& config, const ConvProblem& problem);

/// Packs W [M, C, KH, KW] (contiguous) and the bias [M] (nullptr: zeros) as the kernel reads them:
/// for each block of OCB output channels, for each input channel, kernel row and column, OCB
/// floats (channels past M zero); then the bias padded to a multiple of OCB.
std::vector<float> prepack_conv_weights(const ConvConfig& config, const ConvProblem& problem,
                                        const float* w, const float* bias);

/// The inverse, for the interpreter and tests: W [M, C, KH, KW] then bias [M].
std::vector<float> unpack_conv_weights(const ConvConfig& config, const ConvProblem& problem,
                                       const float* packed);

/// Renders the kernel source (one translation unit defining `function_name` as extern "C").
std::string render_conv(const ConvConfig& config, const ConvProblem& problem,
                        const std::string& function_name, const TemplateEpilogue& epilogue = {});

/// The candidate configs for `problem` on `threads` threads for `isa` (AVX2 register blocks, and
/// AVX-512 ones when isa is kAvx512); the first is conv_default_config's. Empty when no config's
/// row buffer fits the stack budget (an image thousands of columns wide).
std::vector<ConvConfig> conv_configs(const ConvProblem& problem, int threads, TemplateIsa isa);

/// The heuristic choice (nullopt when conv_configs is empty).
std::optional<ConvConfig> conv_default_config(const ConvProblem& problem, int threads,
                                              TemplateIsa isa);

}  // namespace kiln::autotune
