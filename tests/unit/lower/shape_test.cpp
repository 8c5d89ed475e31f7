// Tests of the shape, index and nn lowerings (src/lower/shape.cpp, slice_concat.cpp, index.cpp,
// nn.cpp, pool.cpp): `known` propagation through the Shape -> Gather -> Unsqueeze -> Concat ->
// Reshape chains of exported models, views without copies, and values checked with the reference
// interpreter on graphs built in C++.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
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

const Expr kBatch = Expr::symbol("batch");

/// Builds small ai.onnx graphs node by node.
class GraphBuilder {
 public:
  explicit GraphBuilder(int64_t opset = 13) : opset_(opset) {}

  Value* input(const std::string& name, DType dtype, graph::Shape shape) {
    Value* v = graph.add_value(name, Type::tensor(dtype, std::move(shape)));
    graph.add_input(v);
    return v;
  }
  Value* ints(std::vector<int64_t> values, std::vector<int64_t> dims) {
    auto t = std::make_shared<Tensor>(DType::kInt64, std::move(dims));
    std::copy(values.begin(), values.end(), t->mutable_values<int64_t>().begin());
    Value* v = graph.add_value(fresh("c"), Type::tensor(DType::kInt64, std::nullopt));
    graph.set_initializer(v, std::move(t));
    return v;
  }
  Value* ints(std::vector<int64_t> values) {
    int64_t n = static_cast<int64_t>(values.size());
    return ints(std::move(values), {n});
  }
  std::vector<Value*> node(const std::string& op, std::vector<Value*> inputs,
                           std::map<std::string, graph::AttributeValue> attrs = {},
                           int outputs = 1) {
    std::vector<Value*> outs;
    for (int k = 0; k < outputs; ++k) outs.push_back(graph.add_value(fresh("v"), Type()));
    graph.add_node(fresh(op), op, "", opset_, std::move(inputs), outs, std::move(attrs));
    return outs;
  }
  Value* op(const std::string& op, std::vector<Value*> inputs,
            std::map<std::string, graph::AttributeValue> attrs = {}) {
    return node(op, std::move(inputs), std::move(attrs))[0];
  }
  void output(Value* v) { graph.add_output(v); }

  graph::Graph graph{"main"};

 private:
  std::string fresh(const std::string& prefix) { return prefix + std::to_string(next_++); }
  int64_t opset_;
  int next_ = 0;
};

Tensor iota_tensor(DType dtype, std::vector<int64_t> dims) {
  Tensor t(dtype, std::move(dims));
  for (int64_t k = 0; k < t.numel(); ++k) {
    if (dtype == DType::kFloat32) t.mutable_values<float>()[k] = static_cast<float>(k);
    if (dtype == DType::kInt64) t.mutable_values<int64_t>()[k] = k;
  }
  return t;
}

std::vector<float> floats(const Tensor& t) {
  auto s = t.values<float>();
  return {s.begin(), s.end()};
}

std::vector<float> float_iota(int n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

/// The Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain of a dynamic-batch export.
TEST(ShapeLowering, DynamicBatchReshapeChainResolvesToSymbolicShape) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {kBatch, 3, 4});
  Value* shape = b.op("Shape", {x});
  Value* batch = b.op("Gather", {shape, b.ints({0}, {})}, {{"axis", int64_t{0}}});
  Value* batch1 = b.op("Unsqueeze", {batch, b.ints({0})});
  Value* target = b.op("Concat", {batch1, b.ints({-1})}, {{"axis", int64_t{0}}});
  b.output(b.op("Reshape", {x, target}));
  ir::Program program = lower_graph(b.graph);
  ASSERT_EQ(program.outputs.size(), 1u);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{kBatch, 12}));
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {2, 3, 4})}});
  EXPECT_EQ(out.at(program.outputs[0].onnx_name).dims(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(floats(out.at(program.outputs[0].onnx_name)), float_iota(24));
}

TEST(ShapeLowering, ShapeSliceConcatKnownValues) {
  GraphBuilder b(15);
  Value* x = b.input("x", DType::kFloat32, {kBatch, 3, 4});
  Value* tail = b.op("Shape", {x}, {{"start", int64_t{1}}});
  Value* head = b.op("Slice", {b.op("Shape", {x}), b.ints({0}), b.ints({1})});
  Value* swapped = b.op("Concat", {tail, head}, {{"axis", int64_t{0}}});
  Value* y = b.op("Reshape", {x, swapped});
  b.output(y);
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{3, 4, kBatch}));
}

