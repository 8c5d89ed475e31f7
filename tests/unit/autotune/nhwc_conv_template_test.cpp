// The channels-last convolution choices (src/autotune/nhwc_conv_template.h,
// src/autotune/nhwc_direct_template.h and oneDNN on nhwc):
// each rendered, compiled through the code cache, called on its prepared weight with X
// [N, H, W, C] and compared with the double-precision NCHW convolution of test_util.h, at
// awkward sizes (channels off the vector and off the depthwise block, odd widths, width 1,
// batch 2, stride 2, dilation, asymmetric padding), plain and with a residual Add + Clip(0, 6)
// epilogue; and where prepare() puts each weight (ConvChoice::weight_offset, which the
// interpreter reads).
//
// Tolerance: 8 * eps(float32) * sqrt(depth) * (sum_k |x * w| + |bias| + 1).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "autotune/conv_choice.h"
#include "autotune/nhwc_conv_template.h"
#include "autotune/nhwc_direct_template.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"
#include "support/error.h"

#include "conv_test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

ConvProblem problem(int64_t n, int64_t c, int64_t h, int64_t w, int64_t m, int64_t k,
                    int64_t stride, int64_t pad, int64_t group, int64_t dilation = 1) {
  ConvProblem p = square_conv(n, c, h, w, m, k, stride, pad, dilation, group);
  p.channels_last = true;
  return p;
}

std::vector<ConvProblem> problems() {
  std::vector<ConvProblem> all = {
      problem(2, 19, 5, 7, 37, 1, 1, 0, 1),       // 1x1: channels off the vector, batch 2
      problem(1, 3, 1, 1, 5, 1, 1, 0, 1),         // 1x1 on one pixel
      problem(1, 70, 9, 11, 24, 1, 1, 0, 1),      // 1x1 projection
      problem(1, 37, 9, 13, 37, 3, 1, 1, 37),     // depthwise 3x3 off the block
      problem(2, 70, 10, 7, 70, 3, 2, 1, 70),     // stride 2, batch 2, a block and a tail
      problem(1, 16, 12, 9, 16, 5, 1, 2, 16, 2),  // 5x5 dilation 2
      problem(1, 96, 4, 4, 96, 3, 1, 1, 96),      // channels a multiple of both blocks
  };
  ConvProblem asymmetric = problem(1, 9, 8, 1, 9, 3, 1, 0, 9);  // width 1
  asymmetric.pad_top = 2;
  asymmetric.pad_left = 1;
  asymmetric.pad_right = 1;
  all.push_back(asymmetric);
  // Ungrouped convolutions other than 1x1 stride 1: the direct template.
  all.push_back(problem(2, 5, 9, 17, 37, 3, 1, 1, 1));     // 3x3: batch 2, C and M off the vector
  all.push_back(problem(1, 3, 15, 17, 20, 7, 2, 3, 1));    // a first layer: 7x7 stride 2, C = 3
  all.push_back(problem(1, 24, 7, 9, 40, 1, 2, 0, 1));     // 1x1 stride 2 (downsampling)
  all.push_back(problem(1, 8, 9, 6, 16, 3, 1, 2, 1, 2));   // dilation 2
  ConvProblem dense = problem(1, 6, 7, 5, 9, 3, 2, 0, 1);  // stride 2, asymmetric padding
  dense.pad_top = 1;
  dense.pad_right = 2;
  dense.pad_bottom = 2;
  all.push_back(dense);
  // Grouped convolutions: the direct template's channel blocks inside a group (16 output
  // channels a group), or merging 2 to 4 groups (4 a group: 8- and 16-channel blocks).
  all.push_back(problem(2, 24, 7, 9, 48, 3, 1, 1, 3));   // 8 in, 16 out a group; batch 2
  all.push_back(problem(1, 32, 9, 10, 32, 3, 2, 1, 8));  // 4 in, 4 out a group; stride 2
  all.push_back(problem(1, 12, 5, 6, 24, 1, 2, 0, 3));   // grouped strided 1x1, 4 in, 8 out
  return all;
}

