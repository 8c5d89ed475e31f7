/// Data-movement lowerings through the loop IR, so that they fuse with their neighbours: Pad
/// (constant, reflect, edge) and DepthToSpace / SpaceToDepth as index remaps; GatherND as
/// indirect loads; ScatterElements, Scatter, ScatterND and MaxUnpool as a reduction over the
/// updates that land on each output element (none, add, mul), so indices are only compared, never
/// used to address memory; ReverseSequence as an indirect load along the time axis. Index inputs
/// are bounds-checked before any kernel reads them.
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
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

Expr abs_expr(const Expr& e) { return sym::max(e, Expr(0) - e); }

// --- Pad -----------------------------------------------------------------------------------------

/// Pad-18's pads for the listed axes only (begins then ends), spread over every dim.
std::vector<Expr> pads_over_axes(const LoweringContext& ctx, const std::vector<Expr>& pads,
                                 const std::vector<int64_t>& axes, size_t rank) {
  if (pads.size() != 2 * axes.size()) {
    ctx.fail(fmt::format("expected {} pads (begins then ends) for {} axes, found {}",
                         2 * axes.size(), axes.size(), pads.size()));
  }
  std::vector<Expr> full(2 * rank, Expr(0));
  std::vector<bool> seen(rank, false);
  for (size_t k = 0; k < axes.size(); ++k) {
    size_t a = static_cast<size_t>(ctx.normalize_axis(axes[k], static_cast<int64_t>(rank)));
    if (seen[a]) ctx.fail(fmt::format("axis {} is repeated in axes", axes[k]));
    seen[a] = true;
    full[a] = pads[k];
    full[rank + a] = pads[axes.size() + k];
  }
  return full;
}

std::vector<TensorValue> lower_pad(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  const size_t rank = x.rank();
  std::vector<Expr> pads;
  std::optional<double> value = 0.0;
  const TensorValue* value_input = nullptr;
  if (node.opset() >= 11) {
    pads = require_known(ctx, required_input(ctx, inputs, 1, "pads"), "input 'pads'");
    value_input = optional_input(inputs, 2);
    if (value_input != nullptr) value = known_scalar(*value_input);
  } else {
    for (int64_t p : node.attr_ints(node.opset() >= 2 ? "pads" : "paddings", {}))
      pads.emplace_back(p);
    value = node.attr_float("value", 0.0f);
  }
  if (const TensorValue* axes_input = node.opset() >= 18 ? optional_input(inputs, 3) : nullptr) {
    pads = pads_over_axes(ctx, pads, require_static_ints(ctx, *axes_input, "axes"), rank);
  }
  if (pads.size() != 2 * rank) {
    ctx.fail(fmt::format("expected {} pads (begins then ends) for an input of rank {}, found {}",
                         2 * rank, rank, pads.size()));
  }
  std::string mode = node.attr_string("mode", "constant");
  bool wrap_allowed = node.opset() >= 19;
  if (mode != "constant" && mode != "reflect" && mode != "edge" &&
      !(wrap_allowed && mode == "wrap")) {
    ctx.fail(fmt::format("mode must be constant, reflect, edge{}, found '{}'",
                         wrap_allowed ? " or wrap" : "", mode));
  }
  std::vector<Expr> shape(rank);
  for (size_t d = 0; d < rank; ++d) {
    shape[d] = ctx.analyzer().simplify(x.shape[d] + pads[d] + pads[rank + d]);
    if (auto n = shape[d].as_integer(); n && *n < 0) {
      ctx.fail(fmt::format("pads make dim {} negative ({})", d, *n));
    }
    if (mode != "constant" && shape[d] != x.shape[d] && x.shape[d] == Expr(0)) {
      ctx.fail(fmt::format("{} padding of the empty dim {}", mode, d));
    }
  }
  if (mode != "constant") {
    return {make_view(ctx, x, shape, [&](const std::vector<Expr>& o) {
      std::vector<Expr> in(rank);
      for (size_t d = 0; d < rank; ++d) {
        Expr i = o[d] - pads[d];
        Expr last = x.shape[d] - 1;
        if (mode == "wrap") {
          // Shifted by a multiple of the size so that the operand of mod is non-negative.
          Expr shift = sym::ceil_div(sym::max(pads[d], Expr(0)), x.shape[d]) * x.shape[d];
          in[d] = sym::mod(i + shift, x.shape[d]);
          continue;
        }
        in[d] = mode == "edge" ? sym::min(sym::max(i, Expr(0)), last)
                               : last - abs_expr(last - abs_expr(i));
      }
      return in;
    })};
  }
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    std::vector<Expr> in(rank);
    ValueId mask = ir::kNoValue;
    for (size_t d = 0; d < rank; ++d) {
      in[d] = o[d] - pads[d];
      if (pads[d] != Expr(0) || pads[rank + d] != Expr(0)) {
        mask = and_mask(body, mask, in_range(body, in[d], Expr(0), x.shape[d]));
      }
    }
    if (mask == ir::kNoValue) return ctx.load_at(body, x, in);
    if (value) return load_masked(ctx, body, x, in, mask, *value);
    ValueId fill = ctx.load_at(body, *value_input, std::vector<Expr>(value_input->rank(), Expr(0)));
    return body.where(mask, load_masked(ctx, body, x, in, mask, 0), body.cast(fill, x.dtype));
  })};
}

