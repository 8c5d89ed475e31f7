/// Reduction lowerings: ReduceSum/Mean/Max/Min/Prod/SumSquare/L1/L2/LogSum/LogSumExp, ArgMax,
/// ArgMin, Softmax and LogSoftmax. Each materializes reduction buffers (ctx.reduction) and
/// finishes with a pointwise epilogue that consumers inline. Softmax is max-reduction ->
/// sum-reduction of exp(x - max) -> divide, the shape the scheduler fuses into one kernel.
/// Reductions over zero-size dims give the identity (0 for sums, 1 for products, -inf / +inf for
/// max / min), as ONNX's reference does.
///
/// Tests: tests/unit/lower/suite_ops_test.cpp (ONNX node suite through the interpreter).

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lower/elementwise.h"
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

/// Which dims of the input a reduction removes, and the shapes on both sides.
struct ReducePlan {
  std::vector<bool> reduced;       // per input dim
  std::vector<Expr> out_shape;     // with or without the reduced dims (keepdims)
  std::vector<Expr> keep_shape;    // reduced dims as 1
  std::vector<Expr> reduce_shape;  // the reduced dims, in order; {1} when none (rank-0 input)
  bool keepdims = true;

  /// The input index read at output index `index` and reduction index `r`; `index` is of
  /// keep_shape when `keep`, of out_shape otherwise.
  std::vector<Expr> input_index(const std::vector<Expr>& index, const std::vector<Expr>& r,
                                bool keep) const {
    std::vector<Expr> in;
    size_t j = 0, k = 0;
    for (size_t d = 0; d < reduced.size(); ++d) {
      if (reduced[d]) {
        in.push_back(r[j++]);
        if (keep) ++k;
      } else {
        in.push_back(index[k++]);
      }
    }
    return in;
  }
  /// The keep_shape index of an element of the input (reduced dims read 0).
  std::vector<Expr> kept_index(const std::vector<Expr>& input_index) const {
    std::vector<Expr> out = input_index;
    for (size_t d = 0; d < reduced.size(); ++d) {
      if (reduced[d]) out[d] = 0;
    }
    return out;
  }
};

ReducePlan make_plan(const std::vector<Expr>& shape, std::vector<bool> reduced, bool keepdims) {
  ReducePlan plan;
  plan.reduced = std::move(reduced);
  plan.keepdims = keepdims;
  for (size_t d = 0; d < shape.size(); ++d) {
    plan.keep_shape.push_back(plan.reduced[d] ? Expr(1) : shape[d]);
    if (plan.reduced[d]) plan.reduce_shape.push_back(shape[d]);
    if (!plan.reduced[d] || keepdims)
      plan.out_shape.push_back(plan.reduced[d] ? Expr(1) : shape[d]);
  }
  if (plan.reduce_shape.empty()) plan.reduce_shape.push_back(1);  // a reduction over one element
  return plan;
}

/// The reduced-dims mask from an axes list (empty: every dim).
std::vector<bool> axes_mask(const LoweringContext& ctx, const std::vector<int64_t>& axes,
                            size_t rank) {
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t axis : axes) {
    int64_t a = ctx.normalize_axis(axis, static_cast<int64_t>(rank));
    if (reduced[static_cast<size_t>(a)]) ctx.fail(fmt::format("axis {} is repeated in axes", axis));
    reduced[static_cast<size_t>(a)] = true;
  }
  return reduced;
}

/// The axes of a Reduce* node: an attribute, or (ReduceSum from opset 13, every reduction from
/// opset 18) an optional input
/// that must be known at compile time. nullopt means "no reduction" (noop_with_empty_axes).
std::optional<std::vector<bool>> reduce_axes(const LoweringContext& ctx, const graph::Node& node,
                                             const LowerInputs& inputs, size_t rank) {
  std::vector<int64_t> axes;
  // ReduceSum takes axes as an input from opset 13, the other reductions from opset 18.
  bool from_input = node.opset() >= 18 || (node.op_type() == "ReduceSum" && node.opset() >= 13);
  if (from_input) {
    if (node.has_attribute("axes")) {
      ctx.fail(fmt::format("attribute 'axes' is not part of {} at opset {}; axes are input 1",
                           node.op_type(), node.opset()));
    }
    const TensorValue* a = optional_input(inputs, 1);
    // An axes input of static size 0 is empty whatever its data: no need to know it.
    bool empty = a != nullptr && a->rank() == 1 && a->shape[0] == Expr(0);
    if (a != nullptr && !empty) axes = require_static_ints(ctx, *a, "axes");
    if (axes.empty() && node.attr_int("noop_with_empty_axes", 0) != 0) return std::nullopt;
  } else {
    axes = node.attr_ints("axes", {});
  }
  return axes_mask(ctx, axes, rank);
}

