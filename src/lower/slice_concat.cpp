/// Slice, Concat and Split lowerings (the shape family, continued from shape.cpp). Slice and
/// Split are views; Concat is a pointwise selection over index ranges with masked loads, so that
/// it fuses with its producers and consumers. Known contents are propagated.
///
/// Tests: tests/unit/lower/shape_test.cpp and the ONNX node suite (interpreter_cases.txt).

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using ir::LoopBody;
using ir::ValueId;
using sym::Expr;

namespace {

/// Slice bounds at or beyond this magnitude are "to the end" sentinels (INT64_MAX, INT32_MAX,
/// INT64_MIN...): no tensor dimension comes near them.
constexpr int64_t kHugeBound = int64_t{1} << 40;

/// The start, step and size of a slice along one axis.
struct AxisSlice {
  Expr start;
  int64_t step = 1;
  Expr size;
};

/// Clamps a start or end bound the way ONNX does: negative values count from the end; then
/// [0, d] for positive steps, [0, d-1] (start) or [-1, d-1] (end) for negative steps.
Expr clamp_bound(LoweringContext& ctx, const Expr& v, const Expr& dim, bool is_start,
                 int64_t step) {
  Expr lo = step > 0 || is_start ? 0 : -1;
  Expr hi = step > 0 ? dim : dim - 1;
  Expr normalized = v;
  if (auto c = v.as_integer()) {
    if (*c >= kHugeBound) return hi;
    if (*c <= -kHugeBound) return lo;
    if (*c < 0) normalized = dim + *c;
  } else if (!ctx.analyzer().statically_known_nonnegative(v)) {
    ctx.fail("slice bound " + v.str() +
             " is symbolic with an unknown sign; expected a constant or a non-negative size");
  }
  return ctx.analyzer().simplify(sym::max(sym::min(normalized, hi), lo));
}

AxisSlice slice_axis(LoweringContext& ctx, const Expr& dim, const Expr& start, const Expr& end,
                     int64_t step) {
  AxisSlice s;
  s.step = step;
  if (dim == Expr(0)) {
    s.start = 0;
    s.size = 0;
    return s;
  }
  s.start = clamp_bound(ctx, start, dim, true, step);
  Expr stop = clamp_bound(ctx, end, dim, false, step);
  Expr extent =
      step > 0 ? sym::ceil_div(stop - s.start, step) : sym::ceil_div(s.start - stop, -step);
  s.size = ctx.analyzer().simplify(sym::max(extent, 0));
  return s;
}

struct SliceArgs {
  std::vector<Expr> starts, ends;
  std::vector<int64_t> axes, steps;
};

SliceArgs slice_args(LoweringContext& ctx, const graph::Node& node, const LowerInputs& inputs) {
  SliceArgs args;
  if (node.opset() < 10) {
    for (int64_t v : node.attr_ints("starts", {})) args.starts.emplace_back(v);
    for (int64_t v : node.attr_ints("ends", {})) args.ends.emplace_back(v);
    args.axes = node.attr_ints("axes", {});
  } else {
    args.starts = require_known(ctx, required_input(ctx, inputs, 1, "starts"), "input 'starts'");
    args.ends = require_known(ctx, required_input(ctx, inputs, 2, "ends"), "input 'ends'");
    if (const TensorValue* axes = optional_input(inputs, 3)) {
      args.axes = require_static_ints(ctx, *axes, "input 'axes'");
    }
    if (const TensorValue* steps = optional_input(inputs, 4)) {
      args.steps = require_static_ints(ctx, *steps, "input 'steps'");
    }
  }
  size_t n = args.starts.size();
  if (args.axes.empty()) {
    for (size_t k = 0; k < n; ++k) args.axes.push_back(static_cast<int64_t>(k));
  }
  if (args.steps.empty()) args.steps.assign(n, 1);
  if (args.ends.size() != n || args.axes.size() != n || args.steps.size() != n) {
    ctx.fail("starts, ends, axes and steps must have the same length, found " + std::to_string(n) +
             ", " + std::to_string(args.ends.size()) + ", " + std::to_string(args.axes.size()) +
             ", " + std::to_string(args.steps.size()));
  }
  return args;
}

/// A view of `x` taking, along each sliced axis, `size` elements from `start` by `step`.
TensorValue slice_view(LoweringContext& ctx, const TensorValue& x,
                       const std::vector<std::optional<AxisSlice>>& slices) {
  std::vector<Expr> shape = x.shape;
  for (size_t k = 0; k < slices.size(); ++k) {
    if (slices[k]) shape[k] = slices[k]->size;
  }
  return make_view(ctx, x, std::move(shape), [slices](const std::vector<Expr>& index) {
    std::vector<Expr> in = index;
    for (size_t k = 0; k < slices.size(); ++k) {
      if (slices[k]) in[k] = slices[k]->start + index[k] * slices[k]->step;
    }
    return in;
  });
}

std::vector<TensorValue> lower_slice(LoweringContext& ctx, const graph::Node& node,
                                     const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  SliceArgs args = slice_args(ctx, node, inputs);
  int64_t rank = static_cast<int64_t>(x.rank());
  std::vector<std::optional<AxisSlice>> slices(x.rank());
  for (size_t k = 0; k < args.axes.size(); ++k) {
    size_t axis = static_cast<size_t>(ctx.normalize_axis(args.axes[k], rank));
    if (slices[axis])
      ctx.fail("axes must not repeat an axis, found " + std::to_string(axis) + " twice");
    if (args.steps[k] == 0) ctx.fail("slice step must not be 0");
    slices[axis] = slice_axis(ctx, x.shape[axis], args.starts[k], args.ends[k], args.steps[k]);
  }
  return {slice_view(ctx, x, slices)};
}

/// Concatenates known contents along `axis` (static shapes).
template <typename T>
std::optional<std::vector<T>> concat_known(const std::vector<const TensorValue*>& parts,
                                           const std::optional<std::vector<T>> TensorValue::*field,
                                           size_t axis) {
  std::vector<int64_t> inner_sizes;
  int64_t outer = 1;
  for (const TensorValue* p : parts) {
    if (!(p->*field)) return std::nullopt;
    auto dims = static_shape(p->shape);
    if (!dims) return std::nullopt;
    int64_t inner = 1;
    for (size_t k = axis; k < dims->size(); ++k) inner *= (*dims)[k];
    inner_sizes.push_back(inner);
    outer = 1;
    for (size_t k = 0; k < axis; ++k) outer *= (*dims)[k];
  }
  std::vector<T> out;
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t p = 0; p < parts.size(); ++p) {
      const std::vector<T>& values = *(parts[p]->*field);
      auto begin = values.begin() + o * inner_sizes[p];
      out.insert(out.end(), begin, begin + inner_sizes[p]);
    }
  }
  return out;
}

