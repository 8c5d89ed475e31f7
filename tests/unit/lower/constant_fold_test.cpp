// Tests of constant folding during lowering (src/lower/constant_fold.cpp): values and buffers
// computed only from initializers become constant buffers holding the right values (checked
// against C++ computations, with the dtype's arithmetic), the computed buffers that fed them are
// pruned, values that depend on an input are left alone, and work over the budget stays a
// run-time computation.

#include "lower/constant_fold.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "ir/interpreter.h"
#include "lower/lowering.h"

namespace kiln::lower {
namespace {

using graph::DType;
using graph::Tensor;
using graph::Type;
using graph::Value;

/// Builds small ai.onnx graphs node by node.
class GraphBuilder {
 public:
  explicit GraphBuilder(int64_t opset = 13) : opset_(opset) {}

  Value* input(const std::string& name, DType dtype, graph::Shape shape) {
    Value* v = graph.add_value(name, Type::tensor(dtype, std::move(shape)));
    graph.add_input(v);
    return v;
  }
  Value* initializer(Tensor t) {
    Value* v = graph.add_value(fresh("w"), Type::tensor(t.dtype(), std::nullopt));
    graph.set_initializer(v, std::make_shared<const Tensor>(std::move(t)));
    return v;
  }
  Value* op(const std::string& op, std::vector<Value*> inputs,
            std::map<std::string, graph::AttributeValue> attrs = {}) {
    Value* out = graph.add_value(fresh("v"), Type());
    graph.add_node(fresh(op), op, "", opset_, std::move(inputs), {out}, std::move(attrs));
    return out;
  }
  void output(Value* v) { graph.add_output(v); }

  graph::Graph graph{"main"};

 private:
  std::string fresh(const std::string& prefix) { return prefix + std::to_string(next_++); }
  int64_t opset_;
  int next_ = 0;
};

template <typename T>
Tensor tensor(DType dtype, std::vector<int64_t> dims, const std::vector<T>& values) {
  Tensor t(dtype, std::move(dims));
  std::copy(values.begin(), values.end(), t.mutable_values<T>().begin());
  return t;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  auto s = t.values<T>();
  return {s.begin(), s.end()};
}

/// The buffers that run at run time (computed or extern).
std::vector<const ir::Buffer*> run_time_buffers(const ir::Program& program) {
  std::vector<const ir::Buffer*> out;
  for (const auto& b : program.buffers) {
    if (b->kind == ir::BufferKind::kComputed || b->kind == ir::BufferKind::kExtern) {
      out.push_back(b.get());
    }
  }
  return out;
}

/// The one constant buffer `reader` reads (fails the test when there is not exactly one).
const ir::Buffer* constant_read_by(const ir::Program& program, const ir::Buffer& reader) {
  const ir::Buffer* found = nullptr;
  for (const std::string& name : reader.reads()) {
    const ir::Buffer* b = program.find(name);
    if (b == nullptr || b->kind != ir::BufferKind::kConstant) continue;
    EXPECT_EQ(found, nullptr) << "several constants read by " << reader.name;
    found = b;
  }
  EXPECT_NE(found, nullptr) << "no constant read by " << reader.name;
  return found;
}

/// The constant read by the program's one run-time buffer, which must be a computed kernel;
/// nullptr (the test failed) when there is not exactly one.
const ir::Buffer* constant_of_the_kernel(const ir::Program& program) {
  std::vector<const ir::Buffer*> run = run_time_buffers(program);
  EXPECT_EQ(run.size(), 1u) << program.str();
  if (run.size() != 1) return nullptr;
  EXPECT_EQ(run[0]->kind, ir::BufferKind::kComputed) << program.str();
  return constant_read_by(program, *run[0]);
}

TEST(ConstantFold, TransposedScaledWeightOfMatMulBecomesOneConstant) {
  // y = x @ (W^T * 2): W [3, 4], so B is [4, 3].
  std::vector<float> w(12);
  for (size_t k = 0; k < w.size(); ++k) w[k] = 0.25f * static_cast<float>(k) - 1.0f;
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {2, 4});
  Value* two = b.initializer(tensor<float>(DType::kFloat32, {}, {2.0f}));
  Value* scaled =
      b.op("Mul", {b.op("Transpose", {b.initializer(tensor(DType::kFloat32, {3, 4}, w))}), two});
  b.output(b.op("MatMul", {x, scaled}));
  ir::Program program = lower_graph(b.graph);

