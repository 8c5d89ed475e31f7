#pragma once
// The check the convolution template tests share: every choice of a problem rendered plain and
// with a residual Add + Clip(0, 6) epilogue, compiled side by side through the code cache, run on
// seeded inputs and compared by the test's own checker (which knows the layout of X and Y).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autotune/conv_choice.h"
#include "autotune/runtime_headers.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"

#include "test_util.h"

namespace kiln::autotune::test {

using ConvFn = void(const float*, const float*, float*);
using ConvResidualFn = void(const float*, const float*, float*, const float*);

/// A problem with a square kernel and the same stride, padding and dilation on both axes.
inline ConvProblem square_conv(int64_t n, int64_t c, int64_t h, int64_t w, int64_t m, int64_t k,
                               int64_t stride, int64_t pad, int64_t dilation = 1,
                               int64_t group = 1) {
  return {.n = n,
          .c = c,
          .h = h,
          .w = w,
          .m = m,
          .kh = k,
          .kw = k,
          .stride_h = stride,
          .stride_w = stride,
          .pad_top = pad,
          .pad_left = pad,
          .pad_bottom = pad,
          .pad_right = pad,
          .dilation_h = dilation,
          .dilation_w = dilation,
          .group = group};
}

/// A tensor [N, C, H, W] as [N, H, W, C]; with `to_nchw`, [N, H, W, C] back to [N, C, H, W].
inline std::vector<float> transpose_channels(int64_t n, int64_t c, int64_t h, int64_t w,
                                             const std::vector<float>& x, bool to_nchw = false) {
  std::vector<float> out(x.size());
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t i = 0; i < h * w; ++i) {
        const size_t nchw = static_cast<size_t>((b * c + k) * h * w + i);
        const size_t nhwc = static_cast<size_t>((b * h * w + i) * c + k);
        if (to_nchw) {
          out[nchw] = x[nhwc];
        } else {
          out[nhwc] = x[nchw];
        }
      }
    }
  }
  return out;
}

/// Compares Y with the reference convolution of X, W and bias; with `residual`, with
/// min(max(y + residual, 0), 6). `what` names the choice and problem in failures.
using ConvCheck = std::function<void(const std::vector<float>& x, const std::vector<float>& w,
                                     const std::vector<float>& bias, const float* residual,
                                     const std::vector<float>& y, const std::string& what)>;

/// Each of `choices` for `p` as "conv" and as "conv_fused" with the epilogue `clip_expr` (which
/// reads the residual as e0) and its vector form `clip_vector_expr` (TemplateEpilogue), on X, W,
/// bias in [-1, 1) and a residual in [-8, 8) (so that both ends of the Clip are reached); Y
/// starts as NaN so that an unwritten element fails.
inline void check_choices_with_residual_clip(codecache::CodeCache& cache, const ConvProblem& p,
                                             const std::vector<ConvChoicePtr>& choices,
                                             const std::string& clip_expr, const ConvCheck& check,
                                             const std::string& clip_vector_expr = {}) {
  TemplateEpilogue epilogue{.expr = clip_expr, .args = {"e0"}, .vector_expr = clip_vector_expr};
  std::vector<codecache::LibrarySpec> specs;
  for (const ConvChoicePtr& choice : choices) {
    codecache::CompilerConfig config;
    const ChoiceLinkage link = choice->linkage();
    config.include_dirs.assign(link.include_dirs.begin(), link.include_dirs.end());
    add_runtime(config);
    config.libraries = link.libraries;
    specs.push_back({{{"conv.cpp", choice->render("conv")},
                      {"fused.cpp", choice->render("conv_fused", epilogue)}},
                     config});
  }
  const std::vector<std::filesystem::path> paths = cache.compile_many(specs);
  const std::vector<float> x = random_matrix(p.n, p.c * p.h * p.w, 3);
  const std::vector<float> w = random_matrix(p.m, p.depth(), 4);
  const std::vector<float> bias = random_matrix(1, p.m, 5);
  const size_t out_size = static_cast<size_t>(p.n * p.m * p.oh() * p.ow());
  std::vector<float> residual = random_matrix(1, static_cast<int64_t>(out_size), 6);
  for (float& r : residual) r *= 8;
  for (size_t i = 0; i < choices.size(); ++i) {
    const std::string what = choices[i]->name() + " at " + p.text();
    const std::vector<float> prepared = choices[i]->prepare(w.data(), bias.data());
    codecache::LoadedLibrary library(paths[i]);
    std::vector<float> y(out_size, std::numeric_limits<float>::quiet_NaN());
    library.symbol<ConvFn>("conv")(x.data(), prepared.data(), y.data());
    check(x, w, bias, nullptr, y, what);
    std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
    library.symbol<ConvResidualFn>("conv_fused")(x.data(), prepared.data(), y.data(),
                                                 residual.data());
    check(x, w, bias, residual.data(), y, what + " + residual Clip");
  }
}

}  // namespace kiln::autotune::test
