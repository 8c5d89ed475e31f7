// Tests of the reference interpreter (src/ir/interpreter.h) on Programs built by hand.

#include "ir/interpreter.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/interpreter_scalar.h"
#include "support/error.h"

namespace kiln::ir {
namespace {

using graph::DType;
using graph::Tensor;
using sym::Expr;

Expr i(int k) { return index_var(k); }
Expr r(int k) { return reduce_var(k); }

template <typename T>
Tensor make_tensor(DType dtype, std::vector<int64_t> dims, std::vector<T> values) {
  Tensor t(dtype, std::move(dims));
  auto span = t.mutable_values<T>();
  EXPECT_EQ(span.size(), values.size());
  for (size_t k = 0; k < values.size(); ++k) span[k] = values[k];
  return t;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  auto span = t.values<T>();
  return std::vector<T>(span.begin(), span.end());
}

/// Builds programs: contiguous input, computed and output buffers.
class ProgramBuilder {
 public:
  Buffer& input(const std::string& name, DType dtype, std::vector<Expr> shape) {
    Buffer& b = add(name, BufferKind::kInput, dtype, shape);
    program.inputs.push_back(InputSpec{name, name, dtype, shape});
    return b;
  }
  Buffer& constant(const std::string& name, Tensor tensor) {
    std::vector<Expr> shape(tensor.dims().begin(), tensor.dims().end());
    Buffer& b = add(name, BufferKind::kConstant, tensor.dtype(), shape);
    b.constant = std::make_shared<const Tensor>(std::move(tensor));
    return b;
  }
  Buffer& computed(const std::string& name, DType dtype, std::vector<Expr> shape,
                   std::vector<Expr> reduce_shape = {}) {
    Buffer& b = add(name, BufferKind::kComputed, dtype, shape);
    b.body = LoopBody(shape, std::move(reduce_shape));
    return b;
  }
  Buffer& external(const std::string& name, DType dtype, std::vector<Expr> shape) {
    return add(name, BufferKind::kExtern, dtype, shape);
  }
  void output(const Buffer& b) {
    program.outputs.push_back(OutputSpec{b.name, b.name, b.dtype, b.layout.sizes});
  }
  Program program;

