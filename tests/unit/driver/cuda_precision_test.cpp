// --precision fp16|bf16 (lower/mixed_precision.h): which values of small models the pass stores
// in the half type, what it leaves alone (integers, shapes, float32-only ops, control flow), the
// CPU's refusal, the kernels of a convolution block and an attention block compiled through
// NVRTC at each half type, and with a GPU both blocks against a double-precision reference
// computed here.
//
// Tolerances (GPU checks): the largest error over the largest magnitude of the reference.
// float16 keeps 11 significant bits (unit roundoff 2^-11 = 4.9e-4) and bfloat16 8 (2^-8 =
// 3.9e-3). Inputs, weights and every stored activation are rounded once each (3 to 5 roundings
// along a path here), products accumulate in float32: about 5 roundoffs, 2.5e-3 for float16 and
// 2e-2 for bfloat16. The bounds are 1e-2 and 5e-2, 2-4x above that, so a product accumulated in
// the half type (errors growing with K = 288 here) or a weight left unconverted does not hide.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cuda/nvrtc_compile.h"
#include "cuda_test_util.h"
#include "driver/compile.h"
#include "graph/tensor.h"
#include "lower/mixed_precision.h"
#include "model_builder.h"
#include "support/error.h"

namespace kiln::driver {
namespace {

using graph::DType;
using namespace cuda_test;  // NOLINT: the shared fixtures

graph::Tensor random_tensor(std::vector<int64_t> dims, std::mt19937& rng, float scale = 1) {
  graph::Tensor t(DType::kFloat32, std::move(dims));
  std::uniform_real_distribution<float> u(-scale, scale);
  for (float& v : t.mutable_values<float>()) v = u(rng);
  return t;
}

/// The dtype the converted graph gives the value called `name`.
DType dtype_in(const graph::Model& m, const std::string& name) {
  const graph::Value* v = m.graph->find_local_value(name);
  return v == nullptr ? DType::kUndefined : v->type().dtype;
}

/// How many nodes of `op` the converted graph has.
int nodes_of(const graph::Model& m, const std::string& op) {
  int n = 0;
  for (const auto& node : m.graph->nodes()) n += node->op_type() == op;
  return n;
}

TEST(MixedPrecision, MatMulChainInHalfSoftmaxInFloat32) {
  test_models::ModelBuilder b;
  std::mt19937 rng(1);
  graph::Value* x = b.input("x", DType::kFloat32, {2, 8});
  graph::Value* w = b.constant(random_tensor({8, 4}, rng));
  graph::Value* bias = b.constant(random_tensor({4}, rng));
  graph::Value* mm = b.op("MatMul", {x, w});
  graph::Value* add = b.op("Add", {mm, bias});
  graph::Value* relu = b.op("Relu", {add});
  graph::Value* soft = b.op("Softmax", {relu}, {{"axis", int64_t{1}}});
  b.output(soft);
  lower::MixedPrecisionReport report;
  std::optional<graph::Model> m = lower::to_mixed_precision(b.model, DType::kFloat16, &report);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(report.half_values, (std::vector<std::string>{mm->name(), add->name(), relu->name()}));
  EXPECT_EQ(dtype_in(*m, mm->name()), DType::kFloat16);
  EXPECT_EQ(dtype_in(*m, relu->name()), DType::kFloat16);
  // The boundary and the float32 op keep their types: x and Softmax's output.
  EXPECT_EQ(dtype_in(*m, "x"), DType::kFloat32);
  EXPECT_EQ(m->graph->outputs().at(0)->name(), soft->name());
  EXPECT_NE(m->graph->outputs().at(0)->type().dtype, DType::kFloat16);
  // x cast to half once, Relu's output back to float32 for Softmax; both weights converted.
  EXPECT_EQ(report.casts, 2);
  EXPECT_EQ(nodes_of(*m, "Cast"), 2);
  EXPECT_EQ(report.converted_weights, 2);
  const graph::Node& matmul = *m->graph->find_local_value(mm->name())->producer();
  const graph::Tensor* half_w = matmul.input(1)->initializer();
  ASSERT_NE(half_w, nullptr);
  ASSERT_EQ(half_w->dtype(), DType::kFloat16);
  for (size_t k = 0; k < 32; ++k) {
    EXPECT_EQ(half_w->values<uint16_t>()[k],
              graph::float_to_half(w->initializer()->values<float>()[k]));
  }
}

TEST(MixedPrecision, ModelOutputOfAHalfOpIsCastBackUnderItsName) {
  test_models::ModelBuilder b;
  std::mt19937 rng(2);
  graph::Value* x = b.input("x", DType::kFloat32, {1, 3, 8, 8});
  graph::Value* conv = b.op("Conv", {x, b.constant(random_tensor({4, 3, 3, 3}, rng))},
                            {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  graph::Value* y = b.op("Relu", {conv});
  b.output(y);
  lower::MixedPrecisionReport report;
  std::optional<graph::Model> m = lower::to_mixed_precision(b.model, DType::kBFloat16, &report);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(report.half_values, (std::vector<std::string>{conv->name(), y->name()}));
  const graph::Value* out = m->graph->outputs().at(0);
  EXPECT_EQ(out->name(), y->name());
  ASSERT_NE(out->producer(), nullptr);
  EXPECT_EQ(out->producer()->op_type(), "Cast");
  EXPECT_EQ(out->producer()->attr_int("to", 0), static_cast<int64_t>(DType::kFloat32));
  EXPECT_EQ(out->producer()->input(0)->type().dtype, DType::kBFloat16);
  const graph::Tensor* weight =
      m->graph->find_local_value(conv->name())->producer()->input(1)->initializer();
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->dtype(), DType::kBFloat16);
}

TEST(MixedPrecision, BatchNormalizationFoldsIntoTheConvolutionInFloat32) {
  test_models::ModelBuilder b;
  std::mt19937 rng(4);
  graph::Value* x = b.input("x", DType::kFloat32, {1, 2, 4, 4});
  graph::Tensor w = random_tensor({3, 2, 1, 1}, rng), bias = random_tensor({3}, rng);
  graph::Tensor scale = random_tensor({3}, rng), shift = random_tensor({3}, rng),
                mean = random_tensor({3}, rng), var = random_tensor({3}, rng);
  for (float& v : var.mutable_values<float>()) v = std::abs(v) + 0.5f;
  const std::vector<float> wv(w.values<float>().begin(), w.values<float>().end());
  const std::vector<float> bv(bias.values<float>().begin(), bias.values<float>().end());
  auto vec = [](const graph::Tensor& t) {
    return std::vector<float>(t.values<float>().begin(), t.values<float>().end());
  };
  const std::vector<float> s = vec(scale), sh = vec(shift), mu = vec(mean), v2 = vec(var);
  graph::Value* conv = b.op("Conv", {x, b.constant(std::move(w)), b.constant(std::move(bias))});
  graph::Value* bn = b.op("BatchNormalization",
                          {conv, b.constant(std::move(scale)), b.constant(std::move(shift)),
                           b.constant(std::move(mean)), b.constant(std::move(var))},
                          {{"epsilon", 1e-3f}});
  graph::Value* y = b.op("Relu", {bn});
  b.output(y);
  lower::MixedPrecisionReport report;
  std::optional<graph::Model> m = lower::to_mixed_precision(b.model, DType::kFloat16, &report);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(report.folded_batch_norms, 1);
  EXPECT_EQ(nodes_of(*m, "BatchNormalization"), 0);
  // The convolution writes the normalization's output, in float16, and Relu follows.
  EXPECT_EQ(report.half_values, (std::vector<std::string>{bn->name(), y->name()}));
  const graph::Node& folded = *m->graph->find_local_value(bn->name())->producer();
  ASSERT_EQ(folded.op_type(), "Conv");
  const graph::Tensor* fw = folded.input(1)->initializer();
  const graph::Tensor* fb = folded.input(2)->initializer();
  ASSERT_TRUE(fw != nullptr && fb != nullptr);
  ASSERT_EQ(fw->dtype(), DType::kFloat16);
  for (size_t c = 0; c < 3; ++c) {
    const double k = s[c] / std::sqrt(double{v2[c]} + double{1e-3f});
    for (size_t e = 0; e < 2; ++e) {
      EXPECT_EQ(fw->values<uint16_t>()[c * 2 + e],
                graph::float_to_half(static_cast<float>(wv[c * 2 + e] * k)));
    }
    EXPECT_EQ(fb->values<uint16_t>()[c],
              graph::float_to_half(static_cast<float>((double{bv[c]} - mu[c]) * k + sh[c])));
  }
}

TEST(MixedPrecision, IntegersStayAndFloat32OperandsPromote) {
  test_models::ModelBuilder b;
  std::mt19937 rng(3);
  graph::Value* x = b.input("x", DType::kFloat32, {2, 4});
  graph::Value* z = b.input("z", DType::kFloat32, {2, 4});
  graph::Value* mm = b.op("MatMul", {x, b.constant(random_tensor({4, 4}, rng))});
  // Reshape's shape (int64) is untouched; Reshape follows MatMul into the half type.
  graph::Value* r = b.op("Reshape", {mm, b.ints({4, 2}, {2})});
  graph::Value* back = b.op("Reshape", {r, b.ints({2, 4}, {2})});
  // Add of a half value and a float32 model input: the wider type, float32.
  graph::Value* sum = b.op("Add", {back, z});
  graph::Value* e = b.op("Exp", {sum});
  b.output(e);
  lower::MixedPrecisionReport report;
  std::optional<graph::Model> m = lower::to_mixed_precision(b.model, DType::kFloat16, &report);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(report.half_values, (std::vector<std::string>{mm->name(), r->name(), back->name()}));
  EXPECT_NE(dtype_in(*m, sum->name()), DType::kFloat16);
  EXPECT_EQ(report.converted_weights, 1);  // the MatMul weight; the int64 shapes stay
  for (const auto& node : m->graph->nodes()) {
    if (node->op_type() != "Reshape") continue;
    EXPECT_EQ(node->input(1)->initializer()->dtype(), DType::kInt64);
  }
}

TEST(MixedPrecision, ModelsWithControlFlowStayFloat32) {
  test_models::ModelBuilder b;
  graph::Value* c = b.input("c", DType::kBool, {});
  auto branch = [](const std::string& name) {
    auto g = std::make_shared<graph::Graph>(name);
    graph::Value* v = g->add_value(name + "_y", graph::Type::tensor(DType::kFloat32, {}));
    graph::Tensor t(DType::kFloat32, {});
    t.mutable_values<float>()[0] = 1;
    g->add_node(name + "_const", "Constant", "", 13, {}, {v}, {{"value", t}});
    g->add_output(v);
    return g;
  };
  graph::Value* y =
      b.op("If", {c}, {{"then_branch", branch("then")}, {"else_branch", branch("else")}});
  b.output(y);
  lower::MixedPrecisionReport report;
  EXPECT_FALSE(lower::to_mixed_precision(b.model, DType::kFloat16, &report).has_value());
  EXPECT_NE(report.skipped.find("(If) has subgraphs"), std::string::npos) << report.skipped;
}

TEST(MixedPrecision, TheCpuRefusesHalfPrecision) {
  test_models::ModelBuilder b;
  b.output(b.op("Relu", {b.input("x", DType::kFloat32, {4})}));
  CompileOptions options;
  options.precision = ir::Precision::kFp16;
  TempDir dir;
  options.cache_dir = dir.path;
  try {
    compile(b.model, options);
    FAIL() << "compiled fp16 for the CPU";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--precision fp16 is for --device cuda"),
              std::string::npos)
        << e.what();
  }
}

/// The line of `text` holding the first `needle`.
std::string line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at) + 1, end = text.find('\n', at);
  return text.substr(begin, end - begin);
}

