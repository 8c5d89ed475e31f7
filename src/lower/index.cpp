/// Index-family lowerings: Gather, GatherElements (indirect loads whose indices are checked once
/// by the wrapper before the kernel, ir::IndexCheck), and the generators ConstantOfShape, Range,
/// Tile, OneHot, Trilu, EyeLike, CastLike. Known contents are computed at compile time where the
/// inputs are known (Shape -> Gather chains).
///
/// Tests: tests/unit/lower/shape_test.cpp and the ONNX node suite (interpreter_cases.txt).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "lower/elementwise.h"
#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using ir::LoopBody;
using ir::OpCode;
using ir::ValueId;
using sym::Expr;

TensorValue checked_indices(LoweringContext& ctx, const TensorValue& indices, const Expr& size,
                            std::optional<int64_t> ignored) {
  if (!graph::is_integer(indices.dtype)) {
    ctx.fail("expected integer indices, found " + std::string(graph::dtype_name(indices.dtype)));
  }
  auto n = size.as_integer();
  if (indices.known && n) {
    bool all_static = true;
    for (const Expr& e : *indices.known) {
      auto v = e.as_integer();
      if (!v) {
        all_static = false;
        continue;
      }
      if (*v == ignored) continue;
      if (*v < -*n || *v >= *n) {
        ctx.fail("index " + std::to_string(*v) + " is out of range [" + std::to_string(-*n) + ", " +
                 std::to_string(*n) + ")");
      }
    }
    if (all_static) return indices;
  }
  TensorValue realized = ctx.realize(indices, "indices checked before the kernel");
  std::string buffer = *ctx.as_buffer(realized);
  auto& checks = ctx.program().index_checks;
  bool present = std::any_of(checks.begin(), checks.end(), [&](const ir::IndexCheck& c) {
    return c.buffer == buffer && c.size == size && c.ignored == ignored;
  });
  if (!present) checks.push_back({buffer, size, ctx.node().describe(), ignored});
  return realized;
}

namespace {

/// Gather over known contents: out[o, j, i] = data[o, wrap(indices[j]), i].
std::optional<std::vector<Expr>> gather_known(const TensorValue& data, const TensorValue& indices,
                                              size_t axis) {
  auto dims = static_shape(data.shape);
  if (!data.known || !indices.known || !dims) return std::nullopt;
  int64_t outer = 1, inner = 1;
  for (size_t k = 0; k < axis; ++k) outer *= (*dims)[k];
  for (size_t k = axis + 1; k < dims->size(); ++k) inner *= (*dims)[k];
  int64_t size = (*dims)[axis];
  if (outer * static_cast<int64_t>(indices.known->size()) * inner > kMaxKnownElements) {
    return std::nullopt;
  }
  std::vector<Expr> out;
  for (int64_t o = 0; o < outer; ++o) {
    for (const Expr& e : *indices.known) {
      auto j = e.as_integer();
      if (!j) return std::nullopt;
      int64_t row = *j < 0 ? *j + size : *j;
      for (int64_t i = 0; i < inner; ++i)
        out.push_back((*data.known)[(o * size + row) * inner + i]);
    }
  }
  return out;
}

std::vector<TensorValue> lower_gather(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  const TensorValue& data = required_input(ctx, inputs, 0, "data");
  const TensorValue& raw_indices = required_input(ctx, inputs, 1, "indices");
  size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(data.rank())));
  if (data.rank() == 0) ctx.fail("expected data of rank >= 1, found a scalar");
  const Expr size = data.shape[axis];
  std::vector<Expr> shape(data.shape.begin(), data.shape.begin() + axis);
  shape.insert(shape.end(), raw_indices.shape.begin(), raw_indices.shape.end());
  shape.insert(shape.end(), data.shape.begin() + axis + 1, data.shape.end());
  TensorValue indices = checked_indices(ctx, raw_indices, size);
  auto known = gather_known(data, indices, axis);
  if (known) {
    if (auto out = make_known(ctx, data.dtype, shape, *known)) return {*out};
  }
  const size_t q = indices.rank();
  TensorValue out =
      ctx.pointwise(data.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
        std::vector<Expr> at(index.begin() + axis, index.begin() + axis + q);
        ValueId row = body.indirect(ctx.load_at(body, indices, at), size);
        std::vector<Expr> data_index(index.begin(), index.begin() + axis);
        data_index.push_back(body.op(row).symbol);
        data_index.insert(data_index.end(), index.begin() + axis + q, index.end());
        return ctx.load_at(body, data, data_index);
      });
  out.known = std::move(known);
  return {out};
}

