/// Unary math and activation lowerings: ops that map to one loop-IR op (Exp, Log, Tanh, ...,
/// Floor, Round, Sign, IsNaN) and activations composed of a few (LeakyRelu, Elu, Selu,
/// HardSigmoid, HardSwish, Softsign, ThresholdedRelu, Shrink, Celu, PRelu, Clip, IsInf). All are
/// pointwise bodies that consumers inline. Float16 and bfloat16 compute in float32 (the loop IR
/// loads them as float32), so constants are built in the compute dtype.
///
/// Tests: tests/unit/lower/suite_ops_test.cpp (ONNX node suite through the interpreter).

#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lower/elementwise.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using ir::LoopBody;
using ir::OpCode;
using ir::ValueId;
using sym::Expr;

namespace {

/// The input X of a one-input op, checked against `allowed`.
const TensorValue& unary_input(const LoweringContext& ctx, const LowerInputs& inputs,
                               unsigned allowed) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, allowed, "input X");
  return x;
}

/// A constant of the dtype `like` computes in.
ValueId constant_like(LoopBody& body, double value, ValueId like) {
  return body.constant(value, body.dtype(like));
}

/// A pointwise op on X whose element is fn(body, x).
using UnaryFn = std::function<ValueId(LoopBody& body, ValueId x)>;

TensorValue map_unary(LoweringContext& ctx, const TensorValue& x, DType out, const UnaryFn& fn) {
  return broadcast_map(ctx, {&x}, out, [&fn](LoopBody& body, const std::vector<ValueId>& e) {
    return fn(body, e[0]);
  });
}

/// An op that is exactly one loop-IR op.
LowerFn simple_unary(OpCode code, unsigned allowed) {
  return [code, allowed](LoweringContext& ctx, const graph::Node&,
                         const LowerInputs& inputs) -> std::vector<TensorValue> {
    const TensorValue& x = unary_input(ctx, inputs, allowed);
    DType out = code == OpCode::kIsNan ? DType::kBool : x.dtype;
    TensorValue value =
        map_unary(ctx, x, out, [code](LoopBody& body, ValueId v) { return body.unary(code, v); });
    KnownFn symbolic;
    if (code == OpCode::kNeg)
      symbolic = [](const std::vector<Expr>& a) { return std::optional(-a[0]); };
    fold_known(ctx, value, {&x}, code, symbolic);
    return {value};
  };
}

/// Registers an activation whose element is fn(node, body, x) on float inputs.
using ActivationFn = std::function<ValueId(const graph::Node& node, LoopBody& body, ValueId x)>;

LowerFn activation(unsigned allowed, ActivationFn fn) {
  return [allowed, fn = std::move(fn)](LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) -> std::vector<TensorValue> {
    const TensorValue& x = unary_input(ctx, inputs, allowed);
    return {
        map_unary(ctx, x, x.dtype, [&](LoopBody& body, ValueId v) { return fn(node, body, v); })};
  };
}

double attr(const graph::Node& node, const char* name, double fallback) {
  return node.attr_float(name, static_cast<float>(fallback));
}

ValueId mul_const(LoopBody& body, ValueId x, double c) {
  return body.binary(OpCode::kMul, x, constant_like(body, c, x));
}

ValueId less_than_const(LoopBody& body, ValueId x, double c) {
  return body.binary(OpCode::kLt, x, constant_like(body, c, x));
}

/// max(lo, min(hi, x)) with NaN propagated.
ValueId clamp_const(LoopBody& body, ValueId x, double lo, double hi) {
  ValueId upper = body.binary(OpCode::kMinimum, x, constant_like(body, hi, x));
  return body.binary(OpCode::kMaximum, upper, constant_like(body, lo, x));
}

ValueId leaky_relu(const graph::Node& node, LoopBody& body, ValueId x) {
  ValueId scaled = mul_const(body, x, attr(node, "alpha", 0.01));
  return body.where(less_than_const(body, x, 0), scaled, x);
}

ValueId elu(const graph::Node& node, LoopBody& body, ValueId x) {
  ValueId negative = mul_const(body, body.unary(OpCode::kExpm1, x), attr(node, "alpha", 1.0));
  return body.where(less_than_const(body, x, 0), negative, x);
}

