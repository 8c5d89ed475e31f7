#pragma once
// Shared fixtures of the autotune unit tests: a fresh scratch directory per test, seeded random
// matrices, the signatures of rendered GEMM kernels, and a double-precision convolution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace kiln::autotune::test {

using GemmFn = void(int64_t, const float*, const float*, float*);
using GemmBiasFn = void(int64_t, const float*, const float*, float*, const float*);

/// build/test-tmp/autotune-<suite>-<test>, emptied.
inline std::filesystem::path fresh_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir =
      std::filesystem::path(KILN_BUILD_DIR) / "test-tmp" /
      (std::string("autotune-") + info->test_suite_name() + "-" + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// rows x cols values uniform in [-1, 1), row-major, from `seed`.
inline std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  return values;
}

/// A convolution computed in double: each output and the sum of the magnitudes of its terms
/// (for tolerances that scale with cancellation).
struct ReferenceConv {
  std::vector<double> y, magnitude;
};

/// Y = grouped_conv(X, W) + bias for `problem` (any group, stride, padding and dilation), X
/// [N, C, H, W], W [M, C / group, KH, KW], NCHW out.
template <typename Problem>
ReferenceConv reference_conv(const Problem& p, const std::vector<float>& x,
                             const std::vector<float>& w, const std::vector<float>& bias) {
  const int64_t oh = p.oh(), ow = p.ow(), cg = p.c / p.group, mg = p.m / p.group;
  ReferenceConv out;
  out.y.resize(static_cast<size_t>(p.n * p.m * oh * ow));
  out.magnitude.resize(out.y.size());
  for (int64_t b = 0; b < p.n; ++b) {
    for (int64_t m = 0; m < p.m; ++m) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          double sum = bias[m], magnitude = std::abs(bias[m]);
          for (int64_t c = 0; c < cg; ++c) {
            const int64_t ic = m / mg * cg + c;
            for (int64_t ki = 0; ki < p.kh; ++ki) {
              const int64_t ii = i * p.stride_h - p.pad_top + ki * p.dilation_h;
              if (ii < 0 || ii >= p.h) continue;
              for (int64_t kj = 0; kj < p.kw; ++kj) {
                const int64_t jj = j * p.stride_w - p.pad_left + kj * p.dilation_w;
                if (jj < 0 || jj >= p.w) continue;
                const double term = double{x[((b * p.c + ic) * p.h + ii) * p.w + jj]} *
                                    w[((m * cg + c) * p.kh + ki) * p.kw + kj];
                sum += term;
                magnitude += std::abs(term);
              }
            }
          }
          const size_t at = static_cast<size_t>(((b * p.m + m) * oh + i) * ow + j);
          out.y[at] = sum;
          out.magnitude[at] = magnitude;
        }
      }
    }
  }
  return out;
}

}  // namespace kiln::autotune::test