  std::vector<const ir::Buffer*> run = run_time_buffers(program);
  ASSERT_EQ(run.size(), 1u) << program.str();
  ASSERT_EQ(run[0]->kind, ir::BufferKind::kExtern);
  ASSERT_TRUE(run[0]->call.inputs.at(1).has_value());
  const ir::Buffer* weight = program.find(run[0]->call.inputs[1]->buffer);
  ASSERT_NE(weight, nullptr);
  ASSERT_EQ(weight->kind, ir::BufferKind::kConstant) << program.str();
  // The GEMM template reads the folded weight packed into its panels (the values are checked by
  // running the program below).
  EXPECT_NE(run[0]->call.as<ir::GemmCall>(), nullptr);
  EXPECT_GE(weight->constant->numel(), 12);
  // Only x, the folded weight and the output remain.
  EXPECT_EQ(program.buffers.size(), 3u) << program.str();

  std::vector<float> xs = {1, 0, 2, -1, 0.5f, 3, -2, 1};
  Tensor y = ir::interpret(program, {{"x", tensor(DType::kFloat32, {2, 4}, xs)}})
                 .at(b.graph.outputs()[0]->name());
  for (size_t r = 0; r < 2; ++r) {
    for (size_t c = 0; c < 3; ++c) {
      float sum = 0;
      for (size_t k = 0; k < 4; ++k) sum += xs[r * 4 + k] * 2.0f * w[c * 4 + k];
      EXPECT_FLOAT_EQ(y.values<float>()[r * 3 + c], sum) << r << "," << c;
    }
  }
}

TEST(ConstantFold, ReduceSumOfInitializerFoldsAndItsKernelIsPruned) {
  std::vector<float> w(20);
  for (size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>(k % 7) - 2.5f;
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {4});
  Value* axes = b.initializer(tensor<int64_t>(DType::kInt64, {1}, {1}));
  Value* sums = b.op("ReduceSum", {b.initializer(tensor(DType::kFloat32, {4, 5}, w)), axes},
                     {{"keepdims", int64_t{0}}});
  b.output(b.op("Add", {x, sums}));
  ir::Program program = lower_graph(b.graph);

  std::vector<const ir::Buffer*> run = run_time_buffers(program);
  ASSERT_EQ(run.size(), 1u) << program.str();
  EXPECT_FALSE(run[0]->is_reduction());
  const ir::Buffer* folded = constant_read_by(program, *run[0]);
  ASSERT_NE(folded, nullptr);
  std::vector<float> want(4, 0.0f);
  for (size_t r = 0; r < 4; ++r) {
    for (size_t c = 0; c < 5; ++c) want[r] += w[r * 5 + c];
  }
  EXPECT_EQ(values_of<float>(*folded->constant), want);
  // The [4, 5] initializer is no longer read by anything.
  EXPECT_EQ(program.buffers.size(), 3u) << program.str();
}

TEST(ConstantFold, ValueDependingOnAnInputIsNotFolded) {
  std::vector<float> w(16, 1.5f);
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {16});
  Value* weight = b.initializer(tensor(DType::kFloat32, {16}, w));
  Value* sum = b.op("ReduceSum", {b.op("Mul", {x, weight})}, {{"keepdims", int64_t{0}}});
  b.output(b.op("Exp", {sum}));
  ir::Program program = lower_graph(b.graph);
  std::vector<const ir::Buffer*> run = run_time_buffers(program);
  ASSERT_EQ(run.size(), 2u) << program.str();
  EXPECT_TRUE(run[0]->is_reduction());
  EXPECT_EQ(run[0]->reads(), (std::vector<std::string>{program.inputs[0].buffer,
                                                       constant_read_by(program, *run[0])->name}));
}

