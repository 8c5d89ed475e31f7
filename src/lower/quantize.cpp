/// Linear quantization through the loop IR: QuantizeLinear (saturate(round_half_even(x / scale)
/// + zero_point); to float8 and float4e2m1 the conversion rounds, saturating as the attribute
/// says), DequantizeLinear ((x - zero_point) * scale), per tensor, per axis or blocked (opset
/// 21), to and from the 8-, 4- and 2-bit integer and float types (opsets 19-25), and
/// DynamicQuantizeLinear (uint8 with the scale and zero point computed from the input's range by
/// two reductions); and the integer products MatMulInteger, ConvInteger (int32 sums of
/// zero-point-shifted products) and QLinearMatMul, QLinearConv (the same sums, requantized), as
/// loop-IR reductions.
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

/// The range of a quantized integer dtype.
std::pair<double, double> quantized_range(const LoweringContext& ctx, DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return {0, 255};
    case DType::kInt8:
      return {-128, 127};
    case DType::kUInt16:
      return {0, 65535};
    case DType::kInt16:
      return {-32768, 32767};
    case DType::kInt32:
      return {-2147483648.0, 2147483647.0};
    case DType::kUInt4:
      return {0, 15};
    case DType::kInt4:
      return {-8, 7};
    case DType::kUInt2:
      return {0, 3};
    case DType::kInt2:
      return {-2, 1};
    default:
      ctx.fail(fmt::format(
          "expected a quantized type (int2/4/8/16/32, uint2/4/8/16, float8 or float4e2m1), "
          "found {}",
          graph::dtype_name(dtype)));
  }
}

/// Whether `dtype` is a quantized type: the integers of quantized_range, float8 and float4e2m1
/// (float8e8m0 is a scale type, not a quantized one).
void require_quantized(const LoweringContext& ctx, DType dtype) {
  if (graph::is_small_float(dtype) && dtype != DType::kFloat8E8M0) return;
  quantized_range(ctx, dtype);
}

/// The element of a per-tensor (scalar or one-element) or per-axis (1-D) parameter for
/// `position` along its axis.
ValueId param_at(LoweringContext& ctx, LoopBody& body, const TensorValue& p, const Expr& position) {
  if (p.rank() == 0) return ctx.load_at(body, p, {});
  if (p.rank() != 1) ctx.fail("scales and zero points must be scalars or 1-D (per axis)");
  return ctx.load_at(body, p, {p.shape[0] == Expr(1) ? Expr(0) : position});
}

/// How the scale and zero point map onto the input: per tensor, per axis (1-D along `axis`), or
/// in blocks of `block_size` along `axis` (opset 21's blocked quantization: the parameters have
/// the input's rank, and element i uses the parameter at i with i[axis] / block_size).
struct QuantLayout {
  size_t axis = 0;
  int64_t block_size = 0;
};

/// The parameter element for the input element at `index`.
ValueId quant_param(LoweringContext& ctx, LoopBody& body, const TensorValue& p,
                    const std::vector<Expr>& index, const QuantLayout& layout) {
  if (layout.block_size > 0) {
    if (p.rank() != index.size()) {
      ctx.fail(
          fmt::format("blocked quantization needs scales and zero points of the input's "
                      "rank {}, found rank {}",
                      index.size(), p.rank()));
    }
    std::vector<Expr> at = index;
    at[layout.axis] = sym::floor_div(index[layout.axis], Expr(layout.block_size));
    return ctx.load_at(body, p, at);
  }
  return param_at(ctx, body, p,
                  p.rank() == 1 && p.shape[0] != Expr(1) ? index[layout.axis] : Expr(0));
}

