/// Reductions with structure, in the loop IR: Einsum (a sum over the contracted letters of the
/// product of the operands, or a plain product when nothing is contracted), CumSum and CumProd (a
/// masked sum or product along the axis), Hardmax (ArgMax, then a comparison) and LRN (a windowed
/// sum of squares over channels); and TopK, whose indices come from the library kernel "topk" (a
/// partial sort per slice) and whose values are gathered by the loop IR.
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
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

// --- Einsum --------------------------------------------------------------------------------------

/// One operand's subscripts, with "..." expanded to the letters 'A', 'B', ... (never used by
/// ONNX equations, which take lowercase and uppercase letters; the expansion uses characters
/// below 'A' so they cannot clash).
std::string expand_ellipsis(const LoweringContext& ctx, const std::string& term, size_t rank,
                            size_t* ellipsis_rank) {
  size_t dots = term.find("...");
  if (dots == std::string::npos) {
    if (term.size() != rank) {
      ctx.fail(
          fmt::format("subscripts '{}' name {} dims, the operand has {}", term, term.size(), rank));
    }
    return term;
  }
  size_t letters = term.size() - 3;
  if (letters > rank) ctx.fail(fmt::format("subscripts '{}' exceed the operand's rank", term));
  size_t n = rank - letters;
  *ellipsis_rank = std::max(*ellipsis_rank, n);
  std::string broadcast;
  for (size_t k = 0; k < n; ++k) broadcast += static_cast<char>('0' + (*ellipsis_rank - n) + k);
  return term.substr(0, dots) + broadcast + term.substr(dots + 3);
}

std::vector<TensorValue> lower_einsum(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  std::string equation;
  for (char c : node.attr_string("equation", "")) {
    if (c != ' ') equation += c;
  }
  size_t arrow = equation.find("->");
  std::string lhs = equation.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != inputs.size()) {
    ctx.fail(fmt::format("the equation has {} operands, the node {}", terms.size(), inputs.size()));
  }
  std::vector<const TensorValue*> ops;
  size_t ellipsis_rank = 0;
  for (size_t k = 0; k < terms.size(); ++k) {
    ops.push_back(&required_input(ctx, inputs, k, fmt::format("Inputs[{}]", k)));
  }
  // Ellipsis dims are right-aligned: expand after the widest one is known.
  for (size_t k = 0; k < terms.size(); ++k)
    expand_ellipsis(ctx, terms[k], ops[k]->rank(), &ellipsis_rank);
  for (size_t k = 0; k < terms.size(); ++k) {
    terms[k] = expand_ellipsis(ctx, terms[k], ops[k]->rank(), &ellipsis_rank);
  }
  std::map<char, Expr> size;
  std::map<char, int> count;
  for (size_t k = 0; k < terms.size(); ++k) {
    for (size_t d = 0; d < terms[k].size(); ++d) {
      char c = terms[k][d];
      ++count[c];
      const Expr& n = ops[k]->shape[d];
      auto it = size.find(c);
      if (it == size.end() || it->second == Expr(1)) {
        size[c] = n;
      } else if (n != Expr(1) && n != it->second) {
        ctx.fail(fmt::format("subscript '{}' has sizes {} and {}", c, it->second.str(), n.str()));
      }
    }
  }
  std::string out;
  if (arrow != std::string::npos) {
    std::string rhs = equation.substr(arrow + 2);
    size_t dots = rhs.find("...");
    if (dots != std::string::npos) {
      std::string broadcast;
      for (size_t k = 0; k < ellipsis_rank; ++k) broadcast += static_cast<char>('0' + k);
      rhs = rhs.substr(0, dots) + broadcast + rhs.substr(dots + 3);
    }
    out = rhs;
  } else {
    // Implicit output: the ellipsis dims, then the letters used once, in alphabetical order.
    for (size_t k = 0; k < ellipsis_rank; ++k) out += static_cast<char>('0' + k);
    for (const auto& [c, n] : count) {
      if (n == 1 && std::isalpha(static_cast<unsigned char>(c))) out += c;
    }
  }
  for (char c : out) {
    if (!size.count(c)) ctx.fail(fmt::format("output subscript '{}' names no input dim", c));
  }
  std::string contracted;
  for (const auto& [c, n] : size) {
    if (out.find(c) == std::string::npos) contracted += c;
  }
  DType dtype = ops[0]->dtype;
  for (const TensorValue* op : ops) {
    if (op->dtype != dtype) ctx.fail("the operands must share one dtype");
  }
  const DType acc = compute_dtype(dtype);
  std::vector<Expr> shape, reduce_shape;
  for (char c : out) shape.push_back(size[c]);
  for (char c : contracted) reduce_shape.push_back(size[c]);
  auto product = [&](LoopBody& body, const std::map<char, Expr>& at) {
    ValueId p = ir::kNoValue;
    for (size_t k = 0; k < terms.size(); ++k) {
      std::vector<Expr> index;
      for (size_t d = 0; d < terms[k].size(); ++d) {
        index.push_back(ops[k]->shape[d] == Expr(1) ? Expr(0) : at.at(terms[k][d]));
      }
      ValueId v = body.cast(ctx.load_at(body, *ops[k], index), acc);
      p = p == ir::kNoValue ? v : body.binary(OpCode::kMul, p, v);
    }
    return p;
  };
  auto bind = [&](const std::vector<Expr>& o, const std::vector<Expr>& r) {
    std::map<char, Expr> at;
    for (size_t k = 0; k < out.size(); ++k) at[out[k]] = o[k];
    for (size_t k = 0; k < contracted.size(); ++k) at[contracted[k]] = r[k];
    return at;
  };
  if (contracted.empty()) {
    return {ctx.pointwise(dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
      return body.cast(product(body, bind(o, {})), dtype);
    })};
  }
  TensorValue sum =
      ctx.reduction(acc, shape, reduce_shape, ReductionType::kSum,
                    [&](LoopBody& body, const std::vector<Expr>& o, const std::vector<Expr>& r) {
                      return product(body, bind(o, r));
                    });
  if (acc == dtype) return {sum};
  return {ctx.pointwise(dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    return body.cast(ctx.load_at(body, sum, o), dtype);
  })};
}

