/// Sequence ops over sequences whose length is known when compiling (TensorValue::sequence):
/// SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceErase, SequenceAt, SequenceLength,
/// SplitToSequence and ConcatFromSequence. A sequence is a list of lazy tensors, so SequenceAt
/// of a constructed sequence costs nothing and ConcatFromSequence is one pointwise kernel.
/// Positions must be known when compiling (constants, or inputs given then).
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "lower/graph_lowering.h"
#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using sym::Expr;

namespace {

using Tensors = std::vector<TensorValue>;

TensorValue make_sequence(DType dtype, Tensors tensors) {
  TensorValue v;
  v.dtype = dtype;
  v.sequence = std::make_shared<const Tensors>(std::move(tensors));
  return v;
}

const TensorValue& required_sequence(const LoweringContext& ctx, const LowerInputs& inputs,
                                     size_t i) {
  const TensorValue& v = required_input(ctx, inputs, i, "input_sequence");
  if (!v.sequence) ctx.fail("expected a sequence input");
  return v;
}

/// A position input in [-n, n) (or [-n, n] when `inserting`), normalized; `fallback` when absent.
int64_t position(const LoweringContext& ctx, const LowerInputs& inputs, size_t i, int64_t n,
                 bool inserting, int64_t fallback) {
  const TensorValue* p = optional_input(inputs, i);
  if (p == nullptr) return fallback;
  std::vector<int64_t> v = require_static_ints(ctx, *p, "input 'position'");
  if (v.size() != 1) ctx.fail("the position must be one value");
  int64_t k = v[0] < 0 ? v[0] + n : v[0];
  if (k < 0 || k > n || (k == n && !inserting)) {
    ctx.fail(fmt::format("position {} is out of range for a sequence of length {}", v[0], n));
  }
  return k;
}

std::vector<TensorValue> lower_sequence_empty(LoweringContext& ctx, const graph::Node& node,
                                              const LowerInputs&) {
  std::optional<DType> dtype =
      graph::dtype_from_onnx(static_cast<int32_t>(node.attr_int("dtype", 1)));
  if (!dtype) ctx.fail("attribute 'dtype' names no supported type");
  return {make_sequence(*dtype, {})};
}

std::vector<TensorValue> lower_sequence_construct(LoweringContext& ctx, const graph::Node&,
                                                  const LowerInputs& inputs) {
  Tensors tensors;
  for (size_t i = 0; i < inputs.size(); ++i) {
    tensors.push_back(required_input(ctx, inputs, i, "inputs"));
    if (tensors.back().dtype != tensors[0].dtype) ctx.fail("the tensors must share one dtype");
  }
  if (tensors.empty()) ctx.fail("expected at least one tensor");
  DType dtype = tensors[0].dtype;
  return {make_sequence(dtype, std::move(tensors))};
}

std::vector<TensorValue> lower_sequence_insert(LoweringContext& ctx, const graph::Node&,
                                               const LowerInputs& inputs) {
  const TensorValue& seq = required_sequence(ctx, inputs, 0);
  const TensorValue& tensor = required_input(ctx, inputs, 1, "tensor");
  if (tensor.dtype != seq.dtype) ctx.fail("the tensor's dtype differs from the sequence's");
  Tensors tensors = *seq.sequence;
  const int64_t n = static_cast<int64_t>(tensors.size());
  tensors.insert(tensors.begin() + position(ctx, inputs, 2, n, true, n), tensor);
  return {make_sequence(seq.dtype, std::move(tensors))};
}

std::vector<TensorValue> lower_sequence_erase(LoweringContext& ctx, const graph::Node&,
                                              const LowerInputs& inputs) {
  const TensorValue& seq = required_sequence(ctx, inputs, 0);
  Tensors tensors = *seq.sequence;
  const int64_t n = static_cast<int64_t>(tensors.size());
  if (n == 0) ctx.fail("cannot erase from an empty sequence");
  tensors.erase(tensors.begin() + position(ctx, inputs, 1, n, false, n - 1));
  return {make_sequence(seq.dtype, std::move(tensors))};
}

std::vector<TensorValue> lower_sequence_at(LoweringContext& ctx, const graph::Node&,
                                           const LowerInputs& inputs) {
  const TensorValue& seq = required_sequence(ctx, inputs, 0);
  const int64_t n = static_cast<int64_t>(seq.sequence->size());
  if (optional_input(inputs, 1) == nullptr) ctx.fail("input 'position' is required");
  return {(*seq.sequence)[static_cast<size_t>(position(ctx, inputs, 1, n, false, 0))]};
}

std::vector<TensorValue> lower_sequence_length(LoweringContext& ctx, const graph::Node&,
                                               const LowerInputs& inputs) {
  const TensorValue& seq = required_sequence(ctx, inputs, 0);
  return {ctx.from_known(DType::kInt64, {}, {Expr(static_cast<int64_t>(seq.sequence->size()))})};
}

std::vector<TensorValue> lower_split_to_sequence(LoweringContext& ctx, const graph::Node& node,
                                                 const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  if (x.rank() == 0) ctx.fail("expected an input of rank >= 1");
  const size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(x.rank())));
  std::vector<int64_t> sizes;
  const TensorValue* split = optional_input(inputs, 1);
  const bool squeeze = split == nullptr && node.attr_int("keepdims", 1) == 0;
  std::vector<int64_t> s;
  if (split != nullptr) s = require_static_ints(ctx, *split, "input 'split'");
  if (split != nullptr && split->rank() == 1) {
    sizes = s;  // given sizes: the axis may be symbolic
  } else {
    // One element each, or chunks of the given size (the last one smaller): a static axis.
    const int64_t dim = require_static_dim(ctx, x.shape[axis], "the split axis");
    const int64_t chunk = split == nullptr ? 1 : s.at(0);
    if (chunk <= 0) ctx.fail("the split size must be positive");
    for (int64_t left = dim; left > 0; left -= chunk) sizes.push_back(std::min(chunk, left));
  }
  Tensors parts;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    std::vector<Expr> shape = x.shape;
    shape[axis] = Expr(size);
    if (squeeze) shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(axis));
    const int64_t start = offset;
    parts.push_back(make_view(ctx, x, shape, [&, start](const std::vector<Expr>& o) {
      std::vector<Expr> at = o;
      if (squeeze) at.insert(at.begin() + static_cast<std::ptrdiff_t>(axis), Expr(0));
      at[axis] = at[axis] + start;
      return at;
    }));
    offset += size;
  }
  if (auto dim = x.shape[axis].as_integer(); dim && offset != *dim) {
    ctx.fail(fmt::format("split sizes sum to {}, the axis has {}", offset, *dim));
  }
  return {make_sequence(x.dtype, std::move(parts))};
}