TEST(ConstantFold, Int32ArithmeticWraps) {
  // More elements than lowering's own known-value folding handles, so folding does the work.
  constexpr int64_t kN = 5000;
  std::vector<int32_t> w(kN);
  for (int64_t k = 0; k < kN; ++k) w[k] = 70000 + static_cast<int32_t>(k) * 977;
  GraphBuilder b;
  Value* x = b.input("x", DType::kInt32, {kN});
  Value* weight = b.initializer(tensor(DType::kInt32, {kN}, w));
  b.output(b.op("Add", {x, b.op("Mul", {weight, weight})}));
  ir::Program program = lower_graph(b.graph);

  const ir::Buffer* folded = constant_of_the_kernel(program);
  ASSERT_NE(folded, nullptr);
  ASSERT_EQ(folded->dtype, DType::kInt32);
  std::vector<int32_t> want(kN);
  for (int64_t k = 0; k < kN; ++k) {
    uint32_t u = static_cast<uint32_t>(w[k]);
    want[k] = static_cast<int32_t>(u * u);
  }
  EXPECT_EQ(values_of<int32_t>(*folded->constant), want);
}

TEST(ConstantFold, Float16ResultsAreRoundedToFloat16) {
  // 1 + k/1024 is exact in float16; times 3 needs rounding (spacing 2/1024 above 2).
  constexpr int64_t kN = 64;
  std::vector<uint16_t> w(kN);
  for (int64_t k = 0; k < kN; ++k)
    w[k] = graph::float_to_half(1.0f + static_cast<float>(k) / 1024.0f);
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat16, {kN});
  Value* three = b.initializer(tensor<uint16_t>(DType::kFloat16, {}, {graph::float_to_half(3)}));
  Value* weight = b.initializer(tensor(DType::kFloat16, {kN}, w));
  b.output(b.op("Add", {x, b.op("Mul", {weight, three})}));
  ir::Program program = lower_graph(b.graph);

  const ir::Buffer* folded = constant_of_the_kernel(program);
  ASSERT_NE(folded, nullptr);
  ASSERT_EQ(folded->dtype, DType::kFloat16);
  std::vector<uint16_t> want(kN);
  for (int64_t k = 0; k < kN; ++k) want[k] = graph::float_to_half(graph::half_to_float(w[k]) * 3);
  EXPECT_EQ(values_of<uint16_t>(*folded->constant), want);
}

TEST(ConstantFold, MatMulOfInitializersFoldsWithinBudget) {
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {2, 2});
  Value* a = b.initializer(tensor<float>(DType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6}));
  Value* c = b.initializer(tensor<float>(DType::kFloat32, {3, 2}, {1, 0, 0, 1, 1, 1}));
  b.output(b.op("Add", {x, b.op("MatMul", {a, c})}));
  ir::Program program = lower_graph(b.graph);
  const ir::Buffer* folded = constant_of_the_kernel(program);
  ASSERT_NE(folded, nullptr);
  EXPECT_EQ(values_of<float>(*folded->constant), (std::vector<float>{4, 5, 10, 11}));
}

TEST(ConstantFold, WorkOverTheBudgetStaysAtRunTime) {
  // 400^3 multiply-adds exceed kMaxFoldWork: the product is computed by the generated code.
  constexpr int64_t kN = 400;
  static_assert(kN * kN * kN > kMaxFoldWork);
  std::vector<float> ones(kN * kN, 1.0f);
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {kN, kN});
  Value* a = b.initializer(tensor(DType::kFloat32, {kN, kN}, ones));
  Value* c = b.initializer(tensor(DType::kFloat32, {kN, kN}, ones));
  b.output(b.op("Add", {x, b.op("MatMul", {a, c})}));
  ir::Program program = lower_graph(b.graph);
  std::vector<const ir::Buffer*> run = run_time_buffers(program);
  ASSERT_EQ(run.size(), 2u) << program.str();
  EXPECT_EQ(run[0]->kind, ir::BufferKind::kExtern);
}

TEST(ConstantFold, ViewOfAnInitializerStaysAView) {
  // Rows 1-3 of a constant keep its element order along the last dim: the kernel reads the
  // constant as it is, at no cost, and folding the slice would only copy it.
  std::vector<float> w(6 * 20, 1.0f);
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {3, 20});
  Value* weight = b.initializer(tensor(DType::kFloat32, {6, 20}, w));
  Value* starts = b.initializer(tensor<int64_t>(DType::kInt64, {1}, {1}));
  Value* ends = b.initializer(tensor<int64_t>(DType::kInt64, {1}, {4}));
  b.output(b.op("Add", {x, b.op("Slice", {weight, starts, ends})}));
  ir::Program program = lower_graph(b.graph);
  const ir::Buffer* source = constant_of_the_kernel(program);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->constant->dims(), (std::vector<int64_t>{6, 20}));
}

