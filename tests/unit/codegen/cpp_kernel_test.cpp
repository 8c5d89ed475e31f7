#include "codegen/cpp/cpp_kernel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../sched/test_programs.h"
#include "kernel_runner.h"

namespace kiln::codegen {
namespace {

using graph::DType;
using ir::OpCode;
using sym::Expr;
using testing::CompiledProgram;
using testing::from_bytes;
using testing::ProgramBuilder;
using testing::rvar;
using testing::to_bytes;
using testing::var;

std::vector<float> random_floats(size_t n, unsigned seed, float lo = -3, float hi = 3) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    if (std::isnan(want[k])) {
      EXPECT_TRUE(std::isnan(got[k])) << "at " << k;
      continue;
    }
    if (std::isinf(want[k])) {
      EXPECT_EQ(got[k], want[k]) << "at " << k;
      continue;
    }
    EXPECT_NEAR(got[k], want[k], tol * (1 + std::fabs(want[k]))) << "at " << k;
  }
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const std::vector<int64_t> kTailSizes = {0, 1, 7, 8, 9, 1000};

TEST(CppKernel, PointwiseAddReluMulIsOneVectorizedKernel) {
  ir::Program prog = testing::add_relu_mul_program(Expr::symbol("s0"), Expr::symbol("s1"));
  CompiledProgram c(prog, "add_relu_mul");
  ASSERT_EQ(c.kernel_sources.size(), 1u);
  const std::string& src = c.kernel_sources[0];
  EXPECT_TRUE(contains(src, "extern \"C\" void cpp_fused_add_relu_mul_0(")) << src;
  EXPECT_TRUE(contains(src, "kiln::vec::VecF32::loadu")) << src;
  EXPECT_TRUE(contains(src, "kiln_rt::parallel_for(")) << src;  // Kiln's pool (kiln_rt_pool.h)
  EXPECT_TRUE(contains(src, "ONNX node a_node (Add)")) << src;
  EXPECT_TRUE(contains(src, "int64_t s_s0, int64_t s_s1")) << src;
  for (int64_t cols : kTailSizes) {
    int64_t rows = 3;
    auto x = random_floats(rows * cols, 1), y = random_floats(rows * cols, 2);
    auto out = c.run({{"x", to_bytes(x)}, {"y", to_bytes(y)}}, {{"s0", rows}, {"s1", cols}});
    std::vector<float> want(x.size());
    for (size_t k = 0; k < x.size(); ++k) want[k] = std::max(x[k] + y[k], 0.0f) * 2;
    expect_close(from_bytes<float>(out["m"]), want);
  }
}

TEST(CppKernel, OneDimensionalPointwiseTails) {
  ProgramBuilder p;
  Expr n = Expr::symbol("s0");
  p.input("x", DType::kFloat32, {n});
  ir::Buffer& e = p.computed("e", DType::kFloat32, {n}, {}, "Tanh");
  auto v = e.body.load("x", DType::kFloat32, var(e, 0));
  p.store(e, e.body.binary(OpCode::kAdd, e.body.unary(OpCode::kTanh, v),
                           e.body.unary(OpCode::kExp, v)));
  p.output("e");
  CompiledProgram c(p.program, "one_dim");
  EXPECT_TRUE(contains(c.source, "kiln::vec::tanh")) << c.source;
  for (int64_t size : kTailSizes) {
    auto x = random_floats(size, 3);
    auto out = c.run({{"x", to_bytes(x)}}, {{"s0", size}});
    std::vector<float> want(x.size());
    for (size_t k = 0; k < x.size(); ++k) want[k] = std::tanh(x[k]) + std::exp(x[k]);
    expect_close(from_bytes<float>(out["e"]), want);
  }
}

// An image's 3 channels going channels-last, with a Relu: the last dim (3) is shorter than a
// vector, so the kernel loops over W in blocks of 256 (kiln_block) with the 3-loop inside. Widths
// off the block and the vector, batch 2.
TEST(CppKernel, ShortLastDimLoopsAlongTheDimBeforeIt) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr n = Expr::symbol("s0"), w = Expr::symbol("s1"), three(3);
  p.input("x", f, {n, three, w});
  ir::Buffer& y = p.computed("y", f, {n, w, three}, {}, "Transpose");
  p.store(y, y.body.unary(OpCode::kRelu,
                          y.body.load("x", f, p.at("x", {var(y, 0), var(y, 2), var(y, 1)}))));
  p.output("y");
  CompiledProgram c(p.program, "to_channels_last");
  ASSERT_EQ(c.kernel_sources.size(), 1u);
  EXPECT_TRUE(contains(c.source, "kiln_block")) << c.source;
  for (int64_t width : {1, 7, 256, 300}) {
    const int64_t batch = 2;
    auto x = random_floats(batch * 3 * width, 12);
    auto out = c.run({{"x", to_bytes(x)}}, {{"s0", batch}, {"s1", width}});
    std::vector<float> want(x.size());
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < width; ++i) {
        for (int64_t k = 0; k < 3; ++k) {
          want[(b * width + i) * 3 + k] = std::max(x[(b * 3 + k) * width + i], 0.0f);
        }
      }
    }
    expect_close(from_bytes<float>(out["y"]), want, 0);
  }
}

