#include "lower/op_util.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "support/error.h"
#include "sym/analyzer.h"

namespace kiln::lower {

std::shared_ptr<const graph::Tensor> prepared_weight(const LoweringOptions& options,
                                                     const std::vector<float>& values) {
  const std::vector<int64_t> dims = {static_cast<int64_t>(values.size())};
  if (values.size() * sizeof(float) >= kSpillBytes) {
    const std::filesystem::path dir = options.code_cache_dir.empty()
                                          ? std::filesystem::temp_directory_path()
                                          : options.code_cache_dir / "tmp";
    return std::make_shared<graph::Tensor>(
        graph::Tensor::spilled(graph::DType::kFloat32, dims, values.data(), dir));
  }
  auto tensor = std::make_shared<graph::Tensor>(graph::DType::kFloat32, dims);
  std::copy(values.begin(), values.end(), tensor->mutable_values<float>().begin());
  return tensor;
}

using ir::LoopBody;
using ir::ValueId;
using sym::Expr;

namespace {

/// The integer value of an expression without free symbols; nullopt when it has any.
std::optional<int64_t> eval_static(const Expr& e) {
  if (auto c = e.as_integer()) return c;
  if (!sym::free_symbols(e).empty()) return std::nullopt;
  return sym::evaluate(e, {});
}

/// For each element of the (static) output, the flat position in the (static) input it reads;
/// nullopt when the shapes are symbolic, the output too large, or the remap not evaluable.
std::optional<std::vector<size_t>> static_gather_map(const std::vector<Expr>& in_shape,
                                                     const std::vector<Expr>& out_shape,
                                                     const IndexRemap& remap) {
  auto in_dims = static_shape(in_shape);
  auto out_dims = static_shape(out_shape);
  if (!in_dims || !out_dims) return std::nullopt;
  int64_t count = 1;
  for (int64_t d : *out_dims) count *= d;
  if (count > kMaxKnownElements) return std::nullopt;
  std::vector<size_t> map;
  std::vector<Expr> index(out_dims->size());
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat;
    for (size_t k = out_dims->size(); k-- > 0;) {
      index[k] = rest % (*out_dims)[k];
      rest /= (*out_dims)[k];
    }
    std::vector<Expr> in_index = remap(index);
    int64_t pos = 0;
    for (size_t k = 0; k < in_index.size(); ++k) {
      auto v = eval_static(in_index[k]);
      if (!v || *v < 0 || *v >= (*in_dims)[k]) return std::nullopt;
      pos = pos * (*in_dims)[k] + *v;
    }
    map.push_back(static_cast<size_t>(pos));
  }
  return map;
}

template <typename T>
std::optional<std::vector<T>> gather_known(const std::optional<std::vector<T>>& values,
                                           const std::vector<size_t>& map) {
  if (!values) return std::nullopt;
  std::vector<T> out;
  out.reserve(map.size());
  for (size_t pos : map) {
    if (pos >= values->size()) return std::nullopt;
    out.push_back((*values)[pos]);
  }
  return out;
}

}  // namespace

const TensorValue& required_input(const LoweringContext& ctx, const LowerInputs& inputs, size_t i,
                                  const std::string& name) {
  if (i >= inputs.size() || !inputs[i]) {
    ctx.fail("missing required input " + std::to_string(i) + " ('" + name + "')");
  }
  return *inputs[i];
}

const TensorValue* optional_input(const LowerInputs& inputs, size_t i) {
  return i < inputs.size() && inputs[i] ? &*inputs[i] : nullptr;
}

std::optional<TensorValue> make_known(LoweringContext& ctx, graph::DType dtype,
                                      const std::vector<Expr>& shape, std::vector<Expr> values) {
  bool any_count = dtype == graph::DType::kInt64 || dtype == graph::DType::kInt32 ||
                   dtype == graph::DType::kBool;
  if (!any_count && values.size() > 8) return std::nullopt;
  return ctx.from_known(dtype, shape, std::move(values));
}

namespace {

std::vector<int64_t> int_list(LoweringContext& ctx, const graph::Node& node, const char* name,
                              size_t n, int64_t fallback) {
  std::vector<int64_t> v = node.attr_ints(name, std::vector<int64_t>(n, fallback));
  if (v.size() != n) {
    ctx.fail(std::string("expected ") + std::to_string(n) + " values in attribute '" + name +
             "', found " + std::to_string(v.size()));
  }
  for (int64_t x : v) {
    if (x < (fallback == 0 ? 0 : 1)) {
      ctx.fail(std::string("invalid value ") + std::to_string(x) + " in attribute '" + name + "'");
    }
  }
  return v;
}

}  // namespace

