// Tests of compile() and CompiledModel::run on models with a dynamic batch: one compile serves
// every batch size (driver::compile_count() counts it once, runs never recompile), symbolic shapes
// flow through the Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain of exported models,
// and results match plain C++ loops. Also run-time errors through the API: wrong shapes and
// dtypes, a wrong input count, inputs disagreeing on a symbol, and out-of-range Gather indices
// (UserError naming the input or node). Every test compiles into its own fresh code cache under the
// build tree. Last, per-model library state: two models that differ only in their Conv weights
// share one compiled library, yet each runs with its own weights, also alternately, concurrently
// and after the other was destroyed.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "driver/compile.h"
#include "graph/graph.h"
#include "model_builder.h"
#include "support/error.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;
using graph::Type;
using graph::Value;
using sym::Expr;

const Expr kBatch = Expr::symbol("batch");

using test_models::ModelBuilder;

/// Deterministic values in [-1, 1) that are not a simple pattern.
float wave(int64_t i, int64_t salt) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * salt));
}

Tensor float_tensor(std::vector<int64_t> dims, int64_t salt) {
  Tensor t(DType::kFloat32, std::move(dims));
  auto v = t.mutable_values<float>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = wave(static_cast<int64_t>(i), salt);
  return t;
}

/// A fresh code cache for the running test: KILN_BUILD_DIR/test-tmp/driver/<test name>.
fs::path fresh_cache_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "driver" /
                 (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

CompileOptions options_with_fresh_cache() {
  CompileOptions options;
  options.cache_dir = fresh_cache_dir();
  return options;
}

constexpr int64_t kIn = 12;  // 3 x 4 features, flattened by the Reshape
constexpr int64_t kOut = 5;  // MatMul columns
constexpr int64_t kWSalt = 2;
constexpr int64_t kBSalt = 3;

/// x: float32[batch, 3, 4]. Outputs:
///   y = Relu(Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) @ W + b): [batch, 5]
///   target = the Reshape's target shape, Concat(...): int64[2] = [batch, -1]
///   total = ReduceSum(Reshape(...), axes=[1], keepdims=0) * batch (as float): [batch]
graph::Model dynamic_batch_model() {
  ModelBuilder m;
  Value* x = m.input("x", DType::kFloat32, {kBatch, 3, 4});
  Value* shape = m.op("Shape", {x}, {}, "shape");
  Value* batch = m.op("Gather", {shape, m.ints({0}, {})}, {{"axis", int64_t{0}}}, "batch");
  Value* batch1 = m.op("Unsqueeze", {batch, m.ints({0}, {1})}, {}, "unsqueeze");
  Value* target = m.op("Concat", {batch1, m.ints({-1}, {1})}, {{"axis", int64_t{0}}}, "concat");
  Value* flat = m.op("Reshape", {x, target}, {}, "reshape");
  Value* mm = m.op("MatMul", {flat, m.constant(float_tensor({kIn, kOut}, kWSalt))});
  Value* biased = m.op("Add", {mm, m.constant(float_tensor({kOut}, kBSalt))});
  m.output(m.op("Relu", {biased}, {}, "relu"));
  m.output(target);
  Value* sum = m.op("ReduceSum", {flat, m.ints({1}, {1})}, {{"keepdims", int64_t{0}}});
  Value* batch_f = m.op("Cast", {batch}, {{"to", int64_t{1}}});  // float32 scalar
  m.output(m.op("Mul", {sum, batch_f}));
  return std::move(m.model);
}

struct Reference {
  std::vector<float> y;
  std::vector<float> total;
};

Reference reference(const Tensor& x) {
  int64_t batch = x.dims()[0];
  Tensor w = float_tensor({kIn, kOut}, kWSalt);
  Tensor b = float_tensor({kOut}, kBSalt);
  auto xs = x.values<float>();
  auto ws = w.values<float>();
  auto bs = b.values<float>();
  Reference r;
  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t j = 0; j < kOut; ++j) {
      double acc = bs[j];
      for (int64_t k = 0; k < kIn; ++k) acc += double{xs[n * kIn + k]} * ws[k * kOut + j];
      r.y.push_back(static_cast<float>(std::max(acc, 0.0)));
    }
    double sum = 0;
    for (int64_t k = 0; k < kIn; ++k) sum += xs[n * kIn + k];
    r.total.push_back(static_cast<float>(sum * static_cast<double>(batch)));
  }
  return r;
}