// A bias and Relu after a half product fuse into cuBLASLt's epilogue as they do at float32,
// with the bias in the half type.
TEST(CudaHalfPrecisionText, BiasAndReluFuseIntoTheHalfProduct) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  test_models::ModelBuilder b;
  std::mt19937 rng(6);
  graph::Value* x = b.input("x", DType::kFloat32, {16, 64});
  graph::Value* mm = b.op("MatMul", {x, b.constant(random_tensor({64, 32}, rng))});
  graph::Value* h = b.op("Relu", {b.op("Add", {mm, b.constant(random_tensor({32}, rng))})});
  // A second product reads the activation in the half type (a model output would be cast to
  // float32 in the same kernel, which cuBLASLt's one-type epilogue does not take).
  b.output(b.op("MatMul", {h, b.constant(random_tensor({32, 8}, rng))}));
  TempDir dir;
  Compiled c = compile_cuda_dumped(b.model, dir.path, ir::Precision::kFp16);
  const std::string call = line_of(c.wrapper, "state.cuda.matmul<uint16_t>(");
  EXPECT_NE(call.find("kiln_cuda::Epilogue::kReluBias"), std::string::npos) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "state.cuda.matmul<uint16_t>("), 2u) << c.wrapper;
}

/// Conv 3x3 (32 -> 32 channels, pad 1) + bias, Relu, + x (a residual block's tail), then
/// GlobalAveragePool: the CNN block.
graph::Model cnn_block(std::mt19937& rng, std::vector<float>& w, std::vector<float>& bias) {
  test_models::ModelBuilder b;
  graph::Value* x = b.input("x", DType::kFloat32, {1, 32, 8, 8});
  graph::Tensor wt = random_tensor({32, 32, 3, 3}, rng, 0.06f), bt = random_tensor({32}, rng, 0.1f);
  w.assign(wt.values<float>().begin(), wt.values<float>().end());
  bias.assign(bt.values<float>().begin(), bt.values<float>().end());
  graph::Value* conv = b.op("Conv", {x, b.constant(std::move(wt)), b.constant(std::move(bt))},
                            {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  graph::Value* sum = b.op("Add", {b.op("Relu", {conv}), x});
  b.output(b.op("GlobalAveragePool", {sum}));
  return std::move(b.model);
}

/// Q [1, 4, 16, 32] (batch, heads, sequence, head size) and K, V alike: Softmax(Q K^T / sqrt
/// 32) V through MatMul, Mul, Softmax, MatMul, then a projection by a [32, 32] weight.
graph::Model attention_block(std::mt19937& rng, std::vector<float>& proj) {
  test_models::ModelBuilder b;
  graph::Value* q = b.input("q", DType::kFloat32, {1, 4, 16, 32});
  graph::Value* k = b.input("k", DType::kFloat32, {1, 4, 16, 32});
  graph::Value* v = b.input("v", DType::kFloat32, {1, 4, 16, 32});
  graph::Value* kt = b.op("Transpose", {k}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
  graph::Tensor scale(DType::kFloat32, {});
  scale.mutable_values<float>()[0] = 1.0f / std::sqrt(32.0f);
  graph::Value* s = b.op("Mul", {b.op("MatMul", {q, kt}), b.constant(std::move(scale))});
  graph::Value* p = b.op("Softmax", {s}, {{"axis", int64_t{-1}}});
  graph::Tensor pt = random_tensor({32, 32}, rng, 0.2f);
  proj.assign(pt.values<float>().begin(), pt.values<float>().end());
  b.output(b.op("MatMul", {b.op("MatMul", {p, v}), b.constant(std::move(pt))}));
  return std::move(b.model);
}

std::vector<double> cnn_reference(const std::vector<float>& x, const std::vector<float>& w,
                                  const std::vector<float>& bias) {
  std::vector<double> out(32, 0.0);
  for (int m = 0; m < 32; ++m) {
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 8; ++j) {
        double acc = bias[m];
        for (int c = 0; c < 32; ++c) {
          for (int di = 0; di < 3; ++di) {
            for (int dj = 0; dj < 3; ++dj) {
              const int y = i + di - 1, z = j + dj - 1;
              if (y < 0 || y >= 8 || z < 0 || z >= 8) continue;
              acc += double{x[(c * 8 + y) * 8 + z]} * w[((m * 32 + c) * 3 + di) * 3 + dj];
            }
          }
        }
        out[m] += std::max(acc, 0.0) + x[(m * 8 + i) * 8 + j];
      }
    }
    out[m] /= 64;
  }
  return out;
}

std::vector<double> attention_reference(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v,
                                        const std::vector<float>& proj) {
  std::vector<double> out(4 * 16 * 32, 0.0);
  for (int h = 0; h < 4; ++h) {
    const size_t base = static_cast<size_t>(h) * 16 * 32;
    for (int i = 0; i < 16; ++i) {
      std::vector<double> s(16);
      double top = -1e300, total = 0;
      for (int j = 0; j < 16; ++j) {
        double dot = 0;
        for (int d = 0; d < 32; ++d) dot += double{q[base + i * 32 + d]} * k[base + j * 32 + d];
        s[j] = dot / std::sqrt(32.0);
        top = std::max(top, s[j]);
      }
      for (double& e : s) total += (e = std::exp(e - top));
      std::vector<double> o(32, 0.0);
      for (int j = 0; j < 16; ++j) {
        for (int d = 0; d < 32; ++d) o[d] += s[j] / total * v[base + j * 32 + d];
      }
      for (int n = 0; n < 32; ++n) {
        double acc = 0;
        for (int d = 0; d < 32; ++d) acc += o[d] * proj[d * 32 + n];
        out[base + i * 32 + n] = acc;
      }
    }
  }
  return out;
}

/// The largest |got - want| over the largest |want|.
double relative_error(const graph::Tensor& got, const std::vector<double>& want) {
  EXPECT_EQ(got.dtype(), DType::kFloat32);
  EXPECT_EQ(static_cast<size_t>(got.numel()), want.size());
  double err = 0, top = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    err = std::max(err, std::abs(double{got.values<float>()[k]} - want[k]));
    top = std::max(top, std::abs(want[k]));
  }
  return err / top;
}