/// A reduction of the input element transformed by `pre`, into a buffer of `dtype`.
using PreFn = std::function<ValueId(LoopBody& body, ValueId x)>;

/// The buffer has keep_shape when `keep`, out_shape otherwise.
TensorValue reduce(LoweringContext& ctx, const TensorValue& x, const ReducePlan& plan, bool keep,
                   ReductionType type, DType dtype, const PreFn& pre = {}) {
  const std::vector<Expr>& shape = keep ? plan.keep_shape : plan.out_shape;
  return ctx.reduction(
      dtype, shape, plan.reduce_shape, type,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        ValueId v = ctx.load_at(body, x, plan.input_index(index, r, keep));
        v = pre ? pre(body, v) : v;
        return body.cast(v, dtype);
      });
}

/// The dtype intermediate sums are kept in before an epilogue: float32 for 16-bit floats.
DType accumulate_dtype(DType dtype) { return compute_dtype(dtype); }

ValueId square(LoopBody& body, ValueId v) { return body.binary(OpCode::kMul, v, v); }

/// An epilogue on a reduced value: out = fn(body, reduced element), cast to `out`.
TensorValue epilogue(LoweringContext& ctx, const TensorValue& reduced, DType out,
                     const std::function<ValueId(LoopBody&, ValueId)>& fn) {
  return ctx.pointwise(out, reduced.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    return body.cast(fn(body, ctx.load_at(body, reduced, index)), out);
  });
}

/// fn applied in float64 for integer results (L2, Mean of integers) and in the value's own
/// dtype for floats.
ValueId in_float(LoopBody& body, ValueId v, const std::function<ValueId(ValueId)>& fn) {
  if (graph::is_floating(body.dtype(v))) return fn(v);
  return fn(body.cast(v, DType::kFloat64));
}

/// ReduceLogSumExp as max + log(sum(exp(x - max))), with an infinite max replaced by 0 so that
/// all -inf (or +inf) inputs give -inf (+inf) instead of NaN.
TensorValue log_sum_exp(LoweringContext& ctx, const TensorValue& x, const ReducePlan& plan) {
  DType acc = accumulate_dtype(x.dtype);
  TensorValue max = reduce(ctx, x, plan, true, ReductionType::kMax, acc);
  auto shift = [&](LoopBody& body, const std::vector<Expr>& keep_index) {
    ValueId m = ctx.load_at(body, max, keep_index);
    ValueId inf = body.binary(OpCode::kOr, body.unary(OpCode::kIsPosInf, m),
                              body.unary(OpCode::kIsNegInf, m));
    return body.where(inf, body.constant(0, acc), m);
  };
  TensorValue sum = ctx.reduction(
      acc, plan.keep_shape, plan.reduce_shape, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        std::vector<Expr> in = plan.input_index(index, r, true);
        ValueId v = body.cast(ctx.load_at(body, x, in), acc);
        return body.unary(OpCode::kExp, body.binary(OpCode::kSub, v, shift(body, index)));
      });
  return ctx.pointwise(x.dtype, plan.out_shape,
                       [&](LoopBody& body, const std::vector<Expr>& index) {
                         std::vector<Expr> keep = index;
                         if (!plan.keepdims) {
                           keep.clear();
                           size_t k = 0;
                           for (bool red : plan.reduced) keep.push_back(red ? Expr(0) : index[k++]);
                         }
                         ValueId log = body.unary(OpCode::kLog, ctx.load_at(body, sum, keep));
                         return body.binary(OpCode::kAdd, log, shift(body, keep));
                       });
}

