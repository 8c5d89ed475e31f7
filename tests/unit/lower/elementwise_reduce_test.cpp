// Tests of the elementwise, reduction and normalization lowerings (src/lower/elementwise.cpp,
// activation.cpp, reduce.cpp, norm.cpp) on graphs built in C++: the opset versions the ONNX node
// suite does not cover (legacy broadcasting, Clip and Softmax before 11/13, Cast with a type
// name), known-value folding into symbolic shapes, zero-size reductions and error messages.
// Values are checked with the reference interpreter.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "ir/interpreter.h"
#include "lower/lowering.h"
#include "support/error.h"

namespace kiln::lower {
namespace {

using graph::DType;
using graph::Tensor;
using graph::Type;
using graph::Value;
using sym::Expr;

/// Builds small ai.onnx graphs node by node at one opset.
class GraphBuilder {
 public:
  explicit GraphBuilder(int64_t opset) : opset_(opset) {}

  Value* input(const std::string& name, DType dtype, graph::Shape shape) {
    Value* v = graph.add_value(name, Type::tensor(dtype, std::move(shape)));
    graph.add_input(v);
    return v;
  }
  Value* ints(std::vector<int64_t> values) {
    auto t = std::make_shared<Tensor>(DType::kInt64,
                                      std::vector<int64_t>{static_cast<int64_t>(values.size())});
    std::copy(values.begin(), values.end(), t->mutable_values<int64_t>().begin());
    Value* v = graph.add_value(fresh("c"), Type::tensor(DType::kInt64, std::nullopt));
    graph.set_initializer(v, std::move(t));
    return v;
  }
  std::vector<Value*> node(const std::string& op, std::vector<Value*> inputs,
                           std::map<std::string, graph::AttributeValue> attrs, int outputs) {
    std::vector<Value*> outs;
    for (int k = 0; k < outputs; ++k) outs.push_back(graph.add_value(fresh("v"), Type()));
    graph.add_node(fresh(op), op, "", opset_, std::move(inputs), outs, std::move(attrs));
    return outs;
  }
  Value* op(const std::string& op, std::vector<Value*> inputs,
            std::map<std::string, graph::AttributeValue> attrs = {}) {
    return node(op, std::move(inputs), std::move(attrs), 1)[0];
  }
  void output(Value* v) { graph.add_output(v); }

  graph::Graph graph{"main"};

