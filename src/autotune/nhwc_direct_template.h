#pragma once
/// The channels-last direct convolution template: renders, for one configuration (ConvConfig)
/// and one fully static problem on channels-last activations, the source of
///
///   Y[N, OH, OW, M] = epilogue(conv(X[N, H, W, C], W[M, C, KH, KW]) + bias[M])
///
/// for the convolutions of a channels-last network that are not 1x1 stride-1 (those are the
/// pointwise template's GEMMs): 3x3 and 7x7 kernels, strided 1x1 downsampling, a network's first
/// layer with 3 input channels, and grouped convolutions (ResNeXt's). For each kernel tap (kh, kw)
/// the convolution is a product of the output pixels' input vectors [pixels, C] with the tap's
/// weights [C, M], so a register block of OWB output pixels of one row by OCB output channels
/// accumulates, for every tap and input channel, OCB weights (vectors, contiguous) times OWB
/// broadcast inputs (each pixel's channel run is contiguous too). The weights are prepacked at
/// compile time into [M / OCB][KH][KW][C] [OCB] panels followed by the bias.
///
/// Padding: kernel rows outside the image are skipped per output row (the same rows for a whole
/// register block); for left and right padding the call first copies X into a per-thread buffer
/// whose rows have PL and PR zero columns on either side, so every register block reads inside
/// its rows and none takes a checked path. The copy is one pass over X, against KH * KW * M
/// multiply-adds per input value.
///
/// Groups (G > 1, not depthwise): a channel block lies inside one group, where the groups have a
/// multiple of OCB output channels, and reads that group's C / G input channels; or it spans
/// 2 to 4 whole groups, where OCB is a multiple of their M / G, and reads their input channels
/// (contiguous, as the groups are) with zero weights between groups. Such a merged block does
/// OCB / (M / G) times the multiply-adds a group needs, in full vectors; ResNeXt-50's 4-channel
/// groups run so (AVX2 blocks of 8: twice the multiply-adds). The configs that merge the fewest
/// groups come first. Other groupings (M / G of 7, or 1 with 8-channel blocks) are oneDNN's.
///
/// Tasks are (image, output row, channel block) on Kiln's pool, rows or channel blocks outermost
/// (ConvConfig::rows_outer); with channel blocks outermost, each register block also prefetches
/// its share of the next channel block's weights into L2, so that weights too large for L2 stream
/// from memory while the FMAs run. After the last tap a block's sums (bias included) go to a small
/// buffer, and the epilogue (TemplateEpilogue) is applied per output pixel over its channels as
/// they are stored, with m = (b * OH + oh) * OW + ow (the output pixel) and n = oc, as the other
/// channels-last templates (nhwc_conv_template.h). ConvConfig::icb is the whole of C (sums stay in
/// registers over every input channel). Tested in
/// tests/unit/autotune/nhwc_conv_template_test.cpp.

#include <cstdint>
#include <string>
#include <vector>

#include "autotune/conv_template.h"

namespace kiln::autotune {

/// Whether the template implements `problem`: channels-last, not a 1x1 stride-1 unpadded
/// ungrouped convolution (nhwc_pointwise_applies), not depthwise, groups that some register
/// block tiles (see above), and, when padded left or right, a padded copy of X of at most 32 MiB
/// (each calling thread keeps one per convolution).
bool nhwc_direct_applies(const ConvProblem& problem);

/// Throws InternalError unless `config` and `problem` are valid, nhwc_direct_applies(problem) and
/// config.icb == C.
void check_nhwc_direct(const ConvConfig& config, const ConvProblem& problem);

/// The candidate configs for `isa` (AVX2 register blocks, and AVX-512 ones when isa is
/// kAvx512), the heuristic one first; every one passes check_conv_config and has icb == C.
std::vector<ConvConfig> nhwc_direct_configs(const ConvProblem& problem, TemplateIsa isa);

/// The number of floats prepack_nhwc_direct produces.
int64_t packed_nhwc_direct_size(const ConvConfig& config, const ConvProblem& problem);

/// Packs W [M, C / G, KH, KW] (contiguous) and the bias [M] (nullptr: zeros) as the kernel reads
/// them: for each block of OCB output channels, for each kernel row, column and input channel of
/// the block, OCB floats (channels past M, and those of another group, zero); then the bias
/// padded to a multiple of OCB.
std::vector<float> prepack_nhwc_direct(const ConvConfig& config, const ConvProblem& problem,
                                       const float* w, const float* bias);

/// Where prepack_nhwc_direct puts W[m, t] (t = (c * KH + kh) * KW + kw, W's own order, c within
/// m's group) and the bias of m.
int64_t nhwc_direct_weight_offset(const ConvConfig& config, const ConvProblem& problem, int64_t m,
                                  int64_t t);
int64_t nhwc_direct_bias_offset(const ConvConfig& config, const ConvProblem& problem, int64_t m);

/// Renders the kernel source (one translation unit defining `function_name` as extern "C"):
///   extern "C" void <name>(const float* X, const float* Wp, float* Y
///                          [, const float* <epilogue argument>]...);
/// Throws InternalError unless nhwc_direct_applies(problem) and config.icb == C.
std::string render_nhwc_direct(const ConvConfig& config, const ConvProblem& problem,
                               const std::string& function_name,
                               const TemplateEpilogue& epilogue = {});

}  // namespace kiln::autotune
