#include "ir/loop_body.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/error.h"

namespace kiln::ir {

using graph::DType;

int op_arity(OpCode code) {
  switch (code) {
#define KILN_IR_OP(name, arity, text) \
  case OpCode::k##name:               \
    return arity;
#include "ir/ops.def"
#undef KILN_IR_OP
  }
  return 0;
}

std::string_view op_name(OpCode code) {
  switch (code) {
#define KILN_IR_OP(name, arity, text) \
  case OpCode::k##name:               \
    return text;
#include "ir/ops.def"
#undef KILN_IR_OP
  }
  return "?";
}

bool is_comparison(OpCode code) {
  switch (code) {
    case OpCode::kEq:
    case OpCode::kNe:
    case OpCode::kLt:
    case OpCode::kLe:
    case OpCode::kGt:
    case OpCode::kGe:
      return true;
    default:
      return false;
  }
}

std::string_view reduction_name(ReductionType type) {
  switch (type) {
    case ReductionType::kSum:
      return "sum";
    case ReductionType::kProd:
      return "prod";
    case ReductionType::kMax:
      return "max";
    case ReductionType::kMin:
      return "min";
    case ReductionType::kArgMax:
      return "argmax";
    case ReductionType::kArgMin:
      return "argmin";
    case ReductionType::kWelfordMean:
      return "welford_mean";
    case ReductionType::kWelfordVar:
      return "welford_var";
    case ReductionType::kAny:
      return "any";
    case ReductionType::kAll:
      return "all";
  }
  return "?";
}

sym::Expr index_var(int k) {
  return sym::Expr::symbol(fmt::format("i{}", k), sym::SymbolKind::kIndex);
}
sym::Expr reduce_var(int k) {
  return sym::Expr::symbol(fmt::format("r{}", k), sym::SymbolKind::kIndex);
}

LoopBody::LoopBody(std::vector<sym::Expr> sizes, std::vector<sym::Expr> reduce_sizes)
    : sizes_(std::move(sizes)), reduce_sizes_(std::move(reduce_sizes)) {
  for (size_t k = 0; k < sizes_.size(); ++k) vars_.push_back(index_var(static_cast<int>(k)));
  for (size_t k = 0; k < reduce_sizes_.size(); ++k) {
    reduce_vars_.push_back(reduce_var(static_cast<int>(k)));
  }
}

ValueId LoopBody::push(Op op) {
  for (int k = 0; k < op_arity(op.code); ++k) {
    KILN_CHECK(op.operands[k] >= 0 && op.operands[k] < static_cast<ValueId>(ops_.size()),
               "{} operand {} out of range", op_name(op.code), k);
  }
  ops_.push_back(std::move(op));
  return static_cast<ValueId>(ops_.size() - 1);
}

using graph::compute_dtype;

ValueId LoopBody::load(const std::string& buffer, DType buffer_dtype, const sym::Expr& index) {
  Op op;
  op.code = OpCode::kLoad;
  op.dtype = compute_dtype(buffer_dtype);
  op.buffer = buffer;
  op.buffer_dtype = buffer_dtype;
  op.index = index;
  return push(std::move(op));
}

ValueId LoopBody::masked_load(const std::string& buffer, DType buffer_dtype, const sym::Expr& index,
                              ValueId mask, double other) {
  KILN_CHECK(dtype(mask) == DType::kBool, "mask of a load must be bool");
  Op op;
  op.code = OpCode::kLoad;
  op.dtype = compute_dtype(buffer_dtype);
  op.buffer = buffer;
  op.buffer_dtype = buffer_dtype;
  op.index = index;
  op.mask = mask;
  op.float_value = other;
  return push(std::move(op));
}

ValueId LoopBody::constant(double value, DType dtype) {
  Op op;
  op.code = OpCode::kConstant;
  op.dtype = compute_dtype(dtype);
  if (graph::is_floating(dtype)) {
    op.float_value = value;
  } else {
    op.int_value = static_cast<int64_t>(value);
    op.float_value = value;
  }
  return push(std::move(op));
}

ValueId LoopBody::index_expr(const sym::Expr& index, DType dtype) {
  Op op;
  op.code = OpCode::kIndexExpr;
  op.dtype = dtype;
  op.index = index;
  return push(std::move(op));
}

ValueId LoopBody::indirect(ValueId value, const sym::Expr& size) {
  KILN_CHECK(graph::is_integer(dtype(value)), "indirect index must be an integer");
  Op op;
  op.code = OpCode::kIndirect;
  op.dtype = DType::kInt64;
  op.operands[0] = value;
  op.index = size;
  op.symbol = sym::Expr::symbol(fmt::format("t{}", next_indirect_++), sym::SymbolKind::kIndex);
  return push(std::move(op));
}

ValueId LoopBody::cast(ValueId value, DType dtype) {
  DType to = compute_dtype(dtype);
  if (this->dtype(value) == to) return value;
  Op op;
  op.code = OpCode::kCast;
  op.dtype = to;
  op.operands[0] = value;
  return push(std::move(op));
}

ValueId LoopBody::bitcast(ValueId value, DType from, DType to) {
  KILN_CHECK(graph::dtype_packed_bits(from) == graph::dtype_packed_bits(to) &&
                 graph::dtype_packed_bits(from) > 0 && this->dtype(value) == compute_dtype(from),
             "bitcast from {} to {}", graph::dtype_name(from), graph::dtype_name(to));
  Op op;
  op.code = OpCode::kBitCast;
  op.dtype = compute_dtype(to);
  op.operands[0] = value;
  op.bits_from = from;
  op.bits_to = to;
  return push(std::move(op));
}

ValueId LoopBody::unary(OpCode code, ValueId a) {
  KILN_CHECK(op_arity(code) == 1, "{} is not unary", op_name(code));
  Op op;
  op.code = code;
  op.dtype = (code == OpCode::kIsNan || code == OpCode::kIsPosInf || code == OpCode::kIsNegInf ||
              code == OpCode::kNot)
                 ? DType::kBool
                 : dtype(a);
  op.operands[0] = a;
  return push(std::move(op));
}

DType binary_result_dtype(OpCode code, DType a) {
  if (is_comparison(code)) return DType::kBool;
  return a;
}

ValueId LoopBody::binary(OpCode code, ValueId a, ValueId b) {
  KILN_CHECK(op_arity(code) == 2, "{} is not binary", op_name(code));
  KILN_CHECK(
      code == OpCode::kPow || code == OpCode::kShl || code == OpCode::kShr || dtype(a) == dtype(b),
      "{} operands differ in dtype: {} vs {}", op_name(code), graph::dtype_name(dtype(a)),
      graph::dtype_name(dtype(b)));
  Op op;
  op.code = code;
  op.dtype = binary_result_dtype(code, dtype(a));
  op.operands = {a, b, kNoValue};
  return push(std::move(op));
}

ValueId LoopBody::where(ValueId cond, ValueId a, ValueId b) {
  KILN_CHECK(dtype(cond) == DType::kBool, "where condition must be bool");
  KILN_CHECK(dtype(a) == dtype(b), "where branches differ in dtype");
  Op op;
  op.code = OpCode::kWhere;
  op.dtype = dtype(a);
  op.operands = {cond, a, b};
  return push(std::move(op));
}

ValueId LoopBody::reduction(ReductionType type, ValueId value, DType dtype, bool select_last) {
  KILN_CHECK(is_reduction(), "reduction in a body without reduction variables");
  Op op;
  op.code = OpCode::kReduction;
  op.dtype = compute_dtype(dtype);
  op.operands[0] = value;
  op.reduction = type;
  op.select_last = select_last;
  return push(std::move(op));
}

ValueId LoopBody::store(const std::string& buffer, DType buffer_dtype, const sym::Expr& index,
                        ValueId value) {
  Op op;
  op.code = OpCode::kStore;
  op.dtype = dtype(value);
  op.buffer = buffer;
  op.buffer_dtype = buffer_dtype;
  op.index = index;
  op.operands[0] = value;
  return push(std::move(op));
}

ValueId LoopBody::inline_body(const LoopBody& src, const sym::Substitution& var_map) {
  KILN_CHECK(src.result() != kNoValue, "inlined body has no result");
  sym::Substitution subst = var_map;
  std::vector<ValueId> remap(src.ops().size(), kNoValue);
  for (size_t k = 0; k < src.ops().size(); ++k) {
    const Op& s = src.ops()[k];
    if (s.code == OpCode::kStore) continue;
    Op op = s;
    for (int j = 0; j < op_arity(op.code); ++j) op.operands[j] = remap[op.operands[j]];
    if (op.mask != kNoValue) op.mask = remap[op.mask];
    op.index = sym::substitute(op.index, subst);
    if (op.code == OpCode::kIndirect) {
      sym::Expr fresh =
          sym::Expr::symbol(fmt::format("t{}", next_indirect_++), sym::SymbolKind::kIndex);
      subst[s.symbol] = fresh;
      op.symbol = fresh;
    }
    remap[k] = push(std::move(op));
  }
  return remap[static_cast<size_t>(src.result())];
}

int LoopBody::compute_op_count() const {
  int n = 0;
  for (const Op& op : ops_) {
    switch (op.code) {
      case OpCode::kLoad:
      case OpCode::kStore:
      case OpCode::kConstant:
      case OpCode::kIndexExpr:
      case OpCode::kIndirect:
        break;
      default:
        ++n;
    }
  }
  return n;
}

std::vector<std::string> LoopBody::loaded_buffers() const {
  std::vector<std::string> names;
  for (const Op& op : ops_) {
    if (op.code == OpCode::kLoad) names.push_back(op.buffer);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

void LoopBody::rename_buffer(const std::string& from, const std::string& to) {
  for (Op& op : ops_) {
    if ((op.code == OpCode::kLoad || op.code == OpCode::kStore) && op.buffer == from)
      op.buffer = to;
  }
}

void LoopBody::map_indices(const std::function<sym::Expr(const sym::Expr&)>& fn) {
  for (Op& op : ops_) {
    switch (op.code) {
      case OpCode::kLoad:
      case OpCode::kStore:
      case OpCode::kIndexExpr:
      case OpCode::kIndirect:
        op.index = fn(op.index);
        break;
      default:
        break;
    }
  }
}

}  // namespace kiln::ir