// --- CenterCropPad -------------------------------------------------------------------------------

/// CenterCropPad-18: each listed axis cropped or zero-padded to its target size about the
/// center (a crop starts at (size - target) / 2, a pad puts (target - size) / 2 before).
std::vector<TensorValue> lower_center_crop_pad(LoweringContext& ctx, const graph::Node& node,
                                               const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input_data");
  std::vector<int64_t> target =
      require_static_ints(ctx, required_input(ctx, inputs, 1, "shape"), "shape");
  const size_t rank = x.rank();
  std::vector<int64_t> axes = node.attr_ints("axes", {});
  if (axes.empty()) {
    for (size_t d = 0; d < rank; ++d) axes.push_back(static_cast<int64_t>(d));
  }
  if (target.size() != axes.size()) {
    ctx.fail(fmt::format("input 'shape' has {} sizes for {} axes", target.size(), axes.size()));
  }
  std::vector<Expr> shape = x.shape;
  std::vector<Expr> shift(rank, Expr(0));  // input index = output index + shift
  std::vector<bool> padded(rank, false);
  for (size_t k = 0; k < axes.size(); ++k) {
    size_t a = static_cast<size_t>(ctx.normalize_axis(axes[k], static_cast<int64_t>(rank)));
    int64_t size = require_static_dim(ctx, x.shape[a], "a cropped or padded dim");
    if (target[k] < 0) ctx.fail(fmt::format("input 'shape' holds {}", target[k]));
    shape[a] = target[k];
    shift[a] = target[k] <= size ? (size - target[k]) / 2 : -((target[k] - size) / 2);
    padded[a] = target[k] > size;
  }
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    std::vector<Expr> in(rank);
    ValueId mask = ir::kNoValue;
    for (size_t d = 0; d < rank; ++d) {
      in[d] = o[d] + shift[d];
      if (padded[d]) mask = and_mask(body, mask, in_range(body, in[d], Expr(0), x.shape[d]));
    }
    if (mask == ir::kNoValue) return ctx.load_at(body, x, in);
    return load_masked(ctx, body, x, in, mask, 0);
  })};
}

// --- DepthToSpace / SpaceToDepth ----------------------------------------------------------------

int64_t block_size(const LoweringContext& ctx, const graph::Node& node, const TensorValue& x) {
  if (x.rank() != 4) ctx.fail(fmt::format("expected an input of rank 4, found rank {}", x.rank()));
  int64_t b = node.attr_int("blocksize", 0);
  if (b <= 0) ctx.fail(fmt::format("attribute 'blocksize' must be positive, found {}", b));
  return b;
}

std::vector<TensorValue> lower_depth_to_space(LoweringContext& ctx, const graph::Node& node,
                                              const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const int64_t b = block_size(ctx, node, x);
  if (!ctx.analyzer().statically_known_multiple_of(x.shape[1], Expr(b * b))) {
    ctx.fail(fmt::format("channels ({}) must be a multiple of blocksize^2 = {}", x.shape[1].str(),
                         b * b));
  }
  const bool crd = node.attr_string("mode", "DCR") == "CRD";
  const Expr c_out = ctx.analyzer().simplify(sym::floor_div(x.shape[1], Expr(b * b)));
  std::vector<Expr> shape = {x.shape[0], c_out, x.shape[2] * b, x.shape[3] * b};
  return {make_view(ctx, x, shape, [&](const std::vector<Expr>& o) {
    Expr bh = sym::mod(o[2], Expr(b)), bw = sym::mod(o[3], Expr(b));
    Expr c = crd ? o[1] * (b * b) + bh * b + bw : (bh * b + bw) * c_out + o[1];
    return std::vector<Expr>{o[0], c, sym::floor_div(o[2], Expr(b)), sym::floor_div(o[3], Expr(b))};
  })};
}

