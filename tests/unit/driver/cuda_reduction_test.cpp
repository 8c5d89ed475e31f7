// The CUDA backend's reduction kernels: launch configurations from the row length (a warp per
// row for short static rows, a block per row for long ones, looping over the row), Softmax and
// LayerNormalization each one kernel through ordinary fusion, LayerNorm's variance by Welford.
// Without a GPU the kernels compile through NVRTC and their structure is checked; with one, the
// values are checked against references computed here in double.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "codegen/cuda/nvrtc_compile.h"
#include "cuda_test_util.h"
#include "driver/compile.h"
#include "model_builder.h"
#include "support/files.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;

using namespace cuda_test;  // NOLINT: the shared fixtures
using graph::DType;
using test_models::ModelBuilder;

/// Softmax over the last axis of a [rows, cols] input.
graph::Model softmax_model(int64_t rows, int64_t cols) {
  ModelBuilder m;
  graph::Value* x = m.input("x", DType::kFloat32, graph::Shape{rows, cols});
  m.output(m.op("Softmax", {x}, {{"axis", int64_t{-1}}}));
  return std::move(m.model);
}

/// LayerNormalization over the last axis of a [rows, cols] input, with a scale and a bias.
graph::Model layer_norm_model(int64_t rows, int64_t cols, const std::vector<float>& scale,
                              const std::vector<float>& bias) {
  ModelBuilder m(17);
  graph::Value* x = m.input("x", DType::kFloat32, graph::Shape{rows, cols});
  graph::Tensor s(DType::kFloat32, {cols}), b(DType::kFloat32, {cols});
  std::copy(scale.begin(), scale.end(), s.mutable_values<float>().begin());
  std::copy(bias.begin(), bias.end(), b.mutable_values<float>().begin());
  m.output(m.op("LayerNormalization", {x, m.constant(std::move(s)), m.constant(std::move(b))},
                {{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
  return std::move(m.model);
}

std::vector<float> random_values(size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = uniform(rng);
  return v;
}

/// The softmax of each row of `x` ([rows, cols]) in double.
std::vector<double> softmax_reference(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double top = -INFINITY, sum = 0;
    for (int64_t c = 0; c < cols; ++c) top = std::max<double>(top, x[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[r * cols + c] - top);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = std::exp(x[r * cols + c] - top) / sum;
  }
  return y;
}

struct SoftmaxShape {
  int64_t rows, cols;
  bool warp_per_row;
};

class CudaSoftmax : public ::testing::TestWithParam<SoftmaxShape> {};

// Rows of up to 1024 elements: a warp per row, 4 rows to a block of (32, 4) threads, each lane
// taking every 32nd element; longer rows: a block of 256 threads per row, looping over it. Either
// way Softmax is one kernel (max, sum of exponentials and the quotient over the row).
TEST_P(CudaSoftmax, OneKernelPerRowLayoutMatchesTheReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const SoftmaxShape shape = GetParam();
  TempDir dir;
  Compiled c = compile_cuda_dumped(softmax_model(shape.rows, shape.cols), dir.path);
  EXPECT_EQ(c.model.stats().kernels, 1) << c.kernels;
  if (shape.warp_per_row) {
    EXPECT_NE(c.kernels.find("blockIdx.x) * blockDim.y + threadIdx.y"), std::string::npos);
    EXPECT_NE(c.wrapper.find(", 32, 4, 1, "), std::string::npos) << "a (32, 4) block";
  } else {
    EXPECT_NE(c.kernels.find("const int64_t xindex = blockIdx.x;"), std::string::npos);
    EXPECT_NE(c.wrapper.find(", 256, 1, 1, "), std::string::npos) << "a block of 256 per row";
  }
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  graph::Tensor x(DType::kFloat32, {shape.rows, shape.cols});
  std::vector<float> in = random_values(static_cast<size_t>(shape.rows * shape.cols), 11, -6, 6);
  std::copy(in.begin(), in.end(), x.mutable_values<float>().begin());
  std::vector<graph::Tensor> y = c.model.run({x});
  ASSERT_EQ(y.size(), 1u);
  auto out = y[0].values<float>();
  std::vector<double> want = softmax_reference(in, shape.rows, shape.cols);
  for (size_t k = 0; k < want.size(); ++k) {
    // float32 arithmetic over rows of up to 5,000 terms: relative 1e-5 and a small floor.
    ASSERT_NEAR(out[k], want[k], 1e-9 + 1e-5 * want[k]) << "at " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSoftmax,
                         ::testing::Values(SoftmaxShape{1, 7, true}, SoftmaxShape{131, 100, true},
                                           SoftmaxShape{6, 256, true}, SoftmaxShape{5, 1000, true},
                                           SoftmaxShape{5, 1025, false},
                                           SoftmaxShape{3, 5000, false}),
                         [](const ::testing::TestParamInfo<SoftmaxShape>& info) {
                           return std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols);
                         });

// LayerNormalization at BERT's width: one kernel, a warp per row, mean and variance by Welford
// combined by shuffles, then the normalized row.
TEST(CudaLayerNorm, OneWelfordKernelMatchesTheReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const int64_t rows = 37, cols = 768;
  std::vector<float> scale = random_values(cols, 3, 0.5f, 1.5f);
  std::vector<float> bias = random_values(cols, 4, -1, 1);
  TempDir dir;
  Compiled c = compile_cuda_dumped(layer_norm_model(rows, cols, scale, bias), dir.path);
  EXPECT_EQ(c.model.stats().kernels, 1) << c.kernels;
  EXPECT_NE(c.kernels.find("kiln::Welford<float>"), std::string::npos);
  EXPECT_NE(c.wrapper.find(", 32, 4, 1, "), std::string::npos) << "a warp per row";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  // An offset far from zero: E[x^2] - E[x]^2 would lose most digits of the variance here.
  std::vector<float> in = random_values(static_cast<size_t>(rows * cols), 5, 99, 101);
  graph::Tensor x(DType::kFloat32, {rows, cols});
  std::copy(in.begin(), in.end(), x.mutable_values<float>().begin());
  std::vector<graph::Tensor> y = c.model.run({x});
  ASSERT_FALSE(y.empty());
  auto out = y[0].values<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t k = 0; k < cols; ++k) mean += in[r * cols + k];
    mean /= cols;
    for (int64_t k = 0; k < cols; ++k) var += (in[r * cols + k] - mean) * (in[r * cols + k] - mean);
    var /= cols;
    for (int64_t k = 0; k < cols; ++k) {
      const double want = (in[r * cols + k] - mean) / std::sqrt(var + 1e-5) * scale[k] + bias[k];
      // Inputs near 100 with a spread of 1 keep about 5 significant digits after centering.
      ASSERT_NEAR(out[r * cols + k], want, 2e-4) << "row " << r << " column " << k;
    }
  }
}

}  // namespace
}  // namespace kiln::driver
