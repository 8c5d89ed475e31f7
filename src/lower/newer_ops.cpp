/// Smaller ops of opsets 18 and later, and of ai.onnx.ml, through the loop IR (so that they fuse
/// with their neighbours): SwiGLU (28), CausalConvWithState (27), TensorScatter (24), AffineGrid
/// (20), DeformConv (19, 2-D), Col2Im (18) and ai.onnx.ml's Binarizer, ArrayFeatureExtractor and
/// TreeEnsemble.
///
/// Tests: the ONNX 1.23 node suite (tests/onnx/new_types_cases.txt lists some of its cases).

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <functional>
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

/// SwiGLU-28: a * sigmoid(alpha * a) * b (a and b broadcast).
std::vector<TensorValue> lower_swiglu(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  const TensorValue& a = required_input(ctx, inputs, 0, "A");
  const TensorValue& b = required_input(ctx, inputs, 1, "B");
  require_dtype(ctx, a.dtype, kFloats, "input A");
  const DType dtype = common_dtype(ctx, {&a, &b});
  const double alpha = node.attr_float("alpha", 1.0f);
  const DType cd = compute_dtype(dtype);
  return {broadcast_map(ctx, {&a, &b}, dtype, [&](LoopBody& body, const std::vector<ValueId>& e) {
    ValueId x = body.cast(e[0], cd);
    ValueId gate =
        body.unary(OpCode::kSigmoid, body.binary(OpCode::kMul, body.constant(alpha, cd), x));
    ValueId y = body.binary(OpCode::kMul, body.binary(OpCode::kMul, x, gate), body.cast(e[1], cd));
    return body.cast(y, dtype);
  })};
}

/// TensorScatter-24: the cache with `update` written along `axis` from write_indices[batch]
/// (0 when absent) on; mode 'circular' wraps the positions modulo the cache's length.
std::vector<TensorValue> lower_tensor_scatter(LoweringContext& ctx, const graph::Node& node,
                                              const LowerInputs& inputs) {
  const TensorValue& cache = required_input(ctx, inputs, 0, "past_cache");
  const TensorValue& update = required_input(ctx, inputs, 1, "update");
  const TensorValue* indices = optional_input(inputs, 2);
  const std::string mode = node.attr_string("mode", "linear");
  if (mode != "linear" && mode != "circular") {
    ctx.fail(fmt::format("attribute 'mode' must be linear or circular, found '{}'", mode));
  }
  const size_t rank = cache.rank();
  if (rank < 2 || update.rank() != rank) {
    ctx.fail(fmt::format("past_cache and update must have one rank >= 2, found {} and {}", rank,
                         update.rank()));
  }
  if (update.dtype != cache.dtype) ctx.fail("past_cache and update must have one dtype");
  const size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", -2), static_cast<int64_t>(rank)));
  if (axis == 0) ctx.fail("attribute 'axis' must not be the batch axis 0");
  for (size_t d = 0; d < rank; ++d) {
    if (d != axis && cache.shape[d].is_integer() && update.shape[d].is_integer() &&
        cache.shape[d] != update.shape[d]) {
      ctx.fail(fmt::format("update's dim {} is {}, past_cache's {}", d, update.shape[d].str(),
                           cache.shape[d].str()));
    }
  }
  if (indices != nullptr && (indices->rank() != 1 || !graph::is_integer(indices->dtype))) {
    ctx.fail("write_indices must be a 1-D integer tensor [batch]");
  }
  const Expr length = cache.shape[axis], count = update.shape[axis];
  return {ctx.pointwise(cache.dtype, cache.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    const DType i64 = DType::kInt64;
    // Which element of the update lands here: j = position - write index (mod the length).
    ValueId j = body.index_expr(i[axis]);
    if (indices != nullptr) {
      j = body.binary(OpCode::kSub, j, body.cast(ctx.load_at(body, *indices, {i[0]}), i64));
    }
    if (mode == "circular") j = body.binary(OpCode::kFloorMod, j, body.index_expr(length));
    ValueId inside = body.binary(OpCode::kAnd, body.binary(OpCode::kGe, j, body.constant(0, i64)),
                                 body.binary(OpCode::kLt, j, body.index_expr(count)));
    ValueId clamped =
        body.binary(OpCode::kMinimum, body.binary(OpCode::kMaximum, j, body.constant(0, i64)),
                    body.binary(OpCode::kSub, body.index_expr(count), body.constant(1, i64)));
    std::vector<Expr> at = i;
    at[axis] = body.op(body.indirect(clamped, count)).symbol;
    ValueId written = ctx.load_at(body, update, at);
    return body.where(inside, written, ctx.load_at(body, cache, i));
  })};
}

