// Convolution choices (src/autotune/conv_choice.h, conv_template.h): every choice of
// conv_choices, and template configs with small blocks that cross every block edge, rendered,
// compiled with their linkage through the code cache, called on their prepared weight and
// compared with a double-precision direct convolution written here, at awkward sizes: channels
// not multiples of any block, odd widths, stride 2, padding (asymmetric too), dilation, 1x1,
// 7x7, a kernel larger than the image, batch > 1; plain, and with a residual Add + Relu epilogue.
//
// Tolerance: 8 * eps(float32) * sqrt(K) * (sum_k |x * w| + |bias| + 1), K = C * KH * KW.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "autotune/conv_choice.h"
#include "autotune/runtime_headers.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"
#include "support/error.h"

#include "conv_test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

namespace fs = std::filesystem;

codecache::CompilerConfig config_for(const ConvChoice& choice) {
  codecache::CompilerConfig config;
  const ChoiceLinkage link = choice.linkage();
  config.include_dirs.assign(link.include_dirs.begin(), link.include_dirs.end());
  add_runtime(config);
  config.libraries = link.libraries;
  return config;
}

// The awkward sizes.
std::vector<ConvProblem> problems() {
  std::vector<ConvProblem> all = {
      square_conv(1, 5, 9, 11, 19, 3, 1, 1),     // 3x3, odd width, channels off every block
      square_conv(2, 7, 10, 13, 17, 3, 2, 1),    // stride 2, batch 2
      square_conv(2, 12, 5, 7, 33, 1, 1, 0),     // 1x1 (a GEMM)
      square_conv(1, 8, 9, 9, 16, 1, 2, 0),      // 1x1 stride 2
      square_conv(1, 3, 23, 23, 24, 7, 2, 3),    // ResNet's first layer, small
      square_conv(1, 2, 3, 2, 5, 5, 1, 2),       // kernel larger than the image
      square_conv(1, 4, 11, 14, 9, 3, 1, 2, 2),  // dilation 2
  };
  ConvProblem asymmetric = square_conv(1, 3, 12, 15, 10, 3, 1, 0);
  asymmetric.stride_w = 2;
  asymmetric.pad_top = 2;
  asymmetric.pad_left = 1;
  asymmetric.pad_right = 3;
  asymmetric.kw = 2;
  all.push_back(asymmetric);
  ConvProblem column = square_conv(1, 3, 6, 1, 9, 1, 1, 0);  // width 1
  column.kh = 3;
  column.pad_top = column.pad_bottom = 1;
  all.push_back(column);
  return all;
}

bool can_run(const ConvConfig& config) {
  return config.isa == TemplateIsa::kAvx2 || host_template_isa() == TemplateIsa::kAvx512;
}

// Small blocks: several input channel blocks, and column blocks with a tail at every width; both
// task orders.
std::vector<ConvConfig> small_block_configs() {
  std::vector<ConvConfig> configs = {
      {.isa = TemplateIsa::kAvx2, .ocb = 8, .owb = 3, .icb = 2},
      {.isa = TemplateIsa::kAvx2, .ocb = 16, .owb = 5, .icb = 3, .rows_outer = true},
      {.isa = TemplateIsa::kAvx2, .ocb = 24, .owb = 4, .icb = 5},
      {.isa = TemplateIsa::kAvx512, .ocb = 32, .owb = 7, .icb = 4},
      {.isa = TemplateIsa::kAvx512, .ocb = 64, .owb = 6, .icb = 64}};
  std::vector<ConvConfig> runnable;
  for (const ConvConfig& c : configs) {
    if (can_run(c)) runnable.push_back(c);
  }
  return runnable;
}