struct PrecisionCase {
  ir::Precision precision;
  DType half;
  double tolerance;
};

class CudaHalfPrecision : public ::testing::TestWithParam<PrecisionCase> {};

TEST_P(CudaHalfPrecision, CnnBlock) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const PrecisionCase& p = GetParam();
  std::mt19937 rng(11);
  std::vector<float> w, bias;
  graph::Model model = cnn_block(rng, w, bias);
  TempDir dir;
  Compiled c = compile_cuda_dumped(model, dir.path, p.precision);
  // The half type is what the kernels load and store (16-bit storage, float arithmetic).
  const std::string half_t = p.half == DType::kFloat16 ? "half" : "bf16";
  EXPECT_NE(c.kernels.find("kiln::" + half_t + "_to_float("), std::string::npos) << c.kernels;
  EXPECT_NE(files::read(dir.path / "dump" / "0_mixed_precision.txt").find("Cast"),
            std::string::npos);
  // The wrapper's cuDNN call takes 16-bit tensors, bfloat16 flagged as such, with the bias in
  // cuDNN's graph (the Relu is not: an Add of x follows it in the same kernel).
  EXPECT_EQ(count(c.wrapper, "state.cuda.conv<uint16_t>("), 1u) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "state.cuda.conv<float>("), 0u) << c.wrapper;
  const std::string call = line_of(c.wrapper, "state.cuda.conv<uint16_t>(");
  EXPECT_EQ(call.ends_with(", true);"), p.half == DType::kBFloat16) << call;
  EXPECT_NE(call.find(" + 0, nullptr, kiln_cuda::ConvActivation{0, 0, 0}, "), std::string::npos)
      << call;
  EXPECT_NE(c.wrapper.find("// cuDNN convolution + bias in its graph, " +
                           std::string(graph::dtype_name(p.half)) + " tensors, float32 compute"),
            std::string::npos)
      << c.wrapper;
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  graph::Tensor x = random_tensor({1, 32, 8, 8}, rng);
  std::vector<graph::Tensor> y = c.model.run({x});
  ASSERT_EQ(y.size(), 1u);
  const std::vector<float> xv(x.values<float>().begin(), x.values<float>().end());
  const double err = relative_error(y[0], cnn_reference(xv, w, bias));
  EXPECT_LT(err, p.tolerance) << "--precision " << ir::precision_name(p.precision);
  std::printf("cnn block --precision %s: relative error %.3g (bound %.3g)\n",
              std::string(ir::precision_name(p.precision)).c_str(), err, p.tolerance);
}