std::vector<TensorValue> lower_space_to_depth(LoweringContext& ctx, const graph::Node& node,
                                              const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const int64_t b = block_size(ctx, node, x);
  for (size_t d : {2, 3}) {
    if (!ctx.analyzer().statically_known_multiple_of(x.shape[d], Expr(b))) {
      ctx.fail(
          fmt::format("dim {} ({}) must be a multiple of blocksize {}", d, x.shape[d].str(), b));
    }
  }
  const Expr c = x.shape[1];
  std::vector<Expr> shape = {x.shape[0], c * (b * b),
                             ctx.analyzer().simplify(sym::floor_div(x.shape[2], Expr(b))),
                             ctx.analyzer().simplify(sym::floor_div(x.shape[3], Expr(b)))};
  return {make_view(ctx, x, shape, [&](const std::vector<Expr>& o) {
    Expr block = sym::floor_div(o[1], c);
    return std::vector<Expr>{o[0], sym::mod(o[1], c), o[2] * b + sym::floor_div(block, Expr(b)),
                             o[3] * b + sym::mod(block, Expr(b))};
  })};
}

// --- GatherND / ScatterND / ScatterElements -----------------------------------------------------

/// Component j of the last axis of `indices` ([..., k]) as its own value, bounds-checked against
/// `size`.
TensorValue index_component(LoweringContext& ctx, const TensorValue& indices, size_t j,
                            const Expr& size) {
  std::vector<Expr> prefix(indices.shape.begin(), indices.shape.end() - 1);
  TensorValue component = make_view(ctx, indices, prefix, [&](const std::vector<Expr>& o) {
    std::vector<Expr> at = o;
    at.push_back(Expr(static_cast<int64_t>(j)));
    return at;
  });
  return checked_indices(ctx, component, size);
}

/// An index value wrapped into [0, size) (ONNX negative indices count from the end).
ValueId wrapped(LoopBody& body, ValueId index, const Expr& size) {
  ValueId i = body.cast(index, DType::kInt64);
  ValueId negative = body.binary(OpCode::kLt, i, body.constant(0, DType::kInt64));
  return body.where(negative, body.binary(OpCode::kAdd, i, body.index_expr(size)), i);
}

std::vector<TensorValue> lower_gather_nd(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  const TensorValue& data = required_input(ctx, inputs, 0, "data");
  const TensorValue& indices = required_input(ctx, inputs, 1, "indices");
  const size_t bd = static_cast<size_t>(node.attr_int("batch_dims", 0));
  if (indices.rank() < 1 || data.rank() < 1) ctx.fail("data and indices must have rank >= 1");
  const int64_t k =
      require_static_dim(ctx, indices.shape.back(), "the last dim of input 'indices'");
  if (bd >= std::min(data.rank(), indices.rank()) || bd + static_cast<size_t>(k) > data.rank()) {
    ctx.fail(fmt::format("batch_dims {} and index depth {} do not fit data of rank {}", bd, k,
                         data.rank()));
  }
  std::vector<TensorValue> parts;
  for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
    parts.push_back(index_component(ctx, indices, j, data.shape[bd + j]));
  }
  std::vector<Expr> shape(indices.shape.begin(), indices.shape.end() - 1);
  shape.insert(shape.end(), data.shape.begin() + bd + k, data.shape.end());
  const size_t q = indices.rank() - 1;
  return {ctx.pointwise(data.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    std::vector<Expr> prefix(o.begin(), o.begin() + q);
    std::vector<Expr> at(o.begin(), o.begin() + bd);
    for (size_t j = 0; j < parts.size(); ++j) {
      ValueId row = body.indirect(ctx.load_at(body, parts[j], prefix), data.shape[bd + j]);
      at.push_back(body.op(row).symbol);
    }
    at.insert(at.end(), o.begin() + q, o.end());
    return ctx.load_at(body, data, at);
  })};
}

enum class ScatterMode { kNone, kAdd, kMul, kMax, kMin };