 private:
  std::string fresh(const std::string& prefix) { return prefix + std::to_string(next_++); }
  int64_t opset_;
  int next_ = 0;
};

Tensor float_tensor(std::vector<int64_t> dims, std::vector<float> values) {
  Tensor t(DType::kFloat32, std::move(dims));
  std::copy(values.begin(), values.end(), t.mutable_values<float>().begin());
  return t;
}

std::vector<float> floats(const Tensor& t) {
  auto s = t.values<float>();
  return {s.begin(), s.end()};
}

/// Lowers the builder's graph and runs it; returns output 0.
Tensor run(const GraphBuilder& b, std::map<std::string, Tensor> inputs) {
  ir::Program program = lower_graph(b.graph);
  auto outputs = ir::interpret(program, inputs);
  return outputs.at(b.graph.outputs()[0]->name());
}

std::vector<float> softmax(std::vector<float> x) {
  float m = *std::max_element(x.begin(), x.end());
  float sum = 0;
  for (float& v : x) sum += (v = std::exp(v - m));
  for (float& v : x) v /= sum;
  return x;
}

TEST(ReduceLowering, SoftmaxBeforeOpset13CoercesTo2D) {
  std::vector<float> data = {1, 2, 3, 4, 5, 6, -1, 0, 1, 7, 7, 7};
  for (int64_t opset : {11, 13}) {
    GraphBuilder b(opset);
    Value* x = b.input("x", DType::kFloat32, {2, 2, 3});
    b.output(b.op("Softmax", {x}, {{"axis", int64_t{1}}}));
    std::vector<float> got = floats(run(b, {{"x", float_tensor({2, 2, 3}, data)}}));
    if (opset == 11) {  // rows of 6 elements: dims 1 and 2 together
      std::vector<float> want = softmax({data.begin(), data.begin() + 6});
      for (size_t k = 0; k < 6; ++k) EXPECT_NEAR(got[k], want[k], 1e-6) << k;
    } else {  // axis 1 only: elements 0 and 3 of the first batch
      std::vector<float> want = softmax({data[0], data[3]});
      EXPECT_NEAR(got[0], want[0], 1e-6);
      EXPECT_NEAR(got[3], want[1], 1e-6);
    }
  }
}

TEST(ElementwiseLowering, LegacyBroadcastAlignsBAtAxis) {
  GraphBuilder b(6);
  Value* a = b.input("a", DType::kFloat32, {2, 3, 2});
  Value* c = b.input("c", DType::kFloat32, {3});
  b.output(b.op("Add", {a, c}, {{"broadcast", int64_t{1}}, {"axis", int64_t{1}}}));
  std::vector<float> zeros(12, 0.0f);
  std::vector<float> got =
      floats(run(b, {{"a", float_tensor({2, 3, 2}, zeros)}, {"c", float_tensor({3}, {1, 2, 3})}}));
  EXPECT_EQ(got, (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
}

// A squeeze-and-excitation gate: Mul(x [1, 3, 4, 5], Sigmoid(g [1, 3, 1, 1])). The Sigmoid,
// broadcast over 20 times its elements, is stored once (a buffer of 3 elements) instead of being
// recomputed inside the Mul for each of x's 60; the values are the same.
TEST(ElementwiseLowering, TranscendentalInputBroadcastManyTimesIsStoredFirst) {
  GraphBuilder b(13);
  Value* x = b.input("x", DType::kFloat32, {1, 3, 4, 5});
  Value* g = b.input("g", DType::kFloat32, {1, 3, 1, 1});
  b.output(b.op("Mul", {x, b.op("Sigmoid", {g})}));
  ir::Program program = lower_graph(b.graph);
  int gates = 0;
  for (const auto& buffer : program.buffers) {
    if (buffer->kind == ir::BufferKind::kComputed && buffer->layout.sizes.size() == 4 &&
        buffer->layout.sizes[2] == Expr(1)) {
      ++gates;
    }
  }
  EXPECT_EQ(gates, 1);
  std::vector<float> xs(60), gs = {-1.0f, 0.0f, 2.5f};
  for (size_t k = 0; k < xs.size(); ++k) xs[k] = 0.25f * static_cast<float>(k) - 7.0f;
  std::vector<float> got = floats(
      run(b, {{"x", float_tensor({1, 3, 4, 5}, xs)}, {"g", float_tensor({1, 3, 1, 1}, gs)}}));
  ASSERT_EQ(got.size(), 60u);
  for (size_t k = 0; k < 60; ++k) {
    const float want = xs[k] / (1.0f + std::exp(-gs[k / 20]));
    EXPECT_NEAR(got[k], want, 1e-6f * (1 + std::fabs(want))) << k;
  }
}

TEST(ElementwiseLowering, ClipBeforeOpset11TakesAttributes) {
  GraphBuilder b(6);
  Value* x = b.input("x", DType::kFloat32, {4});
  b.output(b.op("Clip", {x}, {{"min", -1.0f}, {"max", 2.0f}}));
  EXPECT_EQ(floats(run(b, {{"x", float_tensor({4}, {-5, 0, 1.5, 9})}})),
            (std::vector<float>{-1, 0, 1.5, 2}));
}

TEST(ElementwiseLowering, CastWithTypeNameTruncatesTowardZero) {
  GraphBuilder b(1);
  Value* x = b.input("x", DType::kFloat32, {3});
  b.output(b.op("Cast", {x}, {{"to", std::string("INT32")}}));
  Tensor got = run(b, {{"x", float_tensor({3}, {-1.7f, 2.9f, -0.2f})}});
  ASSERT_EQ(got.dtype(), DType::kInt32);
  auto v = got.values<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(v.begin(), v.end()), (std::vector<int32_t>{-1, 2, 0}));
}

TEST(ElementwiseLowering, KnownShapeArithmeticStaysSymbolic) {
  // Reshape x[batch, 6] to Concat(Shape(x) / [1, 2], [2]) = [batch, 3, 2].
  Expr batch = Expr::symbol("batch");
  GraphBuilder b(13);
  Value* x = b.input("x", DType::kFloat32, {batch, 6});
  Value* half = b.op("Div", {b.op("Shape", {x}), b.ints({1, 2})});
  Value* shape = b.op("Concat", {half, b.ints({2})}, {{"axis", int64_t{0}}});
  b.output(b.op("Reshape", {x, shape}));
  ir::Program program = lower_graph(b.graph);
  ASSERT_EQ(program.outputs.size(), 1u);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{batch, 3, 2}));
}

TEST(ElementwiseLowering, IntegerDivTruncatesAndPowKeepsBaseType) {
  GraphBuilder b(15);
  Value* a = b.input("a", DType::kInt64, {4});
  Value* d = b.input("d", DType::kInt64, {4});
  b.output(b.op("Pow", {b.op("Div", {a, d}), b.input("e", DType::kFloat32, {4})}));
  Tensor ta(DType::kInt64, {4}), td(DType::kInt64, {4});
  std::vector<int64_t> av = {7, -7, 9, 5}, dv = {2, 2, -4, 5};
  std::copy(av.begin(), av.end(), ta.mutable_values<int64_t>().begin());
  std::copy(dv.begin(), dv.end(), td.mutable_values<int64_t>().begin());
  Tensor got = run(b, {{"a", ta}, {"d", td}, {"e", float_tensor({4}, {2, 3, 1, 0.5})}});
  ASSERT_EQ(got.dtype(), DType::kInt64);
  auto v = got.values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(v.begin(), v.end()), (std::vector<int64_t>{9, -27, -2, 1}));
}