std::vector<TensorValue> lower_gather_elements(LoweringContext& ctx, const graph::Node& node,
                                               const LowerInputs& inputs) {
  const TensorValue& data = required_input(ctx, inputs, 0, "data");
  const TensorValue& raw_indices = required_input(ctx, inputs, 1, "indices");
  if (data.rank() != raw_indices.rank() || data.rank() == 0) {
    ctx.fail("expected data and indices of the same rank >= 1, found ranks " +
             std::to_string(data.rank()) + " and " + std::to_string(raw_indices.rank()));
  }
  size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(data.rank())));
  const Expr size = data.shape[axis];
  TensorValue indices = checked_indices(ctx, raw_indices, size);
  return {
      ctx.pointwise(data.dtype, indices.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
        ValueId row = body.indirect(ctx.load_at(body, indices, index), size);
        std::vector<Expr> data_index = index;
        data_index[axis] = body.op(row).symbol;
        return ctx.load_at(body, data, data_index);
      })};
}

/// A tensor of `shape` filled with `value`; small integer fills also set `known`.
TensorValue filled(LoweringContext& ctx, DType dtype, const std::vector<Expr>& shape,
                   double value) {
  TensorValue out = ctx.pointwise(dtype, shape, [&](LoopBody& body, const std::vector<Expr>&) {
    return body.constant(value, dtype);
  });
  auto dims = static_shape(shape);
  if (!dims) return out;
  int64_t n = 1;
  for (int64_t d : *dims) n *= d;
  if (n > kMaxKnownElements) return out;
  if (graph::is_integer(dtype) || dtype == DType::kBool) {
    out.known = std::vector<Expr>(static_cast<size_t>(n), Expr(static_cast<int64_t>(value)));
  } else if (graph::is_floating(dtype)) {
    out.known_float = std::vector<double>(static_cast<size_t>(n), value);
  }
  return out;
}

std::vector<TensorValue> lower_constant_of_shape(LoweringContext& ctx, const graph::Node& node,
                                                 const LowerInputs& inputs) {
  std::vector<Expr> shape =
      sizes_from_tensor(ctx, required_input(ctx, inputs, 0, "input"), "input 'input' (the shape)");
  for (const Expr& d : shape) {
    if (auto v = d.as_integer(); v && *v < 0) {
      ctx.fail("expected non-negative sizes, found " + std::to_string(*v));
    }
  }
  DType dtype = DType::kFloat32;
  double value = 0;
  if (const graph::Tensor* t = node.attr_tensor("value")) {
    if (t->numel() != 1)
      ctx.fail("attribute 'value' must hold one element, found " + std::to_string(t->numel()));
    dtype = t->dtype();
    if (dtype == DType::kString) ctx.fail("string tensors are not supported");
    value = graph::is_floating(dtype) ? t->element_as_double(0)
                                      : static_cast<double>(t->element_as_int64(0));
  }
  return {filled(ctx, dtype, shape, value)};
}