/// Every Reduce* op: the reduction kind and the transform before and after it.
std::vector<TensorValue> lower_reduce(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  const std::string& op = node.op_type();
  bool float_only = op == "ReduceLogSum" || op == "ReduceLogSumExp";
  // ReduceMax-20 and ReduceMin-20 take bool: any and all.
  bool bools = node.opset() >= 20 && (op == "ReduceMax" || op == "ReduceMin");
  require_dtype(ctx, x.dtype,
                float_only ? kFloats
                : bools    ? kNumbers | kBools
                           : kNumbers,
                "input data");
  std::optional<std::vector<bool>> mask = reduce_axes(ctx, node, inputs, x.rank());
  if (!mask) return {x};  // ReduceSum with noop_with_empty_axes and no axes
  ReducePlan plan = make_plan(x.shape, *mask, node.attr_int("keepdims", 1) != 0);
  bool keep = plan.keepdims;
  DType acc = accumulate_dtype(x.dtype);
  if (op == "ReduceSum") return {reduce(ctx, x, plan, keep, ReductionType::kSum, x.dtype)};
  if (op == "ReduceProd") return {reduce(ctx, x, plan, keep, ReductionType::kProd, x.dtype)};
  if (x.dtype == DType::kBool) {
    ReductionType type = op == "ReduceMax" ? ReductionType::kAny : ReductionType::kAll;
    return {reduce(ctx, x, plan, keep, type, x.dtype)};
  }
  if (op == "ReduceMax") return {reduce(ctx, x, plan, keep, ReductionType::kMax, x.dtype)};
  if (op == "ReduceMin") return {reduce(ctx, x, plan, keep, ReductionType::kMin, x.dtype)};
  if (op == "ReduceSumSquare") {
    return {reduce(ctx, x, plan, keep, ReductionType::kSum, x.dtype, square)};
  }
  if (op == "ReduceL1") {
    return {reduce(ctx, x, plan, keep, ReductionType::kSum, x.dtype,
                   [](LoopBody& body, ValueId v) { return body.unary(OpCode::kAbs, v); })};
  }
  if (op == "ReduceLogSumExp") return {log_sum_exp(ctx, x, plan)};
  if (op == "ReduceL2") {
    TensorValue sum = reduce(ctx, x, plan, keep, ReductionType::kSum, acc, square);
    return {epilogue(ctx, sum, x.dtype, [](LoopBody& body, ValueId v) {
      return in_float(body, v, [&](ValueId f) { return body.unary(OpCode::kSqrt, f); });
    })};
  }
  if (op == "ReduceLogSum") {
    TensorValue sum = reduce(ctx, x, plan, keep, ReductionType::kSum, acc);
    return {epilogue(ctx, sum, x.dtype,
                     [](LoopBody& body, ValueId v) { return body.unary(OpCode::kLog, v); })};
  }
  KILN_CHECK(op == "ReduceMean", "lower_reduce registered for {}", op);
  TensorValue sum = reduce(ctx, x, plan, keep, ReductionType::kSum, acc);
  Expr count = sym::product(plan.reduce_shape);
  return {epilogue(ctx, sum, x.dtype, [&](LoopBody& body, ValueId v) {
    return in_float(body, v, [&](ValueId f) {
      return body.binary(OpCode::kDiv, f, body.cast(body.index_expr(count), body.dtype(f)));
    });
  })};
}

// --- ArgMax / ArgMin ------------------------------------------------------------------------

/// A reduction buffer like ctx.reduction, with the select_last flag of ArgMax/ArgMin (which
/// ctx.reduction does not take).
TensorValue arg_reduction(LoweringContext& ctx, const TensorValue& x, const ReducePlan& plan,
                          ReductionType type, bool select_last) {
  auto buffer = std::make_unique<ir::Buffer>();
  buffer->name = ctx.new_buffer_name();
  buffer->kind = ir::BufferKind::kComputed;
  buffer->dtype = DType::kInt64;
  buffer->layout = ir::Layout::contiguous(plan.out_shape);
  buffer->body = LoopBody(plan.out_shape, plan.reduce_shape);
  LoopBody& body = buffer->body;
  ValueId v =
      ctx.load_at(body, x, plan.input_index(body.vars(), body.reduce_vars(), plan.keepdims));
  ValueId r = body.reduction(type, v, DType::kInt64, select_last);
  body.store(buffer->name, DType::kInt64, buffer->layout.index(body.vars()), r);
  return ctx.from_buffer(ctx.add_buffer(std::move(buffer)));
}