std::vector<TensorValue> lower_concat_from_sequence(LoweringContext& ctx, const graph::Node& node,
                                                    const LowerInputs& inputs) {
  const TensorValue& seq = required_sequence(ctx, inputs, 0);
  if (seq.sequence->empty()) ctx.fail("cannot concatenate an empty sequence");
  const bool new_axis = node.attr_int("new_axis", 0) != 0;
  const int64_t rank = static_cast<int64_t>((*seq.sequence)[0].rank()) + (new_axis ? 1 : 0);
  const size_t axis = static_cast<size_t>(ctx.normalize_axis(node.attr_int("axis", 0), rank));
  Tensors parts;
  for (const TensorValue& t : *seq.sequence) {
    if (!new_axis) {
      parts.push_back(t);
      continue;
    }
    std::vector<Expr> shape = t.shape;
    shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(axis), Expr(1));
    parts.push_back(make_view(ctx, t, shape, [axis](const std::vector<Expr>& o) {
      std::vector<Expr> at = o;
      at.erase(at.begin() + static_cast<std::ptrdiff_t>(axis));
      return at;
    }));
  }
  std::vector<const TensorValue*> pointers;
  for (const TensorValue& p : parts) pointers.push_back(&p);
  return {concat_values(ctx, pointers, axis)};
}

// --- Optionals ----------------------------------------------------------------------------------