TEST(ReduceLowering, AxesAttributeBeforeOpset13AndNoopWithEmptyAxes) {
  GraphBuilder b11(11);
  Value* x = b11.input("x", DType::kFloat32, {2, 3});
  b11.output(
      b11.op("ReduceSum", {x}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}}));
  Tensor data = float_tensor({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(floats(run(b11, {{"x", data}})), (std::vector<float>{6, 15}));
  GraphBuilder b13(13);
  Value* y = b13.input("x", DType::kFloat32, {2, 3});
  b13.output(b13.op("ReduceSum", {y}, {{"noop_with_empty_axes", int64_t{1}}}));
  EXPECT_EQ(floats(run(b13, {{"x", data}})), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(ReduceLowering, ZeroSizeReductionsGiveTheIdentity) {
  for (const char* op : {"ReduceMax", "ReduceProd", "ReduceSum"}) {
    GraphBuilder b(11);
    Value* x = b.input("x", DType::kFloat32, {2, 0});
    b.output(b.op(op, {x}, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}}));
    std::vector<float> got = floats(run(b, {{"x", Tensor(DType::kFloat32, {2, 0})}}));
    float want = std::string(op) == "ReduceMax" ? -std::numeric_limits<float>::infinity()
                                                : (std::string(op) == "ReduceProd" ? 1.0f : 0.0f);
    EXPECT_EQ(got, (std::vector<float>{want, want})) << op;
  }
}

TEST(ReduceLowering, ArgMaxSelectLastIndexFromOpset12) {
  Tensor data = float_tensor({1, 4}, {3, 7, 7, 1});
  for (int64_t opset : {11, 12}) {
    GraphBuilder b(opset);
    Value* x = b.input("x", DType::kFloat32, {1, 4});
    b.output(b.op("ArgMax", {x}, {{"axis", int64_t{1}}, {"select_last_index", int64_t{1}}}));
    Tensor got = run(b, {{"x", data}});
    EXPECT_EQ(got.values<int64_t>()[0], opset == 11 ? 1 : 2) << opset;
  }
}

TEST(NormLowering, LayerNormStatisticsWithSymbolicBatch) {
  Expr batch = Expr::symbol("batch");
  GraphBuilder b(17);
  Value* x = b.input("x", DType::kFloat32, {batch, 4});
  Value* scale = b.input("scale", DType::kFloat32, {4});
  std::vector<Value*> outs = b.node("LayerNormalization", {x, scale}, {{"epsilon", 0.0f}}, 3);
  for (Value* v : outs) b.output(v);
  ir::Program program = lower_graph(b.graph);
  auto got = ir::interpret(program, {{"x", float_tensor({2, 4}, {1, 2, 3, 4, 2, 2, 2, 6})},
                                     {"scale", float_tensor({4}, {1, 1, 1, 2})}});
  std::vector<float> y = floats(got.at(outs[0]->name()));
  float inv0 = 1.0f / std::sqrt(1.25f);
  EXPECT_NEAR(y[0], -1.5f * inv0, 1e-5);
  EXPECT_NEAR(y[3], 2 * 1.5f * inv0, 1e-5);
  EXPECT_EQ(floats(got.at(outs[1]->name())), (std::vector<float>{2.5f, 3.0f}));
  EXPECT_EQ(got.at(outs[2]->name()).dims(), (std::vector<int64_t>{2, 1}));
  EXPECT_NEAR(floats(got.at(outs[2]->name()))[1], 1.0f / std::sqrt(3.0f), 1e-6);
}

void expect_user_error(const GraphBuilder& b, const std::string& needle) {
  try {
    lower_graph(b.graph);
    ADD_FAILURE() << "expected a UserError containing '" << needle << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LoweringErrors, NameTheNodeAndTheProblem) {
  // Training mode is supported from opset 14; the older statistics outputs are refused.
  GraphBuilder bn(9);
  Value* x = bn.input("x", DType::kFloat32, {1, 2});
  Value* p = bn.input("p", DType::kFloat32, {2});
  std::vector<Value*> bn_outs = bn.node("BatchNormalization", {x, p, p, p, p}, {}, 3);
  bn.output(bn_outs[0]);
  bn.output(bn_outs[1]);
  expect_user_error(bn, "(BatchNormalization): the running-statistics outputs of opset 9");
  GraphBuilder mod(13);
  Value* f = mod.input("f", DType::kFloat32, {2});
  mod.output(mod.op("Mod", {f, f}));
  expect_user_error(mod, "(Mod): fmod must be 1");
  GraphBuilder cast(13);
  Value* c = cast.input("c", DType::kFloat32, {2});
  cast.output(cast.op("Cast", {c}, {{"to", int64_t{8}}}));
  expect_user_error(cast, "casts to string are not supported");
  GraphBuilder logic(13);
  Value* i = logic.input("i", DType::kInt32, {2});
  logic.output(logic.op("And", {i, i}));
  expect_user_error(logic, "input A has dtype int32, which this op does not accept");
}

}  // namespace
}  // namespace kiln::lower