ValueId selu(const graph::Node& node, LoopBody& body, ValueId x) {
  double alpha = attr(node, "alpha", 1.67326319217681884765625);
  double gamma = attr(node, "gamma", 1.05070102214813232421875);
  ValueId exp_part = body.binary(OpCode::kSub, mul_const(body, body.unary(OpCode::kExp, x), alpha),
                                 constant_like(body, alpha, x));
  ValueId positive = body.binary(OpCode::kGt, x, constant_like(body, 0, x));
  return mul_const(body, body.where(positive, x, exp_part), gamma);
}

ValueId hard_sigmoid(const graph::Node& node, LoopBody& body, ValueId x) {
  ValueId linear = body.binary(OpCode::kAdd, mul_const(body, x, attr(node, "alpha", 0.2)),
                               constant_like(body, attr(node, "beta", 0.5), x));
  return clamp_const(body, linear, 0, 1);
}

ValueId hard_swish(const graph::Node&, LoopBody& body, ValueId x) {
  // alpha = 1/6 and beta = 0.5 as float attributes, as ONNX's function body defines them.
  ValueId linear = body.binary(OpCode::kAdd, mul_const(body, x, static_cast<float>(1.0 / 6.0)),
                               constant_like(body, 0.5, x));
  return body.binary(OpCode::kMul, x, clamp_const(body, linear, 0, 1));
}

ValueId softsign(const graph::Node&, LoopBody& body, ValueId x) {
  ValueId denominator =
      body.binary(OpCode::kAdd, body.unary(OpCode::kAbs, x), constant_like(body, 1, x));
  return body.binary(OpCode::kDiv, x, denominator);
}

ValueId thresholded_relu(const graph::Node& node, LoopBody& body, ValueId x) {
  ValueId above = body.binary(OpCode::kGt, x, constant_like(body, attr(node, "alpha", 1.0), x));
  return body.where(above, x, constant_like(body, 0, x));
}

ValueId celu(const graph::Node& node, LoopBody& body, ValueId x) {
  double alpha = attr(node, "alpha", 1.0);
  ValueId scaled = body.binary(OpCode::kDiv, x, constant_like(body, alpha, x));
  ValueId negative = mul_const(body, body.unary(OpCode::kExpm1, scaled), alpha);
  ValueId zero = constant_like(body, 0, x);
  return body.binary(OpCode::kAdd, body.binary(OpCode::kMaximum, x, zero),
                     body.binary(OpCode::kMinimum, negative, zero));
}

/// Shrink on any numeric type: integers are compared and shifted in float64 and cast back.
/// Gelu-20: x * Phi(x) with the normal CDF exactly (erf), or its tanh approximation.
ValueId gelu(const graph::Node& node, LoopBody& body, ValueId x) {
  std::string approximate = node.attr_string("approximate", "none");
  ValueId half_x = mul_const(body, x, 0.5);
  ValueId one = constant_like(body, 1, x);
  if (approximate == "tanh") {
    ValueId cube = body.binary(OpCode::kMul, body.binary(OpCode::kMul, x, x), x);
    ValueId inner = body.binary(OpCode::kAdd, x, mul_const(body, cube, 0.044715));
    ValueId t = body.unary(OpCode::kTanh, mul_const(body, inner, std::sqrt(2.0 / M_PI)));
    return body.binary(OpCode::kMul, half_x, body.binary(OpCode::kAdd, one, t));
  }
  ValueId e = body.unary(OpCode::kErf, mul_const(body, x, M_SQRT1_2));
  return body.binary(OpCode::kMul, half_x, body.binary(OpCode::kAdd, one, e));
}

/// Mish-18: x * tanh(softplus(x)).
ValueId mish(const graph::Node&, LoopBody& body, ValueId x) {
  return body.binary(OpCode::kMul, x, body.unary(OpCode::kTanh, body.unary(OpCode::kSoftplus, x)));
}

/// Swish-24: x * sigmoid(alpha * x).
ValueId swish(const graph::Node& node, LoopBody& body, ValueId x) {
  ValueId scaled = mul_const(body, x, attr(node, "alpha", 1.0));
  return body.binary(OpCode::kMul, x, body.unary(OpCode::kSigmoid, scaled));
}