TEST_P(CudaHalfPrecision, AttentionBlock) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const PrecisionCase& p = GetParam();
  std::mt19937 rng(12);
  std::vector<float> proj;
  graph::Model model = attention_block(rng, proj);
  TempDir dir;
  Compiled c = compile_cuda_dumped(model, dir.path, p.precision);
  // Softmax reads and writes the half type around float arithmetic: its kernel converts.
  const std::string half_t = p.half == DType::kFloat16 ? "half" : "bf16";
  EXPECT_NE(c.kernels.find("kiln::" + half_t + "_to_float("), std::string::npos) << c.kernels;
  // The three products on cuBLASLt with 16-bit operands and float32 accumulation.
  EXPECT_EQ(count(c.wrapper, "state.cuda.matmul<uint16_t>("), 3u) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "state.cuda.matmul<float>("), 0u) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "// cuBLASLt, " + std::string(graph::dtype_name(p.half)) +
                                 " operands, float32 compute"),
            3u)
      << c.wrapper;
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  graph::Tensor q = random_tensor({1, 4, 16, 32}, rng), k = random_tensor({1, 4, 16, 32}, rng),
                v = random_tensor({1, 4, 16, 32}, rng);
  std::vector<graph::Tensor> y = c.model.run({q, k, v});
  ASSERT_EQ(y.size(), 1u);
  auto vec = [](const graph::Tensor& t) {
    return std::vector<float>(t.values<float>().begin(), t.values<float>().end());
  };
  const double err = relative_error(y[0], attention_reference(vec(q), vec(k), vec(v), proj));
  EXPECT_LT(err, p.tolerance) << "--precision " << ir::precision_name(p.precision);
  std::printf("attention block --precision %s: relative error %.3g (bound %.3g)\n",
              std::string(ir::precision_name(p.precision)).c_str(), err, p.tolerance);
}

