/// Ops whose output size depends on the data (Inductor's dynamic scalars: sizes read from data at
/// run time): NonZero, Compress, NonMaxSuppression and Unique (their kernels run once to count,
/// then to write each output). The library kernel count_nonzero writes the count into a one-element
/// buffer; the wrapper binds it to a fresh size symbol (ir::DynamicSize) right after that call;
/// nonzero_positions then lists the positions, and the loop IR gathers or unravels them, so later
/// kernels, allocations and output shapes use the symbol like any other size (possibly 0).
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
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

/// A fresh size symbol bound at run time from element 0 of `count`'s buffer.
Expr dynamic_size(LoweringContext& ctx, const TensorValue& count) {
  return ctx.dynamic_size({"", *ctx.as_buffer(count)});
}

/// The flat positions of the non-zero elements of `x` (viewed as flat and contiguous): a value
/// [n] with n a dynamic size.
TensorValue nonzero_positions(LoweringContext& ctx, const TensorValue& x) {
  ir::View flat = ctx.as_view(x, true);
  TensorValue count = ctx.extern_call(ir::CountNonZeroCall{}, DType::kInt64, {Expr(1)}, {flat});
  Expr n = dynamic_size(ctx, count);
  // The positions read the count too, so they run after it is bound.
  return ctx.extern_call(ir::NonZeroPositionsCall{}, DType::kInt64, {n},
                         {flat, ctx.as_view(count)});
}

std::vector<TensorValue> lower_nonzero(LoweringContext& ctx, const graph::Node&,
                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  TensorValue positions = nonzero_positions(ctx, x);
  const size_t rank = x.rank();
  std::vector<Expr> strides(rank, Expr(1));  // row-major strides of x
  for (size_t d = rank; d-- > 1;) strides[d - 1] = strides[d] * x.shape[d];
  // out[d, j] = coordinate d of flat position j.
  std::vector<Expr> shape = {Expr(static_cast<int64_t>(rank)), positions.shape[0]};
  return {ctx.pointwise(DType::kInt64, shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId flat = ctx.load_at(body, positions, {i[1]});
    Expr p = body.op(body.indirect(flat, sym::product(x.shape))).symbol;
    ValueId result = body.constant(0, DType::kInt64);
    for (size_t d = 0; d < rank; ++d) {
      ValueId c = body.index_expr(sym::mod(sym::floor_div(p, strides[d]), x.shape[d]));
      ValueId here = body.binary(ir::OpCode::kEq, body.index_expr(i[0]),
                                 body.constant(static_cast<double>(d), DType::kInt64));
      result = body.where(here, c, result);
    }
    return result;
  })};
}

std::vector<TensorValue> lower_compress(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const TensorValue& condition = required_input(ctx, inputs, 1, "condition");
  if (condition.rank() != 1) ctx.fail("condition must be 1-D");
  const bool flatten = !node.has_attribute("axis");
  TensorValue data = flatten ? reshape_view(ctx, x, {sym::product(x.shape)}) : x;
  const size_t axis = flatten ? 0
                              : static_cast<size_t>(ctx.normalize_axis(
                                    node.attr_int("axis", 0), static_cast<int64_t>(x.rank())));
  // Only the first min(len(condition), size) entries of the condition count.
  Expr used = ctx.analyzer().simplify(sym::min(condition.shape[0], data.shape[axis]));
  TensorValue head = condition;
  if (used != condition.shape[0]) {
    head = make_view(ctx, condition, {used}, [](const std::vector<Expr>& o) { return o; });
  }
  TensorValue positions = nonzero_positions(ctx, head);
  std::vector<Expr> shape = data.shape;
  shape[axis] = positions.shape[0];
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    std::vector<Expr> at = i;
    at[axis] =
        body.op(body.indirect(ctx.load_at(body, positions, {i[axis]}), data.shape[axis])).symbol;
    return ctx.load_at(body, data, at);
  })};
}