// --- CumSum, CumProd -----------------------------------------------------------------------------

std::vector<TensorValue> lower_cumsum(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "x");
  const TensorValue& axis_input = required_input(ctx, inputs, 1, "axis");
  if (x.rank() == 0) ctx.fail("expected an input of rank >= 1");
  std::vector<int64_t> axis_values = require_static_ints(ctx, axis_input, "input 'axis'");
  if (axis_values.size() != 1) ctx.fail("input 'axis' must hold one value");
  const size_t axis =
      static_cast<size_t>(ctx.normalize_axis(axis_values[0], static_cast<int64_t>(x.rank())));
  const bool exclusive = node.attr_int("exclusive", 0) != 0;
  const bool reverse = node.attr_int("reverse", 0) != 0;
  const DType acc = compute_dtype(x.dtype);
  // CumProd (opset 26) is the same scan with products: excluded elements count as 1.
  const bool product = node.op_type() == "CumProd";
  const double neutral = product ? 1 : 0;
  TensorValue sum = ctx.reduction(
      acc, x.shape, {x.shape[axis]}, product ? ReductionType::kProd : ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        // Element j = r[0] counts toward position i[axis] when j <= i (j < i
        // exclusive), or j >= i (j > i) in reverse.
        Expr lo = reverse ? i[axis] + (exclusive ? 1 : 0) : Expr(0);
        Expr hi = reverse ? x.shape[axis] : i[axis] + (exclusive ? 0 : 1);
        ValueId take = in_range(body, r[0], lo, hi);
        std::vector<Expr> at = i;
        at[axis] = r[0];
        ValueId v = body.cast(ctx.load_at(body, x, at), acc);
        return body.where(take, v, body.constant(neutral, acc));
      });
  if (acc == x.dtype) return {sum};
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    return body.cast(ctx.load_at(body, sum, i), x.dtype);
  })};
}

// --- Hardmax -------------------------------------------------------------------------------------

std::vector<TensorValue> lower_hardmax(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  require_dtype(ctx, x.dtype, kFloats, "input 'input'");
  if (x.rank() == 0) ctx.fail("expected an input of rank >= 1");
  const bool legacy = node.opset() < 13;
  const size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", legacy ? 1 : -1), static_cast<int64_t>(x.rank())));
  // Before opset 13 the input is seen as 2-D [prod(dims[:axis]), prod(dims[axis:])].
  const size_t last = legacy ? x.rank() : axis + 1;
  std::vector<Expr> keep(x.shape.begin(), x.shape.begin() + axis);
  std::vector<Expr> reduced(x.shape.begin() + axis, x.shape.begin() + last);
  std::vector<Expr> tail(x.shape.begin() + last, x.shape.end());
  std::vector<Expr> out_shape = keep;
  out_shape.insert(out_shape.end(), tail.begin(), tail.end());
  TensorValue arg =
      ctx.reduction(DType::kInt64, out_shape, reduced, ReductionType::kArgMax,
                    [&](LoopBody& body, const std::vector<Expr>& o, const std::vector<Expr>& r) {
                      std::vector<Expr> at(o.begin(), o.begin() + axis);
                      at.insert(at.end(), r.begin(), r.end());
                      at.insert(at.end(), o.begin() + axis, o.end());
                      return ctx.load_at(body, x, at);
                    });
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    std::vector<Expr> o(i.begin(), i.begin() + axis);
    o.insert(o.end(), i.begin() + last, i.end());
    // The row-major position of i within the reduced dims, as the ArgMax reports it.
    Expr flat(0);
    for (size_t d = axis; d < last; ++d) flat = flat * x.shape[d] + i[d];
    ValueId hit = body.binary(OpCode::kEq, ctx.load_at(body, arg, o), body.index_expr(flat));
    return body.where(hit, body.constant(1, x.dtype), body.constant(0, x.dtype));
  })};
}