// A channels-last value written out as NCHW with a Clip(0, 6) (a graph output of a network run
// channels-last): the reads stride by C across the inner loop (W), so they are vectorized a lane
// at a time (load_strided), and the loop over the channels runs just outside it, where each
// pixel row's channels stay in L1. 19 channels, widths off the vector, batch 2, a NaN.
TEST(CppKernel, TransposeReadsStridedLanesWithTheChannelsInside) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr h = Expr::symbol("s0"), w = Expr::symbol("s1"), channels(19), n(2);
  p.input("x", f, {n, h, w, channels});
  ir::Buffer& y = p.computed("y", f, {n, channels, h, w}, {}, "Clip");
  auto v = y.body.load("x", f, p.at("x", {var(y, 0), var(y, 2), var(y, 3), var(y, 1)}));
  auto clipped =
      y.body.binary(OpCode::kMinimum, y.body.binary(OpCode::kMaximum, v, y.body.constant(0, f)),
                    y.body.constant(6, f));
  p.store(y, clipped);
  p.output("y");
  CompiledProgram c(p.program, "to_nchw");
  ASSERT_EQ(c.kernel_sources.size(), 1u);
  EXPECT_TRUE(contains(c.source, "load_strided(in_ptr0 + ")) << c.source;
  // The chunk's loop variables, fastest first: the channel (x1) before the row (x2).
  EXPECT_LT(c.source.find("int64_t x1 = kiln_rest % (19);"),
            c.source.find("int64_t x2 = kiln_rest % (s_s0);"))
      << c.source;
  for (int64_t width : {1, 7, 8, 9, 100}) {
    const int64_t height = 3;
    auto x = random_floats(2 * height * width * 19, 13, -2, 8);
    x[5] = std::numeric_limits<float>::quiet_NaN();
    auto out = c.run({{"x", to_bytes(x)}}, {{"s0", height}, {"s1", width}});
    std::vector<float> want(x.size());
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t k = 0; k < 19; ++k) {
        for (int64_t i = 0; i < height; ++i) {
          for (int64_t j = 0; j < width; ++j) {
            const float e = x[((b * height + i) * width + j) * 19 + k];
            want[((b * 19 + k) * height + i) * width + j] =
                std::isnan(e) ? e : std::min(std::max(e, 0.0f), 6.0f);
          }
        }
      }
    }
    expect_close(from_bytes<float>(out["y"]), want, 0);
  }
}

// Maximum and Minimum with a constant bound, the bound first in one and second in the other:
// each takes the one-instruction form (kiln::vec::maximum_num), which must still return a NaN
// input as NaN and clip infinities, in every lane and in the scalar tail. A NaN bound keeps the
// blend of kiln::vec::minimum (a NaN from either operand).
TEST(CppKernel, ClipBoundsKeepNaNInEveryLane) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr n = Expr::symbol("s0");
  p.input("x", f, {n});
  ir::Buffer& y = p.computed("y", f, {n}, {}, "Clip");
  auto v = y.body.load("x", f, p.at("x", {var(y, 0)}));
  auto low = y.body.binary(OpCode::kMaximum, y.body.constant(-0.5, f), v);
  p.store(y, y.body.binary(OpCode::kMinimum, low, y.body.constant(2, f)));
  ir::Buffer& z = p.computed("z", f, {n}, {}, "Min");
  auto w = z.body.load("x", f, p.at("x", {var(z, 0)}));
  p.store(z, z.body.binary(OpCode::kMinimum, w,
                           z.body.constant(std::numeric_limits<double>::quiet_NaN(), f)));
  p.output("y");
  p.output("z");
  CompiledProgram c(p.program, "clip_nan");
  EXPECT_TRUE(contains(c.source, "kiln::vec::maximum_num(")) << c.source;
  EXPECT_TRUE(contains(c.source, "kiln::vec::minimum_num(")) << c.source;
  EXPECT_TRUE(contains(c.source, "kiln::vec::minimum(")) << c.source;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t size : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{19}, int64_t{1000}}) {
    auto x = random_floats(static_cast<size_t>(size), 21, -3, 3);
    for (int64_t k = 0; k < size; k += 3) x[static_cast<size_t>(k)] = nan;
    for (int64_t k = 1; k < size; k += 5) x[static_cast<size_t>(k)] = k % 2 ? inf : -inf;
    auto out = c.run({{"x", to_bytes(x)}}, {{"s0", size}});
    std::vector<float> want_y(x.size()), want_z(x.size(), nan);
    for (size_t k = 0; k < x.size(); ++k) {
      want_y[k] = std::isnan(x[k]) ? nan : std::min(std::max(x[k], -0.5f), 2.0f);
    }
    expect_close(from_bytes<float>(out["y"]), want_y, 0);
    expect_close(from_bytes<float>(out["z"]), want_z, 0);
  }
}