TEST(ShapeLowering, ReshapeInfersSymbolicDimAndCopiesZero) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {kBatch, 12});
  b.output(b.op("Reshape", {x, b.ints({0, 3, -1})}));
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{kBatch, 3, 4}));
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {3, 12})}});
  EXPECT_EQ(floats(out.begin()->second), float_iota(36));
}

TEST(ShapeLowering, ReshapeInfersDimAcrossBatch) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {kBatch, 2, 6});
  b.output(b.op("Reshape", {x, b.ints({-1, 4})}));
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{kBatch * 3, 4}));
}

TEST(ShapeLowering, ReshapeWithRuntimeShapeBindsSizeSymbols) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {2, 6});
  Value* s = b.input("s", DType::kInt64, {2});
  b.output(b.op("Reshape", {x, s}));
  ir::Program program = lower_graph(b.graph);
  // A library call resolves the shape at run time; its two elements become size symbols.
  ASSERT_EQ(program.dynamic_sizes.size(), 2u);
  const ir::Buffer* dims = program.find(program.dynamic_sizes[0].buffer);
  ASSERT_NE(dims, nullptr);
  EXPECT_NE(dims->call.as<ir::ReshapeDimsCall>(), nullptr);
  EXPECT_EQ(program.outputs[0].shape,
            (std::vector<Expr>{Expr::symbol(program.dynamic_sizes[0].symbol),
                               Expr::symbol(program.dynamic_sizes[1].symbol)}));
}

TEST(ShapeLowering, ReshapeWithRuntimeShapeOfUnknownLengthFailsNamingTheNode) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {2, 6});
  Value* s = b.input("s", DType::kInt64, {Expr::symbol("n")});
  b.output(b.op("Reshape", {x, s}));
  try {
    lower_graph(b.graph);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("(Reshape)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("static size"), std::string::npos) << e.what();
  }
}

TEST(ShapeLowering, TransposeThenFlattenIsAViewAndComputesRightValues) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {2, 3});
  Value* t = b.op("Transpose", {x});
  b.output(b.op("Flatten", {t}, {{"axis", int64_t{1}}}));
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{3, 2}));
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {2, 3})}});
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(ShapeLowering, SliceNegativeStepAndSentinels) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {2, 5});
  int64_t big = std::numeric_limits<int64_t>::max();
  int64_t small = std::numeric_limits<int64_t>::min();
  b.output(
      b.op("Slice", {x, b.ints({big, 0}), b.ints({small, big}), b.ints({1, 0}), b.ints({-2, 1})}));
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{2, 3}));
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {2, 5})}});
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{4, 2, 0, 9, 7, 5}));
}

TEST(ShapeLowering, SliceOfSymbolicDimClampsSymbolically) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {kBatch, 4});
  b.output(b.op("Slice", {x, b.ints({0}), b.ints({-1}), b.ints({0})}));
  ir::Program program = lower_graph(b.graph);
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {3, 4})}});
  EXPECT_EQ(out.begin()->second.dims(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(floats(out.begin()->second), float_iota(8));
}

TEST(ShapeLowering, ConcatOfComputedAndLoadedInputs) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {2, 2});
  Value* y = b.input("y", DType::kFloat32, {2, 1});
  Value* t = b.op("Transpose", {x});
  b.output(b.op("Concat", {t, y, t}, {{"axis", int64_t{1}}}));
  ir::Program program = lower_graph(b.graph);
  Tensor yv(DType::kFloat32, {2, 1});
  yv.mutable_values<float>()[0] = 10;
  yv.mutable_values<float>()[1] = 11;
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {2, 2})}, {"y", yv}});
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{0, 2, 10, 0, 2, 1, 3, 11, 1, 3}));
}