// --- LRN -----------------------------------------------------------------------------------------

std::vector<TensorValue> lower_lrn(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, kFloats, "input 'X'");
  if (x.rank() < 3) ctx.fail(fmt::format("expected an input of rank >= 3, found {}", x.rank()));
  const int64_t size = node.attr_int("size", 0);
  if (size <= 0) ctx.fail(fmt::format("attribute 'size' must be positive, found {}", size));
  const double alpha = node.attr_float("alpha", 1e-4f), beta = node.attr_float("beta", 0.75f),
               bias = node.attr_float("bias", 1.0f);
  const int64_t before = (size - 1) / 2;
  const DType acc = compute_dtype(x.dtype);
  TensorValue square_sum = ctx.reduction(
      acc, x.shape, {Expr(size)}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        std::vector<Expr> at = i;
        at[1] = i[1] - before + r[0];
        ValueId v = body.cast(
            load_masked(ctx, body, x, at, in_range(body, at[1], Expr(0), x.shape[1]), 0), acc);
        return body.binary(OpCode::kMul, v, v);
      });
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId s = ctx.load_at(body, square_sum, i);
    ValueId scaled =
        body.binary(OpCode::kMul, s, body.constant(alpha / static_cast<double>(size), acc));
    ValueId base = body.binary(OpCode::kAdd, scaled, body.constant(bias, acc));
    ValueId denom = body.binary(OpCode::kPow, base, body.constant(beta, acc));
    ValueId v = body.cast(ctx.load_at(body, x, i), acc);
    return body.cast(body.binary(OpCode::kDiv, v, denom), x.dtype);
  })};
}

// --- TopK ---------------------------------------------------------------------------------------

std::vector<TensorValue> lower_topk(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, kNumbers, "input 'X'");
  if (x.rank() == 0) ctx.fail("expected an input of rank >= 1");
  const size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", -1), static_cast<int64_t>(x.rank())));
  Expr k;
  if (node.opset() < 10) {
    k = Expr(node.attr_int("k", 0));
  } else {
    const std::vector<Expr> ks =
        sizes_from_tensor(ctx, required_input(ctx, inputs, 1, "K"), "input 'K'", x.shape[axis]);
    if (ks.size() != 1) ctx.fail("input 'K' must hold one value");
    k = ks[0];
  }
  if (auto kv = k.as_integer()) {
    if (*kv < 0) ctx.fail(fmt::format("k must be non-negative, found {}", *kv));
    if (auto n = x.shape[axis].as_integer(); n && *kv > *n) {
      ctx.fail(fmt::format("k = {} exceeds the axis size {}", *kv, *n));
    }
  }
  std::vector<Expr> shape = x.shape;
  shape[axis] = k;
  const bool largest = node.opset() < 11 || node.attr_int("largest", 1) != 0;
  TensorValue indices = ctx.extern_call(ir::TopKCall{static_cast<int64_t>(axis), largest},
                                        DType::kInt64, shape, {ctx.as_view(x, true)});
  // The indices come sorted best first, as sorted = 1 asks; sorted = 0 leaves the order free.
  TensorValue values =
      ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& i) {
        std::vector<Expr> at = i;
        at[axis] = body.op(body.indirect(ctx.load_at(body, indices, i), x.shape[axis])).symbol;
        return ctx.load_at(body, x, at);
      });
  return {values, indices};
}

}  // namespace

void register_contraction_ops(Registry& registry) {
  registry.add("", "TopK", {lower_topk, 1, 17});
  registry.add("", "Einsum", {lower_einsum, 12, 17});
  registry.add("", "CumSum", {lower_cumsum, 11, 17});
  registry.add("", "CumProd", {lower_cumsum, 26, 26});
  registry.add("", "Hardmax", {lower_hardmax, 1, 17});
  registry.add("", "LRN", {lower_lrn, 1, 17});
}

}  // namespace kiln::lower