/// The output shape of Concat: equal dims except along `axis`, which sums.
std::vector<Expr> concat_shape(LoweringContext& ctx, const std::vector<const TensorValue*>& parts,
                               size_t axis) {
  std::vector<Expr> shape = parts[0]->shape;
  shape[axis] = 0;
  for (const TensorValue* p : parts) {
    if (p->rank() != shape.size()) {
      ctx.fail("all inputs must have rank " + std::to_string(shape.size()) + ", found rank " +
               std::to_string(p->rank()));
    }
    for (size_t k = 0; k < shape.size(); ++k) {
      if (k == axis) continue;
      if (p->shape[k].is_integer() && shape[k].is_integer() && p->shape[k] != shape[k]) {
        ctx.fail("input shapes differ outside the concatenation axis: " +
                 graph::shape_str(parts[0]->shape) + " vs " + graph::shape_str(p->shape));
      }
      if (shape[k].is_integer()) continue;
      shape[k] = p->shape[k];  // prefer a static dim over a symbolic one
    }
    shape[axis] += p->shape[axis];
  }
  return shape;
}

std::vector<TensorValue> lower_concat(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  std::vector<const TensorValue*> parts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    parts.push_back(&required_input(ctx, inputs, i, "inputs"));
  }
  if (parts.empty()) ctx.fail("expected at least one input, found none");
  if (node.opset() >= 4 && !node.has_attribute("axis"))
    ctx.fail("missing required attribute 'axis'");
  size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", 1), static_cast<int64_t>(parts[0]->rank())));
  return {concat_values(ctx, parts, axis)};
}

}  // namespace