// Y [N, OH, OW, M] of `p` against the NCHW `reference`, then (with `residual`, also [N, OH,
// OW, M]) min(max(y + residual, 0), 6): each element within 8 eps sqrt(depth) (magnitude + 1),
// plus the error `carried` into it from an earlier stage where there is one.
void expect_within(const ConvProblem& p, const ReferenceConv& reference,
                   const ReferenceConv* carried, const float* residual, const std::vector<float>& y,
                   const std::string& what) {
  const double eps = std::numeric_limits<float>::epsilon();
  int failures = 0;
  for (int64_t b = 0; b < p.n; ++b) {
    for (int64_t i = 0; i < p.oh(); ++i) {
      for (int64_t j = 0; j < p.ow(); ++j) {
        for (int64_t m = 0; m < p.m; ++m) {
          const size_t at = static_cast<size_t>(((b * p.oh() + i) * p.ow() + j) * p.m + m);
          const size_t ref = static_cast<size_t>(((b * p.m + m) * p.oh() + i) * p.ow() + j);
          double expected = reference.y[ref];
          if (residual != nullptr) expected = std::min(std::max(expected + residual[at], 0.0), 6.0);
          const double tolerance =
              8 * eps * std::sqrt(double(p.depth())) * (reference.magnitude[ref] + 1) +
              (carried != nullptr ? carried->magnitude[ref] : 1e-30);
          if (!(std::abs(y[at] - expected) <= tolerance) && ++failures <= 3) {
            ADD_FAILURE() << what << ": Y[" << b << ", " << i << ", " << j << ", " << m
                          << "] = " << y[at] << ", expected " << expected;
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// Y [N, OH, OW, M] against the NCHW reference, then (with `residual`, also [N, OH, OW, M])
// min(max(y + residual, 0), 6).
void expect_matches(const ConvProblem& p, const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& bias, const float* residual,
                    const std::vector<float>& y, const std::string& what) {
  const ReferenceConv reference =
      reference_conv(p, transpose_channels(p.n, p.c, p.h, p.w, x, true), w, bias);
  expect_within(p, reference, nullptr, residual, y, what);
}

// Two convolutions in a row as one fused function computes them, in double: `first` on X [N, H,
// W, C], clipped to [0, 6] and rounded to float32 (as its unfused call would store it), then
// `second` on that; `carried` is the first's error bound (8 eps sqrt(depth) (magnitude + 1) a
// value) carried through the second's weights.
struct ClippedChain {
  ReferenceConv y, carried;
};
ClippedChain clipped_chain(const ConvProblem& first, const std::vector<float>& x,
                           const std::vector<float>& w1, const std::vector<float>& b1,
                           const ConvProblem& second, const std::vector<float>& w2,
                           const std::vector<float>& b2) {
  const ReferenceConv r1 = reference_conv(
      first, transpose_channels(first.n, first.c, first.h, first.w, x, true), w1, b1);
  const double eps = std::numeric_limits<float>::epsilon();
  std::vector<float> v(r1.y.size()), error(r1.y.size());
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(std::min(std::max(r1.y[i], 0.0), 6.0));
    error[i] =
        static_cast<float>(8 * eps * std::sqrt(double(first.depth())) * (r1.magnitude[i] + 1));
  }
  return {
      reference_conv(second, v, w2, b2),
      reference_conv(second, error, w2, std::vector<float>(static_cast<size_t>(second.m), 0.0f))};
}

// The heuristic choice of a problem on both ISAs (where this CPU runs them) and oneDNN; the
// pointwise template's other GEMM configs render through the same code.
std::vector<ConvChoicePtr> all_choices(const ConvProblem& p) {
  std::vector<ConvChoicePtr> choices = conv_choices(p, omp_get_max_threads(), TemplateIsa::kAvx2);
  choices.resize(2);
  if (host_template_isa() == TemplateIsa::kAvx512) {
    choices.push_back(conv_choices(p, omp_get_max_threads(), TemplateIsa::kAvx512).front());
  }
  return choices;
}

// The depthwise template alone (its AVX2 and, where this CPU runs them, AVX-512 renderings) at
// the sizes its blocking splits awkwardly: channels below, between and off the vectors and the
// register blocks (the masked tail group), widths with no interior column, fewer columns than a
// pixel block and blocks plus single pixels, stride 2 on odd sizes, asymmetric padding,
// dilation, larger kernels (taps that do not fit in registers), batch 2, rows cut into runs of
// channel groups (few rows, many channels) and both loop orders (groups outside; columns
// outside, for input rows over 100 KiB).
std::vector<ConvProblem> depthwise_problems() {
  std::vector<ConvProblem> all = {
      problem(1, 2, 33, 2, 2, 3, 1, 2, 2),         // two channels; 35 rows, no interior column
      problem(2, 7, 9, 1, 7, 3, 1, 1, 7),          // width 1, batch 2
      problem(1, 17, 11, 13, 17, 3, 2, 1, 17),     // stride 2, odd sizes, a vector and one lane
      problem(1, 33, 10, 15, 33, 3, 1, 2, 33, 2),  // dilation 2, two vectors and one lane
      problem(1, 48, 9, 11, 48, 5, 2, 2, 48),      // 5x5 stride 2
      problem(1, 200, 3, 23, 200, 3, 1, 1, 200),   // few rows, many groups: runs; 23 columns
      // 118 KiB of input rows: columns outside; the rest group two vectors, the second masked
      problem(1, 89, 4, 111, 89, 3, 2, 1, 89),
  };
  ConvProblem asymmetric = problem(2, 37, 8, 10, 37, 3, 2, 0, 37);
  asymmetric.pad_top = 0;
  asymmetric.pad_left = 2;
  asymmetric.pad_bottom = 1;
  asymmetric.pad_right = 0;
  all.push_back(asymmetric);
  return all;
}

TEST(NhwcConvTemplate, DepthwiseIsCorrectAtAwkwardSizes) {
  codecache::CodeCache cache(fresh_dir() / "code");
  for (const ConvProblem& p : depthwise_problems()) {
    ASSERT_TRUE(nhwc_depthwise_applies(p)) << p.text();
    std::vector<ConvChoicePtr> choices = {make_conv_choice("depthwise-nhwc avx2", p)};
    if (host_template_isa() == TemplateIsa::kAvx512) {
      choices.push_back(make_conv_choice("depthwise-nhwc avx512", p));
    }
    check_choices_with_residual_clip(
        cache, p, choices,
        "std::min(std::max(v + e0[m * " + std::to_string(p.m) + " + n], 0.0f), 6.0f)",
        [&](const std::vector<float>& x, const std::vector<float>& w,
            const std::vector<float>& bias, const float* residual, const std::vector<float>& y,
            const std::string& what) { expect_matches(p, x, w, bias, residual, y, what); });
  }
}

// A rendering of a function of X, two prepared inputs (two weights, or a weight and a scale) and
// Y, compiled as "plain" (no epilogue) and as "fused" (the residual Add + Clip(0, 6) epilogue over
// outputs of `channels` channels a pixel, the residual read as e0).
class PlainAndFused {
 public:
  using Render = std::function<std::string(const std::string&, const TemplateEpilogue&)>;
  PlainAndFused(codecache::CodeCache& cache, int64_t channels, const Render& render)
      : library_(compile(cache, channels, render)) {}

  // The plain function, or with `residual` the fused one.
  void run(const float* x, const float* a, const float* b, float* y, const float* residual) const {
    if (residual != nullptr) {
      using Fn = void(const float*, const float*, const float*, float*, const float*);
      library_.symbol<Fn>("fused")(x, a, b, y, residual);
    } else {
      using Fn = void(const float*, const float*, const float*, float*);
      library_.symbol<Fn>("plain")(x, a, b, y);
    }
  }

 private:
  static std::filesystem::path compile(codecache::CodeCache& cache, int64_t channels,
                                       const Render& render) {
    codecache::CompilerConfig config;
    add_runtime(config);
    const TemplateEpilogue residual_clip{
        .expr = "std::min(std::max(v + e0[m * " + std::to_string(channels) + " + n], 0.0f), 6.0f)",
        .args = {"e0"},
        .vector_expr = {}};
    return cache.compile_shared_library(
        {{"plain.cpp", render("plain", {})}, {"fused.cpp", render("fused", residual_clip)}},
        config);
  }

  codecache::LoadedLibrary library_;
};

// An expansion (1x1, bias, Clip(0, 6) as its epilogue) fused into the depthwise convolution
// after it (render_nhwc_expand_depthwise), plain and with the residual Add + Clip epilogue, on
// both ISAs, against the double-precision expansion, clipped and rounded to float32 (as the
// unfused expansion stores it), then the depthwise convolution in double. On 3 threads: runs of
// output rows that start inside an image and cross into the next (batch 2), so that a run's
// first expanded rows are computed where the run starts. Sizes: channels off the vectors
// (a masked tail), stride 1 and 2 on odd sizes, 5x5, asymmetric padding, rows over 100 KiB
// (the depthwise's columns-outside loop order), a width of 1. The expanded values' own error
// (8 eps sqrt(C) (magnitude + 1) each) is carried through the depthwise weights into the
// tolerance.
TEST(NhwcConvTemplate, ExpansionFusedIntoDepthwiseIsCorrect) {
  struct Pair {
    ConvProblem pw, dw;
  };
  auto pair = [](int64_t n, int64_t c, int64_t h, int64_t w, int64_t m, int64_t k, int64_t stride,
                 int64_t pad) {
    return Pair{problem(n, c, h, w, m, 1, 1, 0, 1), problem(n, m, h, w, m, k, stride, pad, m)};
  };
  std::vector<Pair> pairs = {
      pair(2, 5, 9, 13, 37, 3, 1, 1),    // batch 2, a vector and a tail, stride 1
      pair(2, 16, 11, 7, 48, 3, 2, 1),   // stride 2 on odd sizes
      pair(1, 8, 12, 10, 40, 5, 2, 2),   // 5x5 stride 2
      pair(1, 24, 4, 111, 89, 3, 2, 1),  // 118 KiB of rows: columns outside
      pair(2, 3, 7, 1, 20, 3, 1, 1),     // width 1
  };
  Pair asymmetric = pair(1, 6, 10, 9, 24, 3, 2, 0);
  asymmetric.dw.pad_bottom = 1;
  asymmetric.dw.pad_left = 1;
  pairs.push_back(asymmetric);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);
  std::vector<TemplateIsa> isas = {TemplateIsa::kAvx2};
  if (host_template_isa() == TemplateIsa::kAvx512) isas.push_back(TemplateIsa::kAvx512);
  const TemplateEpilogue clip{.expr = "std::min(std::max(v, 0.0f), 6.0f)",
                              .args = {},
                              .vector_expr = "kv_min(kv_relu(v), kv_set1(6.0f))"};
  codecache::CodeCache cache(fresh_dir() / "code");
  for (const Pair& pr : pairs) {
    const ConvProblem &pw = pr.pw, &dw = pr.dw;
    ASSERT_TRUE(nhwc_expand_depthwise_applies(pw, dw)) << pw.text() << " into " << dw.text();
    const std::vector<float> x = random_matrix(pw.n, pw.c * pw.h * pw.w, 3);
    const std::vector<float> wx = random_matrix(pw.m, pw.depth(), 4);
    const std::vector<float> bx = random_matrix(1, pw.m, 5);
    const std::vector<float> w = random_matrix(dw.m, dw.depth(), 6);
    const std::vector<float> b = random_matrix(1, dw.m, 7);
    const size_t out_size = static_cast<size_t>(dw.n * dw.m * dw.oh() * dw.ow());
    std::vector<float> residual = random_matrix(1, static_cast<int64_t>(out_size), 8);
    for (float& r : residual) r *= 8;
    const ClippedChain reference = clipped_chain(pw, x, wx, bx, dw, w, b);
    for (TemplateIsa isa : isas) {
      const ConvChoicePtr expand = conv_choices(pw, 3, isa).front();
      const ConvChoicePtr depthwise = make_conv_choice(
          isa == TemplateIsa::kAvx2 ? "depthwise-nhwc avx2" : "depthwise-nhwc avx512", dw);
      ASSERT_EQ(depthwise->prologue_refusal(*expand), "") << expand->name();
      const std::string what = expand->name() + " into " + depthwise->name() + " at " + dw.text();
      const PlainAndFused functions(
          cache, dw.m, [&](const std::string& name, const TemplateEpilogue& epilogue) {
            return depthwise->render_with_prologue(*expand, clip, name, epilogue);
          });
      const std::vector<float> prepared_x = expand->prepare(wx.data(), bx.data());
      const std::vector<float> prepared = depthwise->prepare(w.data(), b.data());
      for (const bool with_residual : {false, true}) {
        std::vector<float> y(out_size, std::numeric_limits<float>::quiet_NaN());
        functions.run(x.data(), prepared_x.data(), prepared.data(), y.data(),
                      with_residual ? residual.data() : nullptr);
        expect_within(dw, reference.y, &reference.carried,
                      with_residual ? residual.data() : nullptr, y,
                      what + (with_residual ? " + residual Clip" : ""));
      }
    }
  }
  omp_set_num_threads(threads);
}

// A depthwise convolution (bias, Clip(0, 6) as its epilogue) fused into the 1x1 projection after
// it (render_nhwc_depthwise_project), on both ISAs, against the double-precision depthwise
// convolution, clipped and rounded to float32 (as the unfused one stores it), then the projection
// in double. On 3 threads, so that runs of output rows cross from one image into the next
// (batch 2). Sizes: channels off the vectors on both sides (masked tails, output channels off
// the panels), stride 2 on odd sizes, rows cut into runs of channel groups (few rows, many
// channels), a width of 1. The depthwise values' own error is carried through the projection's
// weights into the tolerance.
TEST(NhwcConvTemplate, DepthwiseFusedIntoProjectionIsCorrect) {
  struct Pair {
    ConvProblem dw, pw;
  };
  auto pair = [](int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t stride, int64_t pad,
                 int64_t m) {
    const ConvProblem dw = problem(n, c, h, w, c, k, stride, pad, c);
    return Pair{dw, problem(n, c, dw.oh(), dw.ow(), m, 1, 1, 0, 1)};
  };
  const std::vector<Pair> pairs = {
      pair(2, 37, 9, 13, 3, 1, 1, 19),   // batch 2, tails on both sides
      pair(1, 32, 11, 7, 3, 2, 1, 16),   // stride 2 on odd sizes
      pair(1, 200, 3, 23, 3, 1, 1, 24),  // runs of channel groups
      pair(2, 20, 7, 1, 3, 1, 1, 45),    // width 1
  };
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);
  std::vector<TemplateIsa> isas = {TemplateIsa::kAvx2};
  if (host_template_isa() == TemplateIsa::kAvx512) isas.push_back(TemplateIsa::kAvx512);
  const TemplateEpilogue clip{.expr = "std::min(std::max(v, 0.0f), 6.0f)",
                              .args = {},
                              .vector_expr = "kv_min(kv_relu(v), kv_set1(6.0f))"};
  codecache::CodeCache cache(fresh_dir() / "code");
  for (const Pair& pr : pairs) {
    const ConvProblem &dw = pr.dw, &pw = pr.pw;
    ASSERT_TRUE(nhwc_depthwise_project_applies(dw, pw)) << dw.text() << " into " << pw.text();
    const std::vector<float> x = random_matrix(dw.n, dw.c * dw.h * dw.w, 3);
    const std::vector<float> wd = random_matrix(dw.m, dw.depth(), 4);
    const std::vector<float> bd = random_matrix(1, dw.m, 5);
    const std::vector<float> w = random_matrix(pw.m, pw.depth(), 6);
    const std::vector<float> b = random_matrix(1, pw.m, 7);
    const ClippedChain reference = clipped_chain(dw, x, wd, bd, pw, w, b);
    for (TemplateIsa isa : isas) {
      const ConvChoicePtr depthwise = make_conv_choice(
          isa == TemplateIsa::kAvx2 ? "depthwise-nhwc avx2" : "depthwise-nhwc avx512", dw);
      const ConvChoicePtr project = conv_choices(pw, 3, isa).front();
      ASSERT_EQ(project->prologue_refusal(*depthwise), "") << project->name();
      EXPECT_FALSE(project->epilogue_reads_buffers_with_prologue());
      const std::string what = depthwise->name() + " into " + project->name() + " at " + pw.text();
      codecache::CompilerConfig config;
      add_runtime(config);
      const codecache::LoadedLibrary library(cache.compile_shared_library(
          {{"fused.cpp", project->render_with_prologue(*depthwise, clip, "fused", {})}}, config));
      const std::vector<float> prepared_d = depthwise->prepare(wd.data(), bd.data());
      const std::vector<float> prepared = project->prepare(w.data(), b.data());
      std::vector<float> y(static_cast<size_t>(pw.n * pw.m * pw.h * pw.w),
                           std::numeric_limits<float>::quiet_NaN());
      using Fn = void(const float*, const float*, const float*, float*);
      library.symbol<Fn>("fused")(x.data(), prepared_d.data(), prepared.data(), y.data());
      expect_within(pw, reference.y, &reference.carried, nullptr, y, what);
    }
  }
  omp_set_num_threads(threads);
}

// The pointwise template with a per-channel scale of its input (a squeeze-excitation gate) folded
// into its weight (render_nhwc_pointwise_scaled), plain and with the residual Add + Clip
// epilogue, on both ISAs' heuristic choices, against the double convolution of X scaled in
// float32 (the multiply the fusion removes). Sizes: channels off the vectors, more input
// channels than one KC block (several blocks of scaled rows), output channels off the panels.
TEST(NhwcConvTemplate, PointwiseWithAnInputScaleIsCorrect) {
  const std::vector<ConvProblem> problems = {
      problem(1, 19, 5, 7, 37, 1, 1, 0, 1),
      problem(1, 600, 3, 5, 24, 1, 1, 0, 1),
      problem(1, 16, 7, 7, 160, 1, 1, 0, 1),
  };
  std::vector<TemplateIsa> isas = {TemplateIsa::kAvx2};
  if (host_template_isa() == TemplateIsa::kAvx512) isas.push_back(TemplateIsa::kAvx512);
  codecache::CodeCache cache(fresh_dir() / "code");
  for (const ConvProblem& p : problems) {
    const std::vector<float> x = random_matrix(1, p.c * p.h * p.w, 3);
    const std::vector<float> scale = random_matrix(1, p.c, 4);
    const std::vector<float> w = random_matrix(p.m, p.depth(), 5);
    const std::vector<float> bias = random_matrix(1, p.m, 6);
    std::vector<float> residual = random_matrix(1, p.m * p.h * p.w, 7);
    for (float& r : residual) r *= 8;
    std::vector<float> scaled = x;  // [H, W, C]
    for (size_t i = 0; i < scaled.size(); ++i) scaled[i] *= scale[i % static_cast<size_t>(p.c)];
    for (TemplateIsa isa : isas) {
      const ConvChoicePtr choice = conv_choices(p, 2, isa).front();
      ASSERT_TRUE(choice->takes_input_scale()) << choice->name();
      const PlainAndFused functions(cache, p.m,
                                    [&](const std::string& name, const TemplateEpilogue& epilogue) {
                                      return choice->render_with_input_scale(name, epilogue);
                                    });
      const std::vector<float> prepared = choice->prepare(w.data(), bias.data());
      for (const bool with_residual : {false, true}) {
        std::vector<float> y(residual.size(), std::numeric_limits<float>::quiet_NaN());
        functions.run(x.data(), prepared.data(), scale.data(), y.data(),
                      with_residual ? residual.data() : nullptr);
        expect_matches(
            p, scaled, w, bias, with_residual ? residual.data() : nullptr, y,
            choice->name() + " with an input scale" + (with_residual ? " + residual Clip" : ""));
      }
    }
  }
}

// Only the pointwise template's expansion fuses, and only into a depthwise convolution that reads
// whole consecutive rows of it; a projection takes only the depthwise convolution whose pixels it
// reads, and then its epilogue may read no buffers.
TEST(NhwcConvTemplate, ProloguesPairDepthwiseWithAnExpansionOrAProjection) {
  const ConvProblem pw = problem(1, 8, 12, 10, 40, 1, 1, 0, 1);
  const ConvProblem dw = problem(1, 40, 12, 10, 40, 3, 1, 1, 40);
  const ConvChoicePtr depthwise = make_conv_choice("depthwise-nhwc avx2", dw);
  EXPECT_EQ(depthwise->prologue_refusal(*conv_choices(pw, 2, TemplateIsa::kAvx2).front()), "");
  EXPECT_NE(depthwise->prologue_refusal(*make_conv_onednn_choice(pw)), "");
  ConvProblem dilated = dw;
  dilated.dilation_h = dilated.dilation_w = 2;
  dilated.pad_top = dilated.pad_bottom = dilated.pad_left = dilated.pad_right = 2;
  EXPECT_FALSE(nhwc_expand_depthwise_applies(pw, dilated));
  ConvProblem narrower = dw;
  narrower.c = narrower.m = narrower.group = 24;
  EXPECT_FALSE(nhwc_expand_depthwise_applies(pw, narrower));
  EXPECT_NE(make_conv_choice("depthwise-nhwc avx2", narrower)
                ->prologue_refusal(*conv_choices(pw, 2, TemplateIsa::kAvx2).front()),
            "");
  // A projection takes the depthwise convolution before it, and nothing else.
  const ConvProblem project = problem(1, 40, 12, 10, 16, 1, 1, 0, 1);
  const ConvChoicePtr projection = conv_choices(project, 2, TemplateIsa::kAvx2).front();
  EXPECT_EQ(projection->prologue_refusal(*depthwise), "");
  EXPECT_NE(projection->prologue_refusal(*conv_choices(pw, 2, TemplateIsa::kAvx2).front()), "");
  EXPECT_NE(conv_choices(problem(1, 24, 12, 10, 16, 1, 1, 0, 1), 2, TemplateIsa::kAvx2)
                .front()
                ->prologue_refusal(*depthwise),
            "");
  EXPECT_TRUE(depthwise->epilogue_reads_buffers_with_prologue());
}

TEST(NhwcConvTemplate, ChoicesNamedAndRebuiltFromTheirNames) {
  const ConvProblem pointwise = problem(1, 32, 56, 56, 96, 1, 1, 0, 1);
  EXPECT_EQ(pointwise.text(), "conv(1x32x56x56, 96x32x1x1, s1, nhwc)");
  EXPECT_EQ(conv_problem_from_ints(conv_problem_ints(pointwise)), pointwise);
  std::vector<ConvChoicePtr> choices = conv_choices(pointwise, 2, TemplateIsa::kAvx512);
  ASSERT_GE(choices.size(), 3u);
  EXPECT_EQ(choices[0]->name().rfind("pointwise-nhwc avx512", 0), 0u) << choices[0]->name();
  EXPECT_EQ(choices[1]->name(), "onednn");
  for (const ConvChoicePtr& c : choices) {
    EXPECT_EQ(make_conv_choice(c->name(), pointwise)->hash_key(), c->hash_key()) << c->name();
  }
  // The heuristic's first choice at 2 threads on AVX-512 starts with `prefix`.
  auto expect_first = [](const ConvProblem& p, const std::string& prefix) {
    const std::string name = conv_choices(p, 2, TemplateIsa::kAvx512)[0]->name();
    EXPECT_TRUE(name.starts_with(prefix)) << p.text() << ": " << name;
  };
  // 16 output channels: the one-vector AVX-512 block; 24: the AVX2 block that fits them exactly.
  expect_first(problem(1, 32, 112, 112, 16, 1, 1, 0, 1), "pointwise-nhwc avx512_14x16_");
  expect_first(problem(1, 144, 56, 56, 24, 1, 1, 0, 1), "pointwise-nhwc avx2_4x24_");
  expect_first(problem(1, 144, 28, 28, 32, 1, 1, 0, 1), "pointwise-nhwc avx512_12x32_");
  // 49 rows (7 x 7): 7-row blocks, with columns split between threads (7 panels of 48: 4 and 3).
  expect_first(problem(1, 960, 7, 7, 320, 1, 1, 0, 1), "pointwise-nhwc avx512_7x48_mc49_");
  expect_first(problem(1, 960, 7, 7, 160, 1, 1, 0, 1), "pointwise-nhwc avx512_7x48_mc49_");
  // 196 rows (14 x 14), 64 columns: the 6 x 64 block, whose 4 extra rows cost less than the 32
  // columns of padding of 7 x 48 (and 14 x 32, which would tile it, is left to the autotuner).
  expect_first(problem(1, 384, 14, 14, 64, 1, 1, 0, 1), "pointwise-nhwc avx512_6x64_");
  // AVX2: 49 rows take the 5-row block (50 rows; 6 x 16 computes 54); 56 x 56 ones keep 4 x 24,
  // where 5 x 16 would save under 1 % of the rows.
  auto expect_first_avx2 = [](const ConvProblem& p, const std::string& prefix) {
    const std::string name = conv_choices(p, 2, TemplateIsa::kAvx2)[0]->name();
    EXPECT_TRUE(name.starts_with(prefix)) << p.text() << ": " << name;
  };
  expect_first_avx2(problem(1, 960, 7, 7, 160, 1, 1, 0, 1), "pointwise-nhwc avx2_5x16_mc50_");
  expect_first_avx2(problem(1, 24, 56, 56, 144, 1, 1, 0, 1), "pointwise-nhwc avx2_4x24_");
  const ConvProblem depthwise = problem(1, 96, 112, 112, 96, 3, 2, 1, 96);
  choices = conv_choices(depthwise, 2, TemplateIsa::kAvx2);
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0]->name(), "depthwise-nhwc avx2");
  EXPECT_EQ(choices[1]->name(), "onednn");
  for (const ConvChoicePtr& c : choices) {
    EXPECT_EQ(make_conv_choice(c->name(), depthwise)->hash_key(), c->hash_key()) << c->name();
  }
  // A 3x3 stride-1 layer of 14 x 14 or more: Winograd, then the direct template, then oneDNN.
  const ConvProblem dense = problem(1, 64, 56, 56, 64, 3, 1, 1, 1);
  choices = conv_choices(dense, 2, TemplateIsa::kAvx512);
  ASSERT_GE(choices.size(), 4u);
  EXPECT_EQ(choices[0]->name(), "winograd-nhwc avx512");
  EXPECT_EQ(choices[1]->name(), "direct-nhwc avx512_oc64x6_ic64_rows");
  EXPECT_EQ(choices[2]->name(), "onednn");
  for (const ConvChoicePtr& c : choices) {
    EXPECT_EQ(make_conv_choice(c->name(), dense)->hash_key(), c->hash_key()) << c->name();
  }
  choices = conv_choices(dense, 2, TemplateIsa::kAvx2);
  ASSERT_GE(choices.size(), 2u);
  EXPECT_EQ(choices[0]->name(), "winograd-nhwc avx2");
  EXPECT_EQ(choices[1]->name(), "direct-nhwc avx2_oc16x6_ic64_rows");
  // At 7 x 7 the direct template is first, Winograd after oneDNN.
  const ConvProblem deep = problem(1, 512, 7, 7, 512, 3, 1, 1, 1);
  choices = conv_choices(deep, 2, TemplateIsa::kAvx512);
  ASSERT_GE(choices.size(), 3u);
  EXPECT_EQ(choices[0]->name(), "direct-nhwc avx512_oc32x7_ic512");
  EXPECT_EQ(choices[1]->name(), "onednn");
  EXPECT_EQ(choices[2]->name(), "winograd-nhwc avx512");
  // At 14 x 14 x 256 (16 tiles of 4x4, 9.4 MB of F(4x4)'s transformed weights) F(4x4) is first
  // at AVX2 and F(2x2) at AVX-512, where F(4x4) is bound by reading its weights; below 8 MiB
  // (14 x 14 x 192: 5.3 MB) or over 16 tiles (a batch of 2, or 20 x 20) F(4x4) is first on both.
  // At 14 x 14 x 512 (38 MB) the direct template is first at AVX2, F(2x2) at AVX-512.
  const ConvProblem mid = problem(1, 256, 14, 14, 256, 3, 1, 1, 1);
  EXPECT_EQ(conv_choices(mid, 2, TemplateIsa::kAvx2)[0]->name(), "winograd-nhwc avx2");
  EXPECT_EQ(conv_choices(mid, 2, TemplateIsa::kAvx512)[0]->name(), "winograd-f2-nhwc avx512");
  for (const ConvProblem& p :
       {problem(1, 192, 14, 14, 192, 3, 1, 1, 1), problem(2, 256, 14, 14, 256, 3, 1, 1, 1),
        problem(1, 256, 20, 20, 256, 3, 1, 1, 1)}) {
    EXPECT_EQ(conv_choices(p, 2, TemplateIsa::kAvx512)[0]->name(), "winograd-nhwc avx512")
        << p.text();
  }
  const ConvProblem wide = problem(1, 512, 14, 14, 512, 3, 1, 1, 1);
  EXPECT_EQ(conv_choices(wide, 2, TemplateIsa::kAvx2)[0]->name().rfind("direct-nhwc avx2", 0), 0u);
  EXPECT_EQ(conv_choices(wide, 2, TemplateIsa::kAvx512)[0]->name(), "winograd-f2-nhwc avx512");
  // First layers (3 input channels): 64 by 6 at 64 output channels, 16 by 14 below.
  const ConvProblem stem7 = problem(1, 3, 224, 224, 64, 7, 2, 3, 1);
  EXPECT_EQ(conv_choices(stem7, 2, TemplateIsa::kAvx512)[0]->name(),
            "direct-nhwc avx512_oc64x6_ic3_rows");
  const ConvProblem stem3 = problem(1, 3, 224, 224, 32, 3, 2, 1, 1);
  EXPECT_EQ(conv_choices(stem3, 2, TemplateIsa::kAvx512)[0]->name(),
            "direct-nhwc avx512_oc16x14_ic3_rows");
  // At AVX2 oneDNN's first for first layers, the direct template's heuristic config next.
  const std::vector<ConvChoicePtr> stem3_avx2 = conv_choices(stem3, 2, TemplateIsa::kAvx2);
  EXPECT_EQ(stem3_avx2[0]->name(), "onednn");
  EXPECT_EQ(stem3_avx2[1]->name(), "direct-nhwc avx2_oc16x6_ic3_rows");
  EXPECT_EQ(conv_choices(stem7, 2, TemplateIsa::kAvx2)[0]->name(), "onednn");
  // A strided 1x1 projection: 64 by 5 (three blocks of a 14-pixel row).
  const ConvProblem projection = problem(1, 512, 28, 28, 1024, 1, 2, 0, 1);
  EXPECT_EQ(conv_choices(projection, 2, TemplateIsa::kAvx512)[0]->name(),
            "direct-nhwc avx512_oc64x5_ic512");
  // Winograd's buffers or a padded copy of X over 32 MiB (a large static batch): oneDNN.
  const ConvProblem large = problem(64, 64, 56, 56, 64, 3, 1, 1, 1);
  EXPECT_EQ(conv_choices(large, 2, TemplateIsa::kAvx512)[0]->name(), "onednn");
  // Grouped (ResNeXt-50's 32 groups): the direct template, its blocks inside a group where the
  // groups are as wide as a block, else merging the fewest groups (AVX2's 8 channels: 2 groups of
  // 4); then oneDNN. Groups that no block tiles (7 output channels, or 1, 8 groups a block):
  // oneDNN.
  const ConvProblem wide_groups = problem(1, 1024, 7, 7, 1024, 3, 1, 1, 32);
  choices = conv_choices(wide_groups, 2, TemplateIsa::kAvx512);
  ASSERT_GE(choices.size(), 2u);
  EXPECT_EQ(choices[0]->name(), "direct-nhwc avx512_oc32x7_ic1024");
  EXPECT_EQ(choices[1]->name(), "onednn");
  for (const ConvChoicePtr& c : choices) {
    EXPECT_EQ(make_conv_choice(c->name(), wide_groups)->hash_key(), c->hash_key()) << c->name();
  }
  const ConvProblem narrow_groups = problem(1, 128, 56, 56, 128, 3, 1, 1, 32);
  EXPECT_EQ(conv_choices(narrow_groups, 2, TemplateIsa::kAvx512)[0]->name(),
            "direct-nhwc avx2_oc8x12_ic128_rows");
  EXPECT_THROW(make_conv_choice("direct-nhwc avx512_oc32x14_ic128_rows", narrow_groups),
               InternalError);
  EXPECT_EQ(conv_choices(problem(1, 21, 8, 8, 21, 3, 1, 1, 3), 2, TemplateIsa::kAvx512)[0]->name(),
            "onednn");
  EXPECT_EQ(conv_choices(problem(1, 32, 8, 8, 16, 3, 1, 1, 16), 2, TemplateIsa::kAvx512)[0]->name(),
            "onednn");
  // The direct template takes whole input channels and no 1x1 stride-1 problem.
  EXPECT_THROW(make_conv_choice("direct-nhwc avx512_oc32x14_ic32", dense), InternalError);
  EXPECT_THROW(make_conv_choice("direct-nhwc avx512_oc32x14_ic32", pointwise), InternalError);
  // The NCHW implementations refuse channels-last problems.
  EXPECT_THROW(make_conv_im2col_choice(pointwise), InternalError);
  EXPECT_THROW(make_conv_choice("depthwise avx2", depthwise), InternalError);
  EXPECT_THROW(make_conv_choice("pointwise-nhwc avx2_1x1", pointwise), InternalError);
  EXPECT_THROW(make_conv_choice("depthwise-nhwc avx2", pointwise), InternalError);
}

// prepare() puts W[m, t] and the bias where weight_offset and bias_offset say, for every choice
// (the interpreter reads prepared weights through them), NCHW template choices included.
TEST(NhwcConvTemplate, WeightOffsetsMatchPrepare) {
  std::vector<ConvProblem> all = problems();
  ConvProblem nchw = problem(1, 21, 9, 9, 35, 3, 1, 1, 1);
  nchw.channels_last = false;
  all.push_back(nchw);
  for (const ConvProblem& p : all) {
    std::vector<ConvChoicePtr> choices = conv_choices(p, 2, TemplateIsa::kAvx512);
    for (const ConvChoicePtr& c : conv_choices(p, 2, TemplateIsa::kAvx2)) choices.push_back(c);
    std::vector<float> w(static_cast<size_t>(p.m * p.depth())), bias(static_cast<size_t>(p.m));
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i + 1);
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = -static_cast<float>(i + 1);
    for (const ConvChoicePtr& c : choices) {
      const std::vector<float> prepared = c->prepare(w.data(), bias.data());
      int failures = 0;
      for (int64_t m = 0; m < p.m; ++m) {
        ASSERT_LT(c->bias_offset(m), static_cast<int64_t>(prepared.size()));
        if (prepared[static_cast<size_t>(c->bias_offset(m))] != bias[static_cast<size_t>(m)])
          ++failures;
        for (int64_t t = 0; t < p.depth(); ++t) {
          const int64_t at = c->weight_offset(m, t);
          ASSERT_LT(at, static_cast<int64_t>(prepared.size()));
          if (prepared[static_cast<size_t>(at)] != w[static_cast<size_t>(m * p.depth() + t)])
            ++failures;
        }
      }
      EXPECT_EQ(failures, 0) << c->name() << " at " << p.text();
    }
  }
}