ValueId shrink(const graph::Node& node, LoopBody& body, ValueId x) {
  DType dtype = body.dtype(x);
  ValueId v = graph::is_floating(dtype) ? x : body.cast(x, DType::kFloat64);
  double lambd = attr(node, "lambd", 0.5);
  double bias = attr(node, "bias", 0.0);
  ValueId below = less_than_const(body, v, -lambd);
  ValueId above = body.binary(OpCode::kGt, v, constant_like(body, lambd, v));
  ValueId plus = body.binary(OpCode::kAdd, v, constant_like(body, bias, v));
  ValueId minus = body.binary(OpCode::kSub, v, constant_like(body, bias, v));
  ValueId result = body.where(below, plus, body.where(above, minus, constant_like(body, 0, v)));
  return body.cast(result, dtype);
}

std::vector<TensorValue> lower_is_inf(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  const TensorValue& x = unary_input(ctx, inputs, kFloats);
  bool positive = node.attr_int("detect_positive", 1) != 0;
  bool negative = node.attr_int("detect_negative", 1) != 0;
  return {map_unary(ctx, x, DType::kBool, [&](LoopBody& body, ValueId v) {
    ValueId result = body.constant(0, DType::kBool);
    if (positive) result = body.unary(OpCode::kIsPosInf, v);
    if (negative) {
      ValueId neg = body.unary(OpCode::kIsNegInf, v);
      result = positive ? body.binary(OpCode::kOr, result, neg) : neg;
    }
    return result;
  })};
}

std::vector<TensorValue> lower_prelu(LoweringContext& ctx, const graph::Node& node,
                                     const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  TensorValue slope = required_input(ctx, inputs, 1, "slope");
  require_dtype(ctx, x.dtype, node.opset() >= 9 ? kSignedNumbers : kFloats, "input X");
  common_dtype(ctx, {&x, &slope});
  // Before opset 7 a 1-D slope holds one value per channel (dim 1), not a broadcast operand.
  if (node.opset() < 7 && slope.rank() == 1 && x.rank() > 2 && slope.shape[0] != Expr(1)) {
    std::vector<Expr> per_channel(x.rank() - 1, Expr(1));
    per_channel[0] = slope.shape[0];
    slope = reshape_view(ctx, slope, per_channel);
  }
  std::vector<Expr> shape = ctx.broadcast_shapes({x.shape, slope.shape});
  if (shape != x.shape) ctx.fail("slope must broadcast to the shape of X (unidirectionally)");
  return {
      broadcast_map(ctx, {&x, &slope}, x.dtype, [](LoopBody& body, const std::vector<ValueId>& e) {
        ValueId negative = body.binary(OpCode::kLt, e[0], constant_like(body, 0, e[0]));
        return body.where(negative, body.binary(OpCode::kMul, e[0], e[1]), e[0]);
      })};
}

/// A Clip bound given as an input (opset 11+): a scalar (or one-element tensor).
const TensorValue* clip_bound(const LoweringContext& ctx, const LowerInputs& inputs, size_t i,
                              DType dtype) {
  const TensorValue* bound = optional_input(inputs, i);
  if (bound == nullptr) return nullptr;
  if (bound->dtype != dtype) ctx.fail("min and max must have the dtype of the input");
  for (const Expr& d : bound->shape) {
    if (d != Expr(1))
      ctx.fail(fmt::format("min and max must be scalars, found shape of rank {}", bound->rank()));
  }
  return bound;
}

std::vector<TensorValue> lower_clip(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& inputs) {
  const TensorValue& x = unary_input(ctx, inputs, node.opset() >= 12 ? kNumbers : kFloats);
  if (node.opset() < 11) {
    double lo = attr(node, "min", -FLT_MAX);
    double hi = attr(node, "max", FLT_MAX);
    return {map_unary(ctx, x, x.dtype, [&](LoopBody& body, ValueId v) {
      ValueId low = body.binary(OpCode::kMaximum, v, constant_like(body, lo, v));
      return body.binary(OpCode::kMinimum, low, constant_like(body, hi, v));
    })};
  }
  const TensorValue* lo = clip_bound(ctx, inputs, 1, x.dtype);
  const TensorValue* hi = clip_bound(ctx, inputs, 2, x.dtype);
  return {map_unary(ctx, x, x.dtype, [&](LoopBody& body, ValueId v) {
    // numpy.clip: minimum(maximum(x, lo), hi), so hi wins when lo > hi.
    if (lo) {
      std::vector<Expr> zeros(lo->rank(), Expr(0));
      v = body.binary(OpCode::kMaximum, v, ctx.load_at(body, *lo, zeros));
    }
    if (hi) {
      std::vector<Expr> zeros(hi->rank(), Expr(0));
      v = body.binary(OpCode::kMinimum, v, ctx.load_at(body, *hi, zeros));
    }
    return v;
  })};
}

