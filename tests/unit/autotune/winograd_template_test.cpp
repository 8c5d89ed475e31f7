// The Winograd F(4x4, 3x3) convolution template (src/autotune/winograd_template.h), on NCHW and
// on channels-last activations: rendered for both ISAs (AVX-512 where this CPU runs it), compiled
// through the code cache, called on its prepared weight and compared with a double-precision
// NCHW convolution (test_util.h; channels-last X is transposed from its input and Y back) at
// awkward sizes (odd channel counts, input and output channels off the vector, partial tiles at
// the right and bottom, asymmetric and no padding, a 1x1 image, batch 2), plain and with a
// residual Add + Clip(0, 6) epilogue, and at ResNet-50's four 3x3 layers.
//
// Tolerance: Winograd's transforms (coefficients up to 8) cost accuracy compared with a direct
// sum, so the error is bounded relative to the layer's output: max |y - y_ref| <= 1e-4 * max
// |y_ref| (the bound the issue asks for on ResNet layers); each element is also within
// 1e-4 * (sum |x * w| + |bias| + 1) of the reference, its own terms' magnitude.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "autotune/conv_choice.h"
#include "autotune/runtime_headers.h"
#include "autotune/winograd_template.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"
#include "support/error.h"

#include "conv_test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

namespace fs = std::filesystem;

ConvProblem conv3x3(int64_t n, int64_t c, int64_t h, int64_t w, int64_t m, int64_t pad,
                    bool channels_last = false) {
  return {.n = n,
          .c = c,
          .h = h,
          .w = w,
          .m = m,
          .kh = 3,
          .kw = 3,
          .pad_top = pad,
          .pad_left = pad,
          .pad_bottom = pad,
          .pad_right = pad,
          .channels_last = channels_last};
}

// The choice name of F(tile x tile, 3x3) on p's layout.
std::string winograd_name(TemplateIsa isa, const ConvProblem& p, int tile = 4) {
  return std::string(tile == 2 ? "winograd-f2" : "winograd") + (p.channels_last ? "-nhwc " : " ") +
         (isa == TemplateIsa::kAvx512 ? "avx512" : "avx2");
}

std::vector<TemplateIsa> isas() {
  std::vector<TemplateIsa> all = {TemplateIsa::kAvx2};
  if (host_template_isa() == TemplateIsa::kAvx512) all.push_back(TemplateIsa::kAvx512);
  return all;
}

// Compares y with the reference (then, with `residual`, min(max(y + residual, 0), 6)); returns
// max |y - y_ref| / max |y_ref|.
double expect_matches(const ConvProblem& p, const std::vector<float>& x,
                      const std::vector<float>& w, const std::vector<float>& bias,
                      const float* residual, const std::vector<float>& y, const std::string& what) {
  const ReferenceConv reference = reference_conv(p, x, w, bias);
  double largest = 0, worst = 0;
  int failures = 0;
  for (size_t at = 0; at < y.size(); ++at) {
    double expected = reference.y[at];
    if (residual != nullptr) expected = std::min(std::max(expected + residual[at], 0.0), 6.0);
    const double error = std::abs(y[at] - expected);
    largest = std::max(largest, std::abs(expected));
    worst = std::max(worst, std::isnan(error) ? std::numeric_limits<double>::infinity() : error);
    if (!(error <= 1e-4 * (reference.magnitude[at] + 1)) && ++failures <= 3) {
      ADD_FAILURE() << what << ": Y[" << at << "] = " << y[at] << ", expected " << expected;
    }
  }
  EXPECT_EQ(failures, 0) << what;
  const double relative = worst / std::max(largest, 1e-30);
  EXPECT_LE(relative, 1e-4) << what;
  return relative;
}