TEST(CppKernel, SumAndMaxReductions) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr rows = Expr::symbol("s0"), cols = Expr::symbol("s1");
  p.input("x", f, {rows, cols});
  ir::Buffer& s = p.computed("s", f, {rows}, {cols}, "ReduceSum");
  p.store(s, s.body.reduction(ir::ReductionType::kSum,
                              s.body.load("x", f, p.at("x", {var(s, 0), rvar(s, 0)})), f));
  ir::Buffer& m = p.computed("m", f, {rows}, {cols}, "ReduceMax");
  p.store(m, m.body.reduction(ir::ReductionType::kMax,
                              m.body.load("x", f, p.at("x", {var(m, 0), rvar(m, 0)})), f));
  p.output("s");
  p.output("m");
  CompiledProgram c(p.program, "sum_max");
  ASSERT_EQ(c.kernel_sources.size(), 1u) << c.schedule.decisions_text();
  EXPECT_TRUE(contains(c.source, "kiln::vec::hsum")) << c.source;
  for (int64_t cols_v : kTailSizes) {
    int64_t rows_v = 5;
    auto x = random_floats(rows_v * cols_v, 4);
    auto out = c.run({{"x", to_bytes(x)}}, {{"s0", rows_v}, {"s1", cols_v}});
    std::vector<float> want_s(rows_v, 0), want_m(rows_v, -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < rows_v; ++i) {
      for (int64_t j = 0; j < cols_v; ++j) {
        want_s[i] += x[i * cols_v + j];
        want_m[i] = std::max(want_m[i], x[i * cols_v + j]);
      }
    }
    expect_close(from_bytes<float>(out["s"]), want_s, 1e-4f);
    expect_close(from_bytes<float>(out["m"]), want_m);
  }
}

// Sum and max over H and W of channels-last x[N, H, W, C]: the reduction strides by C, so the
// kernel runs 64 channels at a time (kiln_block) in a loop across channels, which the C++
// compiler vectorizes. Channel counts off the 64-block and the vector, batch 2.
TEST(CppKernel, ChannelsLastPoolRunsAcrossChannels) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr n = Expr::symbol("s0"), h = Expr::symbol("s1"), w = Expr::symbol("s2"),
       ch = Expr::symbol("s3");
  p.input("x", f, {n, h, w, ch});
  ir::Buffer& s = p.computed("s", f, {n, ch}, {h, w}, "GlobalAveragePool");
  p.store(s,
          s.body.reduction(
              ir::ReductionType::kSum,
              s.body.load("x", f, p.at("x", {var(s, 0), rvar(s, 0), rvar(s, 1), var(s, 1)})), f));
  ir::Buffer& m = p.computed("m", f, {n, ch}, {h, w}, "GlobalMaxPool");
  p.store(m,
          m.body.reduction(
              ir::ReductionType::kMax,
              m.body.load("x", f, p.at("x", {var(m, 0), rvar(m, 0), rvar(m, 1), var(m, 1)})), f));
  p.output("s");
  p.output("m");
  CompiledProgram c(p.program, "pool_nhwc");
  ASSERT_EQ(c.kernel_sources.size(), 1u) << c.schedule.decisions_text();
  EXPECT_TRUE(contains(c.source, "kiln_block")) << c.source;
  for (int64_t channels : {1, 7, 9, 64, 70, 130}) {
    const int64_t batch = 2, height = 3, width = 5;
    auto x = random_floats(batch * height * width * channels, 11);
    auto out = c.run({{"x", to_bytes(x)}},
                     {{"s0", batch}, {"s1", height}, {"s2", width}, {"s3", channels}});
    std::vector<float> want_s(batch * channels, 0);
    std::vector<float> want_m(batch * channels, -std::numeric_limits<float>::infinity());
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < height * width; ++i) {
        for (int64_t k = 0; k < channels; ++k) {
          const float v = x[(b * height * width + i) * channels + k];
          want_s[b * channels + k] += v;
          want_m[b * channels + k] = std::max(want_m[b * channels + k], v);
        }
      }
    }
    expect_close(from_bytes<float>(out["s"]), want_s, 1e-5f);
    expect_close(from_bytes<float>(out["m"]), want_m, 0);
  }
}

