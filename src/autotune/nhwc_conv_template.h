#pragma once
/// Convolution templates on channels-last activations (ConvProblem::channels_last: X [N, H, W, C]
/// and Y [N, OH, OW, M], contiguous), the layout lower/nn.cpp gives the 1x1 and depthwise
/// convolutions of a network with depthwise layers, so that chains of them need no reorder:
///
///   pointwise  a 1x1, stride-1, unpadded, ungrouped convolution is the GEMM
///              Y[N * H * W, M] = X[N * H * W, C] @ W^T[C, M]: the GEMM template
///              (gemm_template.h) on X as it is, with W^T packed for it at compile time and the
///              bias added in its epilogue
///   depthwise  group == C == M: per output row, register blocks of a few pixels of the row by
///              one or two vectors of channels, summing the kernel's taps (W packed tap-major,
///              [KH * KW][M], so each tap's weights are one contiguous vector run, held in
///              registers while a group of channels sweeps the row); interior columns without
///              bounds checks, edge columns checked; the channels off the vectors masked; the
///              epilogue applied by a vectorizable loop over channels as each block is stored;
///              threads share (output row, run of channel groups) tasks
///
/// Both render, as every convolution choice,
///
///   extern "C" void <name>(const float* X, const float* Wp, float* Y
///                          [, const float* <epilogue argument>]...);
///
/// with the epilogue at m = (b * OH + oh) * OW + ow (the output pixel) and n = oc (the channel),
/// the (row, column) of Y seen as a matrix. Tested in
/// tests/unit/autotune/nhwc_conv_template_test.cpp.

#include <cstdint>
#include <string>
#include <vector>

#include "autotune/conv_template.h"

namespace kiln::autotune {

/// Whether `problem` is a channels-last 1x1, stride-1, unpadded, ungrouped convolution.
bool nhwc_pointwise_applies(const ConvProblem& problem);

/// Whether `problem` is a channels-last depthwise convolution with one output channel per input
/// channel.
bool nhwc_depthwise_applies(const ConvProblem& problem);

/// The GEMM config of the pointwise template for `problem` on `threads` threads.
GemmConfig nhwc_pointwise_config(const ConvProblem& problem, int threads, TemplateIsa isa);

/// The pointwise template's weight: W^T [C, M] packed by prepack_b for `config`, then the bias
/// (M floats; zeros when `bias` is null).
std::vector<float> prepack_nhwc_pointwise(const GemmConfig& config, const ConvProblem& problem,
                                          const float* w, const float* bias);

/// Where prepack_nhwc_pointwise puts W[m, c] (`bias_offset`: the bias of m).
int64_t nhwc_pointwise_weight_offset(const GemmConfig& config, const ConvProblem& problem,
                                     int64_t m, int64_t c);
int64_t nhwc_pointwise_bias_offset(const GemmConfig& config, const ConvProblem& problem, int64_t m);

std::string render_nhwc_pointwise(const GemmConfig& config, const ConvProblem& problem,
                                  const std::string& function_name,
                                  const TemplateEpilogue& epilogue = {});

/// The pointwise template for one image whose X is multiplied by a per-channel scale S (a
/// squeeze-excitation gate computed at run time) before the convolution: the function scales the
/// rows of the packed W^T by S into a per-thread copy (C x M multiplies, against the H x W x C of
/// scaling X; codegen's prologue_refusal fuses it from 4 pixels per output channel) and runs the
/// GEMM on X as it is:
///
///   extern "C" void <name>(const float* X, const float* Wp, const float* S, float* Y
///                          [, const float* <epilogue argument>]...);
///
/// S holds C floats; Wp is prepack_nhwc_pointwise's result.
std::string render_nhwc_pointwise_scaled(const GemmConfig& config, const ConvProblem& problem,
                                         const std::string& function_name,
                                         const TemplateEpilogue& epilogue = {});

/// The depthwise template's weight: W [M, 1, KH, KW] transposed to [KH * KW][M], then the bias.
std::vector<float> prepack_nhwc_depthwise(const ConvProblem& problem, const float* w,
                                          const float* bias);

std::string render_nhwc_depthwise(TemplateIsa isa, const ConvProblem& problem,
                                  const std::string& function_name,
                                  const TemplateEpilogue& epilogue = {});

/// Whether the channels-last expansion `pw` (a 1x1 convolution as the pointwise template takes
/// it) can be fused into the depthwise convolution `dw` that reads its output: the same images,
/// KH consecutive rows per output row (no dilation down the columns, a stride of at most KH).
bool nhwc_expand_depthwise_applies(const ConvProblem& pw, const ConvProblem& dw);

/// An expansion and the depthwise convolution after it (MobileNetV2's inverted residual) as one
/// function: each thread takes a run of output rows and computes the expanded rows they read as
/// it reaches them (the pointwise template's GEMM on one row of pixels at a time, with its
/// epilogue `pw_epilogue`, which may read no buffers), into a ring of KH rows that stays in
/// cache, and convolves them as the depthwise template does, with `epilogue`. The expanded
/// activation never goes to memory. Renders
///
///   extern "C" void <name>(const float* X, const float* Wx, const float* Wp, float* Y
///                          [, const float* <epilogue argument>]...);
///
/// X the expansion's input [N, H, W, C], Wx its weight as prepack_nhwc_pointwise(pw_config)
/// left it, Wp the depthwise weight as prepack_nhwc_depthwise left it, Y [N, OH, OW, M].
std::string render_nhwc_expand_depthwise(const GemmConfig& pw_config, const ConvProblem& pw,
                                         const TemplateEpilogue& pw_epilogue, TemplateIsa isa,
                                         const ConvProblem& dw, const std::string& function_name,
                                         const TemplateEpilogue& epilogue = {});

/// Whether the channels-last depthwise convolution `dw` can be fused into the 1x1 projection
/// `pw` that reads its output (the same images and pixels, pw's input channels dw's output).
bool nhwc_depthwise_project_applies(const ConvProblem& dw, const ConvProblem& pw);

/// A depthwise convolution and the 1x1 projection after it as one function, the reverse of
/// render_nhwc_expand_depthwise: each thread takes a run of output rows; each row is convolved
/// as the depthwise template does (with `dw_epilogue`) into a buffer of one row, and projected
/// at once by the pointwise template's GEMM (with `epilogue`) while the row is in L1. Neither
/// epilogue may read buffers. Renders
///
///   extern "C" void <name>(const float* X, const float* Wd, const float* Wp, float* Y);
///
/// X the depthwise input [N, H, W, C], Wd its weight as prepack_nhwc_depthwise left it, Wp the
/// projection's as prepack_nhwc_pointwise(pw_config) left it, Y [N, OH, OW, pw.m].
std::string render_nhwc_depthwise_project(TemplateIsa isa, const ConvProblem& dw,
                                          const TemplateEpilogue& dw_epilogue,
                                          const GemmConfig& pw_config, const ConvProblem& pw,
                                          const std::string& function_name,
                                          const TemplateEpilogue& epilogue = {});

}  // namespace kiln::autotune