TEST(ShapeLowering, SplitUnsqueezeSqueezeExpand) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {4, 3});
  auto parts = b.node("Split", {x, b.ints({1, 3})}, {{"axis", int64_t{0}}}, 2);
  Value* sq = b.op("Squeeze", {parts[0], b.ints({0})});  // [3]
  Value* ex = b.op("Expand", {sq, b.ints({2, 1})});      // [2, 3]
  b.output(ex);
  b.output(parts[1]);
  ir::Program program = lower_graph(b.graph);
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {4, 3})}});
  EXPECT_EQ(floats(out.at(ex->name())), (std::vector<float>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(floats(out.at(parts[1]->name())), (std::vector<float>{3, 4, 5, 6, 7, 8, 9, 10, 11}));
}

TEST(IndexLowering, GatherWithRuntimeIndicesRegistersOneCheck) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {3, 2});
  Value* idx = b.input("idx", DType::kInt64, {2});
  b.output(b.op("Gather", {x, idx}, {{"axis", int64_t{0}}}));
  ir::Program program = lower_graph(b.graph);
  ASSERT_EQ(program.index_checks.size(), 1u);
  EXPECT_EQ(program.index_checks[0].size, Expr(3));
  Tensor iv(DType::kInt64, {2});
  iv.mutable_values<int64_t>()[0] = -1;
  iv.mutable_values<int64_t>()[1] = 0;
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {3, 2})}, {"idx", iv}});
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{4, 5, 0, 1}));
}

TEST(IndexLowering, GatherWithConstantIndicesOutOfRangeFails) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {3, 2});
  b.output(b.op("Gather", {x, b.ints({3})}, {{"axis", int64_t{0}}}));
  EXPECT_THROW(lower_graph(b.graph), UserError);
}

TEST(IndexLowering, RangeOverKnownSizeAndTile) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {kBatch, 2});
  Value* n = b.op("Gather", {b.op("Shape", {x}), b.ints({0}, {})}, {{"axis", int64_t{0}}});
  Value* r = b.op("Range", {b.ints({0}, {}), n, b.ints({1}, {})});
  Value* t = b.op("Tile", {x, b.ints({1, 2})});
  b.output(r);
  b.output(t);
  ir::Program program = lower_graph(b.graph);
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {3, 2})}});
  auto rv = out.at(r->name()).values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(rv.begin(), rv.end()), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(floats(out.at(t->name())), (std::vector<float>{0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5}));
}

TEST(NnLowering, MatMulVectorTimesBatchedMatrixUsesStrideZeroBroadcast) {
  GraphBuilder b;
  Value* a = b.input("a", DType::kFloat32, {3});
  Value* m = b.input("m", DType::kFloat32, {2, 3, 2});
  b.output(b.op("MatMul", {a, m}));
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{2, 2}));
  const ir::Buffer* call = nullptr;
  for (const auto& buf : program.buffers) {
    if (buf->kind == ir::BufferKind::kExtern) call = buf.get();
  }
  ASSERT_NE(call, nullptr);
  EXPECT_NE(call->call.as<ir::MatMulCall>(), nullptr);
  EXPECT_EQ(call->call.inputs[0]->layout.sizes, (std::vector<Expr>{2, 1, 3}));
  EXPECT_EQ(call->call.inputs[0]->layout.strides[0], Expr(0));
  auto out = ir::interpret(program, {{"a", iota_tensor(DType::kFloat32, {3})},
                                     {"m", iota_tensor(DType::kFloat32, {2, 3, 2})}});
  // [0 1 2] @ [[0 1] [2 3] [4 5]] = [10 13]; @ [[6 7] [8 9] [10 11]] = [28 31]
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{10, 13, 28, 31}));
}