/// Range whose bounds are computed at run time: a library call counts the elements (a size
/// symbol from then on), and each element is start + i * delta read from the inputs.
TensorValue range_at_run_time(LoweringContext& ctx, const TensorValue& start_in,
                              const TensorValue& limit_in, const TensorValue& delta_in) {
  const DType dtype = start_in.dtype;
  for (const TensorValue* v : {&start_in, &limit_in, &delta_in}) {
    if (v->rank() != 0 || v->dtype != dtype)
      ctx.fail("start, limit and delta must be scalars of one dtype");
  }
  // float16 and bfloat16 (one storage type) are counted and computed in float32.
  const bool half = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  auto widened = [&](const TensorValue& v) {
    if (!half) return v;
    return ctx.pointwise(DType::kFloat32, {}, [&](LoopBody& body, const std::vector<Expr>&) {
      return body.cast(ctx.load_at(body, v, {}), DType::kFloat32);
    });
  };
  const TensorValue start = widened(start_in), limit = widened(limit_in), delta = widened(delta_in);
  TensorValue count = ctx.extern_call(
      ir::RangeCountCall{ctx.node().describe()}, DType::kInt64, {Expr(1)},
      {ctx.as_view(start, true), ctx.as_view(limit, true), ctx.as_view(delta, true)});
  const Expr n = bind_sizes(ctx, count).at(0);
  const DType wide = dtype == DType::kFloat16 || dtype == DType::kBFloat16 ? DType::kFloat32
                     : graph::is_floating(dtype)                           ? DType::kFloat64
                                                                           : DType::kInt64;
  return ctx.pointwise(dtype, {n}, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId s = body.cast(ctx.load_at(body, start, {}), wide);
    ValueId d = body.cast(ctx.load_at(body, delta, {}), wide);
    ValueId k = body.cast(body.index_expr(i[0]), wide);
    return body.cast(body.binary(OpCode::kAdd, s, body.binary(OpCode::kMul, k, d)), dtype);
  });
}

std::vector<TensorValue> lower_range(LoweringContext& ctx, const graph::Node& node,
                                     const LowerInputs& inputs) {
  const TensorValue& start = required_input(ctx, inputs, 0, "start");
  const TensorValue& limit = required_input(ctx, inputs, 1, "limit");
  const TensorValue& delta = required_input(ctx, inputs, 2, "delta");
  DType dtype = start.dtype;
  // Range-27 adds float16 and bfloat16, computed in stash_type (float32, its default).
  const bool half = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
  if (half && node.opset() < 27) {
    ctx.fail(fmt::format("{} needs opset 27", graph::dtype_name(dtype)));
  }
  if (half && node.attr_int("stash_type", 1) != 1) {
    ctx.fail(fmt::format("attribute 'stash_type' is {}; only 1 (float32) is supported",
                         node.attr_int("stash_type", 1)));
  }
  if (!start.known && !start.known_float) return {range_at_run_time(ctx, start, limit, delta)};
  if (graph::is_integer(dtype) && (!limit.known || !delta.known))
    return {range_at_run_time(ctx, start, limit, delta)};
  if (graph::is_floating(dtype) && (!known_scalar(limit) || !known_scalar(delta)))
    return {range_at_run_time(ctx, start, limit, delta)};
  if (graph::is_integer(dtype)) {
    Expr s = require_known(ctx, start, "input 'start'").at(0);
    Expr l = require_known(ctx, limit, "input 'limit'").at(0);
    int64_t d = require_static_ints(ctx, delta, "input 'delta'").at(0);
    if (d == 0) ctx.fail("delta must not be 0");
    Expr n = ctx.analyzer().simplify(
        sym::max(d > 0 ? sym::ceil_div(l - s, d) : sym::ceil_div(s - l, -d), 0));
    TensorValue out = ctx.pointwise(dtype, {n}, [&](LoopBody& body, const std::vector<Expr>& i) {
      return body.cast(body.index_expr(s + i[0] * d), dtype);
    });
    if (auto count = n.as_integer(); count && *count <= kMaxKnownElements) {
      out.known.emplace();
      for (int64_t k = 0; k < *count; ++k) out.known->push_back(s + k * d);
    }
    return {out};
  }
  auto s = known_scalar(start), l = known_scalar(limit), d = known_scalar(delta);
  if (!s || !l || !d) {
    ctx.fail(
        "start, limit and delta must be known at compile time (the output size depends on "
        "them); data-dependent shapes are not supported yet");
  }
  if (*d == 0) ctx.fail("delta must not be 0");
  int64_t n = std::max<int64_t>(static_cast<int64_t>(std::ceil((*l - *s) / *d)), 0);
  if (half) {
    const float fs = static_cast<float>(*s), fl = static_cast<float>(*l),
                fd = static_cast<float>(*d);
    n = std::max<int64_t>(static_cast<int64_t>(std::ceil((fl - fs) / fd)), 0);
  }
  const DType compute = half ? DType::kFloat32 : DType::kFloat64;
  return {ctx.pointwise(dtype, {Expr(n)}, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId k = body.cast(body.index_expr(i[0]), compute);
    ValueId v = body.binary(OpCode::kAdd, body.constant(*s, compute),
                            body.binary(OpCode::kMul, k, body.constant(*d, compute)));
    return body.cast(v, dtype);
  })};
}