// A ReduceMean over H and W with keepdims of channels-last x[N, H, W, C], as exporters write a
// squeeze-excitation's mean, here of SiLU(x) = x * sigmoid(x) as in EfficientNet's head: the
// output is [N, C, 1, 1], so the kernel's last two dims have one output each; it still runs 64
// channels at a time across C (a loop per channel, striding by C, was 12x slower in
// EfficientNet-B0), and the sigmoid's exp is kiln_simd_exp, which the C++ compiler calls a vector
// at a time in that loop (libm's exp kept it scalar, 5x slower). Channel counts off the 64-block
// and the vector, batch 2.
TEST(CppKernel, KeptUnitDimsStillRunAcrossChannels) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr n = Expr::symbol("s0"), h = Expr::symbol("s1"), w = Expr::symbol("s2"),
       ch = Expr::symbol("s3");
  p.input("x", f, {n, h, w, ch});
  ir::Buffer& s = p.computed("s", f, {n, ch, Expr(1), Expr(1)}, {h, w}, "ReduceMean");
  auto v = s.body.load("x", f, p.at("x", {var(s, 0), rvar(s, 0), rvar(s, 1), var(s, 1)}));
  p.store(s,
          s.body.reduction(ir::ReductionType::kSum,
                           s.body.binary(OpCode::kMul, v, s.body.unary(OpCode::kSigmoid, v)), f));
  p.output("s");
  CompiledProgram c(p.program, "keepdims_nhwc");
  ASSERT_EQ(c.kernel_sources.size(), 1u) << c.schedule.decisions_text();
  EXPECT_TRUE(contains(c.source, "kiln_block")) << c.source;
  EXPECT_TRUE(contains(c.source, "kiln_simd_exp(")) << c.source;
  for (int64_t channels : {1, 9, 64, 70}) {
    const int64_t batch = 2, height = 3, width = 5;
    auto x = random_floats(batch * height * width * channels, 12);
    auto out = c.run({{"x", to_bytes(x)}},
                     {{"s0", batch}, {"s1", height}, {"s2", width}, {"s3", channels}});
    std::vector<double> sums(batch * channels, 0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < height * width; ++i) {
        for (int64_t k = 0; k < channels; ++k) {
          const double e = x[(b * height * width + i) * channels + k];
          sums[b * channels + k] += e / (1 + std::exp(-e));
        }
      }
    }
    expect_close(from_bytes<float>(out["s"]), std::vector<float>(sums.begin(), sums.end()), 1e-5f);
  }
}

TEST(CppKernel, SoftmaxIsOneKernelAndCorrect) {
  ir::Program prog = testing::softmax_program(Expr::symbol("s0"), Expr::symbol("s1"));
  CompiledProgram c(prog, "softmax");
  ASSERT_EQ(c.kernel_sources.size(), 1u);
  EXPECT_TRUE(contains(c.source, "kiln::vec::exp")) << c.source;
  EXPECT_TRUE(contains(c.source, "std::vector<float> scratch")) << c.source;
  for (int64_t cols : {1, 7, 8, 9, 1000}) {
    int64_t rows = 4;
    auto x = random_floats(rows * cols, 5, -10, 10);
    auto out = c.run({{"x", to_bytes(x)}}, {{"s0", rows}, {"s1", cols}});
    std::vector<float> want(x.size());
    for (int64_t i = 0; i < rows; ++i) {
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < cols; ++j) mx = std::max<double>(mx, x[i * cols + j]);
      for (int64_t j = 0; j < cols; ++j) sum += std::exp(x[i * cols + j] - mx);
      for (int64_t j = 0; j < cols; ++j) want[i * cols + j] = std::exp(x[i * cols + j] - mx) / sum;
    }
    expect_close(from_bytes<float>(out["out"]), want);
  }
}

TEST(CppKernel, LayerNormGeluIsOneKernelAndCorrect) {
  ir::Program prog = testing::layernorm_gelu_program(Expr::symbol("s0"), Expr::symbol("s1"));
  CompiledProgram c(prog, "layernorm_gelu");
  ASSERT_EQ(c.kernel_sources.size(), 1u);
  EXPECT_TRUE(contains(c.source, "kiln::vec::WelfordVec")) << c.source;
  for (int64_t cols : {1, 9, 37, 1000}) {
    int64_t rows = 5;
    auto x = random_floats(rows * cols, 6, -2, 4);
    auto gamma = random_floats(cols, 7), beta = random_floats(cols, 8);
    auto out = c.run({{"x", to_bytes(x)}, {"gamma", to_bytes(gamma)}, {"beta", to_bytes(beta)}},
                     {{"s0", rows}, {"s1", cols}});
    std::vector<float> want(x.size());
    for (int64_t i = 0; i < rows; ++i) {
      double mean = 0, var = 0;
      for (int64_t j = 0; j < cols; ++j) mean += x[i * cols + j];
      mean /= cols;
      for (int64_t j = 0; j < cols; ++j) var += (x[i * cols + j] - mean) * (x[i * cols + j] - mean);
      var /= cols;
      for (int64_t j = 0; j < cols; ++j) {
        double y = (x[i * cols + j] - mean) / std::sqrt(var + 1e-5) * gamma[j] + beta[j];
        want[i * cols + j] = static_cast<float>(0.5 * y * (1 + std::erf(y / std::sqrt(2.0))));
      }
    }
    expect_close(from_bytes<float>(out["g"]), want, 1e-4f);
  }
}