ScatterMode scatter_mode(const LoweringContext& ctx, const graph::Node& node) {
  std::string r = node.attr_string("reduction", "none");
  if (r == "none") return ScatterMode::kNone;
  if (r == "add") return ScatterMode::kAdd;
  if (r == "mul") return ScatterMode::kMul;
  // max and min from opset 18.
  if (node.opset() >= 18 && r == "max") return ScatterMode::kMax;
  if (node.opset() >= 18 && r == "min") return ScatterMode::kMin;
  ctx.fail(fmt::format("reduction '{}' is not supported (none, add, mul{})", r,
                       node.opset() >= 18 ? ", max, min" : ""));
}

/// out[i] = data[i] combined with every update u whose target is i: `match(body, i, u)` says
/// whether update u (an index of `update_space`) lands on output index i, and `update(body, i, u)`
/// is its value. With no reduction the (single) matching update replaces the element.
TensorValue scatter(LoweringContext& ctx, const TensorValue& data, ScatterMode mode,
                    const std::vector<Expr>& update_space,
                    const std::function<ValueId(LoopBody&, const std::vector<Expr>&,
                                                const std::vector<Expr>&)>& match,
                    const std::function<ValueId(LoopBody&, const std::vector<Expr>&,
                                                const std::vector<Expr>&)>& update) {
  const DType acc = compute_dtype(data.dtype);
  if (mode == ScatterMode::kMax || mode == ScatterMode::kMin) {
    // The element itself stands in for updates that miss it, so no identity value is needed;
    // it is combined once more for elements every update hits.
    TensorValue extreme = ctx.reduction(
        acc, data.shape, update_space,
        mode == ScatterMode::kMax ? ReductionType::kMax : ReductionType::kMin,
        [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& u) {
          ValueId v = body.cast(update(body, i, u), acc);
          return body.where(match(body, i, u), v, body.cast(ctx.load_at(body, data, i), acc));
        });
    const OpCode combine = mode == ScatterMode::kMax ? OpCode::kMaximum : OpCode::kMinimum;
    return ctx.pointwise(data.dtype, data.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
      ValueId d = body.cast(ctx.load_at(body, data, i), acc);
      return body.cast(body.binary(combine, d, ctx.load_at(body, extreme, i)), data.dtype);
    });
  }
  const bool product = mode == ScatterMode::kMul;
  TensorValue combined = ctx.reduction(
      acc, data.shape, update_space, product ? ReductionType::kProd : ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& u) {
        ValueId hit = match(body, i, u);
        ValueId v = body.cast(update(body, i, u), acc);
        return body.where(hit, v, body.constant(product ? 1 : 0, acc));
      });
  TensorValue hits;
  if (mode == ScatterMode::kNone) {
    hits = ctx.reduction(DType::kBool, data.shape, update_space, ReductionType::kAny,
                         [&](LoopBody& body, const std::vector<Expr>& i,
                             const std::vector<Expr>& u) { return match(body, i, u); });
  }
  return ctx.pointwise(data.dtype, data.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId d = body.cast(ctx.load_at(body, data, i), acc);
    ValueId c = ctx.load_at(body, combined, i);
    ValueId r;
    if (mode == ScatterMode::kNone) {
      r = body.where(ctx.load_at(body, hits, i), c, d);
    } else {
      r = body.binary(product ? OpCode::kMul : OpCode::kAdd, d, c);
    }
    return body.cast(r, data.dtype);
  });
}