/// AffineGrid-20: for theta [N, 2, 3] (or [N, 3, 4]) and size [N, C, H, W] (or [N, C, D, H, W]),
/// the grid [N, H, W, 2] (or [N, D, H, W, 3]) of theta @ (x, y[, z], 1), where x, y, z run over
/// [-1, 1]: through the pixel centres, or the corner pixels with align_corners.
std::vector<TensorValue> lower_affine_grid(LoweringContext& ctx, const graph::Node& node,
                                           const LowerInputs& inputs) {
  const TensorValue& theta = required_input(ctx, inputs, 0, "theta");
  const TensorValue& size_input = required_input(ctx, inputs, 1, "size");
  require_dtype(ctx, theta.dtype, kFloats, "input theta");
  std::vector<int64_t> size = require_static_ints(ctx, size_input, "input 'size'");
  if (size.size() != 4 && size.size() != 5) {
    ctx.fail(
        fmt::format("input 'size' must hold 4 (2-D) or 5 (3-D) values, found {}", size.size()));
  }
  const size_t dims = size.size() - 2;  // 2 or 3 spatial dims
  if (theta.rank() != 3 || theta.shape[1] != Expr(static_cast<int64_t>(dims)) ||
      theta.shape[2] != Expr(static_cast<int64_t>(dims + 1))) {
    ctx.fail(fmt::format("theta must be [N, {}, {}] for {}-D sizes, found {}", dims, dims + 1, dims,
                         graph::shape_str(theta.shape)));
  }
  const bool align = node.attr_int("align_corners", 0) != 0;
  std::vector<Expr> shape = {theta.shape[0]};
  for (size_t d = 0; d < dims; ++d) shape.emplace_back(size[2 + d]);
  shape.emplace_back(static_cast<int64_t>(dims));
  const DType f = DType::kFloat64;
  return {ctx.pointwise(theta.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    FloatMath m{body, f};
    // The base coordinates, x first: x along the last spatial dim, then y, then z.
    std::vector<ValueId> base;
    for (size_t k = 0; k < dims; ++k) {
      const size_t d = dims - 1 - k;  // spatial dim (0-based) of coordinate k
      const int64_t n = size[2 + d];
      ValueId pos = body.cast(body.index_expr(i[1 + d]), f);
      ValueId v = align ? (n == 1 ? m.c(-1) : m.add(m.c(-1), m.mul(pos, m.c(2.0 / (n - 1)))))
                        : m.add(m.c(-1), m.div(m.add(m.mul(pos, m.c(2)), m.c(1)), m.c(n)));
      base.push_back(v);
    }
    base.push_back(m.c(1));
    ValueId sum = m.c(0);
    for (size_t j = 0; j <= dims; ++j) {
      ValueId t = body.cast(ctx.load_at(body, theta, {i[0], i.back(), Expr(int64_t(j))}), f);
      sum = m.add(sum, m.mul(t, base[j]));
    }
    return body.cast(sum, theta.dtype);
  })};
}