TEST(CppKernel, Float16LoadsAndStores) {
  ProgramBuilder p;
  const DType h = DType::kFloat16;
  Expr n = Expr::symbol("s0");
  p.input("x", h, {n});
  p.input("y", h, {n});
  ir::Buffer& o = p.computed("o", h, {n}, {}, "Mul");
  p.store(o, o.body.binary(OpCode::kMul, o.body.load("x", h, var(o, 0)),
                           o.body.load("y", h, var(o, 0))));
  p.output("o");
  CompiledProgram c(p.program, "float16");
  EXPECT_TRUE(contains(c.source, "kiln::half_to_float")) << c.source;
  EXPECT_TRUE(contains(c.source, "kiln::float_to_half")) << c.source;
  for (int64_t size : {0, 1, 9, 1000}) {
    auto xf = random_floats(size, 9), yf = random_floats(size, 10);
    std::vector<_Float16> x(size), y(size), want(size);
    for (int64_t k = 0; k < size; ++k) {
      x[k] = static_cast<_Float16>(xf[k]);
      y[k] = static_cast<_Float16>(yf[k]);
      want[k] = static_cast<_Float16>(static_cast<float>(x[k]) * static_cast<float>(y[k]));
    }
    auto out = c.run({{"x", to_bytes(x)}, {"y", to_bytes(y)}}, {{"s0", size}});
    auto got = from_bytes<uint16_t>(out["o"]);
    auto want_bits = from_bytes<uint16_t>(to_bytes(want));
    EXPECT_EQ(got, want_bits);
  }
}

TEST(CppKernel, Int64ArithmeticAndReduction) {
  ProgramBuilder p;
  const DType i64 = DType::kInt64;
  Expr rows = Expr::symbol("s0"), cols = Expr::symbol("s1");
  p.input("a", i64, {rows, cols});
  ir::Buffer& q = p.computed("q", i64, {rows, cols}, {}, "Div");
  auto av = q.body.load("a", i64, p.at("a", q.body.vars()));
  auto d = q.body.binary(OpCode::kDiv, q.body.binary(OpCode::kMul, av, q.body.constant(3, i64)),
                         q.body.constant(-2, i64));
  p.store(q, q.body.binary(OpCode::kAdd, d,
                           q.body.binary(OpCode::kFloorMod, av, q.body.constant(5, i64))));
  ir::Buffer& s = p.computed("s", i64, {rows}, {cols}, "ReduceSum");
  p.store(s, s.body.reduction(ir::ReductionType::kSum,
                              s.body.load("q", i64, p.at("q", {var(s, 0), rvar(s, 0)})), i64));
  p.output("q");
  p.output("s");
  CompiledProgram c(p.program, "int64");
  EXPECT_FALSE(contains(c.source, "VecF32")) << c.source;
  for (int64_t cols_v : {0, 1, 9, 100}) {
    int64_t rows_v = 3;
    std::vector<int64_t> a(rows_v * cols_v);
    for (size_t k = 0; k < a.size(); ++k) a[k] = static_cast<int64_t>(k * 37 % 101) - 50;
    auto out = c.run({{"a", to_bytes(a)}}, {{"s0", rows_v}, {"s1", cols_v}});
    std::vector<int64_t> want_q(a.size()), want_s(rows_v, 0);
    for (size_t k = 0; k < a.size(); ++k) {
      int64_t m = a[k] % 5;
      if (m < 0) m += 5;
      want_q[k] = (a[k] * 3) / -2 + m;
      want_s[k / cols_v] += want_q[k];
    }
    EXPECT_EQ(from_bytes<int64_t>(out["q"]), want_q);
    EXPECT_EQ(from_bytes<int64_t>(out["s"]), want_s);
  }
}

TEST(CppKernel, BoolComparisonsAndWhere) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr n = Expr::symbol("s0");
  p.input("x", f, {n});
  p.input("y", f, {n});
  ir::Buffer& b = p.computed("b", DType::kBool, {n}, {}, "Greater");
  auto xv = b.body.load("x", f, var(b, 0)), yv = b.body.load("y", f, var(b, 0));
  auto gt = b.body.binary(OpCode::kGt, xv, yv);
  auto pos = b.body.binary(OpCode::kGt, xv, b.body.constant(0, f));
  p.store(b, b.body.binary(OpCode::kAnd, gt, b.body.unary(OpCode::kNot, pos)));
  ir::Buffer& w = p.computed("w", f, {n}, {}, "Where");
  auto xw = w.body.load("x", f, var(w, 0)), yw = w.body.load("y", f, var(w, 0));
  p.store(w, w.body.where(w.body.binary(OpCode::kLt, xw, yw), xw, yw));
  p.output("b");
  p.output("w");
  CompiledProgram c(p.program, "bool");
  for (int64_t size : kTailSizes) {
    auto x = random_floats(size, 11), y = random_floats(size, 12);
    auto out = c.run({{"x", to_bytes(x)}, {"y", to_bytes(y)}}, {{"s0", size}});
    auto got_b = from_bytes<uint8_t>(out["b"]);
    std::vector<float> want_w(size);
    for (int64_t k = 0; k < size; ++k) {
      EXPECT_EQ(got_b[k] != 0, x[k] > y[k] && !(x[k] > 0)) << k;
      want_w[k] = std::min(x[k], y[k]);
    }
    expect_close(from_bytes<float>(out["w"]), want_w);
  }
}

