#include "codegen/cpp/cpp_body.h"

#include <fmt/format.h>

#include "codegen/cpp/cpp_ops.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include "support/error.h"
#include "support/identifier.h"
#include "support/log.h"

namespace kiln::codegen {
namespace {

using graph::DType;
using ir::OpCode;
using ir::ReductionType;

constexpr const char* kVecF32 = "kiln::vec::VecF32";
constexpr const char* kVecMask = "kiln::vec::VecMask";

bool is_vector_dtype(DType d) { return d == DType::kFloat32 || d == DType::kBool; }

bool is_vector_reduction(ReductionType t) {
  switch (t) {
    case ReductionType::kSum:
    case ReductionType::kProd:
    case ReductionType::kMax:
    case ReductionType::kMin:
    case ReductionType::kWelfordMean:
    case ReductionType::kWelfordVar:
      return true;
    default:
      return false;
  }
}

bool is_welford(ReductionType t) {
  return t == ReductionType::kWelfordMean || t == ReductionType::kWelfordVar;
}

bool is_arg(ReductionType t) { return t == ReductionType::kArgMax || t == ReductionType::kArgMin; }

/// The runtime's name for the conversions of a 16-, 8- or 4-bit float stored as its code
/// (kiln_half.h, kiln_small_types.h); empty for other dtypes.
std::string_view float_code_name(DType storage) {
  switch (storage) {
    case DType::kFloat16:
      return "half";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat8E4M3FN:
      return "f8e4m3fn";
    case DType::kFloat8E4M3FNUZ:
      return "f8e4m3fnuz";
    case DType::kFloat8E5M2:
      return "f8e5m2";
    case DType::kFloat8E5M2FNUZ:
      return "f8e5m2fnuz";
    case DType::kFloat4E2M1:
      return "f4e2m1";
    case DType::kFloat8E8M0:
      return "f8e8m0";
    default:
      return "";
  }
}

std::string widen(DType storage, const std::string& element) {
  std::string_view code = float_code_name(storage);
  if (!code.empty()) return fmt::format("kiln::{}_to_float({})", code, element);
  if (graph::is_small_integer(storage)) return fmt::format("static_cast<int32_t>({})", element);
  return element;
}

/// `v` (of dtype `from`) as stored in a `storage` buffer.
std::string narrow(DType storage, DType from, const std::string& v) {
  std::string_view code = float_code_name(storage);
  if (!code.empty()) return fmt::format("kiln::float_to_{}({})", code, v);
  if (graph::is_small_integer(storage)) {
    return fmt::format("kiln::wrap_{}({})", graph::dtype_name(storage), v);
  }
  if (storage != from && graph::dtype_size(storage) != 2) {
    return fmt::format("static_cast<{}>({})", graph::dtype_cpp_storage(storage), v);
  }
  return v;
}

/// ONNX BitCast of `v` (of compute_dtype(op.bits_from)): stored as bits_from, the bytes read as
/// bits_to's storage type (kiln::bit_cast), a sub-byte type's own bits kept, then widened to the
/// compute type as a load would.
std::string bitcast_text(const ir::Op& op, const std::string& v) {
  DType from = op.bits_from, to = op.bits_to;
  std::string stored = narrow(from, graph::compute_dtype(from), v);
  if (to == DType::kBool) return fmt::format("(kiln::bit_cast<uint8_t>({}) != 0)", stored);
  std::string bits = fmt::format("kiln::bit_cast<{}>({})", graph::dtype_cpp_storage(to), stored);
  if (graph::is_small_integer(to)) {
    bits = fmt::format("kiln::wrap_{}({})", graph::dtype_name(to), bits);
  } else if (to == DType::kFloat4E2M1) {
    bits = fmt::format("static_cast<uint8_t>({} & 0xF)", bits);
  }
  return widen(to, bits);
}

}  // namespace

std::string KernelContext::tmp(const char* prefix) {
  return fmt::format("{}{}", prefix, next_tmp++);
}

std::string KernelContext::cpp(const sym::Expr& e) const {
  return sym::to_cpp(
      e, [this](const sym::Expr& x) { return analyzer.statically_known_nonnegative(x); });
}

MemberEmitter::MemberEmitter(KernelContext& ctx, const sched::KernelMember& member)
    : ctx_(ctx), member_(member), body_(member.buffer->body), analyzer_(ctx.analyzer) {
  const auto& ops = body_.ops();
  sym::Substitution subst = member.var_map;
  index_.resize(ops.size());
  post_.resize(ops.size());
  for (size_t k = 0; k < ops.size(); ++k) {
    const ir::Op& op = ops[k];
    auto id = static_cast<ir::ValueId>(k);
    if (op.code == OpCode::kIndirect) {
      std::string name = fmt::format("ind{}", ctx.next_symbol++);
      sym::Expr s = sym::Expr::symbol(name, sym::SymbolKind::kIndex);
      subst[op.symbol] = s;
      indirect_names_[id] = name;
      analyzer_.bind_index(s, op.index);
    }
    if (op.code == OpCode::kLoad || op.code == OpCode::kStore || op.code == OpCode::kIndexExpr ||
        op.code == OpCode::kIndirect) {
      index_[k] = analyzer_.simplify(sym::substitute(op.index, subst));
    }
    bool post = op.code == OpCode::kReduction;
    for (int j = 0; j < ir::op_arity(op.code); ++j) post = post || post_[op.operands[j]];
    if (op.mask != ir::kNoValue) post = post || post_[op.mask];
    post_[k] = post;
  }
  ir::Layout reduce = ir::Layout::contiguous(body_.reduce_sizes());
  arg_index_ = analyzer_.simplify(
      sym::substitute(sym::dot(body_.reduce_vars(), reduce.strides), member.var_map));
}

std::optional<int64_t> MemberEmitter::stride(const sym::Expr& index, const sym::Expr& var) const {
  sym::Expr next = sym::substitute(index, sym::Substitution{{var, var + 1}});
  return analyzer_.simplify(next - index).as_integer();
}

bool MemberEmitter::has_indirect_or_mask(const LoopPass* pass) const {
  for (const ir::Op& op : body_.ops()) {
    if (op.code == OpCode::kIndirect) return true;
    if (op.mask != ir::kNoValue && !(pass && known_truth(op.mask, *pass))) return true;
  }
  return false;
}

sym::Expr MemberEmitter::pass_index(ir::ValueId id, const LoopPass& pass) const {
  if (pass.substitution.empty()) return index_[id];
  return pass.analyzer->simplify(sym::substitute(index_[id], pass.substitution));
}

std::optional<std::pair<int64_t, int64_t>> MemberEmitter::index_difference(
    const ir::Op& op, const sym::Expr& var, const LoopPass* pass) const {
  if (!ir::is_comparison(op.code)) return std::nullopt;
  // Each side an index expression or an integer constant.
  auto side = [&](ir::ValueId id) -> std::optional<sym::Expr> {
    const ir::Op& o = body_.op(id);
    if (o.code == OpCode::kIndexExpr) return pass ? pass_index(id, *pass) : index_[id];
    if (o.code == OpCode::kConstant && graph::is_integer(o.dtype)) return sym::Expr(o.int_value);
    return std::nullopt;
  };
  const std::optional<sym::Expr> a = side(op.operands[0]), b = side(op.operands[1]);
  if (!a || !b) return std::nullopt;
  const sym::Analyzer& analyzer = pass && pass->analyzer ? *pass->analyzer : analyzer_;
  const sym::Expr d = analyzer.simplify(*a - *b);
  const std::optional<int64_t> c = analyzer.simplify(sym::substitute(d, {{var, 0}})).as_integer();
  if (!c) return std::nullopt;
  for (int64_t coef : {0, 1, -1}) {
    if (analyzer.simplify(d - *c - coef * var) == sym::Expr(0)) return std::pair{coef, *c};
  }
  return std::nullopt;
}

void MemberEmitter::range_boundaries(const sym::Expr& var, int64_t size,
                                     std::set<int64_t>& points) const {
  auto add = [&](int64_t p) {
    if (p > 0 && p < size) points.insert(p);
  };
  for (const ir::Op& op : body_.ops()) {
    const auto diff = index_difference(op, var);
    if (!diff || diff->first == 0) continue;
    // The comparison is a test of d = coef * var + c: d <= t (Lt: t = -1, Le: t = 0), d >= t
    // (Gt: 1, Ge: 0) or d == 0 (Eq, Ne). A range starts where the test changes value.
    const auto [coef, c] = *diff;
    auto at_most = [&](int64_t t) { add(coef == 1 ? t - c + 1 : c - t); };
    auto at_least = [&](int64_t t) { add(coef == 1 ? t - c : c - t + 1); };
    switch (op.code) {
      case OpCode::kLt:
        at_most(-1);
        break;
      case OpCode::kLe:
        at_most(0);
        break;
      case OpCode::kGt:
        at_least(1);
        break;
      case OpCode::kGe:
        at_least(0);
        break;
      default:  // Eq, Ne: d is 0 at one position
        at_most(0);
        at_least(0);
        break;
    }
  }
}

namespace {

bool uses(const sym::Expr& e, const sym::Expr& var) {
  const std::vector<sym::Expr> symbols = sym::free_symbols(e);
  return std::find(symbols.begin(), symbols.end(), var) != symbols.end();
}

/// Adds the constant divisors of the floor divisions, moduli and modular indexings of `e` whose
/// dividend uses `var`.
void collect_divisors(const sym::Expr& e, const sym::Expr& var, std::set<int64_t>& divisors) {
  const sym::ExprKind kind = e.kind();
  if (kind == sym::ExprKind::kInteger || kind == sym::ExprKind::kSymbol) return;
  const std::vector<sym::Expr>& args = e.args();
  if ((kind == sym::ExprKind::kFloorDiv || kind == sym::ExprKind::kMod ||
       kind == sym::ExprKind::kModularIndexing) &&
      args.size() >= 2 && uses(args[0], var)) {
    std::optional<int64_t> k = args[1].as_integer();
    if (k && kind == sym::ExprKind::kModularIndexing && args.size() == 3) {
      // (x / div) % mod repeats every div * mod.
      const std::optional<int64_t> m = args[2].as_integer();
      k = m ? std::optional<int64_t>(*k * *m) : std::nullopt;
    }
    divisors.insert(k && *k > 0 ? *k : 0);  // 0: not a constant
  }
  for (const sym::Expr& a : args) collect_divisors(a, var, divisors);
}

}  // namespace

bool MemberEmitter::index_divisors(const sym::Expr& var, std::set<int64_t>& divisors) const {
  for (size_t k = 0; k < body_.ops().size(); ++k) {
    const OpCode code = body_.ops()[k].code;
    if (code == OpCode::kIndirect) return false;
    if (code == OpCode::kLoad || code == OpCode::kStore || code == OpCode::kIndexExpr) {
      collect_divisors(index_[k], var, divisors);
    }
  }
  return true;
}

std::optional<bool> MemberEmitter::known_truth(ir::ValueId id, const LoopPass& pass) const {
  const ir::Op& op = body_.op(id);
  switch (op.code) {
    case OpCode::kConstant:
      if (op.dtype != DType::kBool) return std::nullopt;
      return op.int_value != 0;
    case OpCode::kNot: {
      const auto a = known_truth(op.operands[0], pass);
      return a ? std::optional<bool>(!*a) : std::nullopt;
    }
    case OpCode::kAnd:
    case OpCode::kOr: {
      const bool is_and = op.code == OpCode::kAnd;
      const auto a = known_truth(op.operands[0], pass);
      const auto b = known_truth(op.operands[1], pass);
      // false decides an and, true an or, whatever the other side is.
      if ((a && *a != is_and) || (b && *b != is_and)) return !is_and;
      if (a && b) return is_and;
      return std::nullopt;
    }
    default:
      break;
  }
  if (!pass.ranged) return std::nullopt;
  const auto diff = index_difference(op, pass.range_var, &pass);
  if (!diff) return std::nullopt;
  // The range of d = coef * var + c over var in [lo, hi).
  const auto [coef, c] = *diff;
  const int64_t at_lo = coef * pass.range_lo + c, at_hi = coef * (pass.range_hi - 1) + c;
  const int64_t lo = std::min(at_lo, at_hi), hi = std::max(at_lo, at_hi);
  auto decided = [](bool always, bool never) -> std::optional<bool> {
    if (always) return true;
    if (never) return false;
    return std::nullopt;
  };
  switch (op.code) {
    case OpCode::kLt:
      return decided(hi < 0, lo >= 0);
    case OpCode::kLe:
      return decided(hi <= 0, lo > 0);
    case OpCode::kGt:
      return decided(lo > 0, hi <= 0);
    case OpCode::kGe:
      return decided(lo >= 0, hi < 0);
    case OpCode::kEq:
      return decided(lo == 0 && hi == 0, lo > 0 || hi < 0);
    case OpCode::kNe:
      return decided(lo > 0 || hi < 0, lo == 0 && hi == 0);
    default:
      return std::nullopt;
  }
}

bool MemberEmitter::unit_stride_along(const sym::Expr& var) const {
  bool moves = false;
  for (size_t k = 0; k < body_.ops().size(); ++k) {
    const ir::Op& op = body_.ops()[k];
    if (op.code != OpCode::kLoad && op.code != OpCode::kStore) continue;
    if (ctx_.locals.count(op.buffer)) continue;
    std::optional<int64_t> s = stride(index_[k], var);
    if (!s || (*s != 0 && *s != 1)) return false;
    moves = moves || *s == 1;
  }
  return moves;
}

std::optional<sym::Expr> MemberEmitter::transposed_load_var(
    const sym::Expr& inner, const std::vector<sym::Expr>& outer) const {
  for (size_t k = 0; k < body_.ops().size(); ++k) {
    const ir::Op& op = body_.ops()[k];
    if (op.code != OpCode::kLoad || ctx_.locals.count(op.buffer)) continue;
    const std::optional<int64_t> along_inner = stride(index_[k], inner);
    if (along_inner && (*along_inner == 0 || *along_inner == 1)) continue;
    for (const sym::Expr& var : outer) {
      if (stride(index_[k], var) == std::optional<int64_t>(1)) return var;
    }
  }
  return std::nullopt;
}

bool MemberEmitter::op_vectorizable(const ir::Op& op, const sym::Expr& var,
                                    bool strided_loads) const {
  auto operand_dtype = [&](int j) { return body_.dtype(op.operands[j]); };
  if (op.code != OpCode::kStore && !is_vector_dtype(op.dtype)) return false;
  size_t k = static_cast<size_t>(&op - body_.ops().data());
  auto local = ctx_.locals.find(op.buffer);
  switch (op.code) {
    case OpCode::kLoad:
      if (op.mask != ir::kNoValue) return false;
      if (local != ctx_.locals.end()) {
        return local->second != LocalStorage::kScratch || op.dtype == DType::kFloat32;
      }
      // float32 values, or bools (a mask such as attention's causal one) read as a VecMask.
      if (op.buffer_dtype != op.dtype ||
          (op.dtype != DType::kFloat32 && op.dtype != DType::kBool)) {
        return false;
      }
      if (auto s = stride(index_[k], var)) {
        return *s == 0 || *s == 1 || (strided_loads && op.dtype == DType::kFloat32);
      }
      return false;
    case OpCode::kStore:
      if (local != ctx_.locals.end()) {
        if (local->second == LocalStorage::kScalar) return false;
        return local->second == LocalStorage::kRegister ? is_vector_dtype(op.dtype)
                                                        : op.dtype == DType::kFloat32;
      }
      if (op.buffer_dtype != DType::kFloat32 || op.dtype != DType::kFloat32) return false;
      return stride(index_[k], var) == std::optional<int64_t>(1);
    case OpCode::kConstant:
      return true;
    case OpCode::kIndexExpr:
    case OpCode::kIndirect:
      return false;
    case OpCode::kCast:
      return is_vector_dtype(operand_dtype(0));
    case OpCode::kBitCast:
      return false;
    case OpCode::kWhere:
      return true;
    case OpCode::kReduction:
      return is_vector_reduction(op.reduction) && op.dtype == DType::kFloat32 &&
             operand_dtype(0) == DType::kFloat32;
    default:
      break;
  }
  const CppOpTemplates& t = cpp_op_templates(op.code);
  if (t.vector == nullptr) return false;
  bool masks = t.vector_on_masks || ((op.code == OpCode::kEq || op.code == OpCode::kNe) &&
                                     operand_dtype(0) == DType::kBool);
  for (int j = 0; j < ir::op_arity(op.code); ++j) {
    if (operand_dtype(j) != (masks ? DType::kBool : DType::kFloat32)) return false;
  }
  return true;
}

bool MemberEmitter::can_vectorize(const sym::Expr& var, bool strided_loads) const {
  for (size_t k = 0; k < body_.ops().size(); ++k) {
    const ir::Op& op = body_.ops()[k];
    bool in_loop = !post_[k] || op.code == OpCode::kReduction;
    if (in_loop && !op_vectorizable(op, var, strided_loads)) return false;
  }
  return true;
}

void MemberEmitter::define_indirects(const sym::Expr& index, IndentedBuffer& out, LoopPass& pass,
                                     Scope& scope) {
  for (const auto& [id, name] : indirect_names_) {
    if (sym::has_symbol(index, sym::Expr::symbol(name, sym::SymbolKind::kIndex))) {
      value(id, out, pass, scope);
    }
  }
}

std::string MemberEmitter::load(const ir::Op& op, ir::ValueId id, IndentedBuffer& out,
                                LoopPass& pass, Scope& scope) {
  if (auto f = pass.forwarded.find(op.buffer); f != pass.forwarded.end()) return f->second;
  std::string expr;
  auto local = ctx_.locals.find(op.buffer);
  const char* vec_type = op.dtype == DType::kBool ? kVecMask : kVecF32;
  if (local != ctx_.locals.end()) {
    const std::string& name = ctx_.local_names.at(op.buffer);
    KILN_CHECK(local->second != LocalStorage::kRegister,
               "kernel-local {} is loaded before it is stored", op.buffer);
    if (local->second == LocalStorage::kScalar) {
      if (!pass.vector) return name;
      expr = fmt::format("{}::broadcast({})", vec_type, name);
    } else {
      std::string si = ctx_.cpp(ctx_.scratch_index);
      expr = pass.vector ? fmt::format("{}::loadu({} + {})", kVecF32, name, si)
                         : fmt::format("{}[{}]", name, si);
    }
  } else {
    const std::string& ptr = ctx_.params.at(op.buffer);
    define_indirects(index_[id], out, pass, scope);
    std::string idx = sym::to_cpp(pass_index(id, pass), [this](const sym::Expr& x) {
      return analyzer_.statically_known_nonnegative(x);
    });
    if (pass.vector) {
      const std::optional<int64_t> s = stride(index_[id], pass.vector_var);
      if (s == std::optional<int64_t>(1)) {
        expr = fmt::format("{}::loadu({} + {})", vec_type, ptr, idx);
      } else if (s == std::optional<int64_t>(0)) {
        expr = fmt::format("{}::broadcast({}[{}])", vec_type, ptr, idx);
      } else {
        expr = fmt::format("{}::load_strided({} + {}, {})", vec_type, ptr, idx, *s);
      }
    } else {
      expr = widen(op.buffer_dtype, fmt::format("{}[{}]", ptr, idx));
      if (op.mask != ir::kNoValue) {
        ir::Op other;
        other.dtype = op.dtype;
        other.float_value = op.float_value;
        other.int_value = static_cast<int64_t>(op.float_value);
        // A mask the pass's range decides: the load alone, or the other value alone.
        const std::optional<bool> known =
            pass.ranged ? known_truth(op.mask, pass) : std::optional<bool>();
        if (known == std::optional<bool>(false)) {
          expr = cpp_literal(other);
        } else if (!known) {
          std::string m = value(op.mask, out, pass, scope);
          expr = fmt::format("({} ? {} : {})", m, expr, cpp_literal(other));
        }
      }
    }
  }
  std::string name = ctx_.tmp();
  if (pass.vector) {
    out.linef("auto {} = {};", name, expr);
  } else {
    out.linef("const {} {} = {};", cpp_compute_type(op.dtype), name, expr);
  }
  return name;
}

std::string MemberEmitter::scalar_op(const ir::Op& op, const std::vector<std::string>& args,
                                     IndentedBuffer& out, LoopPass& pass, Scope& scope) {
  std::string_view type = cpp_compute_type(op.dtype);
  switch (op.code) {
    case OpCode::kConstant:
      return cpp_literal(op);
    case OpCode::kIndexExpr: {
      const sym::Expr index = pass_index(static_cast<ir::ValueId>(&op - body_.ops().data()), pass);
      define_indirects(index, out, pass, scope);
      return fmt::format("static_cast<{}>({})", type, ctx_.cpp(index));
    }
    case OpCode::kCast:
      return fmt::format("static_cast<{}>({})", type, args[0]);
    case OpCode::kBitCast:
      return bitcast_text(op, args[0]);
    case OpCode::kWhere:
      return fmt::format("({} ? {} : {})", args[0], args[1], args[2]);
    case OpCode::kIndirect: {
      auto id = static_cast<ir::ValueId>(&op - body_.ops().data());
      const std::string& name = indirect_names_.at(id);
      std::string size = ctx_.cpp(index_[id]);
      out.linef(
          "const int64_t {0} = static_cast<int64_t>({1}) < 0 ? static_cast<int64_t>({1}) + {2} "
          ": static_cast<int64_t>({1});",
          name, args[0], size);
      return name;
    }
    default: {
      if (auto bounded = format_number_bound(op, body_.ops(), args, OpForm::kScalar)) {
        return *bounded;
      }
      const char* simd = pass.simd_math ? cpp_simd_math_form(op) : nullptr;
      return format_op(simd != nullptr ? simd : cpp_op_templates(op.code).scalar, args);
    }
  }
}

std::string MemberEmitter::vector_op(const ir::Op& op, const std::vector<std::string>& args,
                                     LoopPass&) {
  switch (op.code) {
    case OpCode::kConstant:
      return fmt::format("{}::broadcast({})", op.dtype == DType::kBool ? kVecMask : kVecF32,
                         cpp_literal(op));
    case OpCode::kCast: {
      DType from = body_.dtype(op.operands[0]);
      if (from == op.dtype) return args[0];
      if (op.dtype == DType::kBool) return fmt::format("kiln::vec::to_mask({})", args[0]);
      return fmt::format("kiln::vec::to_float({})", args[0]);
    }
    case OpCode::kWhere:
      return fmt::format("kiln::vec::where({}, {}, {})", args[0], args[1], args[2]);
    default:
      if (auto bounded = format_number_bound(op, body_.ops(), args, OpForm::kVec)) return *bounded;
      return format_op(cpp_op_templates(op.code).vector, args);
  }
}

std::string MemberEmitter::value(ir::ValueId id, IndentedBuffer& out, LoopPass& pass,
                                 Scope& scope) {
  if (auto it = scope.names.find(id); it != scope.names.end()) return it->second;
  const ir::Op& op = body_.op(id);
  std::string name;
  if (pass.ranged && op.code == OpCode::kWhere) {
    // A select the range decides is its live side.
    if (const auto cond = known_truth(op.operands[0], pass)) {
      name = value(op.operands[*cond ? 1 : 2], out, pass, scope);
      scope.names[id] = name;
      return name;
    }
  }
  if (pass.ranged && op.dtype == DType::kBool && op.code != OpCode::kLoad) {
    if (const auto known = known_truth(id, pass)) {
      name = *known ? "true" : "false";
      scope.names[id] = name;
      return name;
    }
  }
  if (op.code == OpCode::kLoad) {
    name = load(op, id, out, pass, scope);
  } else {
    KILN_CHECK(op.code != OpCode::kReduction, "reduction value used inside its own loop");
    std::vector<std::string> args;
    for (int j = 0; j < ir::op_arity(op.code); ++j) {
      args.push_back(value(op.operands[j], out, pass, scope));
    }
    if (pass.vector) {
      name = ctx_.tmp();
      out.linef("auto {} = {};", name, vector_op(op, args, pass));
    } else if (op.code == OpCode::kIndirect) {
      name = scalar_op(op, args, out, pass, scope);
    } else {
      name = ctx_.tmp();
      out.linef("const {} {} = {};", cpp_compute_type(op.dtype), name,
                scalar_op(op, args, out, pass, scope));
    }
  }
  scope.names[id] = name;
  return name;
}

void MemberEmitter::store(const ir::Op& op, const std::string& v, IndentedBuffer& out,
                          LoopPass& pass) {
  auto id = static_cast<size_t>(&op - body_.ops().data());
  pass.forwarded[op.buffer] = v;
  auto local = ctx_.locals.find(op.buffer);
  if (local != ctx_.locals.end()) {
    const std::string& name = ctx_.local_names.at(op.buffer);
    switch (local->second) {
      case LocalStorage::kRegister:
        return;
      case LocalStorage::kScalar:
        KILN_CHECK(!pass.vector, "vector store into scalar local {}", op.buffer);
        out.linef("{} = {};", name, v);
        return;
      case LocalStorage::kScratch: {
        std::string si = ctx_.cpp(ctx_.scratch_index);
        if (pass.vector) {
          out.linef("{}.storeu({} + {});", v, name, si);
        } else {
          out.linef("{}[{}] = {};", name, si, v);
        }
        return;
      }
    }
  }
  if (auto staged = pass.staged.find(op.buffer); staged != pass.staged.end()) {
    out.linef("{} = {};", staged->second, narrow(op.buffer_dtype, op.dtype, v));
    return;
  }
  const std::string& ptr = ctx_.params.at(op.buffer);
  std::string idx =
      sym::to_cpp(pass_index(static_cast<ir::ValueId>(id), pass),
                  [this](const sym::Expr& x) { return analyzer_.statically_known_nonnegative(x); });
  if (pass.vector) {
    out.linef("{}.storeu({} + {});", v, ptr, idx);
    return;
  }
  out.linef("{}[{}] = {};", ptr, idx, narrow(op.buffer_dtype, op.dtype, v));
}

void MemberEmitter::emit_accumulators(IndentedBuffer& out, bool vectorized) {
  for (size_t k = 0; k < body_.ops().size(); ++k) {
    const ir::Op& op = body_.ops()[k];
    if (op.code != OpCode::kReduction) continue;
    auto id = static_cast<ir::ValueId>(k);
    std::string acc = ctx_.tmp("acc");
    acc_[id] = acc;
    std::string_view t = cpp_compute_type(op.dtype);
    if (is_welford(op.reduction)) {
      out.linef("kiln::Welford<{}> {};", t, acc);
    } else if (is_arg(op.reduction)) {
      out.linef("kiln::ArgReduce<{}> {};", cpp_compute_type(body_.dtype(op.operands[0])), acc);
    } else {
      out.linef("{} {} = {};", t, acc, cpp_reduction_init(op.reduction, op.dtype));
    }
    if (!vectorized) continue;
    std::string vacc = ctx_.tmp("vacc");
    vacc_[id] = vacc;
    if (is_welford(op.reduction)) {
      out.linef("kiln::vec::WelfordVec {};", vacc);
    } else {
      out.linef("auto {} = {}::broadcast({});", vacc, kVecF32,
                cpp_reduction_init(op.reduction, op.dtype));
    }
  }
}

void MemberEmitter::emit_accumulator_arrays(IndentedBuffer& out, int64_t lanes,
                                            const std::string& lane) {
  for (size_t k = 0; k < body_.ops().size(); ++k) {
    const ir::Op& op = body_.ops()[k];
    if (op.code != OpCode::kReduction) continue;
    std::string acc = ctx_.tmp("acc");
    out.linef("{} {}[{}];", cpp_compute_type(op.dtype), acc, lanes);
    out.linef("for (int64_t kiln_j = 0; kiln_j < {}; ++kiln_j) {}[kiln_j] = {};", lanes, acc,
              cpp_reduction_init(op.reduction, op.dtype));
    acc_[static_cast<ir::ValueId>(k)] = fmt::format("{}[{}]", acc, lane);
  }
}

bool MemberEmitter::plain_reductions() const {
  for (const ir::Op& op : body_.ops()) {
    if (op.code != OpCode::kReduction) continue;
    if (is_welford(op.reduction) || is_arg(op.reduction) || op.reduction == ReductionType::kAny ||
        op.reduction == ReductionType::kAll) {
      return false;
    }
  }
  return true;
}

void MemberEmitter::update_accumulator(ir::ValueId id, const std::string& v, IndentedBuffer& out,
                                       LoopPass& pass) {
  const ir::Op& op = body_.op(id);
  const std::string& acc = pass.vector ? vacc_.at(id) : acc_.at(id);
  std::string_view t = cpp_compute_type(op.dtype);
  std::string x = pass.vector ? v : fmt::format("static_cast<{}>({})", t, v);
  const char* ns = pass.vector ? "kiln::vec" : "kiln";
  switch (op.reduction) {
    case ReductionType::kSum:
      out.linef("{0} = {0} + {1};", acc, x);
      return;
    case ReductionType::kProd:
      out.linef("{0} = {0} * {1};", acc, x);
      return;
    case ReductionType::kMax:
      out.linef("{0} = {2}::maximum({0}, {1});", acc, x, ns);
      return;
    case ReductionType::kMin:
      out.linef("{0} = {2}::minimum({0}, {1});", acc, x, ns);
      return;
    case ReductionType::kAny:
      out.linef("{0} = {0} || {1};", acc, x);
      return;
    case ReductionType::kAll:
      out.linef("{0} = {0} && {1};", acc, x);
      return;
    case ReductionType::kWelfordMean:
    case ReductionType::kWelfordVar:
      out.linef("{}.update({});", acc, x);
      return;
    case ReductionType::kArgMax:
    case ReductionType::kArgMin:
      out.linef("{}.update({}, {}, {}, {});", acc, v, ctx_.cpp(arg_index_),
                op.reduction == ReductionType::kArgMax, op.select_last);
      return;
  }
}

void MemberEmitter::emit_loop_body(IndentedBuffer& out, LoopPass& pass) {
  Scope scope;
  for (size_t k = 0; k < body_.ops().size(); ++k) {
    const ir::Op& op = body_.ops()[k];
    auto id = static_cast<ir::ValueId>(k);
    if (op.code == OpCode::kReduction) {
      update_accumulator(id, value(op.operands[0], out, pass, scope), out, pass);
    } else if (op.code == OpCode::kStore && !post_[k]) {
      std::string v = value(op.operands[0], out, pass, scope);
      define_indirects(index_[k], out, pass, scope);
      store(op, v, out, pass);
    }
  }
}

void MemberEmitter::emit_reduction_end(IndentedBuffer& out, bool vectorized) {
  Scope scope;
  for (const auto& [id, acc] : acc_) {
    const ir::Op& op = body_.op(id);
    if (vectorized) {
      const std::string& vacc = vacc_.at(id);
      switch (op.reduction) {
        case ReductionType::kSum:
          out.linef("{0} = {0} + kiln::vec::hsum({1});", acc, vacc);
          break;
        case ReductionType::kProd:
          out.linef("{0} = {0} * kiln::vec::hprod({1});", acc, vacc);
          break;
        case ReductionType::kMax:
          out.linef("{0} = kiln::maximum({0}, kiln::vec::hmax({1}));", acc, vacc);
          break;
        case ReductionType::kMin:
          out.linef("{0} = kiln::minimum({0}, kiln::vec::hmin({1}));", acc, vacc);
          break;
        default:
          out.linef("{}.combine_into({});", vacc, acc);
          break;
      }
    }
    std::string result = acc;
    if (op.reduction == ReductionType::kWelfordMean) result = fmt::format("{}.result_mean()", acc);
    if (op.reduction == ReductionType::kWelfordVar) result = fmt::format("{}.variance()", acc);
    if (is_arg(op.reduction)) result = fmt::format("{}.index", acc);
    if (result != acc) {
      std::string name = ctx_.tmp();
      out.linef("const {} {} = {};", cpp_compute_type(op.dtype), name, result);
      result = name;
    }
    scope.names[id] = result;
  }
  LoopPass pass;
  for (size_t k = 0; k < body_.ops().size(); ++k) {
    const ir::Op& op = body_.ops()[k];
    if (op.code == OpCode::kStore && post_[k]) {
      std::string v = value(op.operands[0], out, pass, scope);
      define_indirects(index_[k], out, pass, scope);
      store(op, v, out, pass);
    }
  }
}

namespace {
bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
using sched::MemberKind;
}  // namespace

void assign_kernel_params(KernelContext& ctx, std::vector<KernelArg>& args,
                          std::vector<std::string>& param_names) {
  const sched::ScheduleItem& item = *ctx.item;
  std::set<std::string> written;
  for (const ir::Buffer* b : item.buffers) written.insert(b->name);
  std::map<std::string, std::string> inplace_of;  // input -> output
  for (const auto& [out, in] : item.inplace) inplace_of[in] = out;
  int n_in = 0;
  for (const ir::Buffer* b : item.buffers) {
    for (const ir::Op& op : b->body.ops()) {
      if (op.code != ir::OpCode::kLoad || written.count(op.buffer) || inplace_of.count(op.buffer) ||
          ctx.params.count(op.buffer)) {
        continue;
      }
      std::string param = fmt::format("in_ptr{}", n_in++);
      ctx.params[op.buffer] = param;
      args.push_back(KernelArg{KernelArg::Kind::kBuffer, op.buffer, op.buffer_dtype, false, {}});
      param_names.push_back(param);
    }
  }
  int n_out = 0;
  int n_inout = 0;
  for (const ir::Buffer* b : item.buffers) {
    if (contains(item.kernel_local, b->name)) continue;
    bool inplace = std::any_of(item.inplace.begin(), item.inplace.end(),
                               [&](const auto& p) { return p.first == b->name; });
    std::string param =
        inplace ? fmt::format("in_out_ptr{}", n_inout++) : fmt::format("out_ptr{}", n_out++);
    ctx.params[b->name] = param;
    for (const auto& [out, in] : item.inplace) {
      if (out == b->name) ctx.params[in] = param;
    }
    args.push_back(KernelArg{KernelArg::Kind::kBuffer, b->name, b->dtype, true, {}});
    param_names.push_back(param);
  }
}

void assign_kernel_locals(KernelContext& ctx) {
  const sched::ScheduleItem& item = *ctx.item;
  const sched::KernelGroup& group = item.group;
  int n = 0;
  for (const sched::KernelMember& m : item.members) {
    const std::string& name = m.buffer->name;
    if (!contains(item.kernel_local, name)) continue;
    LocalStorage storage = LocalStorage::kRegister;
    if (group.is_reduction()) {
      storage =
          m.kind == MemberKind::kPointwiseInner ? LocalStorage::kScratch : LocalStorage::kScalar;
    }
    ctx.locals[name] = storage;
    ctx.local_names[name] =
        fmt::format("{}{}", storage == LocalStorage::kScratch ? "scratch" : "local", n++);
    ctx.local_dtypes[name] = m.buffer->dtype;
  }
}

void add_size_args(const sched::ScheduleItem& item, std::vector<KernelArg>& args) {
  const sched::KernelGroup& group = item.group;
  std::set<sym::Expr> symbols;
  auto add = [&](const sym::Expr& e) {
    for (const sym::Expr& s : sym::free_symbols(e)) {
      if (s.symbol_kind() != sym::SymbolKind::kIndex) symbols.insert(s);
    }
  };
  for (const sym::Expr& s : group.sizes) add(s);
  for (const sym::Expr& s : group.reduce_sizes) add(s);
  for (const sched::KernelMember& m : item.members) {
    for (const auto& [from, to] : m.var_map) add(to);
    for (const ir::Op& op : m.buffer->body.ops()) add(op.index);
  }
  std::vector<sym::Expr> sorted(symbols.begin(), symbols.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const sym::Expr& a, const sym::Expr& b) { return a.name() < b.name(); });
  for (const sym::Expr& s : sorted) {
    args.push_back(
        KernelArg{KernelArg::Kind::kSize, sym::cpp_identifier(s), graph::DType::kInt64, false, s});
  }
}

GeneratedKernel assemble_kernel(const sched::ScheduleItem& item, const std::string& head,
                                const IndentedBuffer& body, std::vector<KernelArg> args) {
  IndentedBuffer comment;
  comment.linef("// {}: {}", item.name, comment_safe(item.group.str()));
  for (const std::string& node : item.onnx_nodes) comment.linef("//   ONNX node {}", node);
  for (const sched::KernelMember& m : item.members) {
    bool local = contains(item.kernel_local, m.buffer->name);
    comment.linef("//   buffer {}{}", m.buffer->name, local ? " (kernel-local)" : "");
  }
  IndentedBuffer out;
  out.line(head + " {");
  {
    auto _ = out.scope();
    out.splice(body);
  }
  out.line("}");
  GeneratedKernel kernel;
  kernel.name = item.name;
  kernel.comment = comment.str();
  kernel.definition = out.str();
  kernel.name_offset = head.find(item.name);
  kernel.args = std::move(args);
  kernel.onnx_nodes = item.onnx_nodes;
  log::write(log::Category::kOutputCode, "kernel {}:\n{}", kernel.name, kernel.source());
  return kernel;
}

}  // namespace kiln::codegen