std::vector<TensorValue> lower_tile(LoweringContext& ctx, const graph::Node&,
                                    const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  std::vector<Expr> repeats =
      sizes_from_tensor(ctx, required_input(ctx, inputs, 1, "repeats"), "input 'repeats'");
  if (repeats.size() != x.rank()) {
    ctx.fail("expected " + std::to_string(x.rank()) + " repeats (the input's rank), found " +
             std::to_string(repeats.size()));
  }
  std::vector<Expr> shape;
  for (size_t k = 0; k < x.rank(); ++k) {
    if (auto r = repeats[k].as_integer(); r && *r < 0) {
      ctx.fail("expected non-negative repeats, found " + std::to_string(*r));
    }
    shape.push_back(x.shape[k] * repeats[k]);
  }
  const std::vector<Expr> in_shape = x.shape;
  return {make_view(ctx, x, std::move(shape), [in_shape, repeats](const std::vector<Expr>& index) {
    std::vector<Expr> in;
    for (size_t k = 0; k < index.size(); ++k) {
      in.push_back(repeats[k] == Expr(1) ? index[k] : sym::mod(index[k], in_shape[k]));
    }
    return in;
  })};
}

std::vector<TensorValue> lower_one_hot(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& indices = required_input(ctx, inputs, 0, "indices");
  const TensorValue& depth_value = required_input(ctx, inputs, 1, "depth");
  const TensorValue& values = required_input(ctx, inputs, 2, "values");
  auto depth_double = known_scalar(depth_value);
  if (!depth_double) ctx.fail("input 'depth' must be known at compile time (it sets the shape)");
  int64_t depth = static_cast<int64_t>(*depth_double);
  if (depth < 1) ctx.fail("expected depth >= 1, found " + std::to_string(depth));
  if (values.rank() != 1 || values.shape[0] != Expr(2)) {
    ctx.fail("expected values of shape [2] (off, on), found " + graph::shape_str(values.shape));
  }
  int64_t out_rank = static_cast<int64_t>(indices.rank()) + 1;
  size_t axis = static_cast<size_t>(ctx.normalize_axis(node.attr_int("axis", -1), out_rank));
  std::vector<Expr> shape = indices.shape;
  shape.insert(shape.begin() + axis, Expr(depth));
  return {ctx.pointwise(values.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    std::vector<Expr> at = index;
    at.erase(at.begin() + axis);
    ValueId raw = body.cast(ctx.load_at(body, indices, at), DType::kInt64);
    ValueId zero = body.constant(0, DType::kInt64);
    ValueId d = body.constant(static_cast<double>(depth), DType::kInt64);
    // Negative indices count from the end; out-of-range ones match no position.
    ValueId wrapped =
        body.where(body.binary(OpCode::kLt, raw, zero), body.binary(OpCode::kAdd, raw, d), raw);
    ValueId hit = body.binary(OpCode::kEq, wrapped, body.index_expr(index[axis]));
    return body.where(hit, ctx.load_at(body, values, {Expr(1)}),
                      ctx.load_at(body, values, {Expr(0)}));
  })};
}