TEST(CppKernel, MaskedLoadPads) {
  // out[i] = 2 <= i < n + 2 ? x[i - 2] : -1 over n + 4 elements (a Pad).
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr n = Expr::symbol("s0");
  p.input("x", f, {n});
  ir::Buffer& o = p.computed("o", f, {n + 4}, {}, "Pad");
  auto i = o.body.index_expr(var(o, 0));
  auto lo = o.body.binary(OpCode::kGe, i, o.body.constant(2, DType::kInt64));
  auto hi = o.body.binary(OpCode::kLt, i, o.body.index_expr(n + 2));
  auto mask = o.body.binary(OpCode::kAnd, lo, hi);
  p.store(o, o.body.masked_load("x", f, var(o, 0) - 2, mask, -1.0));
  p.output("o");
  CompiledProgram c(p.program, "masked");
  for (int64_t size : {0, 1, 9}) {
    auto x = random_floats(size, 13);
    auto out = c.run({{"x", to_bytes(x)}}, {{"s0", size}});
    std::vector<float> want(size + 4, -1.0f);
    for (int64_t k = 0; k < size; ++k) want[k + 2] = x[k];
    expect_close(from_bytes<float>(out["o"]), want);
  }
}

// A Concat of three parts along the innermost dim (5, 8 and 11 wide; as a channels-last Concat
// lowers: each part a masked load, a chain of selects), with a Relu on the first part: one loop
// per part, each reading only its part, without masks or selects, so that it vectorizes.
TEST(CppKernel, ConcatAlongTheInnerDimRunsOneLoopPerPart) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  const Expr rows = Expr::symbol("s0");
  const std::vector<int64_t> widths = {5, 8, 11};
  const std::vector<std::string> parts = {"a", "b", "c"};
  for (size_t k = 0; k < parts.size(); ++k) p.input(parts[k], f, {rows, Expr(widths[k])});
  ir::Buffer& o = p.computed("o", f, {rows, Expr(24)}, {}, "Concat");
  ir::LoopBody& body = o.body;
  const ir::ValueId i = body.index_expr(var(o, 1));
  auto index = [&](int64_t v) { return body.index_expr(Expr(v)); };
  const ir::ValueId in_a = body.binary(OpCode::kLt, i, index(5));
  const ir::ValueId in_b = body.binary(OpCode::kAnd, body.binary(OpCode::kGe, i, index(5)),
                                       body.binary(OpCode::kLt, i, index(13)));
  // The last part's lower bound as an integer constant, not an index expression.
  const ir::ValueId in_c = body.binary(OpCode::kGe, i, body.constant(13, DType::kInt64));
  auto part = [&](size_t k, int64_t offset, ir::ValueId mask) {
    return body.masked_load(parts[k], f, p.at(parts[k], {var(o, 0), var(o, 1) - offset}), mask,
                            0.0);
  };
  p.store(o, body.where(in_a, body.unary(OpCode::kRelu, part(0, 0, in_a)),
                        body.where(in_b, part(1, 5, in_b), part(2, 13, in_c))));
  p.output("o");
  CompiledProgram c(p.program, "concat");
  ASSERT_EQ(c.kernel_sources.size(), 1u);
  const std::string& src = c.kernel_sources[0];
  for (const char* loop :
       {" = 0; x1 < 5; ++x1)", " = 5; x1 < 13; ++x1)", " = 13; x1 < 24; ++x1)"}) {
    EXPECT_TRUE(contains(src, loop)) << loop << "\n" << src;
  }
  EXPECT_FALSE(contains(src, " ? ")) << src;
  for (int64_t n : {1, 3}) {
    std::map<std::string, testing::Bytes> inputs;
    std::vector<std::vector<float>> values;
    for (size_t k = 0; k < parts.size(); ++k) {
      values.push_back(random_floats(n * widths[k], 20 + static_cast<unsigned>(k)));
      inputs[parts[k]] = to_bytes(values.back());
    }
    auto out = c.run(inputs, {{"s0", n}});
    std::vector<float> want;
    for (int64_t r = 0; r < n; ++r) {
      for (size_t k = 0; k < parts.size(); ++k) {
        for (int64_t j = 0; j < widths[k]; ++j) {
          const float v = values[k][r * widths[k] + j];
          want.push_back(k == 0 ? std::max(v, 0.0f) : v);
        }
      }
    }
    expect_close(from_bytes<float>(out["o"]), want, 0);
  }
}