/// Col2Im-18: input [N, C * prod(block), L] of columns back into an image [N, C, image...]:
/// each image element sums the column entries of every block position and kernel offset that
/// land on it (position * stride - pad + offset * dilation).
std::vector<TensorValue> lower_col2im(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  std::vector<int64_t> image =
      require_static_ints(ctx, required_input(ctx, inputs, 1, "image_shape"), "'image_shape'");
  std::vector<int64_t> block =
      require_static_ints(ctx, required_input(ctx, inputs, 2, "block_shape"), "'block_shape'");
  const size_t n = image.size();
  if (n == 0 || block.size() != n) {
    ctx.fail(
        fmt::format("image_shape and block_shape must have one non-zero length, found {} "
                    "and {}",
                    image.size(), block.size()));
  }
  if (x.rank() != 3) ctx.fail(fmt::format("input must be 3-D, found rank {}", x.rank()));
  auto ints = [&](const char* name, int64_t fallback, size_t count) {
    std::vector<int64_t> v = node.attr_ints(name, std::vector<int64_t>(count, fallback));
    if (v.size() != count) {
      ctx.fail(fmt::format("attribute '{}' has {} values, expected {}", name, v.size(), count));
    }
    return v;
  };
  const std::vector<int64_t> dilations = ints("dilations", 1, n), strides = ints("strides", 1, n),
                             pads = ints("pads", 0, 2 * n);
  int64_t kernel = 1;
  std::vector<int64_t> blocks;  // block positions per dim
  for (size_t d = 0; d < n; ++d) {
    kernel *= block[d];
    const int64_t span = dilations[d] * (block[d] - 1) + 1;
    blocks.push_back((image[d] + pads[d] + pads[n + d] - span) / strides[d] + 1);
  }
  int64_t positions = 1;
  for (int64_t b : blocks) positions *= b;
  const int64_t rows = require_static_dim(ctx, x.shape[1], "dim 1 of the input");
  if (rows % kernel != 0) {
    ctx.fail(fmt::format("dim 1 of the input ({}) is not a multiple of the block size {}", rows,
                         kernel));
  }
  if (x.shape[2] != Expr(positions)) {
    ctx.fail(fmt::format("dim 2 of the input is {}, the image has {} block positions",
                         x.shape[2].str(), positions));
  }
  std::vector<Expr> shape = {x.shape[0], Expr(rows / kernel)};
  for (int64_t s : image) shape.emplace_back(s);
  std::vector<Expr> offsets(block.begin(), block.end());
  TensorValue out = ctx.reduction(
      compute_dtype(x.dtype), shape, offsets, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        ValueId mask = ir::kNoValue;
        Expr row = i[1], column = 0;
        for (size_t d = 0; d < n; ++d) {
          // The block position p with p * stride - pad + r * dilation = image index.
          const Expr t = i[2 + d] + pads[d] - r[d] * dilations[d];
          const Expr p = sym::floor_div(t, Expr(strides[d]));
          row = row * block[d] + r[d];
          column = column * blocks[d] + p;
          mask = and_mask(body, mask, in_range(body, p, 0, blocks[d]));
          if (strides[d] != 1) {
            ValueId exact = body.binary(OpCode::kEq, body.index_expr(sym::mod(t, Expr(strides[d]))),
                                        body.constant(0, DType::kInt64));
            mask = and_mask(body, mask, exact);
          }
        }
        return body.cast(load_masked(ctx, body, x, {i[0], row, column}, mask, 0),
                         compute_dtype(x.dtype));
      });
  if (compute_dtype(x.dtype) == x.dtype) return {out};
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    return body.cast(ctx.load_at(body, out, i), x.dtype);
  })};
}