TEST(NnLowering, IntegerMatMulIsALoopReduction) {
  GraphBuilder b;
  Value* a = b.input("a", DType::kInt64, {2, 3});
  Value* c = b.input("c", DType::kInt64, {3, 2});
  b.output(b.op("MatMul", {a, c}));
  ir::Program program = lower_graph(b.graph);
  auto out = ir::interpret(program, {{"a", iota_tensor(DType::kInt64, {2, 3})},
                                     {"c", iota_tensor(DType::kInt64, {3, 2})}});
  auto v = out.begin()->second.values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(v.begin(), v.end()), (std::vector<int64_t>{10, 13, 28, 40}));
}

TEST(NnLowering, MaxPoolWithPaddingAndIndices) {
  GraphBuilder b(12);
  Value* x = b.input("x", DType::kFloat32, {1, 1, 2, 3});
  auto outs = b.node(
      "MaxPool", {x},
      {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 0, 0}}},
      2);
  b.output(outs[0]);
  b.output(outs[1]);
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{1, 1, 2, 3}));
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {1, 1, 2, 3})}});
  EXPECT_EQ(floats(out.at(outs[0]->name())), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  auto idx = out.at(outs[1]->name()).values<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(idx.begin(), idx.end()), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(NnLowering, AveragePoolExcludesPaddingFromTheCount) {
  GraphBuilder b(11);
  Value* x = b.input("x", DType::kFloat32, {1, 1, 1, 3});
  b.output(b.op(
      "AveragePool", {x},
      {{"kernel_shape", std::vector<int64_t>{1, 3}}, {"pads", std::vector<int64_t>{0, 1, 0, 1}}}));
  ir::Program program = lower_graph(b.graph);
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {1, 1, 1, 3})}});
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{0.5f, 1, 1.5f}));
}

TEST(ShapeLowering, SliceReversesASymbolicDim) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {kBatch, 2});
  int64_t small = std::numeric_limits<int64_t>::min();
  b.output(b.op("Slice", {x, b.ints({-1}), b.ints({small}), b.ints({0}), b.ints({-1})}));
  ir::Program program = lower_graph(b.graph);
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {3, 2})}});
  EXPECT_EQ(out.begin()->second.dims(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{4, 5, 2, 3, 0, 1}));
}

TEST(ShapeLowering, SliceFromOffsetOfSymbolicDim) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {kBatch, 2});
  b.output(b.op("Slice", {x, b.ints({1}), b.ints({std::numeric_limits<int64_t>::max()}),
                          b.ints({0}), b.ints({2})}));
  ir::Program program = lower_graph(b.graph);
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {4, 2})}});
  EXPECT_EQ(out.begin()->second.dims(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{2, 3, 6, 7}));
}

TEST(NnLowering, ConvSamePaddingOverSymbolicSizes) {
  GraphBuilder b;
  Expr h = Expr::symbol("h");
  Value* x = b.input("x", DType::kFloat32, {1, 1, h, 3});
  Value* w = b.input("w", DType::kFloat32, {1, 1, 3, 3});
  b.output(b.op("Conv", {x, w}, {{"auto_pad", std::string("SAME_UPPER")}}));
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{1, 1, h, 3}));
  Tensor ones(DType::kFloat32, {1, 1, 3, 3});
  for (float& v : ones.mutable_values<float>()) v = 1;
  auto out = ir::interpret(program, {{"x", ones}, {"w", ones}});
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{4, 6, 4, 6, 9, 6, 4, 6, 4}));
}

