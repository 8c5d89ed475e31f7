#pragma once
/// LoopBody: the body of a loop nest as data. A small SSA graph of ops (ops.def) over index
/// variables i0..in (pointwise dims) and r0..rm (reduction dims). Every stage walks the same
/// LoopBody: dependency extraction (sched/), code generation (codegen/), printing, and lowering's
/// inlining of a producer into its consumer (inline_body with a variable substitution).
///
/// Values are identified by their position (ValueId); operands always precede their users.
/// Float16 and bfloat16 are computed in float32: a Load of such a buffer yields float32 and a
/// Store converts back, so ops never see 16-bit floats.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/dtype.h"
#include "sym/analyzer.h"
#include "sym/expr.h"

namespace kiln::ir {

enum class OpCode : uint8_t {
#define KILN_IR_OP(name, arity, text) k##name,
#include "ir/ops.def"
#undef KILN_IR_OP
};

int op_arity(OpCode code);
std::string_view op_name(OpCode code);
bool is_comparison(OpCode code);  // Eq..Ge: result is bool

enum class ReductionType : uint8_t {
  kSum,
  kProd,
  kMax,
  kMin,
  kArgMax,  // int64 index of the first (or last, select_last) maximum over the reduce vars
  kArgMin,
  kWelfordMean,  // mean by Welford's update
  kWelfordVar,   // population variance by Welford's update
  kAny,          // logical or (bool)
  kAll,          // logical and (bool)
};
std::string_view reduction_name(ReductionType type);

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;

/// One SSA op. Fields beyond `code`, `dtype` and `operands` are used by the ops that need them.
struct Op {
  OpCode code = OpCode::kConstant;
  graph::DType dtype =
      graph::DType::kFloat32;  // result (compute) dtype; a Store's is the stored value's
  std::array<ValueId, 3> operands = {kNoValue, kNoValue, kNoValue};
  std::string buffer;                                    // Load, Store: buffer name
  graph::DType buffer_dtype = graph::DType::kUndefined;  // Load, Store: the buffer's element type
  sym::Expr index;         // Load, Store, IndexExpr: element index; Indirect: the size to wrap into
  sym::Expr symbol;        // Indirect: the index symbol it defines
  double float_value = 0;  // Constant (floating dtypes); masked Load: value where mask is false
  int64_t int_value = 0;   // Constant (integer and bool dtypes)
  ValueId mask = kNoValue;  // Load: when set, load only where the mask is true
  ReductionType reduction = ReductionType::kSum;  // Reduction
  bool select_last = false;                       // ArgMax/ArgMin: last index on ties
  // BitCast: the storage types of equal bit width (graph::dtype_packed_bits) whose bits it
  // reinterprets; `dtype` is compute_dtype(bits_to).
  graph::DType bits_from = graph::DType::kUndefined;
  graph::DType bits_to = graph::DType::kUndefined;
};

class LoopBody {
 public:
  LoopBody() = default;
  /// A body over `sizes` pointwise dims and `reduce_sizes` reduction dims; creates the index
  /// variables i0.. and r0.. .
  LoopBody(std::vector<sym::Expr> sizes, std::vector<sym::Expr> reduce_sizes);

  const std::vector<sym::Expr>& vars() const { return vars_; }
  const std::vector<sym::Expr>& sizes() const { return sizes_; }
  const std::vector<sym::Expr>& reduce_vars() const { return reduce_vars_; }
  const std::vector<sym::Expr>& reduce_sizes() const { return reduce_sizes_; }
  bool is_reduction() const { return !reduce_sizes_.empty(); }
  const std::vector<Op>& ops() const { return ops_; }
  const Op& op(ValueId id) const { return ops_.at(static_cast<size_t>(id)); }
  /// The value a lazily computed tensor yields (lowering); kNoValue for materialized bodies.
  ValueId result() const { return result_; }
  void set_result(ValueId id) { result_ = id; }

  // Builders. Each appends one op and returns its id.
  ValueId load(const std::string& buffer, graph::DType buffer_dtype, const sym::Expr& index);
  ValueId masked_load(const std::string& buffer, graph::DType buffer_dtype, const sym::Expr& index,
                      ValueId mask, double other);
  ValueId constant(double value, graph::DType dtype);
  ValueId index_expr(const sym::Expr& index, graph::DType dtype = graph::DType::kInt64);
  /// Defines a fresh index symbol from an integer value: negative values wrap by `size` as ONNX
  /// indices do. Returns the op; its symbol is op(id).symbol.
  ValueId indirect(ValueId value, const sym::Expr& size);
  ValueId cast(ValueId value, graph::DType dtype);
  /// `value` (of compute_dtype(from)) stored as `from`, its bits read as `to` (ONNX BitCast):
  /// the two storage types have the same bit width.
  ValueId bitcast(ValueId value, graph::DType from, graph::DType to);
  ValueId unary(OpCode code, ValueId a);
  ValueId binary(OpCode code, ValueId a, ValueId b);
  ValueId where(ValueId cond, ValueId a, ValueId b);
  ValueId reduction(ReductionType type, ValueId value, graph::DType dtype,
                    bool select_last = false);
  ValueId store(const std::string& buffer, graph::DType buffer_dtype, const sym::Expr& index,
                ValueId value);

  /// Copies the ops of `src` (all but its stores) into this body, replacing src's index
  /// variables by the given expressions (keyed by src's variable symbols) and giving src's
  /// indirect symbols fresh names. Returns the id of src.result() in this body.
  ValueId inline_body(const LoopBody& src, const sym::Substitution& var_map);

  /// The compute dtype of a value.
  graph::DType dtype(ValueId id) const { return op(id).dtype; }
  /// Number of ops that do arithmetic (not loads, constants or index math): a cost estimate.
  int compute_op_count() const;
  /// Every buffer this body loads from, sorted, unique.
  std::vector<std::string> loaded_buffers() const;

  /// Renames every load/store of buffer `from` to `to` (scheduler renames, in-place reuse).
  void rename_buffer(const std::string& from, const std::string& to);
  /// Rewrites every index expression (loads, stores, index_expr, indirect sizes).
  void map_indices(const std::function<sym::Expr(const sym::Expr&)>& fn);

  /// Text form, one op per line (see printer.cpp).
  std::string str() const;

 private:
  ValueId push(Op op);
  std::vector<sym::Expr> vars_;
  std::vector<sym::Expr> sizes_;
  std::vector<sym::Expr> reduce_vars_;
  std::vector<sym::Expr> reduce_sizes_;
  std::vector<Op> ops_;
  ValueId result_ = kNoValue;
  int next_indirect_ = 0;
};

/// The result dtype of a binary op on operands of dtype `a` (comparisons give bool).
graph::DType binary_result_dtype(OpCode code, graph::DType a);

/// Index variable symbols: i<k> and r<k>, SymbolKind::kIndex.
sym::Expr index_var(int k);
sym::Expr reduce_var(int k);

}  // namespace kiln::ir
