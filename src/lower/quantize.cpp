/// Linear quantization through the loop IR: QuantizeLinear (saturate(round_half_even(x / scale)
/// + zero_point)), DequantizeLinear ((x - zero_point) * scale), per tensor or per axis, and
/// DynamicQuantizeLinear (uint8 with the scale and zero point computed from the input's range by
/// two reductions).
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include "lower/elementwise.h"
#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using ir::LoopBody;
using ir::OpCode;
using ir::ReductionType;
using ir::ValueId;
using sym::Expr;

namespace {

/// The range of a quantized dtype.
std::pair<double, double> quantized_range(const LoweringContext& ctx, DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return {0, 255};
    case DType::kInt8:
      return {-128, 127};
    case DType::kInt32:
      return {-2147483648.0, 2147483647.0};
    default:
      ctx.fail(fmt::format("expected a uint8, int8 or int32 quantized type, found {}",
                           graph::dtype_name(dtype)));
  }
}

/// The element of a per-tensor (scalar or one-element) or per-axis (1-D along `axis`) parameter
/// for the input element at `index`.
ValueId quant_param(LoweringContext& ctx, LoopBody& body, const TensorValue& p,
                    const std::vector<Expr>& index, size_t axis) {
  if (p.rank() == 0) return ctx.load_at(body, p, {});
  if (p.rank() == 1 && p.shape[0] == Expr(1)) return ctx.load_at(body, p, {Expr(0)});
  if (p.rank() != 1) ctx.fail("scale and zero point must be scalars or 1-D (per axis)");
  return ctx.load_at(body, p, {index[axis]});
}

/// The axis of per-axis parameters (attribute axis, default 1); unused, and not checked, when
/// every parameter is per tensor.
size_t quant_axis(LoweringContext& ctx, const graph::Node& node, const TensorValue& x,
                  std::vector<const TensorValue*> params) {
  bool per_axis = false;
  for (const TensorValue* p : params) {
    per_axis = per_axis || (p != nullptr && p->rank() == 1 && p->shape[0] != Expr(1));
  }
  if (!per_axis) return 0;
  return static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", 1), static_cast<int64_t>(x.rank())));
}

/// saturate(round_half_even(v) + zero_point) as `out`, v in float.
ValueId quantize_value(LoopBody& body, ValueId v, ValueId zero_point, DType out,
                       std::pair<double, double> range) {
  DType f = body.dtype(v);
  ValueId q = body.binary(OpCode::kAdd, body.unary(OpCode::kRound, v), body.cast(zero_point, f));
  q = body.binary(OpCode::kMaximum, q, body.constant(range.first, f));
  q = body.binary(OpCode::kMinimum, q, body.constant(range.second, f));
  return body.cast(q, out);
}

std::vector<TensorValue> lower_quantize(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "x");
  const TensorValue& scale = required_input(ctx, inputs, 1, "y_scale");
  const TensorValue* zero_point = optional_input(inputs, 2);
  require_dtype(ctx, x.dtype, kFloats, "input 'x'");
  const DType out = zero_point != nullptr ? zero_point->dtype : DType::kUInt8;
  const auto range = quantized_range(ctx, out);
  const size_t axis = quant_axis(ctx, node, x, {&scale, zero_point});
  const DType f = compute_dtype(x.dtype);
  return {ctx.pointwise(out, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId s = body.cast(quant_param(ctx, body, scale, i, axis), f);
    ValueId v = body.binary(OpCode::kDiv, body.cast(ctx.load_at(body, x, i), f), s);
    ValueId zp = zero_point != nullptr ? quant_param(ctx, body, *zero_point, i, axis)
                                       : body.constant(0, out);
    return quantize_value(body, v, zp, out, range);
  })};
}

std::vector<TensorValue> lower_dequantize(LoweringContext& ctx, const graph::Node& node,
                                          const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "x");
  const TensorValue& scale = required_input(ctx, inputs, 1, "x_scale");
  const TensorValue* zero_point = optional_input(inputs, 2);
  quantized_range(ctx, x.dtype);
  require_dtype(ctx, scale.dtype, kFloats, "input 'x_scale'");
  const size_t axis = quant_axis(ctx, node, x, {&scale, zero_point});
  const DType out = scale.dtype, f = compute_dtype(scale.dtype);
  return {ctx.pointwise(out, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId v = body.cast(ctx.load_at(body, x, i), f);
    if (zero_point != nullptr) {
      v = body.binary(OpCode::kSub, v, body.cast(quant_param(ctx, body, *zero_point, i, axis), f));
    }
    ValueId s = body.cast(quant_param(ctx, body, scale, i, axis), f);
    return body.cast(body.binary(OpCode::kMul, v, s), out);
  })};
}

std::vector<TensorValue> lower_dynamic_quantize(LoweringContext& ctx, const graph::Node&,
                                                const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "x");
  if (x.dtype != DType::kFloat32) {
    ctx.fail(fmt::format("expected a float32 input, found {}", graph::dtype_name(x.dtype)));
  }
  const DType f = DType::kFloat32;
  std::vector<Expr> all = x.shape;
  auto extreme = [&](ReductionType type) {
    return ctx.reduction(f, {}, all, type,
                         [&](LoopBody& body, const std::vector<Expr>&, const std::vector<Expr>& r) {
                           return ctx.load_at(body, x, r);
                         });
  };
  TensorValue lo = extreme(ReductionType::kMin), hi = extreme(ReductionType::kMax);
  // The range always includes 0; scale = (max - min) / 255, zero point = saturate(round(-min /
  // scale)) in [0, 255].
  auto scale_of = [&](LoopBody& body) {
    ValueId zero = body.constant(0, f);
    ValueId mn = body.binary(OpCode::kMinimum, ctx.load_at(body, lo, {}), zero);
    ValueId mx = body.binary(OpCode::kMaximum, ctx.load_at(body, hi, {}), zero);
    return std::make_pair(
        body.binary(OpCode::kDiv, body.binary(OpCode::kSub, mx, mn), body.constant(255, f)), mn);
  };
  auto zero_point_of = [&](LoopBody& body) {
    auto [s, mn] = scale_of(body);
    ValueId v = body.binary(OpCode::kDiv, body.unary(OpCode::kNeg, mn), s);
    return quantize_value(body, v, body.constant(0, f), DType::kUInt8, {0, 255});
  };
  TensorValue scale = ctx.pointwise(
      f, {}, [&](LoopBody& body, const std::vector<Expr>&) { return scale_of(body).first; });
  TensorValue zero_point =
      ctx.pointwise(DType::kUInt8, {},
                    [&](LoopBody& body, const std::vector<Expr>&) { return zero_point_of(body); });
  TensorValue y =
      ctx.pointwise(DType::kUInt8, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
        ValueId v = body.binary(OpCode::kDiv, ctx.load_at(body, x, i), scale_of(body).first);
        return quantize_value(body, v, zero_point_of(body), DType::kUInt8, {0, 255});
      });
  return {y, scale, zero_point};
}

}  // namespace

void register_quantize_ops(Registry& registry) {
  registry.add("", "QuantizeLinear", {lower_quantize, 10, 17});
  registry.add("", "DequantizeLinear", {lower_dequantize, 10, 17});
  registry.add("", "DynamicQuantizeLinear", {lower_dynamic_quantize, 11, 17});
}

}  // namespace kiln::lower