/// The layout of the parameters (attributes axis, default 1, and block_size, default 0); the
/// axis is unused, and not checked, when every parameter is per tensor.
QuantLayout quant_layout(LoweringContext& ctx, const graph::Node& node, const TensorValue& x,
                         std::vector<const TensorValue*> params) {
  QuantLayout layout;
  layout.block_size = node.attr_int("block_size", 0);
  if (layout.block_size < 0) {
    ctx.fail(fmt::format("block_size must be >= 0, found {}", layout.block_size));
  }
  bool per_axis = layout.block_size > 0;
  for (const TensorValue* p : params) {
    per_axis = per_axis || (p != nullptr && p->rank() == 1 && p->shape[0] != Expr(1));
  }
  if (!per_axis) return layout;
  layout.axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", 1), static_cast<int64_t>(x.rank())));
  return layout;
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

/// v + zero_point as the float8 / float4 `out`: the conversion where it is stored rounds to
/// nearest even; with `saturate` (float8: attribute saturate, default 1) clamped to the type's
/// largest finite value first (float4e2m1 stores always saturate).
ValueId quantize_small_float(LoopBody& body, ValueId v, ValueId zero_point, DType out,
                             bool saturate) {
  DType f = body.dtype(v);
  ValueId q = body.binary(OpCode::kAdd, v, body.cast(zero_point, f));
  if (saturate) {
    const double max = graph::small_float_max(out);
    ValueId hi = body.constant(max, f), lo = body.constant(-max, f);
    q = body.where(body.binary(OpCode::kGt, q, hi), hi, q);
    q = body.where(body.binary(OpCode::kLt, q, lo), lo, q);
  }
  return body.cast(q, out);
}

/// The dtype of an optional dtype attribute (0 or absent: nullopt).
std::optional<DType> dtype_attribute(LoweringContext& ctx, const graph::Node& node,
                                     const std::string& name) {
  int64_t code = node.attr_int(name, 0);
  if (code == 0) return std::nullopt;
  std::optional<DType> dtype = graph::dtype_from_onnx(static_cast<int32_t>(code));
  if (!dtype) ctx.fail(fmt::format("attribute '{}' names an unknown type {}", name, code));
  return dtype;
}

/// The output type of QuantizeLinear: attribute output_dtype (opset 21), else the zero point's
/// type, else uint8; both given must agree.
DType quantize_output_dtype(LoweringContext& ctx, const graph::Node& node,
                            const TensorValue* zero_point) {
  std::optional<DType> attribute = dtype_attribute(ctx, node, "output_dtype");
  if (attribute && zero_point != nullptr && zero_point->dtype != *attribute) {
    ctx.fail(fmt::format("output_dtype {} differs from y_zero_point's type {}",
                         graph::dtype_name(*attribute), graph::dtype_name(zero_point->dtype)));
  }
  if (attribute) return *attribute;
  return zero_point != nullptr ? zero_point->dtype : DType::kUInt8;
}

std::vector<TensorValue> lower_quantize(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "x");
  const TensorValue& scale = required_input(ctx, inputs, 1, "y_scale");
  const TensorValue* zero_point = optional_input(inputs, 2);
  require_dtype(ctx, x.dtype, kFloats, "input 'x'");
  const DType out = quantize_output_dtype(ctx, node, zero_point);
  require_quantized(ctx, out);
  const QuantLayout layout = quant_layout(ctx, node, x, {&scale, zero_point});
  // Opset 23's precision: the type x / y_scale is computed in (default: x's compute type).
  DType f = compute_dtype(x.dtype);
  if (std::optional<DType> precision = dtype_attribute(ctx, node, "precision")) {
    if (*precision != DType::kFloat32 && *precision != DType::kFloat64) {
      ctx.fail(fmt::format("precision {} is not supported (expected float32 or float64)",
                           graph::dtype_name(*precision)));
    }
    f = *precision;
  }
  const bool small_float = graph::is_small_float(out);
  const bool saturate = out != DType::kFloat4E2M1 && node.attr_int("saturate", 1) != 0;
  TensorValue y = ctx.pointwise(out, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId s = body.cast(quant_param(ctx, body, scale, i, layout), f);
    ValueId v = body.binary(OpCode::kDiv, body.cast(ctx.load_at(body, x, i), f), s);
    ValueId zp = zero_point != nullptr ? quant_param(ctx, body, *zero_point, i, layout)
                                       : body.constant(0, out);
    if (small_float) return quantize_small_float(body, v, zp, out, saturate);
    return quantize_value(body, v, zp, out, quantized_range(ctx, out));
  });
  // Float8 / float4 results round where they are stored (see cast_value).
  if (small_float) y = ctx.realize(y, "a quantization to float8 or float4 rounds where stored");
  return {y};
}