std::vector<TensorValue> lower_trilu(LoweringContext& ctx, const graph::Node& node,
                                     const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const TensorValue* k = optional_input(inputs, 1);
  if (x.rank() < 2)
    ctx.fail("expected an input of rank >= 2, found rank " + std::to_string(x.rank()));
  if (k != nullptr && k->rank() != 0 && !(k->rank() == 1 && k->shape[0] == Expr(1))) {
    ctx.fail("expected a scalar k, found shape " + graph::shape_str(k->shape));
  }
  bool upper = node.attr_int("upper", 1) != 0;
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    size_t r = index.size();
    ValueId diagonal = body.index_expr(index[r - 1] - index[r - 2]);  // column - row
    ValueId offset = body.constant(0, DType::kInt64);
    if (k != nullptr) {
      offset =
          body.cast(ctx.load_at(body, *k, std::vector<Expr>(k->rank(), Expr(0))), DType::kInt64);
    }
    ValueId keep = body.binary(upper ? OpCode::kGe : OpCode::kLe, diagonal, offset);
    ValueId v = ctx.load_at(body, x, index);
    return body.where(keep, v, body.constant(0, body.dtype(v)));
  })};
}

std::vector<TensorValue> lower_eye_like(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  if (x.rank() != 2)
    ctx.fail("expected an input of rank 2, found rank " + std::to_string(x.rank()));
  DType dtype = x.dtype;
  if (node.has_attribute("dtype")) {
    auto d = graph::dtype_from_onnx(static_cast<int32_t>(node.attr_int("dtype", 0)));
    if (!d || *d == DType::kString)
      ctx.fail("unsupported dtype " + std::to_string(node.attr_int("dtype", 0)));
    dtype = *d;
  }
  int64_t k = node.attr_int("k", 0);
  return {ctx.pointwise(dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId on = body.binary(OpCode::kEq, body.index_expr(index[1] - index[0]),
                             body.constant(static_cast<double>(k), DType::kInt64));
    return body.where(on, body.constant(1, dtype), body.constant(0, dtype));
  })};
}

std::vector<TensorValue> lower_cast_like(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const TensorValue& target = required_input(ctx, inputs, 1, "target_type");
  if (x.dtype == DType::kString || target.dtype == DType::kString) {
    ctx.fail("string tensors are not supported");
  }
  DType dtype = target.dtype;
  if (graph::is_small_float(dtype) || graph::is_small_integer(dtype)) {
    return {cast_value(ctx, node, x, dtype)};
  }
  TensorValue out = ctx.pointwise(dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    return body.cast(ctx.load_at(body, x, i), dtype);
  });
  if (dtype == DType::kInt64 && graph::is_integer(x.dtype)) out.known = x.known;
  return {out};
}

}  // namespace

void register_index_ops(Registry& registry) {
  registry.add("", "Gather", {lower_gather, 1, 17});
  registry.add("", "GatherElements", {lower_gather_elements, 11, 17});
  registry.add("", "ConstantOfShape", {lower_constant_of_shape, 9, 17});
  registry.add("", "Range", {lower_range, 11, 27});
  registry.add("", "Tile", {lower_tile, 6, 17});
  registry.add("", "OneHot", {lower_one_hot, 9, 17});
  registry.add("", "Trilu", {lower_trilu, 14, 17});
  registry.add("", "EyeLike", {lower_eye_like, 9, 17});
  registry.add("", "CastLike", {lower_cast_like, 15, 25});
}

}  // namespace kiln::lower
