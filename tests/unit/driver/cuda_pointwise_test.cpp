// The CUDA backend's pointwise kernels: buffers read or written at the flat index move as float4
// (or int4), four consecutive elements per thread, with a scalar path for the tail and for
// unaligned pointers, broadcast loads staying scalar; transposed reads go through a
// shared-memory tile. Without a GPU the
// kernel's structure is checked (it compiles through NVRTC); with one, its values against
// references computed here in double.

#include <fmt/format.h>
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

float bias_at(int64_t c) { return 0.25f * static_cast<float>(c % 7) - 0.5f; }

/// y = Relu(x * 2 + 1) + b over x: [rows, cols], b: [cols] a constant (a broadcast load).
graph::Model bias_relu_model(int64_t rows, int64_t cols) {
  ModelBuilder m;
  graph::Value* x = m.input("x", DType::kFloat32, graph::Shape{rows, cols});
  graph::Tensor two(DType::kFloat32, {}), one(DType::kFloat32, {}), b(DType::kFloat32, {cols});
  two.mutable_values<float>()[0] = 2.0f;
  one.mutable_values<float>()[0] = 1.0f;
  for (int64_t c = 0; c < cols; ++c) b.mutable_values<float>()[c] = bias_at(c);
  graph::Value* h =
      m.op("Add", {m.op("Mul", {x, m.constant(std::move(two))}), m.constant(std::move(one))});
  m.output(m.op("Add", {m.op("Relu", {h}), m.constant(std::move(b))}));
  return std::move(m.model);
}

class CudaPointwise : public ::testing::TestWithParam<int64_t> {};

// 7 x 129 = 903 elements: 225 threads take four with one float4 load of x and one float4 store
// of y, the last takes the 3 left with scalar accesses; b (broadcast along rows) is read per
// element either way. 8 x 128: no tail.
TEST_P(CudaPointwise, ContiguousBuffersMoveSixteenBytesAtATime) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const int64_t rows = GetParam() == 903 ? 7 : 8, cols = GetParam() == 903 ? 129 : 128;
  TempDir dir;
  Compiled c = compile_cuda_dumped(bias_relu_model(rows, cols), dir.path);
  EXPECT_EQ(c.model.stats().kernels, 1);
  EXPECT_EQ(count(c.kernels, "*reinterpret_cast<const float4*>("), 1u) << "x only:\n" << c.kernels;
  EXPECT_EQ(count(c.kernels, "*reinterpret_cast<float4*>(out_ptr0 + xbase) = float4{"), 1u)
      << c.kernels;
  EXPECT_NE(c.kernels.find("% 16 == 0"), std::string::npos) << c.kernels;
  EXPECT_NE(c.kernels.find("if (xindex >= "), std::string::npos) << "the scalar tail";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  graph::Tensor x(DType::kFloat32, {rows, cols});
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  for (float& v : x.mutable_values<float>()) v = uniform(rng);
  std::vector<graph::Tensor> y = c.model.run({x});
  ASSERT_EQ(y.size(), 1u);
  auto in = x.values<float>();
  auto out = y[0].values<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const size_t k = static_cast<size_t>(r * cols + col);
      const double want = std::max(0.0, double{in[k]} * 2 + 1) + bias_at(col);
      // float32 arithmetic: a few ulps of the result.
      EXPECT_NEAR(out[k], want, 1e-6 * (1 + std::abs(want))) << "at " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaPointwise, ::testing::Values(903, 1024));

/// y = x + x over x: [7, 129] of `dtype`.
graph::Model double_model(DType dtype) {
  ModelBuilder m;
  graph::Value* x = m.input("x", dtype, graph::Shape{7, 129});
  m.output(m.op("Add", {x, x}));
  return std::move(m.model);
}

struct WidthCase {
  DType dtype;
  const char* vector;  // the vector type of each access
  size_t accesses;     // vector loads (and stores) per thread
};

class CudaPointwiseWidths : public ::testing::TestWithParam<WidthCase> {};