void register_math_ops(Registry& r) {
  r.add("", "Neg", {simple_unary(OpCode::kNeg, kSignedNumbers), 1, 17});
  r.add("", "Abs", {simple_unary(OpCode::kAbs, kNumbers), 1, 17});
  r.add("", "Exp", {simple_unary(OpCode::kExp, kFloats), 1, 17});
  r.add("", "Log", {simple_unary(OpCode::kLog, kFloats), 1, 17});
  r.add("", "Sqrt", {simple_unary(OpCode::kSqrt, kFloats), 1, 17});
  r.add("", "Reciprocal", {simple_unary(OpCode::kReciprocal, kFloats), 1, 17});
  r.add("", "Tanh", {simple_unary(OpCode::kTanh, kFloats), 1, 17});
  r.add("", "Sigmoid", {simple_unary(OpCode::kSigmoid, kFloats), 1, 17});
  r.add("", "Erf", {simple_unary(OpCode::kErf, kFloats), 9, 17});
  r.add("", "Relu", {simple_unary(OpCode::kRelu, kSignedNumbers), 1, 17});
  r.add("", "Softplus", {simple_unary(OpCode::kSoftplus, kFloats), 1, 17});
  r.add("", "Floor", {simple_unary(OpCode::kFloor, kFloats), 1, 17});
  r.add("", "Ceil", {simple_unary(OpCode::kCeil, kFloats), 1, 17});
  r.add("", "Round", {simple_unary(OpCode::kRound, kFloats), 11, 17});
  r.add("", "Sign", {simple_unary(OpCode::kSign, kNumbers), 9, 17});
  r.add("", "IsNaN", {simple_unary(OpCode::kIsNan, kFloats), 9, 17});
  r.add("", "IsInf", {lower_is_inf, 10, 17});
  const std::pair<const char*, OpCode> kTrig[] = {
      {"Sin", OpCode::kSin},     {"Cos", OpCode::kCos},    {"Tan", OpCode::kTan},
      {"Asin", OpCode::kAsin},   {"Acos", OpCode::kAcos},  {"Atan", OpCode::kAtan},
      {"Sinh", OpCode::kSinh},   {"Cosh", OpCode::kCosh},  {"Asinh", OpCode::kAsinh},
      {"Acosh", OpCode::kAcosh}, {"Atanh", OpCode::kAtanh}};
  for (const auto& [name, code] : kTrig) {
    bool hyperbolic = std::string_view(name).ends_with('h');
    r.add("", name, {simple_unary(code, kFloats), hyperbolic ? 9 : 7, 17});
  }
}

}  // namespace

void register_activation_ops(Registry& r) {
  register_math_ops(r);
  r.add("", "LeakyRelu", {activation(kFloats, leaky_relu), 1, 17});
  r.add("", "Elu", {activation(kFloats, elu), 1, 17});
  r.add("", "Selu", {activation(kFloats, selu), 1, 17});
  r.add("", "HardSigmoid", {activation(kFloats, hard_sigmoid), 1, 17});
  r.add("", "HardSwish", {activation(kFloats, hard_swish), 14, 17});
  r.add("", "Softsign", {activation(kFloats, softsign), 1, 17});
  r.add("", "ThresholdedRelu", {activation(kFloats, thresholded_relu), 10, 17});
  r.add("", "Celu", {activation(kFloats, celu), 12, 17});
  r.add("", "Shrink", {activation(kNumbers, shrink), 9, 17});
  r.add("", "Mish", {activation(kFloats, mish), 18, 18});
  r.add("", "Gelu",
        {[](LoweringContext& ctx, const graph::Node& node, const LowerInputs& inputs) {
           std::string approximate = node.attr_string("approximate", "none");
           if (approximate != "none" && approximate != "tanh") {
             ctx.fail(fmt::format("attribute 'approximate' must be none or tanh, found '{}'",
                                  approximate));
           }
           return activation(kFloats, gelu)(ctx, node, inputs);
         },
         20, 20});
  r.add("", "Swish", {activation(kFloats, swish), 24, 24});
  r.add("", "PRelu", {lower_prelu, 1, 17});
  r.add("", "Clip", {lower_clip, 1, 17});
}

}  // namespace kiln::lower