TEST(NnLowering, ConvSamePaddingWithStrideOverSymbolicSizeFails) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {1, 1, Expr::symbol("h"), 3});
  Value* w = b.input("w", DType::kFloat32, {1, 1, 3, 3});
  b.output(
      b.op("Conv", {x, w},
           {{"auto_pad", std::string("SAME_UPPER")}, {"strides", std::vector<int64_t>{2, 2}}}));
  EXPECT_THROW(lower_graph(b.graph), UserError);
}

TEST(NnLowering, GemmTransposedOperandsAreStridedViews) {
  GraphBuilder b;
  Value* a = b.input("a", DType::kFloat32, {3, 2});
  Value* c = b.input("c", DType::kFloat32, {2, 3});
  b.output(b.op("Gemm", {a, c}, {{"transA", int64_t{1}}, {"transB", int64_t{1}}}));
  ir::Program program = lower_graph(b.graph);
  int copies = 0;
  for (const auto& buf : program.buffers) copies += buf->kind == ir::BufferKind::kComputed;
  EXPECT_EQ(copies, 0);
  auto out = ir::interpret(program, {{"a", iota_tensor(DType::kFloat32, {3, 2})},
                                     {"c", iota_tensor(DType::kFloat32, {2, 3})}});
  // A^T = [[0 2 4] [1 3 5]], B^T = [[0 3] [1 4] [2 5]]
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{10, 28, 13, 40}));
}

TEST(NnLowering, MaxPoolCeilModeOverSymbolicSize) {
  GraphBuilder b(12);
  Value* x = b.input("x", DType::kFloat32, {1, 1, 1, Expr::symbol("w")});
  b.output(b.op("MaxPool", {x},
                {{"kernel_shape", std::vector<int64_t>{1, 2}},
                 {"strides", std::vector<int64_t>{1, 2}},
                 {"ceil_mode", int64_t{1}}}));
  ir::Program program = lower_graph(b.graph);
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {1, 1, 1, 5})}});
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{1, 3, 4}));
}

TEST(ShapeLowering, AttributeFormsOfOlderOpsets) {
  GraphBuilder b(9);
  Value* x = b.input("x", DType::kFloat32, {4, 3});
  Value* sliced = b.op("Slice", {x},
                       {{"starts", std::vector<int64_t>{1}},
                        {"ends", std::vector<int64_t>{-1}},
                        {"axes", std::vector<int64_t>{0}}});  // [2, 3]
  auto parts =
      b.node("Split", {sliced}, {{"axis", int64_t{1}}, {"split", std::vector<int64_t>{2, 1}}}, 2);
  Value* col = b.op("Squeeze", {parts[1]}, {{"axes", std::vector<int64_t>{1}}});  // [2]
  Value* row = b.op("Unsqueeze", {col}, {{"axes", std::vector<int64_t>{0}}});     // [1, 2]
  b.output(row);
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{1, 2}));
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {4, 3})}});
  EXPECT_EQ(floats(out.begin()->second), (std::vector<float>{5, 8}));
}

TEST(ShapeLowering, ConstantAttributeForms) {
  GraphBuilder b(13);
  Value* ints = b.op("Constant", {}, {{"value_ints", std::vector<int64_t>{2, -1}}});
  Value* x = b.input("x", DType::kFloat32, {kBatch, 4});
  b.output(b.op("Reshape", {x, ints}));
  b.output(b.op("Constant", {}, {{"value_floats", std::vector<float>{1.5f, 2.5f}}}));
  ir::Program program = lower_graph(b.graph);
  EXPECT_EQ(program.outputs[0].shape, (std::vector<Expr>{2, kBatch * 2}));
  auto out = ir::interpret(program, {{"x", iota_tensor(DType::kFloat32, {3, 4})}});
  EXPECT_EQ(floats(out.at(program.outputs[1].onnx_name)), (std::vector<float>{1.5f, 2.5f}));
}

}  // namespace
}  // namespace kiln::lower