TEST(WinogradTemplate, AppliesToThreeByThreeStrideOneOnly) {
  const ConvProblem resnet = conv3x3(1, 64, 56, 56, 64, 1);
  EXPECT_TRUE(winograd_applies(resnet));
  ConvProblem strided = resnet;
  strided.stride_h = strided.stride_w = 2;
  EXPECT_FALSE(winograd_applies(strided));
  ConvProblem dilated = resnet;
  dilated.dilation_h = 2;
  EXPECT_FALSE(winograd_applies(dilated));
  ConvProblem grouped = resnet;
  grouped.group = 2;
  EXPECT_FALSE(winograd_applies(grouped));
  ConvProblem five = resnet;
  five.kh = five.kw = 5;
  EXPECT_FALSE(winograd_applies(five));
  // A row of tiles 100,000 columns wide does not fit the stack budget.
  EXPECT_FALSE(winograd_applies(conv3x3(1, 1, 3, 100000, 1, 1)));
  EXPECT_THROW(render_winograd(TemplateIsa::kAvx2, 4, strided, "f"), InternalError);

  // conv_choices offers it, as the heuristic choice at 28 x 28 or more with 32 or more channels,
  // and rebuilds it from its name.
  const std::vector<ConvChoicePtr> choices = conv_choices(resnet, 2, TemplateIsa::kAvx512);
  ASSERT_FALSE(choices.empty());
  EXPECT_EQ(choices.front()->name(), "winograd avx512");
  EXPECT_EQ(make_conv_choice("winograd avx512", resnet)->hash_key(), choices.front()->hash_key());
  const ConvProblem small = conv3x3(1, 256, 14, 14, 256, 1);
  const std::vector<ConvChoicePtr> later = conv_choices(small, 2, TemplateIsa::kAvx2);
  ASSERT_FALSE(later.empty());
  EXPECT_NE(later.front()->name(), "winograd avx2");
  EXPECT_TRUE(std::any_of(later.begin(), later.end(),
                          [](const ConvChoicePtr& c) { return c->name() == "winograd avx2"; }));
  EXPECT_EQ(make_conv_choice("winograd avx2", resnet)->name(), "winograd avx2");
  EXPECT_THROW(make_conv_choice("winograd avx3", resnet), InternalError);
  for (const ConvChoicePtr& c : conv_choices(strided, 2, TemplateIsa::kAvx512)) {
    EXPECT_EQ(c->name().rfind("winograd", 0), std::string::npos) << c->name();
  }

  // Channels-last: "winograd-nhwc", among the channels-last choices; each name is rebuilt only
  // for a problem of its own layout. Its input transform reads X in place, so a wide row fits.
  ConvProblem nhwc = resnet;
  nhwc.channels_last = true;
  const std::vector<ConvChoicePtr> nhwc_choices = conv_choices(nhwc, 2, TemplateIsa::kAvx2);
  EXPECT_TRUE(std::any_of(nhwc_choices.begin(), nhwc_choices.end(), [](const ConvChoicePtr& c) {
    return c->name() == "winograd-nhwc avx2";
  }));
  EXPECT_EQ(make_conv_choice("winograd-nhwc avx512", nhwc)->name(), "winograd-nhwc avx512");
  EXPECT_THROW(make_conv_choice("winograd avx512", nhwc), InternalError);
  EXPECT_THROW(make_conv_choice("winograd-nhwc avx512", resnet), InternalError);
  EXPECT_FALSE(winograd_applies(conv3x3(1, 1, 3, 10000, 1, 1)));
  EXPECT_TRUE(winograd_applies(conv3x3(1, 1, 3, 10000, 1, 1, true)));
  // Its buffers are bounded by 32 MiB (a large static batch is left to the other choices).
  EXPECT_FALSE(winograd_applies(conv3x3(64, 64, 56, 56, 64, 1, true)));

  // F(2x2, 3x3): the same problems, no other tile size; the heuristic choice at AVX2 where F(4x4)
  // is not, under 14 x 14 outputs, with transformed weights (16/9 of W) of at most 16 MiB, as at
  // ResNet's 7 x 7 x 512 (and at AVX-512 where reading F(4x4)'s weights would bound it:
  // nhwc_conv_template_test.cpp); a later choice on NCHW activations.
  EXPECT_TRUE(winograd_applies(resnet, 2));
  EXPECT_FALSE(winograd_applies(strided, 2));
  EXPECT_FALSE(winograd_applies(resnet, 3));
  EXPECT_THROW(render_winograd(TemplateIsa::kAvx2, 3, resnet, "f"), InternalError);
  const ConvProblem last = conv3x3(1, 512, 7, 7, 512, 1, true);
  EXPECT_EQ(conv_choices(last, 2, TemplateIsa::kAvx2).front()->name(), "winograd-f2-nhwc avx2");
  EXPECT_NE(conv_choices(last, 2, TemplateIsa::kAvx512).front()->name(), "winograd-f2-nhwc avx512");
  EXPECT_EQ(conv_choices(nhwc, 2, TemplateIsa::kAvx2).front()->name(), "winograd-nhwc avx2");
  EXPECT_EQ(make_conv_choice("winograd-f2 avx512", resnet)->name(), "winograd-f2 avx512");
  EXPECT_THROW(make_conv_choice("winograd-f2 avx512", nhwc), InternalError);
  const std::vector<ConvChoicePtr> nchw_choices = conv_choices(small, 2, TemplateIsa::kAvx2);
  EXPECT_TRUE(std::any_of(nchw_choices.begin(), nchw_choices.end(),
                          [](const ConvChoicePtr& c) { return c->name() == "winograd-f2 avx2"; }));
}