/// A residual block with a projection shortcut at batch 2 and odd spatial sizes, then a 1x1
/// convolution (so that the block's output stays in the half type): a = Relu(Conv 3x3(x) + b1),
/// r = Relu(Conv 3x3(a) + b2 + Conv 1x1(x) + b3), y = Conv 1x1(r) + b4. Four convolutions: the
/// network runs channels-last, in the half type as in float32.
graph::Model residual_block(std::mt19937& rng, std::vector<std::vector<float>>& params) {
  test_models::ModelBuilder b;
  graph::Value* x = b.input("x", DType::kFloat32, {2, 16, 9, 7});
  auto conv = [&](graph::Value* in, int64_t k, const char* weight) {
    graph::Tensor w = random_tensor({16, 16, k, k}, rng, 0.1f),
                  bias = random_tensor({16}, rng, 0.1f);
    params.emplace_back(w.values<float>().begin(), w.values<float>().end());
    params.emplace_back(bias.values<float>().begin(), bias.values<float>().end());
    const int64_t p = k / 2;
    // The weight with its shape, as an exporter writes initializers (the layout choice counts
    // the 2-D convolutions by their weights' shapes).
    graph::Value* wv = b.model.graph->add_value(
        weight, graph::Type::tensor(DType::kFloat32, graph::Shape{16, 16, k, k}));
    b.model.graph->set_initializer(wv, std::make_shared<graph::Tensor>(std::move(w)));
    return b.op("Conv", {in, wv, b.constant(std::move(bias))},
                {{"pads", std::vector<int64_t>{p, p, p, p}}});
  };
  graph::Value* a = b.op("Relu", {conv(x, 3, "w1")});
  graph::Value* main = conv(a, 3, "w2");
  b.output(conv(b.op("Relu", {b.op("Add", {main, conv(x, 1, "w3")})}), 1, "w4"));
  return std::move(b.model);
}