std::vector<TensorValue> lower_arg(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "data");
  require_dtype(ctx, x.dtype, kNumbers, "input data");
  if (x.rank() == 0) ctx.fail("the input must have rank at least 1");
  int64_t axis = ctx.normalize_axis(node.attr_int("axis", 0), static_cast<int64_t>(x.rank()));
  ReducePlan plan =
      make_plan(x.shape, axes_mask(ctx, {axis}, x.rank()), node.attr_int("keepdims", 1) != 0);
  bool select_last = node.opset() >= 12 && node.attr_int("select_last_index", 0) != 0;
  ReductionType type = node.op_type() == "ArgMax" ? ReductionType::kArgMax : ReductionType::kArgMin;
  // An empty axis has no index to return (ONNX defines none): refused now when the sizes are
  // known, else checked by the wrapper once they are bound.
  Expr extent = x.shape[static_cast<size_t>(axis)];
  Expr outputs = sym::product(plan.out_shape);
  std::optional<int64_t> known_extent = extent.as_integer(), known_outputs = outputs.as_integer();
  if (known_extent && known_outputs && *known_extent == 0 && *known_outputs > 0) {
    ctx.fail(
        fmt::format("the reduced axis {} is empty (size 0): there is no index to return", axis));
  }
  TensorValue result = arg_reduction(ctx, x, plan, type, select_last);
  if (!known_extent || !known_outputs) {
    ctx.program().extent_checks.push_back(
        {*ctx.as_buffer(result), extent, outputs, node.describe()});
  }
  return {result};
}

// --- Softmax / LogSoftmax ------------------------------------------------------------------------

/// Softmax-family reduced dims: before opset 13 the input is seen as 2-D [prod(dims[:axis]),
/// prod(dims[axis:])] (axis default 1), so every dim from axis on is reduced; from 13 only
/// `axis` (default -1).
std::vector<bool> softmax_dims(const LoweringContext& ctx, const graph::Node& node, size_t rank) {
  bool legacy = node.opset() < 13;
  int64_t axis =
      ctx.normalize_axis(node.attr_int("axis", legacy ? 1 : -1), static_cast<int64_t>(rank));
  std::vector<bool> reduced(rank, false);
  for (size_t d = static_cast<size_t>(axis); d < rank; ++d)
    reduced[d] = legacy || d == static_cast<size_t>(axis);
  return reduced;
}

std::vector<TensorValue> lower_softmax(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  require_dtype(ctx, x.dtype, kFloats, "input 'input'");
  if (x.rank() == 0) ctx.fail("the input must have rank at least 1");
  bool log = node.op_type() == "LogSoftmax";
  ReducePlan plan = make_plan(x.shape, softmax_dims(ctx, node, x.rank()), true);
  DType acc = accumulate_dtype(x.dtype);
  TensorValue max = reduce(ctx, x, plan, true, ReductionType::kMax, acc);
  // exp(x - max) at an input index: shared by the sum's body and the epilogue.
  auto shifted = [&](LoopBody& body, const std::vector<Expr>& in) {
    ValueId v = body.cast(ctx.load_at(body, x, in), acc);
    return body.binary(OpCode::kSub, v, ctx.load_at(body, max, plan.kept_index(in)));
  };
  TensorValue sum = ctx.reduction(
      acc, plan.keep_shape, plan.reduce_shape, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        return body.unary(OpCode::kExp, shifted(body, plan.input_index(index, r, true)));
      });
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId d = shifted(body, index);
    ValueId s = ctx.load_at(body, sum, plan.kept_index(index));
    if (log) return body.binary(OpCode::kSub, d, body.unary(OpCode::kLog, s));
    return body.binary(OpCode::kDiv, body.unary(OpCode::kExp, d), s);
  })};
}

}  // namespace

void register_reduce_ops(Registry& registry) {
  for (const char* op :
       {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"}) {
    registry.add("", op, {lower_reduce, 1, 18});
  }
  registry.add("", "ArgMax", {lower_arg, 1, 17});
  registry.add("", "ArgMin", {lower_arg, 1, 17});
  registry.add("", "Softmax", {lower_softmax, 1, 17});
  registry.add("", "LogSoftmax", {lower_softmax, 1, 17});
}

}  // namespace kiln::lower