/// CausalConvWithState-27: a depthwise 1-D convolution (weight [C, 1, k]) over the input
/// left-padded with past_state [B, C, k - 1] (zeros when absent), plus bias, optionally followed by
/// SiLU (activation 'silu' or 'swish', in float32); present_state is the last k - 1 columns of the
/// padded input.
std::vector<TensorValue> lower_causal_conv_with_state(LoweringContext& ctx, const graph::Node& node,
                                                      const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const TensorValue& w = required_input(ctx, inputs, 1, "weight");
  const TensorValue* bias = optional_input(inputs, 2);
  const TensorValue* past = optional_input(inputs, 3);
  require_dtype(ctx, x.dtype, kFloats, "input 'input'");
  const std::string activation = node.attr_string("activation", "none");
  if (activation != "none" && activation != "silu" && activation != "swish") {
    ctx.fail(
        fmt::format("attribute 'activation' must be none, silu or swish, found '{}'", activation));
  }
  if (x.rank() != 3)
    ctx.fail(
        fmt::format("input must be 3-D [batch, channels, length], found "
                    "rank {}",
                    x.rank()));
  if (w.rank() != 3 || w.shape[1] != Expr(1)) {
    ctx.fail(fmt::format("weight must be [channels, 1, k], found {}", graph::shape_str(w.shape)));
  }
  const int64_t k = require_static_dim(ctx, w.shape[2], "the kernel size");
  if (k < 1) ctx.fail("the kernel size must be at least 1");
  if (past != nullptr && (past->rank() != 3 || past->shape[2] != Expr(k - 1))) {
    ctx.fail(fmt::format("past_state must be [batch, channels, {}], found {}", k - 1,
                         graph::shape_str(past->shape)));
  }
  const Expr length = x.shape[2];
  // The padded input [B, C, k - 1 + L].
  TensorValue padded = ctx.pointwise(
      x.dtype, {x.shape[0], x.shape[1], length + (k - 1)},
      [&](LoopBody& body, const std::vector<Expr>& i) {
        ValueId from_input = in_range(body, i[2], Expr(k - 1), length + (k - 1));
        ValueId v = load_masked(ctx, body, x, {i[0], i[1], i[2] - (k - 1)}, from_input, 0);
        if (past == nullptr || k == 1) return v;
        ValueId from_past = in_range(body, i[2], Expr(0), Expr(k - 1));
        return body.where(from_past, load_masked(ctx, body, *past, i, from_past, 0), v);
      });
  const DType cd = compute_dtype(x.dtype);
  TensorValue conv = ctx.reduction(
      cd, x.shape, {Expr(k)}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        ValueId a = body.cast(ctx.load_at(body, padded, {i[0], i[1], i[2] + r[0]}), cd);
        ValueId b = body.cast(ctx.load_at(body, w, {i[1], Expr(0), r[0]}), cd);
        return body.binary(OpCode::kMul, a, b);
      });
  TensorValue y = ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId v = ctx.load_at(body, conv, i);
    if (bias != nullptr)
      v = body.binary(OpCode::kAdd, v, body.cast(ctx.load_at(body, *bias, {i[1]}), cd));
    // The convolution's result is rounded to the input's type before the activation.
    v = body.cast(v, x.dtype);
    if (activation == "none") return v;
    ValueId f = body.cast(v, DType::kFloat32);
    return body.cast(body.binary(OpCode::kMul, f, body.unary(OpCode::kSigmoid, f)), x.dtype);
  });
  TensorValue present = make_view(ctx, padded, {x.shape[0], x.shape[1], Expr(k - 1)},
                                  [length](const std::vector<Expr>& i) {
                                    return std::vector<Expr>{i[0], i[1], i[2] + length};
                                  });
  return {y, present};
}