/// residual_block's output in double (NCHW).
std::vector<double> residual_reference(const std::vector<float>& x,
                                       const std::vector<std::vector<float>>& p) {
  constexpr int kN = 2, kC = 16, kH = 9, kW = 7;
  auto conv = [&](const std::vector<double>& in, const std::vector<float>& w,
                  const std::vector<float>& bias, int k) {
    std::vector<double> out(in.size());
    for (int n = 0; n < kN; ++n)
      for (int m = 0; m < kC; ++m)
        for (int i = 0; i < kH; ++i)
          for (int j = 0; j < kW; ++j) {
            double acc = bias[m];
            for (int c = 0; c < kC; ++c)
              for (int di = 0; di < k; ++di)
                for (int dj = 0; dj < k; ++dj) {
                  const int y = i + di - k / 2, z = j + dj - k / 2;
                  if (y < 0 || y >= kH || z < 0 || z >= kW) continue;
                  acc += in[((n * kC + c) * kH + y) * kW + z] * w[((m * kC + c) * k + di) * k + dj];
                }
            out[((n * kC + m) * kH + i) * kW + j] = acc;
          }
    return out;
  };
  const std::vector<double> xd(x.begin(), x.end());
  std::vector<double> a = conv(xd, p[0], p[1], 3);
  for (double& v : a) v = std::max(v, 0.0);
  std::vector<double> y = conv(a, p[2], p[3], 3);
  const std::vector<double> shortcut = conv(xd, p[4], p[5], 1);
  for (size_t i = 0; i < y.size(); ++i) y[i] = std::max(y[i] + shortcut[i], 0.0);
  return conv(y, p[6], p[7], 1);
}