std::vector<TensorValue> lower_dequantize(LoweringContext& ctx, const graph::Node& node,
                                          const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "x");
  const TensorValue& scale = required_input(ctx, inputs, 1, "x_scale");
  const TensorValue* zero_point = optional_input(inputs, 2);
  require_quantized(ctx, x.dtype);
  require_dtype(ctx, scale.dtype, kFloats, "input 'x_scale'");
  const QuantLayout layout = quant_layout(ctx, node, x, {&scale, zero_point});
  // Opset 23's output_dtype (default: the scale's type).
  const DType out = dtype_attribute(ctx, node, "output_dtype").value_or(scale.dtype);
  require_dtype(ctx, out, kFloats, "attribute 'output_dtype'");
  const DType f = compute_dtype(scale.dtype);
  return {ctx.pointwise(out, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId v = body.cast(ctx.load_at(body, x, i), f);
    if (zero_point != nullptr) {
      v = body.binary(OpCode::kSub, v,
                      body.cast(quant_param(ctx, body, *zero_point, i, layout), f));
    }
    ValueId s = body.cast(quant_param(ctx, body, scale, i, layout), f);
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

// --- Integer matrix products and convolutions ------------------------------------------------

/// A zero point's element for a position along its axis (scalar / one element: per tensor), as
/// int32; 0 when absent.
ValueId zero_point_at(LoweringContext& ctx, LoopBody& body, const TensorValue* zp,
                      const Expr& position) {
  if (zp == nullptr) return body.constant(0, DType::kInt32);
  return body.cast(param_at(ctx, body, *zp, position), DType::kInt32);
}

/// sum_k (a[.., m, k] - a_zp[m]) * (b[.., k, n] - b_zp[n]) in int32, numpy-matmul shapes.
TensorValue integer_matmul(LoweringContext& ctx, const TensorValue& a, const TensorValue& b,
                           const TensorValue* a_zp, const TensorValue* b_zp) {
  if (a.rank() < 2 || b.rank() < 2) ctx.fail("expected inputs of rank >= 2");
  const size_t ra = a.rank(), rb = b.rank();
  std::vector<Expr> batch =
      ctx.broadcast_shapes({std::vector<Expr>(a.shape.begin(), a.shape.end() - 2),
                            std::vector<Expr>(b.shape.begin(), b.shape.end() - 2)});
  std::vector<Expr> shape = batch;
  shape.push_back(a.shape[ra - 2]);
  shape.push_back(b.shape[rb - 1]);
  return ctx.reduction(
      DType::kInt32, shape, {a.shape[ra - 1]}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& o, const std::vector<Expr>& r) {
        std::vector<Expr> bi(o.begin(), o.end() - 2);
        const Expr& m = o[o.size() - 2];
        const Expr& n = o.back();
        auto ai = LoweringContext::broadcast_index(bi, {a.shape.begin(), a.shape.end() - 2});
        auto bj = LoweringContext::broadcast_index(bi, {b.shape.begin(), b.shape.end() - 2});
        ai.push_back(m);
        ai.push_back(r[0]);
        bj.push_back(r[0]);
        bj.push_back(n);
        ValueId av = body.binary(OpCode::kSub, body.cast(ctx.load_at(body, a, ai), DType::kInt32),
                                 zero_point_at(ctx, body, a_zp, m));
        ValueId bv = body.binary(OpCode::kSub, body.cast(ctx.load_at(body, b, bj), DType::kInt32),
                                 zero_point_at(ctx, body, b_zp, n));
        return body.binary(OpCode::kMul, av, bv);
      });
}

/// sum over input channels of the group and kernel taps of (x - x_zp) * (w - w_zp[m]), int32.
TensorValue integer_conv(LoweringContext& ctx, const graph::Node& node, const TensorValue& x,
                         const TensorValue& w, const TensorValue* x_zp, const TensorValue* w_zp) {
  if (x.rank() < 3 || w.rank() != x.rank()) ctx.fail("expected X and W of the same rank >= 3");
  const size_t n = x.rank() - 2;
  std::vector<int64_t> kernel;
  for (size_t d = 0; d < n; ++d)
    kernel.push_back(require_static_dim(ctx, w.shape[2 + d], "kernel"));
  const int64_t group = node.attr_int("group", 1);
  std::vector<Expr> spatial(x.shape.begin() + 2, x.shape.end());
  WindowGeometry g = window_geometry(ctx, node, spatial, kernel, false);
  std::vector<Expr> shape = {x.shape[0], w.shape[0]};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  const Expr out_group = ctx.analyzer().simplify(sym::floor_div(w.shape[0], Expr(group)));
  std::vector<Expr> reduce_shape = {w.shape[1]};
  for (int64_t k : g.kernel) reduce_shape.emplace_back(k);
  return ctx.reduction(
      DType::kInt32, shape, reduce_shape, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& o, const std::vector<Expr>& r) {
        Expr c = sym::floor_div(o[1], out_group) * w.shape[1] + r[0];
        std::vector<Expr> xi = {o[0], c}, wi = {o[1], r[0]};
        ValueId mask = ir::kNoValue;
        for (size_t d = 0; d < n; ++d) {
          Expr i = o[2 + d] * g.strides[d] - g.pads[d] + r[1 + d] * g.dilations[d];
          if (g.pads[d] != 0 || g.pads[n + d] != 0) {
            mask = and_mask(body, mask, in_range(body, i, Expr(0), x.shape[2 + d]));
          }
          xi.push_back(i);
          wi.push_back(r[1 + d]);
        }
        ValueId xzp = zero_point_at(ctx, body, x_zp, Expr(0));
        ValueId xv = body.cast(ctx.load_at(body, x, xi), DType::kInt32);
        if (mask != ir::kNoValue) {
          // Padding holds the zero point, so it contributes nothing.
          xv = body.where(mask, body.cast(load_masked(ctx, body, x, xi, mask, 0), DType::kInt32),
                          xzp);
        }
        ValueId wv = body.binary(OpCode::kSub, body.cast(ctx.load_at(body, w, wi), DType::kInt32),
                                 zero_point_at(ctx, body, w_zp, o[1]));
        return body.binary(OpCode::kMul, body.binary(OpCode::kSub, xv, xzp), wv);
      });
}