// A channel shuffle of two parts (ShuffleNet's Concat -> Reshape -> Transpose -> Reshape, as it
// lowers along the inner dim: element c reads element c / 2 of the part that c % 2 picks, through
// masked loads and a select), with a Relu on the second part: the loop runs over c / 2 with the
// two residues unrolled, each reading its part contiguously, without masks or selects.
TEST(CppKernel, ChannelShuffleUnrollsTheResidues) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  const Expr rows = Expr::symbol("s0");
  p.input("a", f, {rows, Expr(6)});
  p.input("b", f, {rows, Expr(6)});
  ir::Buffer& o = p.computed("o", f, {rows, Expr(12)}, {}, "Transpose");
  ir::LoopBody& body = o.body;
  const Expr c = var(o, 1);
  const Expr source = sym::floor_div(c, Expr(2)) + Expr(6) * sym::mod(c, Expr(2));
  const ir::ValueId i = body.index_expr(source);
  const ir::ValueId in_a = body.binary(OpCode::kLt, i, body.index_expr(Expr(6)));
  const ir::ValueId in_b = body.binary(OpCode::kGe, i, body.index_expr(Expr(6)));
  const ir::ValueId from_a = body.masked_load("a", f, p.at("a", {var(o, 0), source}), in_a, 0.0);
  const ir::ValueId from_b =
      body.masked_load("b", f, p.at("b", {var(o, 0), source - 6}), in_b, 0.0);
  p.store(o, body.where(in_a, from_a, body.unary(OpCode::kRelu, from_b)));
  p.output("o");
  CompiledProgram compiled(p.program, "shuffle");
  ASSERT_EQ(compiled.kernel_sources.size(), 1u);
  const std::string& src = compiled.kernel_sources[0];
  EXPECT_TRUE(contains(src, "x1_q < 6; ++x1_q)")) << src;
  EXPECT_FALSE(contains(src, " ? ")) << src;
  for (int64_t n : {1, 5}) {
    auto a = random_floats(n * 6, 30), b = random_floats(n * 6, 31);
    auto out = compiled.run({{"a", to_bytes(a)}, {"b", to_bytes(b)}}, {{"s0", n}});
    std::vector<float> want;
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t k = 0; k < 12; ++k) {
        want.push_back(k % 2 == 0 ? a[r * 6 + k / 2] : std::max(b[r * 6 + k / 2], 0.0f));
      }
    }
    expect_close(from_bytes<float>(out["o"]), want, 0);
  }
}

TEST(CppKernel, IndirectLoadGathers) {
  // out[i, j] = x[idx[i] (negative wraps), j]
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr rows = Expr::symbol("s0"), cols = Expr::symbol("s1"), n = Expr::symbol("s2");
  p.input("x", f, {rows, cols});
  p.input("idx", DType::kInt64, {n});
  ir::Buffer& o = p.computed("o", f, {n, cols}, {}, "Gather");
  auto t = o.body.indirect(o.body.load("idx", DType::kInt64, var(o, 0)), rows);
  Expr ts = o.body.op(t).symbol;
  p.store(o, o.body.load("x", f, ts * cols + var(o, 1)));
  p.output("o");
  CompiledProgram c(p.program, "indirect");
  int64_t r = 5, cl = 9;
  std::vector<int64_t> idx = {0, 4, -1, 2, -5, 3};
  auto x = random_floats(r * cl, 14);
  auto out = c.run({{"x", to_bytes(x)}, {"idx", to_bytes(idx)}},
                   {{"s0", r}, {"s1", cl}, {"s2", static_cast<int64_t>(idx.size())}});
  std::vector<float> want;
  for (int64_t i : idx) {
    int64_t row = i < 0 ? i + r : i;
    for (int64_t j = 0; j < cl; ++j) want.push_back(x[row * cl + j]);
  }
  expect_close(from_bytes<float>(out["o"]), want);
}

TEST(CppKernel, ArgMaxSelectsFirstOrLast) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {3, 4});
  for (bool last : {false, true}) {
    ir::Buffer& a = p.computed(last ? "al" : "af", DType::kInt64, {3}, {4}, "ArgMax");
    auto v = a.body.load("x", f, p.at("x", {var(a, 0), rvar(a, 0)}));
    p.store(a, a.body.reduction(ir::ReductionType::kArgMax, v, DType::kInt64, last));
    p.output(a.name);
  }
  CompiledProgram c(p.program, "argmax");
  std::vector<float> x = {1, 5, 5, 2, -1, -2, -3, -1, 0, 0, 0, 0};
  auto out = c.run({{"x", to_bytes(x)}}, {});
  EXPECT_EQ(from_bytes<int64_t>(out["af"]), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(from_bytes<int64_t>(out["al"]), (std::vector<int64_t>{2, 3, 3}));
}

