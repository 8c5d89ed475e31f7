/// ConvTranspose through the loop IR: each output element is a reduction over the input channels
/// of its group and the kernel taps whose input position (o + pad - k * dilation) / stride is a
/// whole number inside the input, plus the bias. Output sizes follow the ONNX formula, from
/// output_shape (with the padding it implies), auto_pad (SAME_UPPER / SAME_LOWER / VALID) or pads
/// and output_padding.
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <cstdint>
#include <string>
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

struct TransposeGeometry {
  std::vector<int64_t> kernel, strides, dilations, pad_begin;
  std::vector<Expr> out;
};

TransposeGeometry transpose_geometry(LoweringContext& ctx, const graph::Node& node,
                                     const std::vector<Expr>& in, std::vector<int64_t> kernel) {
  const size_t n = in.size();
  TransposeGeometry g;
  g.kernel = node.attr_ints("kernel_shape", kernel);
  g.strides = node.attr_ints("strides", std::vector<int64_t>(n, 1));
  g.dilations = node.attr_ints("dilations", std::vector<int64_t>(n, 1));
  std::vector<int64_t> pads = node.attr_ints("pads", std::vector<int64_t>(2 * n, 0));
  std::vector<int64_t> out_pad = node.attr_ints("output_padding", std::vector<int64_t>(n, 0));
  std::vector<int64_t> out_shape = node.attr_ints("output_shape", {});
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  if (g.kernel.size() != n || g.strides.size() != n || g.dilations.size() != n ||
      pads.size() != 2 * n || out_pad.size() != n) {
    ctx.fail(
        fmt::format("kernel_shape, strides, dilations, output_padding (one per spatial dim, "
                    "{}) and pads ({}) do not match the input",
                    n, 2 * n));
  }
  if (!out_shape.empty() && out_shape.size() != n) {
    if (out_shape.size() != n + 2) ctx.fail("output_shape must give the spatial sizes");
    out_shape.erase(out_shape.begin(), out_shape.begin() + 2);
  }
  for (size_t d = 0; d < n; ++d) {
    const int64_t span = (g.kernel[d] - 1) * g.dilations[d] + 1;
    Expr full = (in[d] - 1) * g.strides[d] + out_pad[d] + span;  // output with no padding
    if (!out_shape.empty() || (auto_pad != "NOTSET" && auto_pad != "VALID")) {
      Expr target = out_shape.empty() ? in[d] * g.strides[d] : Expr(out_shape[d]);
      auto total = ctx.analyzer().simplify(full - target).as_integer();
      if (!total) ctx.fail("the padding implied by output_shape or auto_pad must be static");
      // SAME_LOWER puts the larger half first; output_shape and SAME_UPPER put it last.
      int64_t first = auto_pad == "SAME_LOWER" ? *total - *total / 2 : *total / 2;
      g.pad_begin.push_back(first);
      g.out.push_back(target);
    } else {
      if (auto_pad == "VALID") pads[d] = pads[n + d] = 0;
      g.pad_begin.push_back(pads[d]);
      g.out.push_back(ctx.analyzer().simplify(full - pads[d] - pads[n + d]));
    }
  }
  return g;
}

std::vector<TensorValue> lower_conv_transpose(LoweringContext& ctx, const graph::Node& node,
                                              const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& w = required_input(ctx, inputs, 1, "W");
  const TensorValue* bias = optional_input(inputs, 2);
  require_dtype(ctx, x.dtype, kFloats, "input 'X'");
  if (x.rank() < 3 || w.rank() != x.rank()) {
    ctx.fail(fmt::format("expected X and W of the same rank >= 3, found ranks {} and {}", x.rank(),
                         w.rank()));
  }
  const size_t n = x.rank() - 2;
  const int64_t group = node.attr_int("group", 1);
  if (group < 1) ctx.fail(fmt::format("expected group >= 1, found {}", group));
  std::vector<int64_t> kernel;
  for (size_t d = 0; d < n; ++d)
    kernel.push_back(require_static_dim(ctx, w.shape[2 + d], "kernel"));
  std::vector<Expr> spatial(x.shape.begin() + 2, x.shape.end());
  TransposeGeometry g = transpose_geometry(ctx, node, spatial, kernel);
  const Expr in_group = ctx.analyzer().simplify(sym::floor_div(x.shape[1], Expr(group)));
  const Expr out_group = w.shape[1];
  std::vector<Expr> shape = {x.shape[0], w.shape[1] * group};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  std::vector<Expr> reduce_shape = {in_group};
  for (int64_t k : g.kernel) reduce_shape.emplace_back(k);
  const DType acc = compute_dtype(x.dtype);
  TensorValue sum = ctx.reduction(
      acc, shape, reduce_shape, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& o, const std::vector<Expr>& r) {
        Expr g_index = sym::floor_div(o[1], out_group);
        Expr c = g_index * in_group + r[0];
        std::vector<Expr> xi = {o[0], c}, wi = {c, sym::mod(o[1], out_group)};
        ValueId mask = ir::kNoValue;
        for (size_t d = 0; d < n; ++d) {
          Expr t = o[2 + d] + g.pad_begin[d] - r[1 + d] * g.dilations[d];
          Expr i = sym::floor_div(t, Expr(g.strides[d]));
          if (g.strides[d] != 1) {
            ValueId rem = body.index_expr(sym::mod(t, Expr(g.strides[d])));
            mask = and_mask(body, mask,
                            body.binary(OpCode::kEq, rem, body.constant(0, DType::kInt64)));
          }
          mask = and_mask(body, mask, in_range(body, i, Expr(0), x.shape[2 + d]));
          xi.push_back(i);
          wi.push_back(r[1 + d]);
        }
        ValueId xv = body.cast(load_masked(ctx, body, x, xi, mask, 0), acc);
        ValueId wv = body.cast(ctx.load_at(body, w, wi), acc);
        return body.binary(OpCode::kMul, xv, wv);
      });
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    ValueId v = ctx.load_at(body, sum, o);
    if (bias != nullptr)
      v = body.binary(OpCode::kAdd, v, body.cast(ctx.load_at(body, *bias, {o[1]}), acc));
    return body.cast(v, x.dtype);
  })};
}

}  // namespace

void register_conv_transpose_ops(Registry& registry) {
  registry.add("", "ConvTranspose", {lower_conv_transpose, 1, 17});
}

}  // namespace kiln::lower