/// DeformConv-19 (2-D): a grouped convolution whose kernel taps are displaced per output position
/// by `offset` [N, offset_group * kH * kW * 2, oH, oW] ((dy, dx) per tap) and weighed by `mask`
/// [N, offset_group * kH * kW, oH, oW] (ones when absent); each displaced tap reads X bilinearly,
/// corners outside X counting 0.
std::vector<TensorValue> lower_deform_conv(LoweringContext& ctx, const graph::Node& node,
                                           const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& w = required_input(ctx, inputs, 1, "W");
  const TensorValue& offset = required_input(ctx, inputs, 2, "offset");
  const TensorValue* bias = optional_input(inputs, 3);
  const TensorValue* mask = optional_input(inputs, 4);
  require_dtype(ctx, x.dtype, kFloats, "input X");
  if (x.rank() != 4 || w.rank() != 4 || offset.rank() != 4) {
    ctx.fail(
        fmt::format("X, W and offset must be 4-D (2-D deformable convolution), found ranks "
                    "{}, {} and {}",
                    x.rank(), w.rank(), offset.rank()));
  }
  const int64_t group = node.attr_int("group", 1), offset_group = node.attr_int("offset_group", 1);
  const int64_t channels = require_static_dim(ctx, x.shape[1], "X's channels");
  const int64_t out_channels = require_static_dim(ctx, w.shape[0], "W's output channels");
  const int64_t per_group = require_static_dim(ctx, w.shape[1], "W's input channels");
  const int64_t kh = require_static_dim(ctx, w.shape[2], "the kernel height");
  const int64_t kw = require_static_dim(ctx, w.shape[3], "the kernel width");
  if (group < 1 || offset_group < 1 || per_group * group != channels || out_channels % group != 0 ||
      channels % offset_group != 0) {
    ctx.fail(fmt::format("group {} and offset_group {} do not fit X's {} channels and W {}", group,
                         offset_group, channels, graph::shape_str(w.shape)));
  }
  if (node.attr_ints("kernel_shape", {kh, kw}) != std::vector<int64_t>{kh, kw}) {
    ctx.fail("attribute 'kernel_shape' differs from W's kernel");
  }
  if (offset.shape[1] != Expr(offset_group * kh * kw * 2)) {
    ctx.fail(fmt::format("offset has {} channels, expected offset_group * kH * kW * 2 = {}",
                         offset.shape[1].str(), offset_group * kh * kw * 2));
  }
  const std::vector<int64_t> strides = node.attr_ints("strides", {1, 1}),
                             dilations = node.attr_ints("dilations", {1, 1}),
                             pads = node.attr_ints("pads", {0, 0, 0, 0});
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4) {
    ctx.fail("attributes 'strides', 'dilations' and 'pads' must have 2, 2 and 4 values");
  }
  const int64_t out_per_group = out_channels / group, per_offset_group = channels / offset_group;
  const DType cd = compute_dtype(x.dtype), f = DType::kFloat64;
  std::vector<Expr> shape = {x.shape[0], Expr(out_channels), offset.shape[2], offset.shape[3]};
  TensorValue sum = ctx.reduction(
      cd, shape, {Expr(per_group), Expr(kh), Expr(kw)}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        FloatMath m{body, f};
        const Expr ic = sym::floor_div(i[1], Expr(out_per_group)) * per_group + r[0];
        const Expr og = sym::floor_div(ic, Expr(per_offset_group));
        const Expr tap = (og * kh + r[1]) * kw + r[2];
        auto displaced = [&](int c, const Expr& base) {
          ValueId d = body.cast(ctx.load_at(body, offset, {i[0], tap * 2 + c, i[2], i[3]}), f);
          return m.add(body.cast(body.index_expr(base), f), d);
        };
        ValueId y = displaced(0, i[2] * strides[0] - pads[0] + r[1] * dilations[0]);
        ValueId xx = displaced(1, i[3] * strides[1] - pads[1] + r[2] * dilations[1]);
        ValueId y0 = m.floor(y), x0 = m.floor(xx);
        ValueId ly = m.sub(y, y0), lx = m.sub(xx, x0);
        // X[n, ic] at the whole-number corner (yc, xc), 0 outside.
        auto corner = [&](ValueId yc, ValueId xc) {
          ValueId inside = ir::kNoValue;
          std::vector<Expr> at = {i[0], ic};
          for (auto [v, d] : {std::pair{yc, size_t{2}}, std::pair{xc, size_t{3}}}) {
            ValueId k = body.cast(v, DType::kInt64);
            ValueId n = body.index_expr(x.shape[d]);
            inside =
                and_mask(body, inside,
                         body.binary(OpCode::kAnd,
                                     body.binary(OpCode::kGe, k, body.constant(0, DType::kInt64)),
                                     body.binary(OpCode::kLt, k, n)));
            ValueId clamped = body.binary(
                OpCode::kMinimum, body.binary(OpCode::kMaximum, k, body.constant(0, DType::kInt64)),
                body.binary(OpCode::kSub, n, body.constant(1, DType::kInt64)));
            at.push_back(body.op(body.indirect(clamped, x.shape[d])).symbol);
          }
          return body.where(inside, body.cast(ctx.load_at(body, x, at), f), m.c(0));
        };
        ValueId y1 = m.add(y0, m.c(1)), x1 = m.add(x0, m.c(1));
        ValueId top = m.add(m.mul(m.sub(m.c(1), lx), corner(y0, x0)), m.mul(lx, corner(y0, x1)));
        ValueId bottom = m.add(m.mul(m.sub(m.c(1), lx), corner(y1, x0)), m.mul(lx, corner(y1, x1)));
        ValueId sample = m.add(m.mul(m.sub(m.c(1), ly), top), m.mul(ly, bottom));
        if (mask != nullptr) {
          sample = m.mul(sample, body.cast(ctx.load_at(body, *mask, {i[0], tap, i[2], i[3]}), f));
        }
        ValueId weight = body.cast(ctx.load_at(body, w, {i[1], r[0], r[1], r[2]}), f);
        return body.cast(m.mul(sample, weight), cd);
      });
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId v = ctx.load_at(body, sum, i);
    if (bias != nullptr) {
      v = body.binary(OpCode::kAdd, v, body.cast(ctx.load_at(body, *bias, {i[1]}), cd));
    }
    return body.cast(v, x.dtype);
  })};
}