std::vector<TensorValue> lower_matmul_integer(LoweringContext& ctx, const graph::Node&,
                                              const LowerInputs& inputs) {
  return {integer_matmul(ctx, required_input(ctx, inputs, 0, "A"),
                         required_input(ctx, inputs, 1, "B"), optional_input(inputs, 2),
                         optional_input(inputs, 3))};
}

std::vector<TensorValue> lower_conv_integer(LoweringContext& ctx, const graph::Node& node,
                                            const LowerInputs& inputs) {
  return {integer_conv(ctx, node, required_input(ctx, inputs, 0, "x"),
                       required_input(ctx, inputs, 1, "w"), optional_input(inputs, 2),
                       optional_input(inputs, 3))};
}

/// A float scale (scalar or 1-D) at `position`.
ValueId scale_at(LoweringContext& ctx, LoopBody& body, const TensorValue& s, const Expr& position) {
  return body.cast(param_at(ctx, body, s, position), DType::kFloat32);
}

/// y = saturate(round(acc * a_scale * b_scale / y_scale) + y_zp), with `scales(body, o)`
/// giving a_scale * b_scale at output index o (per tensor or per output channel).
TensorValue requantize(LoweringContext& ctx, const TensorValue& acc, const TensorValue& y_scale,
                       const TensorValue& y_zp,
                       const std::function<ValueId(LoopBody&, const std::vector<Expr>&)>& scales) {
  const DType out = y_zp.dtype;
  const auto range = quantized_range(ctx, out);
  return ctx.pointwise(out, acc.shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    const DType f = DType::kFloat32;
    ValueId v = body.cast(ctx.load_at(body, acc, o), f);
    ValueId ys = scale_at(ctx, body, y_scale, Expr(0));
    v = body.binary(OpCode::kDiv, body.binary(OpCode::kMul, v, scales(body, o)), ys);
    return quantize_value(body, v, zero_point_at(ctx, body, &y_zp, Expr(0)), out, range);
  });
}