// Y = conv(X, W) + bias in double (test_util.h), then (with `residual`) max(y + residual, 0),
// with each element's tolerance.
void expect_matches(const ConvProblem& p, const std::vector<float>& x, const std::vector<float>& w,
                    const std::vector<float>& bias, const float* residual,
                    const std::vector<float>& y, const std::string& what) {
  const double eps = std::numeric_limits<float>::epsilon();
  const ReferenceConv reference = reference_conv(p, x, w, bias);
  int failures = 0;
  for (size_t at = 0; at < y.size(); ++at) {
    double expected = reference.y[at];
    if (residual != nullptr) expected = std::max(expected + residual[at], 0.0);
    const double tolerance =
        8 * eps * std::sqrt(double(p.depth())) * (reference.magnitude[at] + 1) + 1e-30;
    if (!(std::abs(y[at] - expected) <= tolerance) && ++failures <= 3) {
      ADD_FAILURE() << what << ": Y[" << at << "] = " << y[at] << ", expected " << expected;
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

TEST(ConvTemplate, ConfigsAreValidAndTheDefaultComesFirst) {
  for (const ConvProblem& p : problems()) {
    for (TemplateIsa isa : {TemplateIsa::kAvx2, TemplateIsa::kAvx512}) {
      const std::vector<ConvConfig> configs = conv_configs(p, 2, isa);
      ASSERT_FALSE(configs.empty()) << p.text();
      EXPECT_EQ(*conv_default_config(p, 2, isa), configs.front());
      std::set<std::string> names;
      for (const ConvConfig& c : configs) {
        EXPECT_NO_THROW(check_conv_config(c));
        EXPECT_TRUE(names.insert(c.name()).second) << c.name();
        EXPECT_EQ(decode_conv_config(c.name()), c);
        if (isa == TemplateIsa::kAvx2) {
          EXPECT_EQ(c.isa, TemplateIsa::kAvx2);
        }
      }
    }
  }
  EXPECT_THROW(check_conv_config({.isa = TemplateIsa::kAvx2, .ocb = 12, .owb = 4, .icb = 8}),
               InternalError);  // not a multiple of 8
  EXPECT_THROW(check_conv_config({.isa = TemplateIsa::kAvx2, .ocb = 16, .owb = 7, .icb = 8}),
               InternalError);  // 17 registers
  EXPECT_THROW(decode_conv_config("avx3_oc16x6_ic8"), InternalError);
}

TEST(ConvTemplate, PrepackRoundTripsAndPadsChannelsWithZeros) {
  const ConvProblem p = square_conv(1, 3, 5, 5, 11, 3, 1, 1);
  const ConvConfig config{.isa = TemplateIsa::kAvx2, .ocb = 8, .owb = 4, .icb = 2};
  const std::vector<float> w = random_matrix(p.m, p.depth(), 1), bias = random_matrix(1, p.m, 2);
  const std::vector<float> packed = prepack_conv_weights(config, p, w.data(), bias.data());
  ASSERT_EQ(static_cast<int64_t>(packed.size()), packed_conv_weight_size(config, p));
  EXPECT_EQ(packed.size(), static_cast<size_t>(16 * 27 + 16));
  // Channel 9, tap 4 is lane 1 of block 1.
  EXPECT_EQ(packed[(1 * 27 + 4) * 8 + 1], w[9 * 27 + 4]);
  EXPECT_EQ(packed[(1 * 27 + 4) * 8 + 7], 0.0f);  // channel 15 does not exist
  const std::vector<float> back = unpack_conv_weights(config, p, packed.data());
  std::vector<float> expected = w;
  expected.insert(expected.end(), bias.begin(), bias.end());
  EXPECT_EQ(back, expected);
}

// Every choice of conv_choices and the small-block configs, plain and with a residual Add + Relu
// epilogue (the template fuses it, the libraries apply it in a pass).
TEST(ConvChoices, EveryChoiceIsCorrectAtAwkwardSizes) {
  codecache::CodeCache cache(fresh_dir() / "code");
  const int threads = omp_get_max_threads();
  for (const ConvProblem& p : problems()) {
    // The heuristic template, the libraries, the small-block configs; the other configs of
    // conv_configs differ from these in block sizes only.
    const std::vector<ConvChoicePtr> all = conv_choices(p, threads);
    std::vector<ConvChoicePtr> choices(all.begin(), all.begin() + 3);
    for (const ConvConfig& config : small_block_configs()) {
      choices.push_back(make_conv_template_choice(config, p));
    }
    TemplateEpilogue epilogue{.expr = {}, .args = {"e0"}, .vector_expr = {}};
    epilogue.expr = "std::max(v + e0[m * " + std::to_string(p.ow()) + " + n], 0.0f)";
    // Each choice's plain and fused kernels are one library; the fused one for the first four.
    std::vector<codecache::LibrarySpec> specs;
    for (size_t i = 0; i < choices.size(); ++i) {
      codecache::LibrarySpec spec{{{"conv.cpp", choices[i]->render("conv")}},
                                  config_for(*choices[i])};
      if (i < 4) spec.sources.push_back({"fused.cpp", choices[i]->render("conv_fused", epilogue)});
      specs.push_back(std::move(spec));
    }
    const std::vector<fs::path> paths = cache.compile_many(specs);
    const std::vector<float> x = random_matrix(p.n, p.c * p.h * p.w, 3);
    const std::vector<float> w = random_matrix(p.m, p.depth(), 4);
    const std::vector<float> bias = random_matrix(1, p.m, 5);
    const size_t out_size = static_cast<size_t>(p.n * p.m * p.oh() * p.ow());
    const std::vector<float> residual = random_matrix(1, static_cast<int64_t>(out_size), 6);
    for (size_t i = 0; i < choices.size(); ++i) {
      const std::string what = choices[i]->name() + " at " + p.text();
      const std::vector<float> prepared = choices[i]->prepare(w.data(), bias.data());
      codecache::LoadedLibrary library(paths[i]);
      std::vector<float> y(out_size, std::numeric_limits<float>::quiet_NaN());
      library.symbol<ConvFn>("conv")(x.data(), prepared.data(), y.data());
      expect_matches(p, x, w, bias, nullptr, y, what);
      if (i >= 4) continue;
      std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
      library.symbol<ConvResidualFn>("conv_fused")(x.data(), prepared.data(), y.data(),
                                                   residual.data());
      expect_matches(p, x, w, bias, residual.data(), y, what + " + residual Relu");
    }
  }
}

TEST(ConvChoices, HeuristicFirstNamesUniqueAndRebuiltFromTheirNames) {
  // Stride 2: the template's default config, then the libraries.
  const ConvProblem p = square_conv(1, 64, 56, 56, 64, 3, 2, 1);
  const std::vector<ConvChoicePtr> choices = conv_choices(p, 2);
  ASSERT_GE(choices.size(), 3u);
  EXPECT_EQ(choices[0]->backend(), "template");
  EXPECT_EQ(choices[1]->name(), "onednn");
  EXPECT_EQ(choices[2]->name(), "im2col-openblas");
  // Stride 1 at 56 x 56 x 64: Winograd first, then the same order.
  const std::vector<ConvChoicePtr> stride1 =
      conv_choices(square_conv(1, 64, 56, 56, 64, 3, 1, 1), 2, TemplateIsa::kAvx2);
  ASSERT_GE(stride1.size(), 4u);
  EXPECT_EQ(stride1[0]->name(), "winograd avx2");
  EXPECT_EQ(stride1[1]->backend(), "template");
  EXPECT_EQ(stride1[2]->name(), "onednn");
  EXPECT_EQ(stride1[3]->name(), "im2col-openblas");
  std::set<std::string> names, keys;
  for (const ConvChoicePtr& c : choices) {
    EXPECT_TRUE(names.insert(c->name()).second) << c->name();
    EXPECT_TRUE(keys.insert(c->hash_key()).second) << c->name();
    EXPECT_EQ(make_conv_choice(c->name(), p)->hash_key(), c->hash_key()) << c->name();
  }
  EXPECT_EQ(p.text(), "conv(1x64x56x56, 64x64x3x3, s2, p1)");
  EXPECT_EQ(conv_problem_from_ints(conv_problem_ints(p)), p);
}

}  // namespace
}  // namespace kiln::autotune