std::vector<TensorValue> lower_scatter_elements(LoweringContext& ctx, const graph::Node& node,
                                                const LowerInputs& inputs) {
  const TensorValue& data = required_input(ctx, inputs, 0, "data");
  const TensorValue& raw_indices = required_input(ctx, inputs, 1, "indices");
  const TensorValue& updates = required_input(ctx, inputs, 2, "updates");
  const size_t rank = data.rank();
  if (rank == 0 || raw_indices.rank() != rank || updates.shape != raw_indices.shape) {
    ctx.fail(
        "data, indices and updates must have the same rank >= 1, and indices and updates "
        "the same shape");
  }
  const size_t axis =
      static_cast<size_t>(ctx.normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(rank)));
  const Expr size = data.shape[axis];
  TensorValue indices = checked_indices(ctx, raw_indices, size);
  const ScatterMode mode =
      node.op_type() == "Scatter" ? ScatterMode::kNone : scatter_mode(ctx, node);
  // Update u = (i with axis -> j) lands on i when u is inside indices and indices[u] == i[axis].
  auto at = [axis](const std::vector<Expr>& i, const std::vector<Expr>& u) {
    std::vector<Expr> p = i;
    p[axis] = u[0];
    return p;
  };
  auto inside = [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId mask = ir::kNoValue;
    for (size_t d = 0; d < rank; ++d) {
      if (d != axis && indices.shape[d] != data.shape[d]) {
        mask = and_mask(body, mask, in_range(body, i[d], Expr(0), indices.shape[d]));
      }
    }
    return mask;
  };
  return {scatter(
      ctx, data, mode, {indices.shape[axis]},
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& u) {
        ValueId mask = inside(body, i);
        ValueId idx = mask == ir::kNoValue ? ctx.load_at(body, indices, at(i, u))
                                           : load_masked(ctx, body, indices, at(i, u), mask, -1);
        ValueId hit = body.binary(OpCode::kEq, wrapped(body, idx, size), body.index_expr(i[axis]));
        return mask == ir::kNoValue ? hit : and_mask(body, mask, hit);
      },
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& u) {
        ValueId mask = inside(body, i);
        if (mask == ir::kNoValue) return ctx.load_at(body, updates, at(i, u));
        return load_masked(ctx, body, updates, at(i, u), mask, 0);
      })};
}

std::vector<TensorValue> lower_scatter_nd(LoweringContext& ctx, const graph::Node& node,
                                          const LowerInputs& inputs) {
  const TensorValue& data = required_input(ctx, inputs, 0, "data");
  const TensorValue& indices = required_input(ctx, inputs, 1, "indices");
  const TensorValue& updates = required_input(ctx, inputs, 2, "updates");
  if (indices.rank() < 1 || data.rank() < 1) ctx.fail("data and indices must have rank >= 1");
  const int64_t k =
      require_static_dim(ctx, indices.shape.back(), "the last dim of input 'indices'");
  if (static_cast<size_t>(k) > data.rank()) {
    ctx.fail(fmt::format("index depth {} exceeds the rank of data ({})", k, data.rank()));
  }
  std::vector<Expr> space(indices.shape.begin(), indices.shape.end() - 1);
  std::vector<Expr> want = space;
  want.insert(want.end(), data.shape.begin() + k, data.shape.end());
  if (updates.shape != want) {
    ctx.fail(fmt::format("expected updates of shape {}, found {}", graph::shape_str(want),
                         graph::shape_str(updates.shape)));
  }
  std::vector<TensorValue> parts;
  for (size_t j = 0; j < static_cast<size_t>(k); ++j) {
    parts.push_back(index_component(ctx, indices, j, data.shape[j]));
  }
  return {scatter(
      ctx, data, scatter_mode(ctx, node), space,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& u) {
        ValueId hit = ir::kNoValue;
        for (size_t j = 0; j < parts.size(); ++j) {
          ValueId idx = wrapped(body, ctx.load_at(body, parts[j], u), data.shape[j]);
          hit = and_mask(body, hit, body.binary(OpCode::kEq, idx, body.index_expr(i[j])));
        }
        return hit == ir::kNoValue ? body.constant(1, DType::kBool) : hit;
      },
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& u) {
        std::vector<Expr> at = u;
        at.insert(at.end(), i.begin() + k, i.end());
        return ctx.load_at(body, updates, at);
      })};
}

