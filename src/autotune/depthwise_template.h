#pragma once
/// The C++ depthwise convolution template: renders, for one ISA and one fully static depthwise
/// problem (ConvProblem with group == C, so that output channel oc reads input channel
/// oc / (M / C) only), the source of
///
///   Y[N, M, OH, OW] = epilogue(depthwise_conv(X[N, C, H, W], W[M, 1, KH, KW]) + bias[M])
///
/// in NCHW, the layout the rest of the program uses (no reorder before or after, as a oneDNN
/// depthwise convolution needs). A depthwise convolution does KH * KW multiply-adds per output
/// and reads each input once per kernel row: it is bound by memory, not by arithmetic. Each task
/// is one output row of one channel: the row's sums start at the bias, every kernel tap adds its
/// weight times a shifted (and, for strides above 1, strided) input row in one vectorized pass,
/// and the epilogue is applied as the row is stored. Padding costs nothing in the passes: kernel
/// rows outside the image are skipped, and only the few output columns whose taps reach past the
/// image's left or right edge take the bounds-checked loop. The weights stay as W is laid out
/// ([M][KH * KW]), followed by the bias.
///
/// The rendered function is
///
///   extern "C" void <name>(const float* X, const float* Wp, float* Y
///                          [, const float* <epilogue argument>]...);
///
/// with the epilogue (TemplateEpilogue) seeing v (the biased sum), m = (b * M + oc) * OH + oh
/// and n = ow, as the direct template's does. The ISA is turned on with `#pragma GCC target`.
/// Tested in tests/unit/autotune/depthwise_template_test.cpp.

#include <cstdint>
#include <string>

#include "autotune/conv_template.h"

namespace kiln::autotune {

/// The output columns [begin, end) whose every kernel tap reads inside the image's columns (the
/// loop without bounds checks); begin <= end <= OW.
struct InteriorColumns {
  int64_t begin = 0, end = 0;
};
InteriorColumns depthwise_interior(const ConvProblem& problem);

/// Renders the kernel source (one translation unit defining `function_name` as extern "C").
/// Throws InternalError unless problem.depthwise().
std::string render_depthwise(TemplateIsa isa, const ConvProblem& problem,
                             const std::string& function_name,
                             const TemplateEpilogue& epilogue = {});

}  // namespace kiln::autotune