TEST_P(CudaHalfPrecision, ResidualBlockChannelsLastWithItsEpiloguesInCudnn) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const PrecisionCase& p = GetParam();
  std::mt19937 rng(13);
  std::vector<std::vector<float>> params;
  graph::Model model = residual_block(rng, params);
  TempDir dir;
  Compiled c = compile_cuda_dumped(model, dir.path, p.precision);
  // Four half convolutions, channels-last, each with its bias in cuDNN's graph: the first
  // with its Relu, one of the block's last two with the other's output as its residual and the
  // Relu.
  EXPECT_EQ(count(c.wrapper, "state.cuda.conv<uint16_t>("), 4u) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "// cuDNN convolution (channels-last) + bias"), 4u) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "// cuDNN convolution (channels-last) + bias, Relu in its graph"), 1u)
      << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "+ bias + residual, Relu in its graph"), 1u) << c.wrapper;
  EXPECT_EQ(count(c.wrapper, "kiln_cuda::ConvActivation{1, 0, 0}"), 2u) << c.wrapper;
  // The module carries the half type's epilogue kernel, for where cuDNN has no fused engine.
  EXPECT_NE(c.kernels.find(p.half == DType::kFloat16 ? "kiln_conv_epilogue_f16"
                                                     : "kiln_conv_epilogue_bf16"),
            std::string::npos);
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device (the kernels compiled)";
  graph::Tensor x = random_tensor({2, 16, 9, 7}, rng);
  const std::vector<float> xv(x.values<float>().begin(), x.values<float>().end());
  const std::vector<double> want = residual_reference(xv, params);
  // Twice: the first run makes cuDNN's plans, the second replays them (or a CUDA graph).
  for (int run = 0; run < 2; ++run) {
    std::vector<graph::Tensor> y = c.model.run({x});
    ASSERT_EQ(y.size(), 1u);
    const double err = relative_error(y[0], want);
    EXPECT_LT(err, p.tolerance) << "--precision " << ir::precision_name(p.precision);
    std::printf("residual block --precision %s, run %d: relative error %.3g (bound %.3g)\n",
                std::string(ir::precision_name(p.precision)).c_str(), run, err, p.tolerance);
  }
  // Where cuDNN has no engine for a fused graph (forced by KILN_CUDNN_UNFUSED=1 in a model
  // loaded anew, whose plans are made anew): each convolution alone, then that kernel.
  setenv("KILN_CUDNN_UNFUSED", "1", 1);
  Compiled unfused = compile_cuda_dumped(model, dir.path, p.precision);
  std::vector<graph::Tensor> y = unfused.model.run({x});
  unsetenv("KILN_CUDNN_UNFUSED");
  ASSERT_EQ(y.size(), 1u);
  const double err = relative_error(y[0], want);
  EXPECT_LT(err, p.tolerance) << "--precision " << ir::precision_name(p.precision) << ", unfused";
  std::printf("residual block --precision %s, unfused: relative error %.3g (bound %.3g)\n",
              std::string(ir::precision_name(p.precision)).c_str(), err, p.tolerance);
}

INSTANTIATE_TEST_SUITE_P(
    Types, CudaHalfPrecision,
    ::testing::Values(PrecisionCase{ir::Precision::kFp16, DType::kFloat16, 1e-2},
                      PrecisionCase{ir::Precision::kBf16, DType::kBFloat16, 5e-2}),
    [](const ::testing::TestParamInfo<PrecisionCase>& info) {
      return std::string(ir::precision_name(info.param.precision));
    });

}  // namespace
}  // namespace kiln::driver