std::vector<TensorValue> lower_max_unpool(LoweringContext& ctx, const graph::Node& node,
                                          const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& indices = required_input(ctx, inputs, 1, "I");
  const TensorValue* output_shape = optional_input(inputs, 2);
  if (x.rank() < 3 || indices.shape != x.shape) {
    ctx.fail("expected X of rank >= 3 and indices I of the same shape");
  }
  const size_t n = x.rank() - 2;
  std::vector<int64_t> kernel = node.attr_ints("kernel_shape", {});
  std::vector<int64_t> strides = node.attr_ints("strides", std::vector<int64_t>(n, 1));
  std::vector<int64_t> pads = node.attr_ints("pads", std::vector<int64_t>(2 * n, 0));
  if (kernel.size() != n || strides.size() != n || pads.size() != 2 * n) {
    ctx.fail(fmt::format("kernel_shape and strides need {} values and pads {}", n, 2 * n));
  }
  std::vector<Expr> inferred = {x.shape[0], x.shape[1]};
  for (size_t d = 0; d < n; ++d) {
    inferred.push_back(ctx.analyzer().simplify((x.shape[2 + d] - 1) * strides[d] - pads[d] -
                                               pads[n + d] + kernel[d]));
  }
  std::vector<Expr> shape = inferred;
  if (output_shape != nullptr) {
    shape = require_known(ctx, *output_shape, "input 'output_shape'");
    if (shape.size() != x.rank()) ctx.fail("output_shape must give every dim of the output");
  }
  // Each value goes to the position its index names, a flat index over the inferred output
  // shape (what MaxPool's indices count over); a larger output_shape pads with 0 after it.
  TensorValue zeros = ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>&) {
    return body.constant(0, x.dtype);
  });
  std::vector<Expr> space(x.shape.begin() + 2, x.shape.end());
  auto at = [](const std::vector<Expr>& i, const std::vector<Expr>& u) {
    std::vector<Expr> p = {i[0], i[1]};
    p.insert(p.end(), u.begin(), u.end());
    return p;
  };
  return {scatter(
      ctx, zeros, ScatterMode::kNone, space,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& u) {
        Expr flat(0);
        ValueId inside = ir::kNoValue;
        for (size_t d = 0; d < shape.size(); ++d) {
          flat = flat * inferred[d] + i[d];
          if (shape[d] != inferred[d]) {
            inside = and_mask(body, inside, in_range(body, i[d], Expr(0), inferred[d]));
          }
        }
        ValueId idx = body.cast(ctx.load_at(body, indices, at(i, u)), DType::kInt64);
        return and_mask(body, inside, body.binary(OpCode::kEq, idx, body.index_expr(flat)));
      },
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& u) {
        return ctx.load_at(body, x, at(i, u));
      })};
}

// --- ReverseSequence -----------------------------------------------------------------------------

std::vector<TensorValue> lower_reverse_sequence(LoweringContext& ctx, const graph::Node& node,
                                                const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const TensorValue& raw_lens = required_input(ctx, inputs, 1, "sequence_lens");
  if (x.rank() < 2) ctx.fail(fmt::format("expected an input of rank >= 2, found {}", x.rank()));
  const size_t time = static_cast<size_t>(node.attr_int("time_axis", 0));
  const size_t batch = static_cast<size_t>(node.attr_int("batch_axis", 1));
  if (time > 1 || batch > 1 || time == batch) {
    ctx.fail(fmt::format("time_axis and batch_axis must be 0 and 1 in some order, found {} and {}",
                         time, batch));
  }
  if (raw_lens.rank() != 1) ctx.fail("sequence_lens must be 1-D ([batch])");
  // A length is in [0, time]: checked as an index into time + 1 positions.
  TensorValue lens = checked_indices(ctx, raw_lens, x.shape[time] + 1);
  // The first len[b] steps of each batch entry are reversed, the rest copied.
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId len = body.cast(ctx.load_at(body, lens, {i[batch]}), DType::kInt64);
    ValueId t = body.index_expr(i[time]);
    ValueId reversed = body.binary(
        OpCode::kSub, body.binary(OpCode::kSub, len, body.constant(1, DType::kInt64)), t);
    ValueId source = body.where(body.binary(OpCode::kLt, t, len), reversed, t);
    std::vector<Expr> at = i;
    at[time] = body.op(body.indirect(source, x.shape[time])).symbol;
    return ctx.load_at(body, x, at);
  })};
}

}  // namespace

void register_movement_ops(Registry& registry) {
  registry.add("", "ReverseSequence", {lower_reverse_sequence, 10, 17});
  registry.add("", "MaxUnpool", {lower_max_unpool, 9, 17});
  registry.add("", "Pad", {lower_pad, 1, 19});
  registry.add("", "CenterCropPad", {lower_center_crop_pad, 18, 18});
  registry.add("", "DepthToSpace", {lower_depth_to_space, 1, 17});
  registry.add("", "SpaceToDepth", {lower_space_to_depth, 1, 17});
  registry.add("", "GatherND", {lower_gather_nd, 11, 17});
  registry.add("", "ScatterElements", {lower_scatter_elements, 11, 18});
  registry.add("", "Scatter", {lower_scatter_elements, 9, 10});
  registry.add("", "ScatterND", {lower_scatter_nd, 11, 18});
}

}  // namespace kiln::lower