std::vector<TensorValue> lower_optional(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  if (const TensorValue* x = optional_input(inputs, 0)) {
    TensorValue v = *x;
    v.optional = true;
    return {v};
  }
  // An empty optional: its element type is the output's declared type.
  const graph::Type& type = node.output(0)->type();
  if (type.kind != graph::ValueKind::kOptional || !type.element)
    ctx.fail("an empty Optional needs its type (the output's declared optional type)");
  TensorValue v;
  v.optional = true;
  v.none = true;
  const graph::Type& element = *type.element;
  if (element.kind == graph::ValueKind::kSequence) {
    v.dtype = element.element ? element.element->dtype : DType::kUndefined;
    v.sequence = std::make_shared<const Tensors>();
  } else {
    v.dtype = element.dtype;
  }
  return {v};
}

std::vector<TensorValue> lower_optional_has_element(LoweringContext& ctx, const graph::Node&,
                                                    const LowerInputs& inputs) {
  const TensorValue* x = optional_input(inputs, 0);
  bool has = x != nullptr && !x->none;
  return {ctx.from_known(DType::kBool, {}, {Expr(has ? 1 : 0)})};
}

std::vector<TensorValue> lower_optional_get_element(LoweringContext& ctx, const graph::Node&,
                                                    const LowerInputs& inputs) {
  TensorValue v = required_input(ctx, inputs, 0, "input");
  if (v.none) ctx.fail("the optional input is empty");
  v.optional = false;
  return {v};
}

// --- SequenceMap
// ----------------------------------------------------------------------------------

/// The body runs once per position of the sequences (all of one length), each run lowered inline
/// with the elements at that position and the plain tensor inputs; its outputs form sequences.
std::vector<TensorValue> lower_sequence_map(LoweringContext& ctx, const graph::Node& node,
                                            const LowerInputs& inputs) {
  std::shared_ptr<graph::Graph> body = node.attr_graph("body");
  if (!body) ctx.fail("attribute 'body' (a graph) is missing");
  const TensorValue& first = required_sequence(ctx, inputs, 0);
  const size_t n = first.sequence->size();
  for (size_t k = 1; k < inputs.size(); ++k) {
    const TensorValue& in = required_input(ctx, inputs, k, "additional input");
    if (in.sequence && in.sequence->size() != n) {
      ctx.fail(fmt::format("input {} is a sequence of {} tensors, input 0 of {}", k,
                           in.sequence->size(), n));
    }
  }
  std::vector<Tensors> outputs(body->outputs().size());
  for (size_t i = 0; i < n; ++i) {
    std::vector<TensorValue> formals;
    for (const auto& in : inputs) formals.push_back(in->sequence ? (*in->sequence)[i] : *in);
    std::vector<TensorValue> results = ctx.graph_lowering().inline_graph(*body, formals);
    for (size_t k = 0; k < results.size(); ++k) outputs[k].push_back(std::move(results[k]));
  }
  std::vector<TensorValue> sequences;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const graph::Type& type = body->outputs()[k]->type();
    DType dtype = outputs[k].empty() ? type.dtype : outputs[k][0].dtype;
    sequences.push_back(make_sequence(dtype, std::move(outputs[k])));
  }
  return sequences;
}

}  // namespace

void register_sequence_ops(Registry& registry) {
  registry.add("", "Optional", {lower_optional, 15, 17});
  registry.add("", "OptionalHasElement", {lower_optional_has_element, 15, 18});
  registry.add("", "OptionalGetElement", {lower_optional_get_element, 15, 18});
  registry.add("", "SequenceMap", {lower_sequence_map, 17, 17});
  registry.add("", "SequenceEmpty", {lower_sequence_empty, 11, 17});
  registry.add("", "SequenceConstruct", {lower_sequence_construct, 11, 17});
  registry.add("", "SequenceInsert", {lower_sequence_insert, 11, 17});
  registry.add("", "SequenceErase", {lower_sequence_erase, 11, 17});
  registry.add("", "SequenceAt", {lower_sequence_at, 11, 17});
  registry.add("", "SequenceLength", {lower_sequence_length, 11, 17});
  registry.add("", "SplitToSequence", {lower_split_to_sequence, 11, 17});
  registry.add("", "ConcatFromSequence", {lower_concat_from_sequence, 11, 17});
}

}  // namespace kiln::lower