WindowGeometry window_geometry(LoweringContext& ctx, const graph::Node& node,
                               const std::vector<Expr>& spatial, std::vector<int64_t> kernel,
                               bool ceil_mode) {
  size_t n = spatial.size();
  WindowGeometry g;
  if (kernel.size() != n) {
    ctx.fail("expected a kernel of " + std::to_string(n) + " spatial dims, found " +
             std::to_string(kernel.size()));
  }
  g.kernel = std::move(kernel);
  g.strides = int_list(ctx, node, "strides", n, 1);
  g.dilations = int_list(ctx, node, "dilations", n, 1);
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  g.pads =
      auto_pad == "NOTSET" ? int_list(ctx, node, "pads", 2 * n, 0) : std::vector<int64_t>(2 * n, 0);
  for (size_t j = 0; j < n; ++j) {
    int64_t s = g.strides[j];
    int64_t extent = g.dilations[j] * (g.kernel[j] - 1) + 1;
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      Expr out = sym::ceil_div(spatial[j], s);
      Expr total = sym::max((out - 1) * s + extent - spatial[j], 0);
      total = ctx.analyzer().simplify(total);
      auto t = total.as_integer();
      if (!t) {
        ctx.fail("auto_pad " + auto_pad + " with stride " + std::to_string(s) +
                 " over the symbolic size " + spatial[j].str() + " needs size-dependent pads");
      }
      g.pads[j] = auto_pad == "SAME_UPPER" ? *t / 2 : *t - *t / 2;
      g.pads[j + n] = *t - g.pads[j];
      g.out.push_back(out);
      continue;
    }
    if (auto_pad != "NOTSET" && auto_pad != "VALID") {
      ctx.fail("unknown auto_pad '" + auto_pad + "'");
    }
    Expr span = spatial[j] + g.pads[j] + g.pads[j + n] - extent;
    Expr steps = ceil_mode ? sym::ceil_div(span, s) : sym::floor_div(span, s);
    Expr out = steps + 1;
    // With ceil_mode, a last window that would start in the end padding is dropped (ONNX's
    // pooling shape rule, as PyTorch's): window k starts at k * s < size + begin pad.
    if (ceil_mode) out = sym::min(out, sym::ceil_div(spatial[j] + g.pads[j], s));
    g.out.push_back(ctx.analyzer().simplify(out));
  }
  return g;
}

std::optional<std::vector<int64_t>> static_shape(const std::vector<Expr>& shape) {
  std::vector<int64_t> dims;
  for (const Expr& d : shape) {
    auto v = d.as_integer();
    if (!v) return std::nullopt;
    dims.push_back(*v);
  }
  return dims;
}

TensorValue make_view(LoweringContext& ctx, const TensorValue& input, std::vector<Expr> shape,
                      const IndexRemap& remap) {
  bool empty = false;
  for (const Expr& d : shape) empty = empty || d == Expr(0);
  const std::vector<Expr> out_shape = shape;
  TensorValue out = ctx.pointwise(input.dtype, std::move(shape),
                                  [&](LoopBody& body, const std::vector<Expr>& index) {
                                    std::vector<Expr> in_index = remap(index);
                                    if (!empty) {
                                      // Simplify under the output's index ranges, so that e.g. a
                                      // reshape that only merges or splits dims folds back to plain
                                      // indices.
                                      sym::Analyzer ranges = ctx.analyzer();
                                      for (size_t k = 0; k < index.size(); ++k)
                                        ranges.bind_index(index[k], out_shape[k]);
                                      for (Expr& e : in_index) e = ranges.simplify(e);
                                    }
                                    return ctx.load_at(body, input, in_index);
                                  });
  if (input.known || input.known_float) {
    if (auto map = static_gather_map(input.shape, out_shape, remap)) {
      out.known = gather_known(input.known, *map);
      out.known_float = gather_known(input.known_float, *map);
    }
  }
  return out;
}

TensorValue reshape_view(LoweringContext& ctx, const TensorValue& input, std::vector<Expr> shape) {
  if (shape == input.shape) return input;
  const std::vector<Expr> in_shape = input.shape;
  const std::vector<Expr> out_strides = ir::Layout::contiguous(shape).strides;
  return make_view(ctx, input, std::move(shape), [in_shape, out_strides](const auto& index) {
    Expr flat = sym::dot(index, out_strides);
    std::vector<Expr> in_index(in_shape.size());
    Expr stride = 1;
    for (size_t k = in_shape.size(); k-- > 0;) {
      if (in_shape[k] == Expr(1)) {
        in_index[k] = 0;
      } else if (k == 0) {
        in_index[k] = sym::floor_div(flat, stride);
      } else {
        in_index[k] = sym::modular_indexing(flat, stride, in_shape[k]);
      }
      stride *= in_shape[k];
    }
    return in_index;
  });
}

ValueId load_masked(LoweringContext& ctx, LoopBody& body, const TensorValue& value,
                    const std::vector<Expr>& index, ValueId mask, double other) {
  if (mask == ir::kNoValue) return ctx.load_at(body, value, index);
  const LoopBody& src = *value.body;
  bool scalar_known = (value.known && value.known->size() == 1) ||
                      (value.known_float && value.known_float->size() == 1);
  if (!scalar_known && src.ops().size() == 1 && src.op(0).code == ir::OpCode::kLoad &&
      src.op(0).mask == ir::kNoValue) {
    const ir::Op& load = src.op(0);
    sym::Substitution map;
    for (size_t k = 0; k < index.size(); ++k) map[src.vars()[k]] = index[k];
    return body.masked_load(load.buffer, load.buffer_dtype, sym::substitute(load.index, map), mask,
                            other);
  }
  // Any other body may load from buffers at the index: keep it in bounds and select.
  std::vector<Expr> clamped;
  for (size_t k = 0; k < index.size(); ++k) {
    clamped.push_back(sym::max(sym::min(index[k], value.shape[k] - 1), 0));
  }
  ValueId v = ctx.load_at(body, value, clamped);
  return body.where(mask, v, body.constant(other, body.dtype(v)));
}