TEST(NhwcConvTemplate, EveryChoiceIsCorrectAtAwkwardSizes) {
  codecache::CodeCache cache(fresh_dir() / "code");
  for (const ConvProblem& p : problems()) {
    // Y and the residual are [N, OH, OW, M]: the epilogue's row m is a pixel, n a channel. The
    // pointwise choices apply the vector form in registers.
    const std::string row = std::to_string(p.m);
    check_choices_with_residual_clip(
        cache, p, all_choices(p), "std::min(std::max(v + e0[m * " + row + " + n], 0.0f), 6.0f)",
        [&](const std::vector<float>& x, const std::vector<float>& w,
            const std::vector<float>& bias, const float* residual, const std::vector<float>& y,
            const std::string& what) { expect_matches(p, x, w, bias, residual, y, what); },
        "kv_min(kv_max(kv_add(v, kv_load(e0 + m * " + row +
            " + n0)), kv_set1(0.0f)), kv_set1(6.0f))");
  }
}

// Every register block of the direct template (both ISAs where the CPU runs them; the task
// order of each block's first config, the other order being the same code in a swapped loop
// nest), on a problem whose width leaves a tail block for each and whose channels leave a
// partial channel block.
TEST(NhwcConvTemplate, EveryDirectConfigIsCorrect) {
  codecache::CodeCache cache(fresh_dir() / "code");
  const ConvProblem p = problem(1, 5, 6, 19, 70, 3, 1, 1, 1);
  std::vector<ConvChoicePtr> choices;
  const TemplateIsa isa = host_template_isa();
  std::vector<std::pair<TemplateIsa, int>> blocks;
  for (const ConvConfig& config : nhwc_direct_configs(p, isa)) {
    const std::pair<TemplateIsa, int> block{config.isa, config.ocb};
    if (std::find(blocks.begin(), blocks.end(), block) != blocks.end()) continue;
    blocks.push_back(block);
    choices.push_back(make_conv_choice("direct-nhwc " + config.name(), p));
  }
  ASSERT_GE(choices.size(), isa == TemplateIsa::kAvx512 ? 7u : 3u);
  check_choices_with_residual_clip(
      cache, p, choices,
      "std::min(std::max(v + e0[m * " + std::to_string(p.m) + " + n], 0.0f), 6.0f)",
      [&](const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& bias,
          const float* residual, const std::vector<float>& y,
          const std::string& what) { expect_matches(p, x, w, bias, residual, y, what); });
}

}  // namespace
}  // namespace kiln::autotune
