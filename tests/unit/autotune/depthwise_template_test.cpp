// The depthwise convolution template (src/autotune/depthwise_template.h) and the grouped
// choices of conv_choices: each rendered, compiled through the code cache, called on its prepared
// weight and compared with a double-precision grouped convolution written here, at awkward sizes
// (depth multiplier 1 and 3, odd widths, stride 2, asymmetric padding, dilation, a kernel larger
// than the image, width 1, batch > 1), plain and with a residual Add + Clip(0, 6) epilogue.
//
// Tolerance: 8 * eps(float32) * sqrt(K) * (sum_k |x * w| + |bias| + 1), K = KH * KW.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "autotune/conv_choice.h"
#include "autotune/depthwise_template.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"
#include "support/error.h"

#include "conv_test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

ConvProblem depthwise(int64_t n, int64_t c, int64_t h, int64_t w, int64_t multiplier, int64_t k,
                      int64_t stride, int64_t pad, int64_t dilation = 1) {
  return square_conv(n, c, h, w, c * multiplier, k, stride, pad, dilation, /*group=*/c);
}

std::vector<ConvProblem> problems() {
  std::vector<ConvProblem> all = {
      depthwise(1, 5, 9, 37, 1, 3, 1, 1),      // MobileNet's 3x3, an odd width over 2 vectors
      depthwise(2, 7, 10, 13, 1, 3, 2, 1),     // stride 2, batch 2
      depthwise(1, 4, 11, 14, 3, 3, 1, 2, 2),  // multiplier 3, dilation 2
      depthwise(1, 3, 12, 19, 1, 5, 2, 2),     // 5x5 stride 2
      depthwise(1, 2, 3, 2, 1, 5, 1, 2),       // kernel larger than the image: no interior
  };
  ConvProblem asymmetric = depthwise(1, 3, 12, 15, 2, 3, 1, 0);
  asymmetric.stride_w = 2;
  asymmetric.pad_top = 2;
  asymmetric.pad_left = 1;
  asymmetric.pad_right = 3;
  asymmetric.kw = 2;
  all.push_back(asymmetric);
  ConvProblem column = depthwise(1, 3, 6, 1, 1, 1, 1, 0);  // width 1
  column.kh = 3;
  column.pad_top = column.pad_bottom = 1;
  all.push_back(column);
  return all;
}

// Y = grouped_conv(X, W) + bias in double, then (with `residual`) min(max(y + residual, 0), 6).
void expect_matches(const ConvProblem& p, const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& bias, const float* residual,
                    const std::vector<float>& y, const std::string& what) {
  const double eps = std::numeric_limits<float>::epsilon();
  const ReferenceConv reference = reference_conv(p, x, w, bias);
  int failures = 0;
  for (size_t at = 0; at < y.size(); ++at) {
    double expected = reference.y[at];
    if (residual != nullptr) expected = std::min(std::max(expected + residual[at], 0.0), 6.0);
    const double tolerance =
        8 * eps * std::sqrt(double(p.depth())) * (reference.magnitude[at] + 1) + 1e-30;
    if (!(std::abs(y[at] - expected) <= tolerance) && ++failures <= 3) {
      ADD_FAILURE() << what << ": Y[" << at << "] = " << y[at] << ", expected " << expected;
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

TEST(DepthwiseTemplate, InteriorColumnsReadInsideTheImage) {
  for (const ConvProblem& p : problems()) {
    const InteriorColumns inside = depthwise_interior(p);
    ASSERT_LE(inside.begin, inside.end) << p.text();
    ASSERT_LE(inside.end, p.ow()) << p.text();
    for (int64_t ow = 0; ow < p.ow(); ++ow) {
      const int64_t first = ow * p.stride_w - p.pad_left;
      const int64_t last = first + (p.kw - 1) * p.dilation_w;
      // The interior is exactly the columns whose taps all read inside the image.
      EXPECT_EQ(first >= 0 && last < p.w, ow >= inside.begin && ow < inside.end)
          << p.text() << " column " << ow;
    }
  }
  // MobileNet's 3x3 stride-1 layer at 112 columns: only the first and the last are edges.
  const InteriorColumns mobilenet = depthwise_interior(depthwise(1, 32, 112, 112, 1, 3, 1, 1));
  EXPECT_EQ(mobilenet.begin, 1);
  EXPECT_EQ(mobilenet.end, 111);
}

TEST(DepthwiseTemplate, GroupedChoicesNamedAndRebuiltFromTheirNames) {
  const ConvProblem p = depthwise(1, 96, 112, 112, 1, 3, 2, 1);
  EXPECT_EQ(p.text(), "conv(1x96x112x112, 96x1x3x3, s2, p1, g96)");
  EXPECT_EQ(p.depth(), 9);
  EXPECT_EQ(conv_problem_from_ints(conv_problem_ints(p)), p);
  const std::vector<ConvChoicePtr> choices = conv_choices(p, 2, TemplateIsa::kAvx512);
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices[0]->name(), "depthwise avx512");
  EXPECT_EQ(choices[1]->name(), "onednn");
  for (const ConvChoicePtr& c : choices) {
    EXPECT_EQ(make_conv_choice(c->name(), p)->hash_key(), c->hash_key()) << c->name();
  }
  // A grouped convolution that is not depthwise has oneDNN only; im2col refuses groups.
  ConvProblem grouped = depthwise(1, 8, 9, 9, 1, 3, 1, 1);
  grouped.group = 4;
  ASSERT_EQ(conv_choices(grouped, 2).size(), 1u);
  EXPECT_EQ(conv_choices(grouped, 2)[0]->name(), "onednn");
  EXPECT_THROW(make_conv_im2col_choice(grouped), InternalError);
  EXPECT_THROW(make_conv_choice("depthwise avx3", p), InternalError);
  ConvProblem bad = p;
  bad.group = 5;  // does not divide 96
  EXPECT_THROW(check_conv_problem(bad), InternalError);
}

// The depthwise template at both ISAs (where this CPU runs them) and oneDNN, plain and with a
// residual Add + Clip(0, 6) epilogue (the template fuses it, oneDNN applies it in a pass).
TEST(DepthwiseTemplate, EveryChoiceIsCorrectAtAwkwardSizes) {
  codecache::CodeCache cache(fresh_dir() / "code");
  for (const ConvProblem& p : problems()) {
    std::vector<ConvChoicePtr> choices = conv_choices(p, omp_get_max_threads(), TemplateIsa::kAvx2);
    if (host_template_isa() == TemplateIsa::kAvx512) {
      choices.push_back(make_conv_choice("depthwise avx512", p));
    }
    // Y and the residual are NCHW: the epilogue's row m is a channel's output row, n a column.
    check_choices_with_residual_clip(
        cache, p, choices,
        "std::min(std::max(v + e0[m * " + std::to_string(p.ow()) + " + n], 0.0f), 6.0f)",
        [&](const std::vector<float>& x, const std::vector<float>& w,
            const std::vector<float>& bias, const float* residual, const std::vector<float>& y,
            const std::string& what) { expect_matches(p, x, w, bias, residual, y, what); });
  }
}

}  // namespace
}  // namespace kiln::autotune