// 16-bit floats move as one 8-byte vector of a thread's 4 elements (widened to float one by
// one), 8-byte types as two 16-byte vectors; the 3 elements of the tail are scalar. x + x is
// exact in every type here: a 16-bit float doubles by adding 1 to its exponent, so the expected
// bits are the input's with that (finite inputs of exponents 1..29, any sign and mantissa).
TEST_P(CudaPointwiseWidths, TwoAndEightByteTypesMoveInVectors) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const WidthCase& w = GetParam();
  TempDir dir;
  Compiled c = compile_cuda_dumped(double_model(w.dtype), dir.path);
  EXPECT_EQ(c.model.stats().kernels, 1);
  EXPECT_EQ(count(c.kernels, fmt::format("kiln_raw = *reinterpret_cast<const {}*>(", w.vector)),
            w.accesses)
      << c.kernels;
  EXPECT_EQ(count(c.kernels,
                  fmt::format("*reinterpret_cast<{}*>(reinterpret_cast<char*>(out_ptr0", w.vector)),
            w.accesses)
      << c.kernels;
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  graph::Tensor x(w.dtype, {7, 129});
  std::mt19937 rng(5);
  const size_t n = 7 * 129;
  std::vector<graph::Tensor> y;
  if (w.dtype == DType::kFloat16 || w.dtype == DType::kBFloat16) {
    const int mantissa = w.dtype == DType::kFloat16 ? 10 : 7;
    const int top = w.dtype == DType::kFloat16 ? 29 : 253;
    auto bits = x.mutable_values<uint16_t>();
    for (uint16_t& b : bits) {
      const unsigned sign = rng() & 1u, exponent = 1 + rng() % top;
      const unsigned frac = rng() & ((1u << mantissa) - 1);
      b = static_cast<uint16_t>((sign << 15) | (exponent << mantissa) | frac);
    }
    y = c.model.run({x});
    ASSERT_EQ(y.size(), 1u);
    for (size_t k = 0; k < n; ++k) {
      ASSERT_EQ(y[0].values<uint16_t>()[k], bits[k] + (1u << mantissa)) << "at " << k;
    }
  } else if (w.dtype == DType::kInt64) {
    auto v = x.mutable_values<int64_t>();
    for (int64_t& e : v) e = static_cast<int64_t>(rng()) * 1000003 - (int64_t{1} << 40);
    y = c.model.run({x});
    ASSERT_EQ(y.size(), 1u);
    for (size_t k = 0; k < n; ++k) ASSERT_EQ(y[0].values<int64_t>()[k], 2 * v[k]) << "at " << k;
  } else {
    auto v = x.mutable_values<double>();
    std::uniform_real_distribution<double> uniform(-1e6, 1e6);
    for (double& e : v) e = uniform(rng);
    y = c.model.run({x});
    ASSERT_EQ(y.size(), 1u);
    for (size_t k = 0; k < n; ++k) ASSERT_EQ(y[0].values<double>()[k], 2 * v[k]) << "at " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CudaPointwiseWidths,
                         ::testing::Values(WidthCase{DType::kFloat16, "uint2", 1},
                                           WidthCase{DType::kBFloat16, "uint2", 1},
                                           WidthCase{DType::kInt64, "uint4", 2},
                                           WidthCase{DType::kFloat64, "uint4", 2}),
                         [](const ::testing::TestParamInfo<WidthCase>& info) {
                           return std::string(graph::dtype_name(info.param.dtype));
                         });

/// Relu(Transpose(x, perm)) over x of `dims`.
graph::Model transpose_model(const std::vector<int64_t>& dims, const std::vector<int64_t>& perm) {
  ModelBuilder m;
  graph::Value* x = m.input("x", DType::kFloat32, graph::Shape(dims.begin(), dims.end()));
  m.output(m.op("Relu", {m.op("Transpose", {x}, {{"perm", perm}})}));
  return std::move(m.model);
}

struct TransposeCase {
  std::vector<int64_t> dims, perm;
  bool tiled;
};

class CudaTranspose : public ::testing::TestWithParam<TransposeCase> {};

// A load whose stride-1 variable is not the output's innermost one goes through a shared-memory
// tile when both sides span at least 16 elements: [33, 17] -> [17, 33] (partial tiles on both
// sides), NCHW [2, 64, 4, 24] -> NHWC (w and c, 8 combinations of n and h), a batched
// [3, 40, 50] -> [3, 50, 40]; [6, 5] -> [5, 6] is too small and stays a plain kernel.
TEST_P(CudaTranspose, ReadsThroughATileWhereTheInnermostDimsDiffer) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const TransposeCase& tc = GetParam();
  TempDir dir;
  Compiled c = compile_cuda_dumped(transpose_model(tc.dims, tc.perm), dir.path);
  EXPECT_EQ(c.model.stats().kernels, 1);
  EXPECT_EQ(c.kernels.find("const float4*"), std::string::npos) << c.kernels;
  EXPECT_EQ(count(c.kernels, "kiln_tile[32][33];"), tc.tiled ? 1u : 0u) << c.kernels;
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  graph::Tensor x(DType::kFloat32, tc.dims);
  auto v = x.mutable_values<float>();
  for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(k % 13) - 6.0f;
  std::vector<graph::Tensor> y = c.model.run({x});
  ASSERT_EQ(y.size(), 1u);
  // The reference: walk the output's positions, map each to the input's.
  const size_t rank = tc.dims.size();
  std::vector<int64_t> in_strides(rank, 1), out_dims(rank);
  for (size_t d = rank - 1; d > 0; --d) in_strides[d - 1] = in_strides[d] * tc.dims[d];
  for (size_t d = 0; d < rank; ++d) out_dims[d] = tc.dims[static_cast<size_t>(tc.perm[d])];
  auto out = y[0].values<float>();
  ASSERT_EQ(out.size(), v.size());
  for (size_t k = 0; k < out.size(); ++k) {
    int64_t rest = static_cast<int64_t>(k), at = 0;
    for (size_t d = rank; d-- > 0;) {
      at += (rest % out_dims[d]) * in_strides[static_cast<size_t>(tc.perm[d])];
      rest /= out_dims[d];
    }
    ASSERT_EQ(out[k], std::max(0.0f, v[static_cast<size_t>(at)])) << "at " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Perms, CudaTranspose,
                         ::testing::Values(TransposeCase{{33, 17}, {1, 0}, true},
                                           TransposeCase{{2, 64, 4, 24}, {0, 2, 3, 1}, true},
                                           TransposeCase{{3, 40, 50}, {0, 2, 1}, true},
                                           TransposeCase{{6, 5}, {1, 0}, false},
                                           // 65537 x 16 combinations of the other variables
                                           // (rows): more than gridDim.y takes, so each
                                           // block loops over them.
                                           TransposeCase{{65537, 16, 16}, {0, 2, 1}, true}));