void expect_close(const Tensor& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), DType::kFloat32) << what;
  auto g = got.values<float>();
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(g[i], want[i], 1e-5 + 1e-4 * std::abs(want[i])) << what << " at " << i;
  }
}

TEST(DynamicShape, OneCompileServesBatches1And3And8) {
  graph::Model model = dynamic_batch_model();
  int before = compile_count();
  CompiledModel compiled = compile(model, options_with_fresh_cache());
  EXPECT_EQ(compile_count(), before + 1);
  EXPECT_FALSE(compiled.stats().cache_hit);

  // The symbol flows from the input through the Reshape chain to the outputs.
  ASSERT_EQ(compiled.inputs().size(), 1u);
  EXPECT_EQ(compiled.inputs()[0].shape, (std::vector<Expr>{kBatch, 3, 4}));
  ASSERT_EQ(compiled.outputs().size(), 3u);
  EXPECT_EQ(compiled.outputs()[0].shape, (std::vector<Expr>{kBatch, kOut}));
  EXPECT_EQ(compiled.outputs()[1].shape, (std::vector<Expr>{2}));
  EXPECT_EQ(compiled.outputs()[2].shape, (std::vector<Expr>{kBatch}));

  int after_compile = compile_count();
  for (int64_t batch : {1, 3, 8}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    Tensor x = float_tensor({batch, 3, 4}, batch);
    std::vector<Tensor> out = compiled.run({x});
    ASSERT_EQ(out.size(), 3u);
    Reference want = reference(x);
    EXPECT_EQ(out[0].dims(), (std::vector<int64_t>{batch, kOut}));
    expect_close(out[0], want.y, "y");
    ASSERT_EQ(out[1].dtype(), DType::kInt64);
    auto target = out[1].values<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(target.begin(), target.end()),
              (std::vector<int64_t>{batch, -1}));
    EXPECT_EQ(out[2].dims(), (std::vector<int64_t>{batch}));
    expect_close(out[2], want.total, "total");
  }
  EXPECT_EQ(compile_count(), after_compile) << "running at another batch size recompiled";
}

TEST(DynamicShape, BatchesRunInAnyOrderOnOneCompiledModel) {
  // Smaller after larger: nothing from a previous run's sizes leaks into the next.
  graph::Model model = dynamic_batch_model();
  CompiledModel compiled = compile(model, options_with_fresh_cache());
  int after_compile = compile_count();
  for (int64_t batch : {8, 1, 3, 8}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    Tensor x = float_tensor({batch, 3, 4}, 10 + batch);
    std::vector<Tensor> out = compiled.run({x});
    ASSERT_EQ(out.size(), 3u);
    expect_close(out[0], reference(x).y, "y");
  }
  EXPECT_EQ(compile_count(), after_compile);
}

TEST(DynamicShape, SecondCompileOfTheSameModelHitsTheCodeCache) {
  graph::Model model = dynamic_batch_model();
  CompileOptions options = options_with_fresh_cache();
  int before = compile_count();
  CompiledModel first = compile(model, options);
  CompiledModel second = compile(model, options);
  EXPECT_EQ(compile_count(), before + 2);  // compile() counts calls, cached or not
  EXPECT_FALSE(first.stats().cache_hit);
  EXPECT_TRUE(second.stats().cache_hit);
  Tensor x = float_tensor({3, 3, 4}, 7);
  expect_close(second.run({x})[0], reference(x).y, "y");
}

// --- run-time errors through the API ---------------------------------------------------------

