#include "lower/lowering.h"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <set>

#include <algorithm>

#include "support/error.h"
#include "support/log.h"

namespace kiln::lower {

using graph::DType;
using ir::LoopBody;
using ir::ValueId;

namespace {

/// Known values up to this many elements are inlined into kernels as a select chain instead of a
/// constant buffer.
constexpr size_t kMaxInlineKnown = 8;

std::shared_ptr<LoopBody> new_body(const std::vector<sym::Expr>& shape) {
  return std::make_shared<LoopBody>(shape, std::vector<sym::Expr>{});
}

/// Row-major flat index of `index` in `shape`.
sym::Expr flat_index(const std::vector<sym::Expr>& index, const std::vector<sym::Expr>& shape) {
  return ir::Layout::contiguous(shape).index(index);
}

}  // namespace

const std::vector<sym::Expr>& TensorValue::known_ints(std::string_view what) const {
  if (!known)
    user_error("{} must be known at compile time (a constant or computed from shapes)", what);
  return *known;
}

LoweringContext::LoweringContext(ir::Program& program, const LoweringOptions& options)
    : program_(program), options_(options) {}

void LoweringContext::fail(const std::string& message) const {
  if (node_ == nullptr) throw UserError(message);
  throw UserError(node_->describe() + ": " + message);
}

sym::Expr LoweringContext::dynamic_size(ir::DynamicSize size) {
  std::set<std::string> taken;
  for (const ir::InputSpec& in : program_.inputs) {
    for (const sym::Expr& d : in.shape) {
      for (const sym::Expr& s : sym::free_symbols(d)) taken.insert(s.name());
    }
  }
  for (const ir::DynamicSize& d : program_.dynamic_sizes) taken.insert(d.symbol);
  for (size_t k = program_.dynamic_sizes.size();; ++k) {
    size.symbol = fmt::format("dyn{}", k);
    if (!taken.count(size.symbol)) break;
  }
  program_.dynamic_sizes.push_back(size);
  return sym::Expr::symbol(size.symbol);
}

std::string LoweringContext::new_buffer_name() { return fmt::format("buf{}", next_buffer_++); }

ir::Buffer& LoweringContext::add_buffer(std::unique_ptr<ir::Buffer> buffer) {
  if (node_ != nullptr) buffer->add_origin({node_->name(), node_->op_type()});
  program_.buffers.push_back(std::move(buffer));
  return *program_.buffers.back();
}

TensorValue LoweringContext::from_buffer(const ir::Buffer& buffer) {
  TensorValue value;
  value.dtype = buffer.dtype;
  value.shape = buffer.layout.sizes;
  auto body = new_body(value.shape);
  body->set_result(body->load(buffer.name, buffer.dtype, buffer.layout.index(body->vars())));
  value.body = std::move(body);
  if (buffer.kind == ir::BufferKind::kConstant && buffer.constant &&
      buffer.constant->numel() <= kMaxKnownElements) {
    const graph::Tensor& t = *buffer.constant;
    if (graph::is_integer(t.dtype()) || t.dtype() == DType::kBool) {
      std::vector<sym::Expr> ints;
      for (int64_t i = 0; i < t.numel(); ++i) ints.emplace_back(t.element_as_int64(i));
      value.known = std::move(ints);
    } else if (graph::is_floating(t.dtype())) {
      std::vector<double> floats;
      for (int64_t i = 0; i < t.numel(); ++i) floats.push_back(t.element_as_double(i));
      value.known_float = std::move(floats);
    }
  }
  return value;
}

TensorValue LoweringContext::from_constant(std::shared_ptr<const graph::Tensor> tensor) {
  if (tensor->dtype() == DType::kString) fail("string tensors are not supported");
  auto buffer = std::make_unique<ir::Buffer>();
  buffer->name = fmt::format("const{}", next_buffer_++);
  buffer->kind = ir::BufferKind::kConstant;
  buffer->dtype = tensor->dtype();
  std::vector<sym::Expr> dims(tensor->dims().begin(), tensor->dims().end());
  buffer->layout = ir::Layout::contiguous(std::move(dims));
  buffer->constant = std::move(tensor);
  return from_buffer(add_buffer(std::move(buffer)));
}

TensorValue LoweringContext::from_known(DType dtype, std::vector<sym::Expr> shape,
                                        std::vector<sym::Expr> values) {
  TensorValue value;
  value.dtype = dtype;
  value.shape = shape;
  auto body = new_body(shape);
  // Element i of the flat index is a select chain over the (few) values; larger known tensors
  // with static values become constant buffers.
  bool all_static =
      std::all_of(values.begin(), values.end(), [](const sym::Expr& e) { return e.is_integer(); });
  if (values.size() > kMaxInlineKnown && all_static) {
    auto tensor = std::make_shared<graph::Tensor>(dtype, std::vector<int64_t>{});
    std::vector<int64_t> dims;
    for (const sym::Expr& d : shape) dims.push_back(*d.as_integer());
    auto data = std::make_shared<graph::Tensor>(dtype, dims);
    for (size_t i = 0; i < values.size(); ++i) {
      int64_t v = *values[i].as_integer();
      switch (dtype) {
        case DType::kInt64:
          data->mutable_values<int64_t>()[i] = v;
          break;
        case DType::kInt32:
          data->mutable_values<int32_t>()[i] = static_cast<int32_t>(v);
          break;
        case DType::kBool:
          data->mutable_values<bool>()[i] = v != 0;
          break;
        default:
          fail("known values of dtype " + std::string(graph::dtype_name(dtype)));
      }
    }
    TensorValue loaded = from_constant(data);
    loaded.known = std::move(values);
    return loaded;
  }
  sym::Expr flat = flat_index(body->vars(), shape);
  ValueId result = ir::kNoValue;
  for (size_t i = values.size(); i-- > 0;) {
    ValueId v = values[i].is_integer()
                    ? body->constant(static_cast<double>(*values[i].as_integer()), dtype)
                    : body->cast(body->index_expr(values[i]), dtype);
    if (result == ir::kNoValue) {
      result = v;
      continue;
    }
    ValueId here = body->binary(ir::OpCode::kEq, body->index_expr(flat),
                                body->constant(static_cast<double>(i), DType::kInt64));
    result = body->where(here, v, result);
  }
  if (result == ir::kNoValue) result = body->constant(0, dtype);  // zero-size tensor
  body->set_result(result);
  value.body = std::move(body);
  value.known = std::move(values);
  return value;
}

TensorValue LoweringContext::pointwise(DType dtype, std::vector<sym::Expr> shape,
                                       const PointwiseFn& fn) {
  TensorValue value;
  value.dtype = dtype;
  value.shape = std::move(shape);
  auto body = new_body(value.shape);
  ValueId result = fn(*body, body->vars());
  body->set_result(body->cast(result, dtype));
  value.body = std::move(body);
  return value;
}

ValueId LoweringContext::load_at(LoopBody& body, const TensorValue& value,
                                 const std::vector<sym::Expr>& index) {
  KILN_CHECK(value.body != nullptr, "value without a body");
  KILN_CHECK(index.size() == value.rank(), "index of rank {} for a value of rank {}", index.size(),
             value.rank());
  // Scalars known at compile time become literals in the consumer.
  if (value.known_float && value.known_float->size() == 1) {
    return body.constant((*value.known_float)[0], value.dtype);
  }
  if (value.known && value.known->size() == 1) {
    const sym::Expr& v = (*value.known)[0];
    if (auto c = v.as_integer()) return body.constant(static_cast<double>(*c), value.dtype);
    return body.cast(body.index_expr(v), value.dtype);
  }
  sym::Substitution map;
  for (size_t k = 0; k < index.size(); ++k) map[value.body->vars()[k]] = index[k];
  return body.inline_body(*value.body, map);
}

TensorValue LoweringContext::reduction(DType dtype, std::vector<sym::Expr> shape,
                                       std::vector<sym::Expr> reduce_shape, ir::ReductionType type,
                                       const ReductionFn& fn) {
  auto buffer = std::make_unique<ir::Buffer>();
  buffer->name = new_buffer_name();
  buffer->kind = ir::BufferKind::kComputed;
  buffer->dtype = dtype;
  buffer->layout = ir::Layout::contiguous(shape);
  buffer->body = LoopBody(shape, std::move(reduce_shape));
  LoopBody& body = buffer->body;
  ValueId v = fn(body, body.vars(), body.reduce_vars());
  ValueId r = body.reduction(type, v, dtype);
  body.store(buffer->name, dtype, buffer->layout.index(body.vars()), body.cast(r, dtype));
  return from_buffer(add_buffer(std::move(buffer)));
}

TensorValue LoweringContext::extern_call(ir::LibraryCall op, DType dtype,
                                         std::vector<sym::Expr> shape,
                                         std::vector<std::optional<ir::View>> inputs) {
  auto buffer = std::make_unique<ir::Buffer>();
  buffer->name = new_buffer_name();
  buffer->kind = ir::BufferKind::kExtern;
  buffer->dtype = dtype;
  buffer->layout = ir::Layout::contiguous(std::move(shape));
  buffer->call.op = std::move(op);
  buffer->call.inputs = std::move(inputs);
  return from_buffer(add_buffer(std::move(buffer)));
}

std::optional<std::string> LoweringContext::as_buffer(const TensorValue& value) const {
  if (!value.body || value.body->ops().size() != 1) return std::nullopt;
  const ir::Op& op = value.body->op(0);
  if (op.code != ir::OpCode::kLoad || op.mask != ir::kNoValue) return std::nullopt;
  const ir::Buffer* buffer = program_.find(op.buffer);
  if (buffer == nullptr || buffer->dtype != value.dtype) return std::nullopt;
  if (buffer->layout.sizes != value.shape) return std::nullopt;
  if (op.index != buffer->layout.index(value.body->vars())) return std::nullopt;
  return buffer->name;
}

namespace {

// `value` with its dims reordered: dim k of the result is dim perm[k] of `value`.
TensorValue permuted(LoweringContext& ctx, const TensorValue& value,
                     const std::array<size_t, 4>& perm) {
  KILN_CHECK(value.rank() == 4, "a channels-last view of a rank-{} value", value.rank());
  std::vector<sym::Expr> shape;
  for (size_t k : perm) shape.push_back(value.shape[k]);
  TensorValue out =
      ctx.pointwise(value.dtype, shape, [&](LoopBody& body, const std::vector<sym::Expr>& index) {
        std::vector<sym::Expr> at(4);
        for (size_t k = 0; k < 4; ++k) at[perm[k]] = index[k];
        return ctx.load_at(body, value, at);
      });
  out.origins = value.origins;
  return out;
}

}  // namespace

TensorValue LoweringContext::to_channels_last(const TensorValue& value) {
  return permuted(*this, value, {0, 2, 3, 1});
}

TensorValue LoweringContext::from_channels_last(const TensorValue& value) {
  return permuted(*this, value, {0, 3, 1, 2});
}

bool LoweringContext::reads_channels_last(const TensorValue& value) const {
  if (!value.body || value.rank() != 4) return false;
  for (const ir::Op& op : value.body->ops()) {
    if (op.code == ir::OpCode::kLoad && channels_last_.count(op.buffer)) return true;
  }
  return false;
}

TensorValue LoweringContext::realize_channels_last(const TensorValue& value,
                                                   std::string_view reason) {
  TensorValue realized = realize(to_channels_last(value), reason);
  mark_channels_last(*as_buffer(realized));
  return from_channels_last(realized);
}

TensorValue LoweringContext::realize(const TensorValue& value, std::string_view reason, bool copy) {
  if (!copy && as_buffer(value)) return value;
  auto buffer = std::make_unique<ir::Buffer>();
  buffer->name = new_buffer_name();
  buffer->kind = ir::BufferKind::kComputed;
  buffer->dtype = value.dtype;
  buffer->layout = ir::Layout::contiguous(value.shape);
  buffer->body = *value.body;
  LoopBody& body = buffer->body;
  ValueId result = body.result();
  body.set_result(ir::kNoValue);
  body.store(buffer->name, value.dtype, buffer->layout.index(body.vars()), result);
  log::write(log::Category::kSchedule, "realize {} ({})", buffer->name, reason);
  for (const ir::Origin& origin : value.origins) buffer->add_origin(origin);
  program_.buffers.push_back(std::move(buffer));
  if (value.origins.empty() && node_ != nullptr) {
    program_.buffers.back()->add_origin({node_->name(), node_->op_type()});
  }
  TensorValue realized = from_buffer(*program_.buffers.back());
  realized.known = value.known;
  realized.known_float = value.known_float;
  return realized;
}

ir::View LoweringContext::as_view(const TensorValue& value, bool contiguous) {
  // An unmasked load of a buffer at an index affine in the variables is a strided view.
  if (value.body && value.body->ops().size() == 1 && value.body->op(0).code == ir::OpCode::kLoad &&
      value.body->op(0).mask == ir::kNoValue && value.body->op(0).buffer_dtype == value.dtype) {
    const ir::Op& load = value.body->op(0);
    const std::vector<sym::Expr>& vars = value.body->vars();
    sym::Substitution zero;
    for (const sym::Expr& v : vars) zero[v] = 0;
    ir::Layout layout;
    layout.sizes = value.shape;
    layout.offset = sym::substitute(load.index, zero);
    for (size_t k = 0; k < vars.size(); ++k) {
      sym::Substitution unit = zero;
      unit[vars[k]] = 1;
      layout.strides.push_back(sym::substitute(load.index, unit) - layout.offset);
    }
    // Affine means: the index is offset + sum(stride * var) with strides and offset free of any
    // index variable (loop or indirect).
    bool affine = layout.index(vars) == load.index;
    auto has_index_symbol = [](const sym::Expr& e) {
      for (const sym::Expr& s : sym::free_symbols(e)) {
        if (s.symbol_kind() == sym::SymbolKind::kIndex) return true;
      }
      return false;
    };
    if (has_index_symbol(layout.offset)) affine = false;
    for (const sym::Expr& s : layout.strides) affine = affine && !has_index_symbol(s);
    if (affine && (!contiguous || layout.is_contiguous())) {
      return ir::View{load.buffer, value.dtype, std::move(layout)};
    }
  }
  TensorValue realized =
      realize(value, contiguous ? "contiguous input of a library call" : "input of a library call");
  const ir::Buffer* buffer = program_.find(*as_buffer(realized));
  return ir::View{buffer->name, buffer->dtype, buffer->layout};
}

std::vector<sym::Expr> LoweringContext::broadcast_shapes(
    const std::vector<std::vector<sym::Expr>>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<sym::Expr> out(rank, sym::Expr(1));
  for (size_t d = 0; d < rank; ++d) {
    std::optional<sym::Expr> chosen;
    for (const auto& s : shapes) {
      if (s.size() + d < rank) continue;
      const sym::Expr& dim = s[s.size() - rank + d];
      if (dim == sym::Expr(1)) continue;
      if (!chosen) {
        chosen = dim;
        continue;
      }
      if (*chosen == dim) continue;
      if (chosen->is_integer() && dim.is_integer()) {
        fail(fmt::format(
            "cannot broadcast shapes: dimension {} is {} in one input and {} in another", d,
            chosen->str(), dim.str()));
      }
      // A symbolic dim against another dim: they must be equal at run time; prefer the static one.
      if (dim.is_integer()) chosen = dim;
    }
    if (chosen) out[d] = *chosen;
  }
  return out;
}

std::vector<sym::Expr> LoweringContext::broadcast_index(const std::vector<sym::Expr>& index,
                                                        const std::vector<sym::Expr>& input_shape) {
  std::vector<sym::Expr> out;
  size_t skip = index.size() - input_shape.size();
  for (size_t k = 0; k < input_shape.size(); ++k) {
    out.push_back(input_shape[k] == sym::Expr(1) ? sym::Expr(0) : index[skip + k]);
  }
  return out;
}

int64_t LoweringContext::normalize_axis(int64_t axis, int64_t rank) const {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1)) {
    fail(fmt::format("axis {} is out of range for a tensor of rank {}", axis, rank));
  }
  return axis < 0 ? axis + rank : axis;
}

}  // namespace kiln::lower