TensorValue concat_values(LoweringContext& ctx, const std::vector<const TensorValue*>& parts,
                          size_t axis) {
  std::vector<Expr> shape = concat_shape(ctx, parts, axis);
  DType dtype = parts[0]->dtype;
  auto known = concat_known(parts, &TensorValue::known, axis);
  bool simple_known = dtype == DType::kInt64 || dtype == DType::kInt32 || dtype == DType::kBool;
  if (known && (simple_known || known->size() <= 8)) {
    return ctx.from_known(dtype, shape, std::move(*known));
  }
  // Parts that are statically empty along the axis contribute nothing.
  std::vector<const TensorValue*> live;
  for (const TensorValue* p : parts) {
    if (p->shape[axis] != Expr(0)) live.push_back(p);
  }
  if (live.empty()) return *parts[0];  // the output is empty too
  if (live.size() == 1) return *live[0];
  TensorValue out =
      ctx.pointwise(dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
        ValueId result = ir::kNoValue;
        Expr offset = 0;
        std::vector<std::pair<ValueId, ValueId>> pieces;  // (mask, value)
        for (const TensorValue* p : live) {
          Expr end = offset + p->shape[axis];
          std::vector<Expr> at = index;
          at[axis] = index[axis] - offset;
          ValueId mask = in_range(body, index[axis], offset, end);
          pieces.emplace_back(mask, body.cast(load_masked(ctx, body, *p, at, mask, 0), dtype));
          offset = end;
        }
        result = pieces.back().second;
        for (size_t k = pieces.size() - 1; k-- > 0;) {
          result = body.where(pieces[k].first, pieces[k].second, result);
        }
        return result;
      });
  out.known = std::move(known);
  out.known_float = concat_known(parts, &TensorValue::known_float, axis);
  return out;
}

namespace {

/// The sizes of Split's outputs along the axis.
std::vector<Expr> split_sizes(LoweringContext& ctx, const graph::Node& node,
                              const LowerInputs& inputs, const Expr& dim) {
  std::vector<Expr> sizes;
  const TensorValue* split =
      node.opset() >= 13 || !node.has_attribute("split") ? optional_input(inputs, 1) : nullptr;
  if (split != nullptr) {
    sizes = require_known(ctx, *split, "input 'split'");
  } else if (node.has_attribute("split")) {
    for (int64_t v : node.attr_ints("split", {})) sizes.emplace_back(v);
  }
  size_t n = node.outputs().size();
  if (sizes.empty() && node.opset() >= 18 && node.has_attribute("num_outputs")) {
    // Split-18's num_outputs: parts of ceil(dim / n), the last one smaller when n does not
    // divide the dim.
    int64_t num = node.attr_int("num_outputs", 0);
    if (num < 1 || static_cast<size_t>(num) != n) {
      ctx.fail(fmt::format("attribute 'num_outputs' is {} but the node has {} outputs", num, n));
    }
    Expr part = ctx.analyzer().simplify(sym::ceil_div(dim, num));
    std::vector<Expr> parts(n, part);
    parts.back() = ctx.analyzer().simplify(dim - part * Expr(num - 1));
    if (auto last = parts.back().as_integer(); last && *last < 0) {
      ctx.fail(fmt::format("cannot split a dimension of size {} into {} parts", dim.str(), num));
    }
    return parts;
  }
  if (sizes.empty()) {
    if (auto d = dim.as_integer(); d && *d % static_cast<int64_t>(n) != 0) {
      ctx.fail("cannot split dimension of size " + std::to_string(*d) + " into " +
               std::to_string(n) + " equal parts");
    }
    Expr part = ctx.analyzer().simplify(sym::floor_div(dim, static_cast<int64_t>(n)));
    return std::vector<Expr>(n, part);
  }
  if (sizes.size() != n) {
    ctx.fail("expected " + std::to_string(n) + " split sizes (one per output), found " +
             std::to_string(sizes.size()));
  }
  Expr total = 0;
  for (const Expr& s : sizes) total += s;
  if (total.is_integer() && dim.is_integer() && total != dim) {
    ctx.fail("split sizes sum to " + total.str() + ", expected the dimension size " + dim.str());
  }
  return sizes;
}

std::vector<TensorValue> lower_split(LoweringContext& ctx, const graph::Node& node,
                                     const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(x.rank())));
  std::vector<Expr> sizes = split_sizes(ctx, node, inputs, x.shape[axis]);
  std::vector<TensorValue> outputs;
  Expr offset = 0;
  for (const Expr& size : sizes) {
    std::vector<std::optional<AxisSlice>> slices(x.rank());
    slices[axis] = AxisSlice{offset, 1, size};
    outputs.push_back(slice_view(ctx, x, slices));
    offset += size;
  }
  return outputs;
}

}  // namespace

void register_slice_concat_ops(Registry& registry) {
  registry.add("", "Slice", {lower_slice, 1, 17});
  registry.add("", "Concat", {lower_concat, 1, 17});
  registry.add("", "Split", {lower_split, 1, 18});
}

}  // namespace kiln::lower