/// Runs and returns the UserError's message; fails the test when nothing (or something else) is
/// thrown.
std::string run_error(const CompiledModel& compiled, const std::vector<Tensor>& inputs) {
  try {
    compiled.run(inputs);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

TEST(RunErrors, WrongShapeNamesTheInputAndBothShapes) {
  CompiledModel compiled = compile(dynamic_batch_model(), options_with_fresh_cache());
  std::string message = run_error(compiled, {float_tensor({2, 4, 3}, 0)});
  EXPECT_NE(message.find("'x'"), std::string::npos) << message;
  EXPECT_NE(message.find("[batch, 3, 4]"), std::string::npos) << message;
  EXPECT_NE(message.find("[2, 4, 3]"), std::string::npos) << message;

  message = run_error(compiled, {float_tensor({2, 12}, 0)});  // rank 2 for rank 3
  EXPECT_NE(message.find("'x'"), std::string::npos) << message;
  EXPECT_NE(message.find("[2, 12]"), std::string::npos) << message;

  // The model still runs after refusing bad inputs.
  Tensor x = float_tensor({2, 3, 4}, 1);
  expect_close(compiled.run({x})[0], reference(x).y, "y");
}

TEST(RunErrors, WrongDtypeNamesTheInputAndBothDtypes) {
  CompiledModel compiled = compile(dynamic_batch_model(), options_with_fresh_cache());
  Tensor x(DType::kFloat64, {2, 3, 4});
  std::string message = run_error(compiled, {x});
  EXPECT_NE(message.find("'x'"), std::string::npos) << message;
  EXPECT_NE(message.find("float32"), std::string::npos) << message;
  EXPECT_NE(message.find("float64"), std::string::npos) << message;
}

TEST(RunErrors, WrongInputCount) {
  CompiledModel compiled = compile(dynamic_batch_model(), options_with_fresh_cache());
  std::string message = run_error(compiled, {});
  EXPECT_NE(message.find("1 input"), std::string::npos) << message;
  EXPECT_NE(message.find("0 were given"), std::string::npos) << message;
}

TEST(RunErrors, InputsDisagreeingOnASymbolNameBoth) {
  ModelBuilder m;
  Value* a = m.input("a", DType::kFloat32, {kBatch, 3});
  Value* b = m.input("b", DType::kFloat32, {kBatch, 3});
  m.output(m.op("Add", {a, b}));
  CompiledModel compiled = compile(m.model, options_with_fresh_cache());
  std::string message = run_error(compiled, {float_tensor({2, 3}, 0), float_tensor({4, 3}, 1)});
  EXPECT_NE(message.find("input 'b'"), std::string::npos) << message;
  EXPECT_NE(message.find("[4, 3]"), std::string::npos) << message;
  EXPECT_NE(message.find("input 'a'"), std::string::npos) << message;
  std::vector<Tensor> out = compiled.run({float_tensor({4, 3}, 0), float_tensor({4, 3}, 1)});
  ASSERT_EQ(out.size(), 1u);
  std::vector<float> want;
  for (int64_t i = 0; i < 12; ++i) want.push_back(wave(i, 0) + wave(i, 1));
  expect_close(out[0], want, "a + b");
}

/// y = Gather(data float32[5, 2], idx int64[n], axis=0), node 'pick_rows'.
graph::Model gather_model() {
  ModelBuilder m;
  Value* idx = m.input("idx", DType::kInt64, {Expr::symbol("n")});
  Tensor data(DType::kFloat32, {5, 2});
  for (int64_t i = 0; i < 10; ++i) data.mutable_values<float>()[i] = static_cast<float>(i);
  m.output(m.op("Gather", {m.constant(std::move(data)), idx}, {{"axis", int64_t{0}}}, "pick_rows"));
  return std::move(m.model);
}

Tensor indices(std::vector<int64_t> values) {
  Tensor t(DType::kInt64, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.mutable_values<int64_t>().begin());
  return t;
}

TEST(RunErrors, OutOfRangeGatherIndexNamesTheNode) {
  CompiledModel compiled = compile(gather_model(), options_with_fresh_cache());
  for (int64_t bad : {7, 5, -6}) {
    std::string message = run_error(compiled, {indices({0, bad, 1})});
    SCOPED_TRACE(message);
    EXPECT_NE(message.find("'pick_rows' (Gather)"), std::string::npos);
    EXPECT_NE(message.find("index " + std::to_string(bad)), std::string::npos);
    EXPECT_NE(message.find("size 5"), std::string::npos);
  }
  // Boundary indices are valid: 4 and -5 (row 0), -1 (row 4).
  std::vector<Tensor> out = compiled.run({indices({4, -5, -1, 2})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dims(), (std::vector<int64_t>{4, 2}));
  auto v = out[0].values<float>();
  EXPECT_EQ(std::vector<float>(v.begin(), v.end()), (std::vector<float>{8, 9, 0, 1, 8, 9, 4, 5}));
}

// --- Per-model library state ------------------------------------------------------------------

constexpr int64_t kConvIn = 2, kConvOut = 3, kConvSize = 6, kConvK = 3;

/// y = Conv(x float32[1, 2, 6, 6], W [3, 2, 3, 3] (weights from `salt`), pads 1): [1, 3, 6, 6].
graph::Model conv_model(int64_t salt) {
  ModelBuilder m;
  Value* x = m.input("x", DType::kFloat32, {1, kConvIn, kConvSize, kConvSize});
  Value* w = m.constant(float_tensor({kConvOut, kConvIn, kConvK, kConvK}, salt));
  m.output(m.op("Conv", {x, w}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}, "conv"));
  return std::move(m.model);
}

std::vector<float> conv_reference(const Tensor& x, int64_t salt) {
  Tensor w = float_tensor({kConvOut, kConvIn, kConvK, kConvK}, salt);
  auto xs = x.values<float>();
  auto ws = w.values<float>();
  std::vector<float> out;
  for (int64_t o = 0; o < kConvOut; ++o) {
    for (int64_t i = 0; i < kConvSize; ++i) {
      for (int64_t j = 0; j < kConvSize; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < kConvIn; ++c) {
          for (int64_t ki = 0; ki < kConvK; ++ki) {
            for (int64_t kj = 0; kj < kConvK; ++kj) {
              int64_t ii = i + ki - 1, jj = j + kj - 1;
              if (ii < 0 || ii >= kConvSize || jj < 0 || jj >= kConvSize) continue;
              acc += double{xs[(c * kConvSize + ii) * kConvSize + jj]} *
                     ws[((o * kConvIn + c) * kConvK + ki) * kConvK + kj];
            }
          }
        }
        out.push_back(static_cast<float>(acc));
      }
    }
  }
  return out;
}

TEST(ModelState, ModelsSharingALibraryKeepTheirOwnWeights) {
  CompileOptions options = options_with_fresh_cache();
  Tensor x = float_tensor({1, kConvIn, kConvSize, kConvSize}, 1);
  CompiledModel a = compile(conv_model(5), options);
  CompiledModel b = compile(conv_model(6), options);
  EXPECT_TRUE(b.stats().cache_hit) << "the two models should share one library";
  for (int round = 0; round < 2; ++round) {
    expect_close(a.run({x})[0], conv_reference(x, 5), "a");
    expect_close(b.run({x})[0], conv_reference(x, 6), "b");
  }
  // Concurrent runs of both, from threads other than the ones that created them.
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> last(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const CompiledModel& model = t % 2 ? b : a;
      for (int k = 0; k < 20; ++k) {
        Tensor y = model.run({x})[0];
        auto v = y.values<float>();
        last[t].assign(v.begin(), v.end());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < 4; ++t) {
    std::vector<float> want = conv_reference(x, t % 2 ? 6 : 5);
    ASSERT_EQ(last[t].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(last[t][i], want[i], 1e-5 + 1e-4 * std::abs(want[i])) << "thread " << t;
    }
  }
  // A model compiled after another was destroyed may get its weights at the same address.
  for (int64_t salt : {7, 8, 9}) {
    CompiledModel c = compile(conv_model(salt), options);
    expect_close(c.run({x})[0], conv_reference(x, salt), "salt " + std::to_string(salt));
  }
}

}  // namespace
}  // namespace kiln::driver