 private:
  Buffer& add(const std::string& name, BufferKind kind, DType dtype, std::vector<Expr> shape) {
    auto b = std::make_unique<Buffer>();
    b->name = name;
    b->kind = kind;
    b->dtype = dtype;
    b->layout = Layout::contiguous(std::move(shape));
    program.buffers.push_back(std::move(b));
    return *program.buffers.back();
  }
};

/// out[i0] = op(a[i0]) or op(a[i0], b[i0]) on 1-D buffers of n elements.
Program unary_program(OpCode code, DType in, DType out, int64_t n) {
  ProgramBuilder pb;
  pb.input("a", in, {n});
  Buffer& c = pb.computed("c", out, {n});
  ValueId a = c.body.load("a", in, i(0));
  ValueId v = code == OpCode::kCast ? c.body.cast(a, out) : c.body.unary(code, a);
  c.body.store("c", out, i(0), v);
  pb.output(c);
  return std::move(pb.program);
}

Program binary_program(OpCode code, DType in, DType out, int64_t n) {
  ProgramBuilder pb;
  pb.input("a", in, {n});
  pb.input("b", in, {n});
  Buffer& c = pb.computed("c", out, {n});
  ValueId v = c.body.binary(code, c.body.load("a", in, i(0)), c.body.load("b", in, i(0)));
  c.body.store("c", out, i(0), v);
  pb.output(c);
  return std::move(pb.program);
}

TEST(InterpreterTest, PointwiseAddWithSymbolicSize) {
  Expr n = Expr::symbol("n");
  ProgramBuilder pb;
  pb.input("a", DType::kFloat32, {n});
  pb.input("b", DType::kFloat32, {n});
  Buffer& c = pb.computed("c", DType::kFloat32, {n});
  ValueId sum = c.body.binary(OpCode::kAdd, c.body.load("a", DType::kFloat32, i(0)),
                              c.body.load("b", DType::kFloat32, i(0)));
  c.body.store("c", DType::kFloat32, i(0), sum);
  pb.output(c);
  auto out = interpret(pb.program, {{"a", make_tensor<float>(DType::kFloat32, {3}, {1, 2, 3})},
                                    {"b", make_tensor<float>(DType::kFloat32, {3}, {.5, .25, 0})}});
  ASSERT_EQ(out.at("c").dims(), std::vector<int64_t>{3});
  EXPECT_EQ(values_of<float>(out.at("c")), (std::vector<float>{1.5f, 2.25f, 3.f}));
}

TEST(InterpreterTest, Float32ResultsAreRoundedToFloat) {
  Program p = binary_program(OpCode::kDiv, DType::kFloat32, DType::kFloat32, 1);
  auto out = interpret(p, {{"a", make_tensor<float>(DType::kFloat32, {1}, {1})},
                           {"b", make_tensor<float>(DType::kFloat32, {1}, {3})}});
  EXPECT_EQ(values_of<float>(out.at("c"))[0], 1.0f / 3.0f);
}

TEST(InterpreterTest, IntegerDivisionTruncatesAndModsFollowTheirSigns) {
  auto a = make_tensor<int32_t>(DType::kInt32, {4}, {7, -7, 7, -7});
  auto b = make_tensor<int32_t>(DType::kInt32, {4}, {2, 2, -2, -2});
  auto run = [&](OpCode code) {
    return values_of<int32_t>(
        interpret(binary_program(code, DType::kInt32, DType::kInt32, 4), {{"a", a}, {"b", b}})
            .at("c"));
  };
  EXPECT_EQ(run(OpCode::kDiv), (std::vector<int32_t>{3, -3, -3, 3}));
  EXPECT_EQ(run(OpCode::kFmod), (std::vector<int32_t>{1, -1, 1, -1}));
  EXPECT_EQ(run(OpCode::kFloorMod), (std::vector<int32_t>{1, 1, -1, -1}));
  auto zero = make_tensor<int32_t>(DType::kInt32, {4}, {1, 0, 1, 1});
  EXPECT_THROW(interpret(binary_program(OpCode::kDiv, DType::kInt32, DType::kInt32, 4),
                         {{"a", a}, {"b", zero}}),
               UserError);
}

TEST(InterpreterTest, IntegerArithmeticWrapsToItsWidth) {
  auto a = make_tensor<int8_t>(DType::kInt8, {2}, {100, -128});
  auto b = make_tensor<int8_t>(DType::kInt8, {2}, {100, -1});
  auto sum =
      interpret(binary_program(OpCode::kAdd, DType::kInt8, DType::kInt8, 2), {{"a", a}, {"b", b}});
  EXPECT_EQ(values_of<int8_t>(sum.at("c")), (std::vector<int8_t>{-56, 127}));
  auto quotient =
      interpret(binary_program(OpCode::kDiv, DType::kInt8, DType::kInt8, 2), {{"a", a}, {"b", b}});
  EXPECT_EQ(values_of<int8_t>(quotient.at("c")), (std::vector<int8_t>{1, -128}));
}

TEST(InterpreterTest, FloatFmodAndFloorMod) {
  auto a = make_tensor<float>(DType::kFloat32, {2}, {5.5f, -5.5f});
  auto b = make_tensor<float>(DType::kFloat32, {2}, {2.f, 2.f});
  auto fmod = interpret(binary_program(OpCode::kFmod, DType::kFloat32, DType::kFloat32, 2),
                        {{"a", a}, {"b", b}});
  EXPECT_EQ(values_of<float>(fmod.at("c")), (std::vector<float>{1.5f, -1.5f}));
  auto floor_mod = interpret(binary_program(OpCode::kFloorMod, DType::kFloat32, DType::kFloat32, 2),
                             {{"a", a}, {"b", b}});
  EXPECT_EQ(values_of<float>(floor_mod.at("c")), (std::vector<float>{1.5f, 0.5f}));
}

TEST(InterpreterTest, RoundIsHalfToEven) {
  auto a = make_tensor<float>(DType::kFloat32, {5}, {0.5f, 1.5f, 2.5f, -0.5f, -2.5f});
  auto out =
      interpret(unary_program(OpCode::kRound, DType::kFloat32, DType::kFloat32, 5), {{"a", a}});
  EXPECT_EQ(values_of<float>(out.at("c")), (std::vector<float>{0.f, 2.f, 2.f, -0.f, -2.f}));
}

TEST(InterpreterTest, CastsTruncateAndWrapLikeStaticCast) {
  auto a = make_tensor<float>(DType::kFloat32, {4}, {-1.7f, 2.9f, 300.f, 0.f});
  auto to_int8 =
      interpret(unary_program(OpCode::kCast, DType::kFloat32, DType::kInt8, 4), {{"a", a}});
  EXPECT_EQ(values_of<int8_t>(to_int8.at("c")), (std::vector<int8_t>{-1, 2, 44, 0}));
  auto to_bool =
      interpret(unary_program(OpCode::kCast, DType::kFloat32, DType::kBool, 4), {{"a", a}});
  EXPECT_EQ(values_of<uint8_t>(to_bool.at("c")), (std::vector<uint8_t>{1, 1, 1, 0}));
  auto big = make_tensor<int64_t>(DType::kInt64, {2}, {-1, 65537});
  auto to_u16 =
      interpret(unary_program(OpCode::kCast, DType::kInt64, DType::kUInt16, 2), {{"a", big}});
  EXPECT_EQ(values_of<uint16_t>(to_u16.at("c")), (std::vector<uint16_t>{65535, 1}));
}

TEST(InterpreterTest, Float16IsComputedInFloat32AndRoundedOnStore) {
  auto a = make_tensor<uint16_t>(DType::kFloat16, {2},
                                 {graph::float_to_half(1.0f), graph::float_to_half(2.0f)});
  auto out =
      interpret(unary_program(OpCode::kSqrt, DType::kFloat16, DType::kFloat16, 2), {{"a", a}});
  auto halves = values_of<uint16_t>(out.at("c"));
  EXPECT_EQ(graph::half_to_float(halves[0]), 1.0f);
  EXPECT_EQ(halves[1], graph::float_to_half(std::sqrt(2.0f)));
}

TEST(InterpreterTest, ComparisonsAndLogic) {
  auto a = make_tensor<float>(DType::kFloat32, {3}, {1, NAN, 3});
  auto b = make_tensor<float>(DType::kFloat32, {3}, {1, NAN, 2});
  auto eq = interpret(binary_program(OpCode::kEq, DType::kFloat32, DType::kBool, 3),
                      {{"a", a}, {"b", b}});
  EXPECT_EQ(values_of<uint8_t>(eq.at("c")), (std::vector<uint8_t>{1, 0, 0}));
  auto isnan =
      interpret(unary_program(OpCode::kIsNan, DType::kFloat32, DType::kBool, 3), {{"a", a}});
  EXPECT_EQ(values_of<uint8_t>(isnan.at("c")), (std::vector<uint8_t>{0, 1, 0}));
  auto x = make_tensor<uint8_t>(DType::kBool, {2}, {1, 0});
  auto y = make_tensor<uint8_t>(DType::kBool, {2}, {1, 1});
  auto xor_out =
      interpret(binary_program(OpCode::kXor, DType::kBool, DType::kBool, 2), {{"a", x}, {"b", y}});
  EXPECT_EQ(values_of<uint8_t>(xor_out.at("c")), (std::vector<uint8_t>{0, 1}));
}

TEST(InterpreterTest, ShiftsOfUnsignedIntegers) {
  auto a = make_tensor<uint8_t>(DType::kUInt8, {3}, {16, 4, 255});
  auto b = make_tensor<uint8_t>(DType::kUInt8, {3}, {1, 2, 4});
  auto shl = interpret(binary_program(OpCode::kShl, DType::kUInt8, DType::kUInt8, 3),
                       {{"a", a}, {"b", b}});
  EXPECT_EQ(values_of<uint8_t>(shl.at("c")), (std::vector<uint8_t>{32, 16, 240}));
  auto shr = interpret(binary_program(OpCode::kShr, DType::kUInt8, DType::kUInt8, 3),
                       {{"a", a}, {"b", b}});
  EXPECT_EQ(values_of<uint8_t>(shr.at("c")), (std::vector<uint8_t>{8, 1, 15}));
}

TEST(InterpreterTest, PowWithIntegerBaseKeepsTheBaseType) {
  ProgramBuilder pb;
  pb.input("a", DType::kInt64, {3});
  pb.input("b", DType::kFloat32, {3});
  Buffer& c = pb.computed("c", DType::kInt64, {3});
  ValueId v = c.body.binary(OpCode::kPow, c.body.load("a", DType::kInt64, i(0)),
                            c.body.load("b", DType::kFloat32, i(0)));
  c.body.store("c", DType::kInt64, i(0), v);
  pb.output(c);
  auto out = interpret(pb.program, {{"a", make_tensor<int64_t>(DType::kInt64, {3}, {2, 3, 4})},
                                    {"b", make_tensor<float>(DType::kFloat32, {3}, {3, 0.5, 2})}});
  EXPECT_EQ(values_of<int64_t>(out.at("c")), (std::vector<int64_t>{8, 1, 16}));
}

/// c[i0] = reduce over r0 of a[i0, r0], a of shape [rows, cols].
Program row_reduction(ReductionType type, DType in, DType out, int64_t rows, int64_t cols,
                      bool select_last = false) {
  ProgramBuilder pb;
  pb.input("a", in, {rows, cols});
  Buffer& c = pb.computed("c", out, {rows}, {cols});
  ValueId x = c.body.load("a", in, i(0) * cols + r(0));
  ValueId red = c.body.reduction(type, x, out, select_last);
  c.body.store("c", out, i(0), red);
  pb.output(c);
  return std::move(pb.program);
}

TEST(InterpreterTest, Reductions) {
  auto a = make_tensor<float>(DType::kFloat32, {2, 3}, {1, 5, 5, -2, 4, -3});
  auto run = [&](ReductionType type, DType out, bool last = false) {
    return interpret(row_reduction(type, DType::kFloat32, out, 2, 3, last), {{"a", a}}).at("c");
  };
  EXPECT_EQ(values_of<float>(run(ReductionType::kSum, DType::kFloat32)),
            (std::vector<float>{11, -1}));
  EXPECT_EQ(values_of<float>(run(ReductionType::kProd, DType::kFloat32)),
            (std::vector<float>{25, 24}));
  EXPECT_EQ(values_of<float>(run(ReductionType::kMax, DType::kFloat32)),
            (std::vector<float>{5, 4}));
  EXPECT_EQ(values_of<float>(run(ReductionType::kMin, DType::kFloat32)),
            (std::vector<float>{1, -3}));
  EXPECT_EQ(values_of<int64_t>(run(ReductionType::kArgMax, DType::kInt64)),
            (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(values_of<int64_t>(run(ReductionType::kArgMax, DType::kInt64, true)),
            (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(values_of<int64_t>(run(ReductionType::kArgMin, DType::kInt64)),
            (std::vector<int64_t>{0, 2}));
  auto mean = values_of<float>(run(ReductionType::kWelfordMean, DType::kFloat32));
  EXPECT_FLOAT_EQ(mean[0], 11.0f / 3);
  EXPECT_FLOAT_EQ(mean[1], -1.0f / 3);
  auto var = values_of<float>(run(ReductionType::kWelfordVar, DType::kFloat32));
  EXPECT_FLOAT_EQ(var[0], (std::pow(1 - 11.0 / 3, 2) + 2 * std::pow(5 - 11.0 / 3, 2)) / 3);
}

TEST(InterpreterTest, ArgMaxUsesRowMajorOrderOfSeveralReduceVars) {
  ProgramBuilder pb;
  pb.input("a", DType::kInt32, {2, 2});
  Buffer& c = pb.computed("c", DType::kInt64, {}, {2, 2});
  ValueId x = c.body.load("a", DType::kInt32, r(0) * 2 + r(1));
  c.body.store("c", DType::kInt64, 0, c.body.reduction(ReductionType::kArgMax, x, DType::kInt64));
  pb.output(c);
  auto out =
      interpret(pb.program, {{"a", make_tensor<int32_t>(DType::kInt32, {2, 2}, {1, 2, 7, 3})}});
  EXPECT_EQ(values_of<int64_t>(out.at("c")), (std::vector<int64_t>{2}));
}

TEST(InterpreterTest, EmptyReductionsGiveTheIdentity) {
  auto a = Tensor(DType::kFloat32, {2, 0});
  auto run = [&](ReductionType type) {
    return values_of<float>(
        interpret(row_reduction(type, DType::kFloat32, DType::kFloat32, 2, 0), {{"a", a}}).at("c"));
  };
  EXPECT_EQ(run(ReductionType::kSum), (std::vector<float>{0, 0}));
  EXPECT_EQ(run(ReductionType::kProd), (std::vector<float>{1, 1}));
  EXPECT_EQ(run(ReductionType::kMax)[0], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(run(ReductionType::kMin)[0], std::numeric_limits<float>::infinity());
  auto ints = Tensor(DType::kInt32, {1, 0});
  auto max = interpret(row_reduction(ReductionType::kMax, DType::kInt32, DType::kInt32, 1, 0),
                       {{"a", ints}});
  EXPECT_EQ(values_of<int32_t>(max.at("c"))[0], std::numeric_limits<int32_t>::min());
}

TEST(InterpreterTest, EpilogueAfterReductionAndNaNPropagation) {
  // c[i0] = exp(max_r a[i0, r]) - 1: the ops after the reduction run once per output element.
  ProgramBuilder pb;
  pb.input("a", DType::kFloat64, {2, 2});
  Buffer& c = pb.computed("c", DType::kFloat64, {2}, {2});
  ValueId x = c.body.load("a", DType::kFloat64, i(0) * 2 + r(0));
  ValueId m = c.body.reduction(ReductionType::kMax, x, DType::kFloat64);
  ValueId e = c.body.binary(OpCode::kSub, c.body.unary(OpCode::kExp, m),
                            c.body.constant(1, DType::kFloat64));
  c.body.store("c", DType::kFloat64, i(0), e);
  pb.output(c);
  auto out =
      interpret(pb.program, {{"a", make_tensor<double>(DType::kFloat64, {2, 2}, {0, 1, NAN, 2})}});
  auto v = values_of<double>(out.at("c"));
  EXPECT_DOUBLE_EQ(v[0], std::exp(1.0) - 1);
  EXPECT_TRUE(std::isnan(v[1]));
}

TEST(InterpreterTest, MaskedLoadsAndIndexExprs) {
  // Pad by one on each side: c[i0] = (1 <= i0 < 4) ? a[i0 - 1] : -1, plus i0.
  ProgramBuilder pb;
  pb.input("a", DType::kFloat32, {3});
  Buffer& c = pb.computed("c", DType::kFloat32, {5});
  LoopBody& body = c.body;
  ValueId idx = body.index_expr(i(0));
  ValueId lo = body.binary(OpCode::kGe, idx, body.constant(1, DType::kInt64));
  ValueId hi = body.binary(OpCode::kLt, idx, body.constant(4, DType::kInt64));
  ValueId mask = body.binary(OpCode::kAnd, lo, hi);
  ValueId x = body.masked_load("a", DType::kFloat32, i(0) - 1, mask, -1.0);
  ValueId sum = body.binary(OpCode::kAdd, x, body.cast(idx, DType::kFloat32));
  body.store("c", DType::kFloat32, i(0), sum);
  pb.output(c);
  auto out = interpret(pb.program, {{"a", make_tensor<float>(DType::kFloat32, {3}, {10, 20, 30})}});
  EXPECT_EQ(values_of<float>(out.at("c")), (std::vector<float>{-1, 11, 22, 33, 3}));
}

Program gather_program() {
  ProgramBuilder pb;
  pb.input("data", DType::kFloat32, {3});
  pb.input("idx", DType::kInt64, {4});
  Buffer& c = pb.computed("c", DType::kFloat32, {4});
  ValueId t = c.body.indirect(c.body.load("idx", DType::kInt64, i(0)), 3);
  ValueId x = c.body.load("data", DType::kFloat32, c.body.op(t).symbol);
  c.body.store("c", DType::kFloat32, i(0), x);
  pb.output(c);
  return std::move(pb.program);
}

TEST(InterpreterTest, IndirectIndicesWrapNegativeValues) {
  auto data = make_tensor<float>(DType::kFloat32, {3}, {1, 2, 3});
  auto out = interpret(
      gather_program(),
      {{"data", data}, {"idx", make_tensor<int64_t>(DType::kInt64, {4}, {0, -1, 2, -3})}});
  EXPECT_EQ(values_of<float>(out.at("c")), (std::vector<float>{1, 3, 3, 1}));
  EXPECT_THROW(
      interpret(gather_program(),
                {{"data", data}, {"idx", make_tensor<int64_t>(DType::kInt64, {4}, {0, 3, 0, 0})}}),
      UserError);
}

TEST(InterpreterTest, ConstantBuffersAndStridedLayouts) {
  // c = transpose of a constant 2x3 matrix, read through a [3, 2] view with strides [1, 3].
  ProgramBuilder pb;
  pb.constant("k", make_tensor<int32_t>(DType::kInt32, {2, 3}, {1, 2, 3, 4, 5, 6}));
  Buffer& c = pb.computed("c", DType::kInt32, {3, 2});
  c.body.store("c", DType::kInt32, i(0) * 2 + i(1),
               c.body.load("k", DType::kInt32, i(1) * 3 + i(0)));
  pb.output(c);
  auto out = interpret(pb.program, {});
  EXPECT_EQ(out.at("c").dims(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(values_of<int32_t>(out.at("c")), (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
}

TEST(InterpreterTest, MatmulBroadcastsBatchesThroughStrides) {
  // A: [2, 2, 3] batch of two; B: [3, 2] shared (rank 2); C bias [2] along N.
  ProgramBuilder pb;
  pb.input("a", DType::kFloat32, {2, 2, 3});
  pb.input("b", DType::kFloat32, {3, 2});
  pb.input("bias", DType::kFloat32, {2});
  Buffer& y = pb.external("y", DType::kFloat32, {2, 2, 2});
  y.call.op = ir::MatMulCall{1.0, 2.0};
  View a{"a", DType::kFloat32, Layout::contiguous({2, 2, 3})};
  View b{"b", DType::kFloat32, Layout::contiguous({3, 2})};
  View bias{"bias", DType::kFloat32, Layout{{2, 2, 2}, {0, 0, 1}, 0}};
  y.call.inputs = {a, b, bias};
  pb.output(y);
  auto out = interpret(
      pb.program,
      {{"a", make_tensor<float>(DType::kFloat32, {2, 2, 3}, {1, 0, 0, 0, 1, 0, 1, 1, 1, 2, 0, 0})},
       {"b", make_tensor<float>(DType::kFloat32, {3, 2}, {1, 2, 3, 4, 5, 6})},
       {"bias", make_tensor<float>(DType::kFloat32, {2}, {10, 100})}});
  EXPECT_EQ(values_of<float>(out.at("y")),
            (std::vector<float>{21, 202, 23, 204, 29, 212, 22, 204}));
}

TEST(InterpreterTest, MatmulReadsTransposedViews) {
  ProgramBuilder pb;
  pb.input("a", DType::kFloat64, {2, 2});
  Buffer& y = pb.external("y", DType::kFloat64, {2, 2});
  y.call.op = ir::MatMulCall{0.5, 1.0};
  y.call.inputs = {View{"a", DType::kFloat64, Layout{{2, 2}, {1, 2}, 0}},  // a^T
                   View{"a", DType::kFloat64, Layout::contiguous({2, 2})}};
  pb.output(y);
  auto out =
      interpret(pb.program, {{"a", make_tensor<double>(DType::kFloat64, {2, 2}, {1, 2, 3, 4})}});
  // a^T a = [[10, 14], [14, 20]], halved.
  EXPECT_EQ(values_of<double>(out.at("y")), (std::vector<double>{5, 7, 7, 10}));
}

TEST(InterpreterTest, MatmulAppliesItsFusedActivation) {
  // The CUDA backend's cuBLASLt epilogues: act(A @ B + bias) with Relu, then tanh-Gelu.
  for (ir::MatMulActivation act : {ir::MatMulActivation::kRelu, ir::MatMulActivation::kGeluTanh}) {
    ProgramBuilder pb;
    pb.input("a", DType::kFloat64, {1, 2});
    pb.input("b", DType::kFloat64, {2, 2});
    pb.input("bias", DType::kFloat64, {2});
    Buffer& y = pb.external("y", DType::kFloat64, {1, 2});
    ir::MatMulCall call{1.0, 1.0};
    call.activation = act;
    y.call.op = call;
    y.call.inputs = {View{"a", DType::kFloat64, Layout::contiguous({1, 2})},
                     View{"b", DType::kFloat64, Layout::contiguous({2, 2})},
                     View{"bias", DType::kFloat64, Layout{{1, 2}, {0, 1}, 0}}};
    pb.output(y);
    auto out = interpret(pb.program,
                         {{"a", make_tensor<double>(DType::kFloat64, {1, 2}, {1, 2})},
                          {"b", make_tensor<double>(DType::kFloat64, {2, 2}, {1, -1, 0.25, -2})},
                          {"bias", make_tensor<double>(DType::kFloat64, {2}, {0.5, 1})}});
    // A @ B + bias = [1.5 + 0.5, -5 + 1] = [2, -4].
    const std::vector<double> got = values_of<double>(out.at("y"));
    if (act == ir::MatMulActivation::kRelu) {
      EXPECT_EQ(got, (std::vector<double>{2, 0}));
    } else {
      // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) at 2 and -4 (Python's math module).
      EXPECT_NEAR(got[0], 1.954597694087775, 1e-12);
      EXPECT_NEAR(got[1], -7.024594819227126e-05, 1e-15);
    }
  }
}

TEST(InterpreterTest, ConvWithPaddingStrideAndGroups) {
  // X [1, 2, 3, 3], W [2, 1, 2, 2] (group 2), pads 1 on each side, stride 2 -> out [1, 2, 2, 2].
  ProgramBuilder pb;
  pb.input("x", DType::kFloat32, {1, 2, 3, 3});
  pb.input("w", DType::kFloat32, {2, 1, 2, 2});
  pb.input("bias", DType::kFloat32, {2});
  Buffer& y = pb.external("y", DType::kFloat32, {1, 2, 2, 2});
  ir::ConvCall conv;
  conv.strides = {2, 2};
  conv.pads = {1, 1, 1, 1};
  conv.group = 2;
  y.call.op = conv;
  y.call.inputs = {View{"x", DType::kFloat32, Layout::contiguous({1, 2, 3, 3})},
                   View{"w", DType::kFloat32, Layout::contiguous({2, 1, 2, 2})},
                   View{"bias", DType::kFloat32, Layout::contiguous({2})}};
  pb.output(y);
  std::vector<float> x(18);
  for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>(k);
  auto out =
      interpret(pb.program,
                {{"x", make_tensor<float>(DType::kFloat32, {1, 2, 3, 3}, x)},
                 {"w", make_tensor<float>(DType::kFloat32, {2, 1, 2, 2}, {1, 0, 0, 1, 0, 1, 1, 0})},
                 {"bias", make_tensor<float>(DType::kFloat32, {2}, {0, 100})}});
  // Channel 0 picks (top-left, bottom-right): out[oy, ox] = X[2oy-1, 2ox-1] + X[2oy, 2ox].
  // Channel 1 (X values 9..17) picks X[2oy-1, 2ox] + X[2oy, 2ox-1], plus bias 100.
  EXPECT_EQ(values_of<float>(out.at("y")),
            (std::vector<float>{0, 2, 6, 4 + 8, 100, 100 + 10, 100 + 12, 100 + 14 + 16}));
}

TEST(InterpreterTest, InputProblemsAreUserErrors) {
  Program p = unary_program(OpCode::kNeg, DType::kFloat32, DType::kFloat32, 2);
  EXPECT_THROW(interpret(p, {}), UserError);
  EXPECT_THROW(interpret(p, {{"a", Tensor(DType::kFloat64, {2})}}), UserError);
  EXPECT_THROW(interpret(p, {{"a", Tensor(DType::kFloat32, {3})}}), UserError);
  EXPECT_THROW(interpret(p, {{"a", Tensor(DType::kFloat32, {2})}, {"b", Tensor()}}), UserError);
}

TEST(InterpreterTest, ReadingUnwrittenElementsIsABug) {
  ProgramBuilder pb;
  pb.computed("t", DType::kFloat32, {2});  // no stores
  Buffer& c = pb.computed("c", DType::kFloat32, {2});
  c.body.store("c", DType::kFloat32, i(0), c.body.load("t", DType::kFloat32, i(0)));
  pb.output(c);
  EXPECT_THROW(interpret(pb.program, {}), InternalError);
}

TEST(InterpreterTest, IndexChecksGuardIntegerBuffers) {
  ProgramBuilder pb;
  pb.input("idx", DType::kInt32, {2});
  Buffer& c = pb.computed("c", DType::kInt32, {2});
  c.body.store("c", DType::kInt32, i(0), c.body.load("idx", DType::kInt32, i(0)));
  pb.output(c);
  pb.program.index_checks.push_back(IndexCheck{"idx", 4, "node 'g' (Gather)", std::nullopt});
  auto ok = interpret(pb.program, {{"idx", make_tensor<int32_t>(DType::kInt32, {2}, {-4, 3})}});
  EXPECT_EQ(values_of<int32_t>(ok.at("c")), (std::vector<int32_t>{-4, 3}));
  EXPECT_THROW(interpret(pb.program, {{"idx", make_tensor<int32_t>(DType::kInt32, {2}, {0, 4})}}),
               UserError);
}

TEST(InterpreterScalarTest, CastEdgeCases) {
  using interp::cast;
  using interp::Scalar;
  EXPECT_EQ(cast(Scalar{-0.9, 0}, DType::kFloat32, DType::kInt32).i, 0);
  EXPECT_EQ(cast(Scalar{NAN, 0}, DType::kFloat32, DType::kBool).i, 1);
  EXPECT_EQ(cast(Scalar{0, -1}, DType::kInt64, DType::kUInt64).i, -1);
  EXPECT_EQ(cast(Scalar{0, -1}, DType::kUInt64, DType::kFloat64).f, 18446744073709551616.0);
  EXPECT_EQ(cast(Scalar{0, 255}, DType::kUInt8, DType::kInt8).i, -1);
  EXPECT_EQ(cast(Scalar{1e10, 0}, DType::kFloat64, DType::kFloat32).f, 1e10f);
}

}  // namespace
}  // namespace kiln::ir