std::vector<TensorValue> lower_nms(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  const TensorValue& boxes = required_input(ctx, inputs, 0, "boxes");
  const TensorValue& scores = required_input(ctx, inputs, 1, "scores");
  if (boxes.rank() != 3 || boxes.shape[2] != Expr(4) || scores.rank() != 3 ||
      boxes.dtype != DType::kFloat32 || scores.dtype != DType::kFloat32) {
    ctx.fail("expected float32 boxes [batches, boxes, 4] and scores [batches, classes, boxes]");
  }
  // The scalar arguments must be known when compiling (constants, or inputs given then).
  auto scalar = [&](size_t i, const char* name) {
    const TensorValue* v = optional_input(inputs, i);
    if (v == nullptr) return 0.0;
    std::optional<double> value = known_scalar(*v);
    if (!value) ctx.fail(fmt::format("input '{}' must be known when compiling", name));
    return *value;
  };
  ir::NmsCall call;
  call.max_per_class = static_cast<int64_t>(scalar(2, "max_output_boxes_per_class"));
  call.iou_threshold = scalar(3, "iou_threshold");
  call.center_point_box = node.attr_int("center_point_box", 0) != 0;
  // Without a score threshold every box is a candidate.
  if (optional_input(inputs, 4) != nullptr) call.score_threshold = scalar(4, "score_threshold");
  std::vector<std::optional<ir::View>> views = {ctx.as_view(boxes, true),
                                                ctx.as_view(scores, true)};
  ir::NmsCall count_call = call;
  count_call.count = true;
  TensorValue count = ctx.extern_call(count_call, DType::kInt64, {Expr(1)}, views);
  Expr n = dynamic_size(ctx, count);
  views.push_back(ctx.as_view(count));
  return {ctx.extern_call(call, DType::kInt64, {n, Expr(3)}, views)};
}

std::vector<TensorValue> lower_unique(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const bool flatten = !node.has_attribute("axis");
  const size_t axis = flatten ? 0
                              : static_cast<size_t>(ctx.normalize_axis(
                                    node.attr_int("axis", 0), static_cast<int64_t>(x.rank())));
  const Expr n = flatten ? sym::product(x.shape) : x.shape[axis];
  // The kernel sees x as [outer, n, inner] around the axis (-1: flattened, [1, numel, 1]).
  ir::UniqueCall call;
  call.axis = flatten ? int64_t{-1} : static_cast<int64_t>(axis);
  call.sorted = node.attr_int("sorted", 1) != 0;
  std::vector<std::optional<ir::View>> views = {ctx.as_view(x, true)};
  TensorValue count = ctx.extern_call(call, DType::kInt64, {Expr(1)}, views);
  Expr u = dynamic_size(ctx, count);
  views.push_back(ctx.as_view(count));
  std::vector<Expr> y_shape = {u};
  if (!flatten) {
    y_shape = x.shape;
    y_shape[axis] = u;
  }
  std::vector<TensorValue> outputs;
  const std::vector<std::pair<DType, std::vector<Expr>>> specs = {
      {x.dtype, y_shape}, {DType::kInt64, {u}}, {DType::kInt64, {n}}, {DType::kInt64, {u}}};
  for (size_t which = 0; which < specs.size(); ++which) {
    if (which > 0 && (which >= node.outputs().size() || node.output(which) == nullptr)) {
      outputs.push_back(TensorValue{});  // not asked for
      continue;
    }
    ir::UniqueCall output_call = call;
    output_call.which = static_cast<int64_t>(which);
    outputs.push_back(ctx.extern_call(output_call, specs[which].first, specs[which].second, views));
  }
  while (!outputs.empty() && !outputs.back().body) outputs.pop_back();
  return outputs;
}

}  // namespace

void register_dynamic_ops(Registry& registry) {
  registry.add("", "Unique", {lower_unique, 11, 17});
  registry.add("", "NonMaxSuppression", {lower_nms, 10, 17});
  registry.add("", "NonZero", {lower_nonzero, 9, 17});
  registry.add("", "Compress", {lower_compress, 9, 17});
}

}  // namespace kiln::lower