ValueId in_range(LoopBody& body, const Expr& e, const Expr& lo, const Expr& hi) {
  ValueId mask = ir::kNoValue;
  // Loop and indirect index symbols are never negative.
  bool index_symbol = e.is_symbol() && e.symbol_kind() == sym::SymbolKind::kIndex;
  auto above = (e - lo).as_integer();
  if (!(index_symbol && lo == Expr(0)) && (!above || *above < 0)) {
    mask = body.binary(ir::OpCode::kGe, body.index_expr(e), body.index_expr(lo));
  }
  auto below = (hi - e).as_integer();
  if (!below || *below <= 0) {
    mask =
        and_mask(body, mask, body.binary(ir::OpCode::kLt, body.index_expr(e), body.index_expr(hi)));
  }
  if (mask == ir::kNoValue) mask = body.constant(1, graph::DType::kBool);
  return mask;
}

ValueId and_mask(LoopBody& body, ValueId a, ValueId b) {
  if (a == ir::kNoValue) return b;
  if (b == ir::kNoValue) return a;
  return body.binary(ir::OpCode::kAnd, a, b);
}

const std::vector<Expr>& require_known(const LoweringContext& ctx, const TensorValue& value,
                                       const std::string& what) {
  if (!value.known) {
    ctx.fail(what +
             " must be known at compile time (a constant or computed from shapes); "
             "data-dependent shapes are not supported yet");
  }
  return *value.known;
}

std::string node_what(const LoweringContext& ctx, const std::string& what) {
  return ctx.node().describe() + ": " + what;
}

std::vector<Expr> bind_sizes(LoweringContext& ctx, const TensorValue& sizes) {
  const std::string buffer = *ctx.as_buffer(sizes);
  const int64_t n = require_static_dim(ctx, sizes.shape.at(0), "the number of sizes");
  std::vector<Expr> symbols;
  for (int64_t k = 0; k < n; ++k) symbols.push_back(ctx.dynamic_size({"", buffer, -1, -1, k}));
  return symbols;
}

std::vector<Expr> sizes_from_tensor(LoweringContext& ctx, const TensorValue& value,
                                    const std::string& what, const std::optional<Expr>& max) {
  if (value.known) return *value.known;
  if (!graph::is_integer(value.dtype) || value.rank() > 1)
    ctx.fail(what + " must be an integer tensor of rank 0 or 1");
  const Expr n = value.rank() == 0 ? Expr(1) : value.shape[0];
  require_static_dim(ctx, n, what + "'s length");
  std::vector<std::optional<ir::View>> inputs = {ctx.as_view(value, true)};
  if (max) inputs.push_back(ctx.as_view(ctx.from_known(graph::DType::kInt64, {}, {*max}), true));
  return bind_sizes(ctx, ctx.extern_call(ir::ShapeValuesCall{node_what(ctx, what)},
                                         graph::DType::kInt64, {n}, std::move(inputs)));
}

std::vector<int64_t> require_static_ints(const LoweringContext& ctx, const TensorValue& value,
                                         const std::string& what) {
  std::vector<int64_t> out;
  for (const Expr& e : require_known(ctx, value, what)) {
    auto v = e.as_integer();
    if (!v) ctx.fail(what + " must hold static integers, found symbolic value " + e.str());
    out.push_back(*v);
  }
  return out;
}

int64_t require_static_dim(const LoweringContext& ctx, const Expr& dim, const std::string& what) {
  auto v = dim.as_integer();
  if (!v) ctx.fail(what + " must be a static size, found symbolic " + dim.str());
  return *v;
}

std::optional<double> known_scalar(const TensorValue& v) {
  if (v.known_float && v.known_float->size() == 1) return (*v.known_float)[0];
  if (v.known && v.known->size() == 1) {
    if (auto c = (*v.known)[0].as_integer()) return static_cast<double>(*c);
  }
  return std::nullopt;
}

ir::Layout broadcast_layout(const ir::Layout& layout, const std::vector<sym::Expr>& sizes) {
  ir::Layout out;
  out.offset = layout.offset;
  size_t skip = sizes.size() - layout.rank();
  for (size_t k = 0; k < sizes.size(); ++k) {
    out.sizes.push_back(sizes[k]);
    if (k < skip) {
      out.strides.push_back(0);
      continue;
    }
    const sym::Expr& own = layout.sizes[k - skip];
    out.strides.push_back(
        own == sym::Expr(1) && sizes[k] != sym::Expr(1) ? sym::Expr(0) : layout.strides[k - skip]);
  }
  return out;
}

}  // namespace kiln::lower