/// ai.onnx.ml Binarizer: 1 where x > threshold, else 0, in x's type.
std::vector<TensorValue> lower_binarizer(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, kNumbers, "input X");
  const double threshold = node.attr_float("threshold", 0.0f);
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    const DType cd = graph::is_floating(x.dtype) ? compute_dtype(x.dtype) : DType::kFloat64;
    ValueId v = body.cast(ctx.load_at(body, x, i), cd);
    ValueId above = body.binary(OpCode::kGt, v, body.constant(threshold, cd));
    return body.where(above, body.constant(1, x.dtype), body.constant(0, x.dtype));
  })};
}

/// ai.onnx.ml ArrayFeatureExtractor: X's last axis gathered at the indices Y ([n] or [1, n]); the
/// output is X's shape with the last dim n ([1, n] for a 1-D X).
std::vector<TensorValue> lower_array_feature_extractor(LoweringContext& ctx, const graph::Node&,
                                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& y = required_input(ctx, inputs, 1, "Y");
  if (x.rank() == 0) ctx.fail("X must have rank at least 1");
  if (!(y.rank() == 1 || (y.rank() == 2 && y.shape[0] == Expr(1)))) {
    ctx.fail(fmt::format("Y must be [n] or [1, n], found {}", graph::shape_str(y.shape)));
  }
  const Expr count = y.shape.back();
  const TensorValue indices = checked_indices(ctx, reshape_view(ctx, y, {count}), x.shape.back());
  std::vector<Expr> shape = x.rank() == 1 ? std::vector<Expr>{Expr(1)} : x.shape;
  if (x.rank() == 1) {
    shape.push_back(count);
  } else {
    shape.back() = count;
  }
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId column = body.indirect(ctx.load_at(body, indices, {i.back()}), x.shape.back());
    std::vector<Expr> at = x.rank() == 1 ? std::vector<Expr>{} : i;
    if (x.rank() == 1) {
      at.push_back(body.op(column).symbol);
    } else {
      at.back() = body.op(column).symbol;
    }
    return ctx.load_at(body, x, at);
  })};
}