TEST(ConstantFold, SmallTransposedInitializerIsFolded) {
  // A transpose of a small constant is folded into a constant of its own layout: read through
  // the transpose, its readers would load it with a stride along their vector loop and stay
  // scalar (Swin's relative position bias before each Softmax).
  std::vector<float> w(12);
  for (size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>(k);
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {4, 3});
  Value* weight = b.initializer(tensor(DType::kFloat32, {3, 4}, w));
  b.output(b.op("Add", {x, b.op("Transpose", {weight})}));
  ir::Program program = lower_graph(b.graph);
  const ir::Buffer* source = constant_of_the_kernel(program);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->constant->dims(), (std::vector<int64_t>{4, 3}));
  std::vector<float> xs(12, 0.5f);
  Tensor y = ir::interpret(program, {{"x", tensor(DType::kFloat32, {4, 3}, xs)}})
                 .at(b.graph.outputs()[0]->name());
  for (size_t r = 0; r < 4; ++r) {
    for (size_t c = 0; c < 3; ++c) EXPECT_EQ(y.values<float>()[r * 3 + c], w[c * 4 + r] + 0.5f);
  }
}

TEST(ConstantFold, LargeTransposedInitializerStaysAView) {
  // Above 256 KiB a transposed constant is read through the transpose: folding would copy it.
  GraphBuilder b;
  Value* x = b.input("x", DType::kFloat32, {256, 300});
  Value* weight = b.initializer(tensor(DType::kFloat32, {300, 256}, std::vector<float>(76800)));
  b.output(b.op("Add", {x, b.op("Transpose", {weight})}));
  ir::Program program = lower_graph(b.graph);
  const ir::Buffer* source = constant_of_the_kernel(program);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->constant->dims(), (std::vector<int64_t>{300, 256}));
}

TEST(ConstantFold, ConstantOnlyBufferOfTheProgramBecomesAConstant) {
  // A computed buffer reading only a constant (as an op lowering may materialize one) is folded
  // in place, keeping its name.
  ir::Program program;
  auto constant = std::make_unique<ir::Buffer>();
  constant->name = "const0";
  constant->kind = ir::BufferKind::kConstant;
  constant->layout = ir::Layout::contiguous({3});
  constant->constant =
      std::make_shared<const Tensor>(tensor<float>(DType::kFloat32, {3}, {1, 2, 3}));
  auto computed = std::make_unique<ir::Buffer>();
  computed->name = "buf0";
  computed->layout = ir::Layout::contiguous({3});
  computed->body = ir::LoopBody({3}, {});
  ir::LoopBody& body = computed->body;
  ir::ValueId v = body.load("const0", DType::kFloat32, body.vars()[0]);
  body.store("buf0", DType::kFloat32, body.vars()[0],
             body.binary(ir::OpCode::kMul, v, body.constant(10, DType::kFloat32)));
  auto output = std::make_unique<ir::Buffer>();
  output->name = "buf1";
  output->layout = ir::Layout::contiguous({3});
  output->body = ir::LoopBody({3}, {});
  ir::LoopBody& out = output->body;
  out.store("buf1", DType::kFloat32, out.vars()[0],
            out.unary(ir::OpCode::kNeg, out.load("buf0", DType::kFloat32, out.vars()[0])));
  program.buffers.push_back(std::move(constant));
  program.buffers.push_back(std::move(computed));
  program.buffers.push_back(std::move(output));
  program.outputs.push_back({"y", "buf1", DType::kFloat32, {3}});

  finish_constant_folding(program);
  const ir::Buffer* folded = program.find("buf0");
  ASSERT_NE(folded, nullptr);
  ASSERT_EQ(folded->kind, ir::BufferKind::kConstant);
  EXPECT_EQ(values_of<float>(*folded->constant), (std::vector<float>{10, 20, 30}));
  EXPECT_EQ(program.find("buf1")->kind, ir::BufferKind::kComputed);  // an output stays
  EXPECT_EQ(values_of<float>(ir::interpret(program, {}).at("y")),
            (std::vector<float>{-10, -20, -30}));
}

}  // namespace
}  // namespace kiln::lower