/// Checks y = Relu(Transpose(x, perm)) exactly (a copy: no rounding): each output position is
/// mapped to the input's in integer arithmetic.
void expect_transposed(const graph::Tensor& x, const std::vector<int64_t>& perm,
                       const graph::Tensor& y) {
  const std::vector<int64_t>& dims = x.dims();
  const size_t rank = dims.size();
  std::vector<int64_t> in_strides(rank, 1), out_dims(rank);
  for (size_t d = rank - 1; d > 0; --d) in_strides[d - 1] = in_strides[d] * dims[d];
  for (size_t d = 0; d < rank; ++d) out_dims[d] = dims[static_cast<size_t>(perm[d])];
  ASSERT_EQ(y.dims(), out_dims);
  auto in = x.values<float>();
  auto out = y.values<float>();
  ASSERT_EQ(out.size(), in.size());
  for (size_t k = 0; k < out.size(); ++k) {
    int64_t rest = static_cast<int64_t>(k), at = 0;
    for (size_t d = rank; d-- > 0;) {
      at += (rest % out_dims[d]) * in_strides[static_cast<size_t>(perm[d])];
      rest /= out_dims[d];
    }
    ASSERT_EQ(out[k], std::max(0.0f, in[static_cast<size_t>(at)])) << "at " << k;
  }
}

// Run-time sizes: the tile's sides and the other variables are size arguments of the kernel, its
// grid is computed from them at each run, and the edge tiles are bounds-checked. x: [batch, 33,
// seq] -> [batch, seq, 33] (the sequence is the tile's written side) and NCHW [batch, 24, h, w]
// -> NHWC, each run at awkward sizes (1, 31, 33, 257) and batches 1 and 3 from one compile.
TEST(CudaTransposeDynamic, SymbolicSizesTakeTheTiledKernel) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const sym::Expr batch = sym::Expr::symbol("batch"), seq = sym::Expr::symbol("seq");
  const sym::Expr h = sym::Expr::symbol("h"), w = sym::Expr::symbol("w");
  struct Case {
    graph::Shape shape;
    std::vector<int64_t> perm;
    std::vector<std::vector<int64_t>> runs;  // the input's dims at each run
  };
  const std::vector<Case> cases = {
      {{batch, sym::Expr(33), seq},
       {0, 2, 1},
       {{1, 33, 1}, {1, 33, 31}, {3, 33, 33}, {3, 33, 257}, {2, 33, 16}}},
      {{batch, sym::Expr(24), h, w},
       {0, 2, 3, 1},
       {{1, 24, 1, 1}, {3, 24, 2, 31}, {1, 24, 3, 33}, {2, 24, 1, 257}}},
  };
  for (const Case& tc : cases) {
    ModelBuilder m;
    graph::Value* x = m.input("x", DType::kFloat32, tc.shape);
    m.output(m.op("Relu", {m.op("Transpose", {x}, {{"perm", tc.perm}})}));
    TempDir dir;
    Compiled c = compile_cuda_dumped(m.model, dir.path);
    EXPECT_EQ(c.model.stats().kernels, 1);
    EXPECT_EQ(count(c.kernels, "kiln_tile[32][33];"), 1u) << c.kernels;
    // The batch is symbolic: the blocks loop over the other variables' combinations.
    EXPECT_EQ(count(c.kernels, "kiln_batch += gridDim.y"), 1u) << c.kernels;
    // gridDim.y: the combinations, at most 65535, computed by the wrapper at each run.
    EXPECT_NE(c.wrapper.find("std::min<int64_t>("), std::string::npos) << c.wrapper;
    if (!has_cuda_device()) continue;
    for (const std::vector<int64_t>& dims : tc.runs) {
      SCOPED_TRACE(::testing::PrintToString(dims));
      graph::Tensor xt(DType::kFloat32, dims);
      auto v = xt.mutable_values<float>();
      for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(k % 13) - 6.0f;
      std::vector<graph::Tensor> y = c.model.run({xt});
      ASSERT_EQ(y.size(), 1u);
      expect_transposed(xt, tc.perm, y[0]);
    }
  }
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
}

}  // namespace
}  // namespace kiln::driver