/// The values of a tensor attribute (or, when absent, of its list form `list`) as doubles.
std::vector<double> attr_values(const graph::Node& node, const std::string& tensor,
                                const std::string& list) {
  std::vector<double> out;
  if (const graph::Tensor* t = node.attr_tensor(tensor)) {
    for (int64_t k = 0; k < t->numel(); ++k) out.push_back(t->element_as_double(k));
    return out;
  }
  for (float v : node.attr_floats(list, {})) out.push_back(v);
  return out;
}

/// ai.onnx.ml TreeEnsemble (5): each tree, known when compiling, becomes a nest of selects from
/// its root to its leaves; a leaf adds its weight to its target. Y [N, n_targets] is the sum over
/// the trees (aggregate_function SUM) or their mean (AVERAGE), with no post_transform. Node modes:
/// x <= split, <, >=, >, ==, != and membership in the node's set (membership_values, the sets of
/// the member nodes in order, separated by NaN); a NaN x takes the true branch where
/// nodes_missing_value_tracks_true says so.
std::vector<TensorValue> lower_tree_ensemble(LoweringContext& ctx, const graph::Node& node,
                                             const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, kFloats, "input X");
  if (x.rank() != 2) ctx.fail(fmt::format("X must be 2-D [N, features], found rank {}", x.rank()));
  const int64_t aggregate = node.attr_int("aggregate_function", 1);
  if (aggregate != 0 && aggregate != 1) {
    ctx.fail(
        fmt::format("attribute 'aggregate_function' is {}; AVERAGE (0) and SUM (1) are "
                    "supported",
                    aggregate));
  }
  if (node.attr_int("post_transform", 0) != 0) {
    ctx.fail(fmt::format("attribute 'post_transform' is {}; only NONE (0) is supported",
                         node.attr_int("post_transform", 0)));
  }
  const int64_t targets = node.attr_int("n_targets", 0);
  const std::vector<int64_t> roots = node.attr_ints("tree_roots", {});
  const std::vector<int64_t> features = node.attr_ints("nodes_featureids", {});
  const std::vector<int64_t> true_ids = node.attr_ints("nodes_truenodeids", {});
  const std::vector<int64_t> false_ids = node.attr_ints("nodes_falsenodeids", {});
  const std::vector<int64_t> true_leafs = node.attr_ints("nodes_trueleafs", {});
  const std::vector<int64_t> false_leafs = node.attr_ints("nodes_falseleafs", {});
  const std::vector<int64_t> leaf_targets = node.attr_ints("leaf_targetids", {});
  const std::vector<int64_t> missing = node.attr_ints("nodes_missing_value_tracks_true", {});
  const std::vector<double> modes = attr_values(node, "nodes_modes", "");
  const std::vector<double> splits = attr_values(node, "nodes_splits", "");
  const std::vector<double> weights = attr_values(node, "leaf_weights", "");
  const std::vector<double> members = attr_values(node, "membership_values", "");
  const size_t count = features.size();
  if (targets <= 0 || roots.empty() || true_ids.size() != count || false_ids.size() != count ||
      true_leafs.size() != count || false_leafs.size() != count || modes.size() != count ||
      splits.size() != count || (!missing.empty() && missing.size() != count) ||
      leaf_targets.size() != weights.size()) {
    ctx.fail(
        "the node and leaf attributes (nodes_*, leaf_*, tree_roots, n_targets) are "
        "missing or of different lengths");
  }
  // The membership set of each member node.
  std::vector<std::vector<double>> sets(count);
  for (size_t i = 0, k = 0; i < count; ++i) {
    if (modes[i] != 6) continue;
    for (; k < members.size() && !std::isnan(members[k]); ++k) sets[i].push_back(members[k]);
    ++k;  // the NaN closing the set
  }
  const Expr features_n = x.shape[1];
  const DType f = DType::kFloat64;
  return {ctx.pointwise(
      x.dtype, {x.shape[0], Expr(targets)}, [&](LoopBody& body, const std::vector<Expr>& i) {
        ValueId target = body.index_expr(i[1]);
        std::function<ValueId(int64_t, bool, size_t)> visit = [&](int64_t id, bool leaf,
                                                                  size_t depth) -> ValueId {
          if (leaf) {
            if (id < 0 || static_cast<size_t>(id) >= weights.size()) {
              ctx.fail(fmt::format("leaf {} does not exist", id));
            }
            ValueId mine =
                body.binary(OpCode::kEq, target,
                            body.constant(static_cast<double>(leaf_targets[id]), DType::kInt64));
            return body.where(mine, body.constant(weights[id], f), body.constant(0, f));
          }
          if (id < 0 || static_cast<size_t>(id) >= count || depth > count) {
            ctx.fail(fmt::format("tree node {} does not exist or the trees have a cycle", id));
          }
          const int64_t feature = features[id];
          if (auto n = features_n.as_integer(); feature < 0 || (n && feature >= *n)) {
            ctx.fail(
                fmt::format("node {} reads feature {}, X has {}", id, feature, features_n.str()));
          }
          ValueId v = body.cast(ctx.load_at(body, x, {i[0], Expr(feature)}), f);
          ValueId s = body.constant(splits[id], f);
          ValueId cond;
          switch (static_cast<int>(modes[id])) {
            case 0:
              cond = body.binary(OpCode::kLe, v, s);
              break;
            case 1:
              cond = body.binary(OpCode::kLt, v, s);
              break;
            case 2:
              cond = body.binary(OpCode::kGe, v, s);
              break;
            case 3:
              cond = body.binary(OpCode::kGt, v, s);
              break;
            case 4:
              cond = body.binary(OpCode::kEq, v, s);
              break;
            case 5:
              cond = body.binary(OpCode::kNe, v, s);
              break;
            case 6:
              cond = body.constant(0, DType::kBool);
              for (double m : sets[id]) {
                cond = body.binary(OpCode::kOr, cond,
                                   body.binary(OpCode::kEq, v, body.constant(m, f)));
              }
              break;
            default:
              ctx.fail(fmt::format("node {} has mode {}; expected 0 to 6", id, modes[id]));
          }
          if (!missing.empty() && missing[id] != 0) {
            cond = body.binary(OpCode::kOr, body.unary(OpCode::kIsNan, v), cond);
          }
          return body.where(cond, visit(true_ids[id], true_leafs[id] != 0, depth + 1),
                            visit(false_ids[id], false_leafs[id] != 0, depth + 1));
        };
        ValueId sum = body.constant(0, f);
        for (int64_t root : roots) sum = body.binary(OpCode::kAdd, sum, visit(root, false, 0));
        if (aggregate == 0) {
          sum = body.binary(OpCode::kDiv, sum, body.constant(static_cast<double>(roots.size()), f));
        }
        return body.cast(sum, x.dtype);
      })};
}

}  // namespace

// ai.onnx.ml's versions are not checked against the node's opset (lower_graph.cpp checks the
// default domain only); they are listed for docs/ops.md: Binarizer and ArrayFeatureExtractor have
// one version through ai.onnx.ml 5, TreeEnsemble appeared in 5.
void register_newer_ops(Registry& registry) {
  registry.add("", "SwiGLU", {lower_swiglu, 28, 28});
  registry.add("", "TensorScatter", {lower_tensor_scatter, 24, 24});
  registry.add("", "AffineGrid", {lower_affine_grid, 20, 20});
  registry.add("", "Col2Im", {lower_col2im, 18, 18});
  registry.add("", "DeformConv", {lower_deform_conv, 19, 19});
  registry.add("", "CausalConvWithState", {lower_causal_conv_with_state, 27, 27});
  registry.add("ai.onnx.ml", "Binarizer", {lower_binarizer, 1, 5});
  registry.add("ai.onnx.ml", "ArrayFeatureExtractor", {lower_array_feature_extractor, 1, 5});
  registry.add("ai.onnx.ml", "TreeEnsemble", {lower_tree_ensemble, 5, 5});
}

}  // namespace kiln::lower