// Runs `choice` (plain, and with the residual Clip epilogue when `fused`) on seeded data and
// returns the relative error of the plain call. X, Y and the residual are generated and compared
// as NCHW, transposed around the call of a channels-last choice.
double run_and_check(codecache::CodeCache& cache, const ConvChoice& choice, bool fused) {
  const ConvProblem& p = choice.problem();
  TemplateEpilogue epilogue{.expr = {}, .args = {"e0"}, .vector_expr = {}};
  // The epilogue's row m is a channel's output row (NCHW) or a pixel (channels-last).
  const int64_t row = p.channels_last ? p.m : p.ow();
  epilogue.expr = "std::min(std::max(v + e0[m * " + std::to_string(row) + " + n], 0.0f), 6.0f)";
  auto input = [&](const std::vector<float>& x) {
    return p.channels_last ? transpose_channels(p.n, p.c, p.h, p.w, x) : x;
  };
  auto output = [&](const std::vector<float>& y, bool to_nchw) {
    return p.channels_last ? transpose_channels(p.n, p.m, p.oh(), p.ow(), y, to_nchw) : y;
  };
  std::vector<codecache::SourceUnit> sources = {{"conv.cpp", choice.render("conv")}};
  if (fused) sources.push_back({"fused.cpp", choice.render("conv_fused", epilogue)});
  codecache::CompilerConfig config;
  add_runtime(config);
  codecache::LoadedLibrary library(cache.compile_shared_library(sources, config));
  const std::vector<float> x = random_matrix(p.n, p.c * p.h * p.w, 3);
  const std::vector<float> w = random_matrix(p.m, p.depth(), 4);
  const std::vector<float> bias = random_matrix(1, p.m, 5);
  const std::vector<float> prepared = choice.prepare(w.data(), bias.data());
  const size_t out_size = static_cast<size_t>(p.n * p.m * p.oh() * p.ow());
  const std::string what = choice.name() + " at " + p.text();
  const std::vector<float> x_in = input(x);
  std::vector<float> y(out_size, std::numeric_limits<float>::quiet_NaN());
  // Twice: the first call transforms the weights, the second reuses them.
  for (int call = 0; call < 2; ++call) {
    library.symbol<ConvFn>("conv")(x_in.data(), prepared.data(), y.data());
  }
  const double relative = expect_matches(p, x, w, bias, nullptr, output(y, true), what);
  if (fused) {
    std::vector<float> residual = random_matrix(1, static_cast<int64_t>(out_size), 6);
    for (float& r : residual) r *= 8;  // reach both ends of the Clip
    const std::vector<float> residual_in = output(residual, false);
    std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
    library.symbol<ConvResidualFn>("conv_fused")(x_in.data(), prepared.data(), y.data(),
                                                 residual_in.data());
    expect_matches(p, x, w, bias, residual.data(), output(y, true), what + " + residual Clip");
  }
  return relative;
}

TEST(WinogradTemplate, CorrectAtAwkwardSizes) {
  std::vector<ConvProblem> problems = {
      conv3x3(1, 5, 9, 13, 7, 1),     // odd channels, M under one vector, partial tiles
      conv3x3(2, 16, 14, 14, 40, 1),  // batch 2, M off the two-vector block
      conv3x3(1, 3, 5, 6, 33, 0),     // no padding: a 3x4 output
      conv3x3(1, 8, 1, 1, 4, 1),      // a 1x1 image: one tile, mostly padding
  };
  ConvProblem asymmetric = conv3x3(1, 6, 10, 11, 20, 0);
  asymmetric.pad_top = 2;
  asymmetric.pad_bottom = 1;
  asymmetric.pad_right = 3;
  problems.push_back(asymmetric);
  codecache::CodeCache cache(fresh_dir() / "code");
  for (ConvProblem p : problems) {
    for (bool nhwc : {false, true}) {
      p.channels_last = nhwc;
      for (TemplateIsa isa : isas()) {
        for (int tile : {4, 2}) {
          run_and_check(cache, *make_conv_choice(winograd_name(isa, p, tile), p), true);
        }
      }
    }
  }
}

// ResNet-50's 3x3 layers, at the ISA this CPU selects: relative error <= 1e-4. F(2x2, 3x3) at
// the 14 x 14 and 7 x 7 ones (where it can be chosen), channels-last as in the network.
TEST(WinogradTemplate, ResNetLayersWithinOneInTenThousand) {
  codecache::CodeCache cache(fresh_dir() / "code");
  for (int64_t scale = 1; scale <= 8; scale *= 2) {
    const int64_t size = 56 / scale;
    for (bool nhwc : {false, true}) {
      for (int tile : {4, 2}) {
        if (tile == 2 && (scale < 4 || !nhwc)) continue;
        const ConvProblem p = conv3x3(1, 64 * scale, size, size, 64 * scale, 1, nhwc);
        const double relative = run_and_check(
            cache, *make_conv_choice(winograd_name(host_template_isa(), p, tile), p), false);
        std::printf("%s F(%dx%d, 3x3): relative error %.2e\n", p.text().c_str(), tile, tile,
                    relative);
      }
    }
  }
}

}  // namespace
}  // namespace kiln::autotune
