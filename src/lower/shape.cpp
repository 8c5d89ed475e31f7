/// Shape-family lowerings: Constant, Shape, Size, and the views Reshape, Flatten, Transpose,
/// Squeeze, Unsqueeze and Expand. Views are index remaps of their input (make_view): no copy.
/// Values known at compile time (`known`) are propagated so that Shape -> Gather -> Unsqueeze ->
/// Concat -> Reshape chains of exported models resolve to symbolic shapes. Slice, Concat and
/// Split live in slice_concat.cpp.
///
/// Tests: tests/unit/lower/shape_test.cpp and the ONNX node suite (interpreter_cases.txt).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
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
using sym::Expr;

namespace {

std::vector<TensorValue> lower_constant(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs&) {
  if (const graph::Tensor* t = node.attr_tensor("value")) {
    return {ctx.from_constant(std::make_shared<const graph::Tensor>(*t))};
  }
  auto float_tensor = [&](std::vector<float> values, std::vector<int64_t> dims) {
    auto t = std::make_shared<graph::Tensor>(DType::kFloat32, std::move(dims));
    std::copy(values.begin(), values.end(), t->mutable_values<float>().begin());
    return ctx.from_constant(std::move(t));
  };
  if (node.has_attribute("value_float"))
    return {float_tensor({node.attr_float("value_float", 0)}, {})};
  if (node.has_attribute("value_floats")) {
    std::vector<float> values = node.attr_floats("value_floats", {});
    int64_t n = static_cast<int64_t>(values.size());
    return {float_tensor(std::move(values), {n})};
  }
  if (node.has_attribute("value_int")) {
    return {ctx.from_known(DType::kInt64, {}, {Expr(node.attr_int("value_int", 0))})};
  }
  if (node.has_attribute("value_ints")) {
    std::vector<Expr> values;
    for (int64_t v : node.attr_ints("value_ints", {})) values.emplace_back(v);
    Expr n = static_cast<int64_t>(values.size());
    return {ctx.from_known(DType::kInt64, {n}, std::move(values))};
  }
  for (const char* name : {"sparse_value", "value_string", "value_strings"}) {
    if (node.has_attribute(name))
      ctx.fail(std::string("attribute '") + name + "' is not supported");
  }
  ctx.fail("expected one of the attributes value, value_float(s), value_int(s), found none");
}

std::vector<TensorValue> lower_shape(LoweringContext& ctx, const graph::Node& node,
                                     const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t start = 0;
  int64_t end = rank;
  if (node.opset() >= 15) {
    start = node.attr_int("start", 0);
    end = node.attr_int("end", rank);
  }
  auto clamp = [rank](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  std::vector<Expr> dims(x.shape.begin() + start, x.shape.begin() + end);
  Expr n = static_cast<int64_t>(dims.size());
  return {ctx.from_known(DType::kInt64, {n}, std::move(dims))};
}

std::vector<TensorValue> lower_size(LoweringContext& ctx, const graph::Node&,
                                    const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  return {ctx.from_known(DType::kInt64, {}, {sym::product(x.shape)})};
}

/// An integer coefficient times a multiset of symbolic factors: a product of dims taken apart so
/// that equal factors cancel in the division that infers Reshape's -1.
struct Factors {
  int64_t coef = 1;
  std::vector<Expr> atoms;

  void multiply(const Expr& dim) {
    if (auto v = dim.as_integer()) {
      coef *= *v;
      return;
    }
    if (dim.kind() == sym::ExprKind::kMul) {
      for (const Expr& a : dim.args()) multiply(a);
      return;
    }
    atoms.push_back(dim);
  }
  Expr value() const { return Expr(coef) * sym::product(atoms); }
};

/// numel(input) / product(known output dims), cancelling common factors.
Expr infer_reshape_dim(LoweringContext& ctx, const std::vector<Expr>& in_shape,
                       const std::vector<Expr>& known_dims) {
  Factors num, den;
  for (const Expr& d : in_shape) num.multiply(d);
  for (const Expr& d : known_dims) den.multiply(d);
  std::vector<Expr> rest;
  for (const Expr& a : den.atoms) {
    auto it = std::find(num.atoms.begin(), num.atoms.end(), a);
    if (it == num.atoms.end()) {
      rest.push_back(a);
    } else {
      num.atoms.erase(it);
    }
  }
  den.atoms = std::move(rest);
  if (den.coef == 0) ctx.fail("cannot infer the -1 dimension when another dimension is 0");
  if (num.coef == 0) return 0;
  int64_t g = std::gcd(num.coef, den.coef);
  num.coef /= g;
  den.coef /= g;
  if (den.atoms.empty() && num.atoms.empty() && den.coef != 1) {
    ctx.fail("cannot reshape a tensor of shape " + graph::shape_str(in_shape) +
             ": the other dimensions' product does not divide its element count");
  }
  // A symbolic remainder must divide at run time, as ONNX requires; floor_div states the result.
  return ctx.analyzer().simplify(sym::floor_div(num.value(), den.value()));
}

std::vector<Expr> reshape_target(LoweringContext& ctx, const graph::Node& node,
                                 const LowerInputs& inputs) {
  if (node.opset() < 5) {
    std::vector<Expr> target;
    for (int64_t v : node.attr_ints("shape", {})) target.emplace_back(v);
    return target;
  }
  return require_known(ctx, required_input(ctx, inputs, 1, "shape"), "input 'shape'");
}

std::vector<TensorValue> lower_reshape(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  bool allowzero = node.opset() >= 14 && node.attr_int("allowzero", 0) != 0;
  if (node.opset() >= 5 && !required_input(ctx, inputs, 1, "shape").known) {
    // A target computed at run time: a library call resolves its 0 and -1 entries and checks
    // the element count; the resolved dims become size symbols.
    const TensorValue& shape = *inputs[1];
    if (shape.rank() != 1) ctx.fail("input 'shape' must have rank 1");
    TensorValue in_dims =
        ctx.from_known(DType::kInt64, {Expr(static_cast<int64_t>(x.rank()))}, x.shape);
    TensorValue dims = ctx.extern_call(
        ir::ReshapeDimsCall{node_what(ctx, "input 'shape'"), allowzero}, DType::kInt64,
        {shape.shape[0]}, {ctx.as_view(shape, true), ctx.as_view(in_dims, true)});
    return {reshape_view(ctx, x, bind_sizes(ctx, dims))};
  }
  std::vector<Expr> target = reshape_target(ctx, node, inputs);
  std::vector<Expr> out;
  std::optional<size_t> infer;
  for (size_t k = 0; k < target.size(); ++k) {
    auto v = target[k].as_integer();
    if (v == 0 && !allowzero) {
      if (k >= x.rank()) {
        ctx.fail("shape entry " + std::to_string(k) + " is 0 (copy the input dimension) but the " +
                 "input has rank " + std::to_string(x.rank()));
      }
      out.push_back(x.shape[k]);
    } else if (v == -1) {
      if (infer) ctx.fail("expected at most one -1 in the shape, found two");
      infer = k;
      out.push_back(0);
    } else if (v && *v < -1) {
      ctx.fail("invalid shape entry " + std::to_string(*v) + " at position " + std::to_string(k));
    } else {
      out.push_back(target[k]);
    }
  }
  if (infer) {
    std::vector<Expr> others = out;
    others.erase(others.begin() + static_cast<std::ptrdiff_t>(*infer));
    out[*infer] = infer_reshape_dim(ctx, x.shape, others);
  } else {
    Expr in_numel = sym::product(x.shape);
    Expr out_numel = sym::product(out);
    if (in_numel.is_integer() && out_numel.is_integer() && in_numel != out_numel) {
      ctx.fail("cannot reshape " + graph::shape_str(x.shape) + " (" + in_numel.str() +
               " elements) to " + graph::shape_str(out) + " (" + out_numel.str() + " elements)");
    }
  }
  return {reshape_view(ctx, x, std::move(out))};
}

std::vector<TensorValue> lower_flatten(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = node.attr_int("axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) {
    ctx.fail("axis " + std::to_string(node.attr_int("axis", 1)) + " is out of range [" +
             std::to_string(-rank) + ", " + std::to_string(rank) + "]");
  }
  auto mid = x.shape.begin() + axis;
  Expr outer = sym::product(std::vector<Expr>(x.shape.begin(), mid));
  Expr inner = sym::product(std::vector<Expr>(mid, x.shape.end()));
  return {reshape_view(ctx, x, {outer, inner})};
}

std::vector<TensorValue> lower_transpose(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  int64_t rank = static_cast<int64_t>(x.rank());
  std::vector<int64_t> reversed(x.rank());
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  std::vector<int64_t> perm = node.attr_ints("perm", reversed);
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(x.rank());
  std::iota(identity.begin(), identity.end(), 0);
  if (sorted != identity) {
    ctx.fail("perm must be a permutation of 0.." + std::to_string(rank - 1) + " for rank " +
             std::to_string(rank));
  }
  std::vector<Expr> shape;
  for (int64_t p : perm) shape.push_back(x.shape[static_cast<size_t>(p)]);
  return {make_view(ctx, x, std::move(shape), [perm](const std::vector<Expr>& index) {
    std::vector<Expr> in(index.size());
    for (size_t k = 0; k < perm.size(); ++k) in[static_cast<size_t>(perm[k])] = index[k];
    return in;
  })};
}

/// The `axes` of Squeeze/Unsqueeze: an attribute before opset 13, an input from 13.
std::optional<std::vector<int64_t>> axes_argument(LoweringContext& ctx, const graph::Node& node,
                                                  const LowerInputs& inputs) {
  if (node.opset() < 13) {
    if (!node.has_attribute("axes")) return std::nullopt;
    return node.attr_ints("axes", {});
  }
  const TensorValue* axes = optional_input(inputs, 1);
  if (axes == nullptr) return std::nullopt;
  return require_static_ints(ctx, *axes, "input 'axes'");
}

/// Normalized, sorted axes; fails on duplicates.
std::vector<int64_t> normalize_axes(LoweringContext& ctx, std::vector<int64_t> axes, int64_t rank) {
  for (int64_t& a : axes) a = ctx.normalize_axis(a, rank);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) {
    ctx.fail("axes must not repeat an axis");
  }
  return axes;
}

std::vector<TensorValue> lower_squeeze(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  int64_t rank = static_cast<int64_t>(x.rank());
  std::set<int64_t> squeezed;
  if (auto axes = axes_argument(ctx, node, inputs)) {
    for (int64_t a : normalize_axes(ctx, *axes, rank)) {
      const Expr& dim = x.shape[static_cast<size_t>(a)];
      auto v = dim.as_integer();
      if (v && *v != 1) {
        ctx.fail("cannot squeeze axis " + std::to_string(a) + " of shape " +
                 graph::shape_str(x.shape) + ": expected size 1, found " + dim.str());
      }
      // A symbolic dim squeezed by the model is 1: record it.
      if (dim.is_symbol()) ctx.analyzer().bind_range(dim, {1, 1});
      squeezed.insert(a);
    }
  } else {
    for (int64_t k = 0; k < rank; ++k) {
      if (x.shape[static_cast<size_t>(k)] == Expr(1)) squeezed.insert(k);
    }
  }
  std::vector<Expr> shape;
  for (int64_t k = 0; k < rank; ++k) {
    if (!squeezed.count(k)) shape.push_back(x.shape[static_cast<size_t>(k)]);
  }
  return {make_view(ctx, x, std::move(shape), [squeezed, rank](const std::vector<Expr>& index) {
    std::vector<Expr> in;
    size_t next = 0;
    for (int64_t k = 0; k < rank; ++k) in.push_back(squeezed.count(k) ? Expr(0) : index[next++]);
    return in;
  })};
}

std::vector<TensorValue> lower_unsqueeze(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  auto axes = axes_argument(ctx, node, inputs);
  if (!axes) ctx.fail("missing required axes");
  int64_t out_rank = static_cast<int64_t>(x.rank() + axes->size());
  std::vector<int64_t> sorted = normalize_axes(ctx, *axes, out_rank);
  std::set<int64_t> inserted(sorted.begin(), sorted.end());
  std::vector<Expr> shape;
  size_t next = 0;
  for (int64_t k = 0; k < out_rank; ++k)
    shape.push_back(inserted.count(k) ? Expr(1) : x.shape[next++]);
  return {make_view(ctx, x, std::move(shape), [inserted, out_rank](const std::vector<Expr>& index) {
    std::vector<Expr> in;
    for (int64_t k = 0; k < out_rank; ++k) {
      if (!inserted.count(k)) in.push_back(index[static_cast<size_t>(k)]);
    }
    return in;
  })};
}

std::vector<TensorValue> lower_expand(LoweringContext& ctx, const graph::Node&,
                                      const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const TensorValue& shape_value = required_input(ctx, inputs, 1, "shape");
  if (!shape_value.known) {
    // A target computed at run time: a library call broadcasts it with the input's dims (and
    // checks they broadcast); the result's dims become size symbols. A symbolic input dim may
    // turn out to be 1, so it reads index * min(dim - 1, 1).
    if (shape_value.rank() != 1) ctx.fail("input 'shape' must have rank 1");
    const int64_t n = require_static_dim(ctx, shape_value.shape[0], "input 'shape''s length");
    const int64_t rank = std::max<int64_t>(n, static_cast<int64_t>(x.rank()));
    TensorValue in_dims =
        ctx.from_known(DType::kInt64, {Expr(static_cast<int64_t>(x.rank()))}, x.shape);
    TensorValue dims =
        ctx.extern_call(ir::ExpandDimsCall{node_what(ctx, "input 'shape'")}, DType::kInt64,
                        {Expr(rank)}, {ctx.as_view(shape_value, true), ctx.as_view(in_dims, true)});
    const std::vector<Expr> in_shape = x.shape;
    return {make_view(ctx, x, bind_sizes(ctx, dims), [in_shape](const std::vector<Expr>& index) {
      std::vector<Expr> in;
      const size_t skip = index.size() - in_shape.size();
      for (size_t k = 0; k < in_shape.size(); ++k) {
        const Expr& d = in_shape[k];
        const Expr& i = index[skip + k];
        in.push_back(d == Expr(1) ? Expr(0) : d.is_integer() ? i : i * sym::min(d - 1, 1));
      }
      return in;
    })};
  }
  std::vector<Expr> target = require_known(ctx, shape_value, "input 'shape'");
  for (const Expr& d : target) {
    if (auto v = d.as_integer(); v && *v < 0) {
      ctx.fail("expected non-negative sizes in the shape, found " + std::to_string(*v));
    }
  }
  std::vector<Expr> shape = ctx.broadcast_shapes({x.shape, target});
  const std::vector<Expr> in_shape = x.shape;
  return {make_view(ctx, x, std::move(shape), [in_shape](const std::vector<Expr>& index) {
    return LoweringContext::broadcast_index(index, in_shape);
  })};
}

}  // namespace

void register_slice_concat_ops(Registry& registry);

void register_shape_ops(Registry& registry) {
  registry.add("", "Constant", {lower_constant, 1, 17});
  registry.add("", "Shape", {lower_shape, 1, 17});
  registry.add("", "Size", {lower_size, 1, 17});
  registry.add("", "Reshape", {lower_reshape, 1, 17});
  registry.add("", "Flatten", {lower_flatten, 1, 17});
  registry.add("", "Transpose", {lower_transpose, 1, 17});
  registry.add("", "Squeeze", {lower_squeeze, 1, 17});
  registry.add("", "Unsqueeze", {lower_unsqueeze, 1, 17});
  registry.add("", "Expand", {lower_expand, 8, 17});
  register_slice_concat_ops(registry);
}

}  // namespace kiln::lower
