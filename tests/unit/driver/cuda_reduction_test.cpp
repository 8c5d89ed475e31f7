// The CUDA backend's reduction kernels: launch configurations from the row length (a warp per
// row for short static rows, a block per row for long ones, looping over the row), Softmax and
// LayerNormalization each one kernel through ordinary fusion, LayerNorm's variance by Welford.
// Without a GPU the kernels compile through NVRTC and their structure is checked; with one, the
// values are checked against references computed here in double.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
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
  // The mean and the variance read one Welford pass over the row.
  EXPECT_EQ(count(c.kernels, ".update("), 1u) << c.kernels;
  EXPECT_NE(c.kernels.find("// The accumulation of "), std::string::npos) << c.kernels;
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

/// A reduction of a [rows, cols] input into [rows]: over its last axis, or with `inner` > 0 over
/// the last two axes of the same data as [rows, cols / inner, inner].
graph::Model reduce_model(const std::string& op, int64_t rows, int64_t cols, int64_t inner) {
  ModelBuilder m(18);
  graph::Value* x =
      m.input("x", DType::kFloat32,
              inner > 0 ? graph::Shape{rows, cols / inner, inner} : graph::Shape{rows, cols});
  graph::Tensor axes(DType::kInt64, {inner > 0 ? 2 : 1});
  axes.mutable_values<int64_t>()[0] = 1;
  if (inner > 0) axes.mutable_values<int64_t>()[1] = 2;
  m.output(m.op(op, {x, m.constant(std::move(axes))}, {{"keepdims", int64_t{0}}}));
  return std::move(m.model);
}

struct SplitCase {
  std::string op;
  int64_t rows, cols;
  int64_t inner = 0;  // > 0: two reduced axes, the last of this length
};

class CudaSplitReduction : public ::testing::TestWithParam<SplitCase> {};

// Few rows of many elements: two kernels, a block per chunk of a row writing partial results,
// then the partials of each row reduced in order (no atomics: the same bits every run), and
// what follows the reduction (ReduceMean's division, ReduceL2's root) in the second kernel.
TEST_P(CudaSplitReduction, TwoKernelsMatchTheReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const SplitCase& k = GetParam();
  TempDir dir;
  Compiled c = compile_cuda_dumped(reduce_model(k.op, k.rows, k.cols, k.inner), dir.path);
  EXPECT_EQ(c.model.stats().kernels, 2) << c.kernels;
  const std::string schedule = files::read(dir.path / "dump" / "2_schedule.txt");
  EXPECT_NE(schedule.find("_partial: kernel"), std::string::npos) << schedule;
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  std::vector<float> in = random_values(static_cast<size_t>(k.rows * k.cols), 21, -1, 1.5f);
  graph::Tensor x(DType::kFloat32, k.inner > 0
                                       ? std::vector<int64_t>{k.rows, k.cols / k.inner, k.inner}
                                       : std::vector<int64_t>{k.rows, k.cols});
  std::copy(in.begin(), in.end(), x.mutable_values<float>().begin());
  std::vector<graph::Tensor> first = c.model.run({x});
  std::vector<graph::Tensor> second = c.model.run({x});
  ASSERT_EQ(first.size(), 1u);
  auto out = first[0].values<float>();
  ASSERT_EQ(out.size(), static_cast<size_t>(k.rows));
  for (int64_t r = 0; r < k.rows; ++r) {
    double sum = 0, sq = 0, top = -INFINITY;
    for (int64_t i = 0; i < k.cols; ++i) {
      const double v = in[r * k.cols + i];
      sum += v;
      sq += v * v;
      top = std::max(top, v);
    }
    double want = sum, scale = 0;
    for (int64_t i = 0; i < k.cols; ++i) scale += std::abs(in[r * k.cols + i]);
    if (k.op == "ReduceMean") want = sum / k.cols, scale /= k.cols;
    if (k.op == "ReduceL2") want = std::sqrt(sq), scale = want;
    if (k.op == "ReduceMax") want = top, scale = 0;
    // float32 sums of up to 2^20 terms in a tree of partials: 1e-5 of the sum of magnitudes.
    EXPECT_NEAR(out[r], want, 1e-5 * scale) << k.op << " row " << r;
    // Reproducible: the same bits on a second run.
    EXPECT_EQ(out[r], second[0].values<float>()[r]) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaSplitReduction,
                         ::testing::Values(SplitCase{"ReduceSum", 8, int64_t{1} << 20},
                                           SplitCase{"ReduceMean", 1, 3 << 16},
                                           SplitCase{"ReduceMax", 3, 40000},
                                           SplitCase{"ReduceL2", 2, 65536},
                                           SplitCase{"ReduceSum", 3, 1000 * 48, 48}),
                         [](const ::testing::TestParamInfo<SplitCase>& info) {
                           return info.param.op + "_" + std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols) +
                                  (info.param.inner > 0 ? "_two_axes" : "");
                         });

// A row that fits in registers: each thread loads its elements once, in 16-byte vectors, and
// the members (max, sum of exponentials, quotient) work on registers, with no shared memory.
TEST(CudaRegisterRow, SoftmaxAndLayerNormHoldTheRowInRegisters) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  Compiled s = compile_cuda_dumped(softmax_model(64, 128), dir.path / "softmax");
  // Rows of 128: a lane holds 4 elements of each of the 4 rows its warp takes.
  EXPECT_NE(s.kernels.find("float kiln_row0[4][4];"), std::string::npos) << s.kernels;
  EXPECT_NE(s.kernels.find("*reinterpret_cast<const float4*>(in_ptr0"), std::string::npos);
  EXPECT_NE(s.kernels.find("*reinterpret_cast<float4*>(out_ptr0"), std::string::npos);
  EXPECT_EQ(s.kernels.find("kiln_smem"), std::string::npos) << "no shared-memory row";
  Compiled l = compile_cuda_dumped(
      layer_norm_model(8, 768, std::vector<float>(768, 1), std::vector<float>(768, 0)),
      dir.path / "layernorm");
  EXPECT_NE(l.kernels.find("[24];"), std::string::npos) << "24 elements a lane" << l.kernels;
  // A row too long for registers (256 threads x 32 elements) loops as before (enough rows not
  // to be split).
  Compiled big = compile_cuda_dumped(softmax_model(300, 9000), dir.path / "big");
  EXPECT_EQ(big.model.stats().kernels, 1);
  EXPECT_EQ(big.kernels.find("kiln_row0["), std::string::npos);
}

}  // namespace
}  // namespace kiln::driver