std::vector<TensorValue> lower_qlinear_matmul(LoweringContext& ctx, const graph::Node&,
                                              const LowerInputs& inputs) {
  const TensorValue& a = required_input(ctx, inputs, 0, "a");
  const TensorValue& a_scale = required_input(ctx, inputs, 1, "a_scale");
  const TensorValue& b = required_input(ctx, inputs, 3, "b");
  const TensorValue& b_scale = required_input(ctx, inputs, 4, "b_scale");
  const TensorValue& y_scale = required_input(ctx, inputs, 6, "y_scale");
  const TensorValue& y_zp = required_input(ctx, inputs, 7, "y_zero_point");
  TensorValue acc = integer_matmul(ctx, a, b, optional_input(inputs, 2), optional_input(inputs, 5));
  return {requantize(ctx, acc, y_scale, y_zp, [&](LoopBody& body, const std::vector<Expr>& o) {
    return body.binary(OpCode::kMul, scale_at(ctx, body, a_scale, o[o.size() - 2]),
                       scale_at(ctx, body, b_scale, o.back()));
  })};
}

std::vector<TensorValue> lower_qlinear_conv(LoweringContext& ctx, const graph::Node& node,
                                            const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "x");
  const TensorValue& x_scale = required_input(ctx, inputs, 1, "x_scale");
  const TensorValue& w = required_input(ctx, inputs, 3, "w");
  const TensorValue& w_scale = required_input(ctx, inputs, 4, "w_scale");
  const TensorValue& y_scale = required_input(ctx, inputs, 6, "y_scale");
  const TensorValue& y_zp = required_input(ctx, inputs, 7, "y_zero_point");
  const TensorValue* bias = optional_input(inputs, 8);
  TensorValue acc =
      integer_conv(ctx, node, x, w, optional_input(inputs, 2), optional_input(inputs, 5));
  if (bias != nullptr) {
    acc = ctx.pointwise(DType::kInt32, acc.shape, [&](LoopBody& body, const std::vector<Expr>& o) {
      ValueId bv = body.cast(ctx.load_at(body, *bias, {o[1]}), DType::kInt32);
      return body.binary(OpCode::kAdd, ctx.load_at(body, acc, o), bv);
    });
  }
  return {requantize(ctx, acc, y_scale, y_zp, [&](LoopBody& body, const std::vector<Expr>& o) {
    return body.binary(OpCode::kMul, scale_at(ctx, body, x_scale, Expr(0)),
                       scale_at(ctx, body, w_scale, o[1]));
  })};
}

}  // namespace

void register_quantize_ops(Registry& registry) {
  registry.add("", "MatMulInteger", {lower_matmul_integer, 10, 17});
  registry.add("", "ConvInteger", {lower_conv_integer, 10, 17});
  registry.add("", "QLinearMatMul", {lower_qlinear_matmul, 10, 17});
  registry.add("", "QLinearConv", {lower_qlinear_conv, 10, 17});
  registry.add("", "QuantizeLinear", {lower_quantize, 10, 25});
  registry.add("", "DequantizeLinear", {lower_dequantize, 10, 25});
  registry.add("", "DynamicQuantizeLinear", {lower_dynamic_quantize, 11, 17});
}

}  // namespace kiln::lower