TEST(CppKernel, InPlaceKernelTakesOnePointer) {
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  p.input("x", f, {8});
  p.extern_call("e", f, {8}, {"x"});
  ir::Buffer& k = p.computed("k", f, {8}, {}, "Relu");
  p.store(k, k.body.unary(OpCode::kRelu, k.body.load("e", f, var(k, 0))));
  p.extern_call("out", f, {8}, {"k"});
  p.output("out");
  CompiledProgram c(p.program, "inplace");
  ASSERT_EQ(c.kernel_sources.size(), 1u);
  EXPECT_TRUE(contains(c.kernel_sources[0], "float* __restrict__ in_out_ptr0)"))
      << c.kernel_sources[0];
  auto e = random_floats(8, 15);
  auto out = c.run({{"e", to_bytes(e)}}, {});
  std::vector<float> want(8);
  for (int k2 = 0; k2 < 8; ++k2) want[k2] = std::max(e[k2], 0.0f);
  expect_close(from_bytes<float>(out["k"]), want);
}

TEST(CppKernel, FullReductionAndOuterPointwiseMember) {
  // total = sum(x); s = rowsum(x); inv = 1 / (s + 1) over rows; out = x * inv[row].
  ProgramBuilder p;
  const DType f = DType::kFloat32;
  Expr rows = Expr::symbol("s0"), cols = Expr::symbol("s1");
  p.input("x", f, {rows, cols});
  ir::Buffer& t = p.computed("total", f, {}, {rows, cols}, "ReduceSum");
  t.body.store("total", f, 0,
               t.body.reduction(ir::ReductionType::kSum,
                                t.body.load("x", f, p.at("x", {rvar(t, 0), rvar(t, 1)})), f));
  ir::Buffer& s = p.computed("s", f, {rows}, {cols}, "ReduceSum");
  p.store(s, s.body.reduction(ir::ReductionType::kSum,
                              s.body.load("x", f, p.at("x", {var(s, 0), rvar(s, 0)})), f));
  ir::Buffer& inv = p.computed("inv", f, {rows}, {}, "Reciprocal");
  p.store(inv, inv.body.unary(OpCode::kReciprocal,
                              inv.body.binary(OpCode::kAdd, inv.body.load("s", f, var(inv, 0)),
                                              inv.body.constant(1, f))));
  ir::Buffer& o = p.computed("o", f, {rows, cols}, {}, "Mul");
  p.store(o, o.body.binary(OpCode::kMul, o.body.load("x", f, p.at("x", o.body.vars())),
                           o.body.load("inv", f, var(o, 0))));
  p.output("total");
  p.output("o");
  CompiledProgram c(p.program, "full_reduction");
  ASSERT_EQ(c.kernel_sources.size(), 2u) << c.schedule.decisions_text();
  for (int64_t cols_v : {0, 1, 9, 1000}) {
    int64_t rows_v = 6;
    auto x = random_floats(rows_v * cols_v, 18, 0, 1);
    auto out = c.run({{"x", to_bytes(x)}}, {{"s0", rows_v}, {"s1", cols_v}});
    double total = 0;
    std::vector<float> want(x.size());
    for (int64_t i = 0; i < rows_v; ++i) {
      float row = 0;
      for (int64_t j = 0; j < cols_v; ++j) row += x[i * cols_v + j];
      total += row;
      for (int64_t j = 0; j < cols_v; ++j) want[i * cols_v + j] = x[i * cols_v + j] / (row + 1);
    }
    expect_close(from_bytes<float>(out["total"]), {static_cast<float>(total)}, 1e-4f);
    expect_close(from_bytes<float>(out["o"]), want, 1e-4f);
  }
}

TEST(CppKernel, OutputIsDeterministic) {
  ir::Program prog = testing::softmax_program(Expr::symbol("s0"), 64);
  sched::Schedule s1 = sched::schedule(prog, CppBackend());
  sched::Schedule s2 = sched::schedule(prog, CppBackend());
  ASSERT_EQ(s1.items.size(), s2.items.size());
  for (size_t k = 0; k < s1.items.size(); ++k) {
    EXPECT_EQ(generate_cpp_kernel(s1.items[k], prog).source(),
              generate_cpp_kernel(s2.items[k], prog).source());
  }
}

TEST(CppKernel, ScalarFallbackWhenVectorizationOff) {
  ir::Program prog = testing::add_relu_mul_program(4, 10);
  CppKernelOptions options;
  options.vectorize = false;
  CompiledProgram c(prog, "novec", options);
  EXPECT_FALSE(contains(c.source, "VecF32::loadu")) << c.source;
  auto x = random_floats(40, 16), y = random_floats(40, 17);
  auto out = c.run({{"x", to_bytes(x)}, {"y", to_bytes(y)}}, {});
  std::vector<float> want(40);
  for (size_t k = 0; k < 40; ++k) want[k] = std::max(x[k] + y[k], 0.0f) * 2;
  expect_close(from_bytes<float>(out["m"]), want);
}

}  // namespace
}  // namespace kiln::codegen
