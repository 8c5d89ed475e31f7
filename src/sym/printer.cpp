/// Printing: Expr::str() (canonical, Python-like: //, %, ceildiv, min, max) and the C++ and
/// CUDA expression printers (int64_t arithmetic; see expr.h for when / and % are plain).

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "support/error.h"
#include "support/identifier.h"
#include "sym/expr_node.h"

namespace kiln::sym {
namespace {

enum class Dialect { kStr, kCpp, kCuda };

struct Text {
  std::string text;
  bool atomic = false;  // can stand as an operand of * / % without parentheses
};

class Printer {
 public:
  Printer(Dialect dialect, const std::function<bool(const Expr&)>& nonnegative)
      : dialect_(dialect), nonnegative_(nonnegative) {}

  Text print(const Expr& e) const {
    const auto& args = e.args();
    switch (e.kind()) {
      case ExprKind::kInteger:
        return {literal(*e.as_integer()), true};
      case ExprKind::kSymbol:
        return {dialect_ == Dialect::kStr ? e.name() : cpp_identifier(e), true};
      case ExprKind::kAdd:
        return {print_add(e), false};
      case ExprKind::kMul: {
        LinearForm l = to_linear(e);
        return {print_term(l.terms[0].coef, l.terms[0].mono, false), false};
      }
      case ExprKind::kFloorDiv:
        return print_div(args[0], args[1], " // ", "kiln_floordiv");
      case ExprKind::kMod:
        return print_div(args[0], args[1], " % ", "kiln_mod");
      case ExprKind::kModularIndexing: {
        Expr quotient = ExprBuilder::node(ExprKind::kFloorDiv, {args[0], args[1]});
        return print_div(quotient, args[2], " % ", "kiln_mod");
      }
      case ExprKind::kCeilDiv:
        return print_ceil_div(args[0], args[1]);
      case ExprKind::kMin:
        return {print_min_max(args, "min"), true};
      case ExprKind::kMax:
        return {print_min_max(args, "max"), true};
    }
    internal_error("print: unknown expression kind {}", static_cast<int>(e.kind()));
  }

 private:
  bool is_nonnegative(const Expr& e) const {
    return is_structurally_nonnegative(e) || (nonnegative_ && nonnegative_(e));
  }

  std::string operand(const Expr& e) const {
    Text t = print(e);
    return t.atomic ? t.text : "(" + t.text + ")";
  }

  std::string literal(int64_t v) const {
    if (dialect_ == Dialect::kStr) return std::to_string(v);
    if (v == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807LL - 1)";
    bool fits_int32 =
        v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
    return fits_int32 ? std::to_string(v) : std::to_string(v) + "LL";
  }

  // coef * mono; with `magnitude_only` the sign is left to the caller.
  std::string print_term(int64_t coef, const Expr& mono, bool magnitude_only) const {
    std::string out;
    uint64_t magnitude = coef < 0 ? 0 - static_cast<uint64_t>(coef) : coef;
    if (coef < 0 && !magnitude_only) out += "-";
    if (magnitude != 1) {
      bool fits_int32 = magnitude <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
      out += std::to_string(magnitude);
      if (dialect_ != Dialect::kStr && !fits_int32) out += "LL";
      out += "*";
    }
    auto factors = factors_of(mono);
    if (magnitude == 1 && factors.size() == 1) return out + print(factors[0]).text;
    for (size_t i = 0; i < factors.size(); ++i) {
      if (i > 0) out += "*";
      out += operand(factors[i]);
    }
    return out;
  }

  std::string print_add(const Expr& e) const {
    LinearForm l = to_linear(e);
    std::string out;
    for (const Term& t : l.terms) {
      if (out.empty()) {
        out = print_term(t.coef, t.mono, false);
        continue;
      }
      out += t.coef < 0 ? " - " : " + ";
      out += print_term(t.coef, t.mono, true);
    }
    if (l.constant != 0) {
      uint64_t magnitude = l.constant < 0 ? 0 - static_cast<uint64_t>(l.constant) : l.constant;
      out += l.constant < 0 ? " - " : " + ";
      bool fits_int32 = magnitude <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
      out += std::to_string(magnitude);
      if (dialect_ != Dialect::kStr && !fits_int32) out += "LL";
    }
    return out;
  }

  Text print_div(const Expr& a, const Expr& b, const char* str_op, const char* function) const {
    if (dialect_ == Dialect::kStr) return {operand(a) + str_op + operand(b), false};
    if (is_nonnegative(a) && is_nonnegative(b)) {
      const char* op = std::string_view(str_op) == " // " ? " / " : " % ";
      return {operand(a) + op + operand(b), false};
    }
    return {fmt::format("{}({}, {})", function, print(a).text, print(b).text), true};
  }

  Text print_ceil_div(const Expr& a, const Expr& b) const {
    if (dialect_ == Dialect::kStr) {
      return {fmt::format("ceildiv({}, {})", print(a).text, print(b).text), true};
    }
    if (is_nonnegative(a) && is_nonnegative(b)) {
      std::string divisor = operand(b);
      return {fmt::format("({} + {} - 1) / {}", print(a).text, divisor, divisor), false};
    }
    return {fmt::format("kiln_ceildiv({}, {})", print(a).text, print(b).text), true};
  }

  std::string min_max_operand(const Expr& e) const {
    std::string text = print(e).text;
    // CUDA's min/max overloads are ambiguous for (int64_t, int): make literals int64_t.
    if (dialect_ == Dialect::kCuda && e.is_integer()) return "static_cast<int64_t>(" + text + ")";
    return text;
  }

  std::string print_min_max(const std::vector<Expr>& args, const char* name) const {
    if (dialect_ == Dialect::kStr) {
      std::string out = std::string(name) + "(";
      for (size_t i = 0; i < args.size(); ++i) out += (i ? ", " : "") + print(args[i]).text;
      return out + ")";
    }
    std::string function =
        dialect_ == Dialect::kCpp ? fmt::format("std::{}<int64_t>", name) : std::string(name);
    std::string out = min_max_operand(args[0]);
    for (size_t i = 1; i < args.size(); ++i) {
      out = fmt::format("{}({}, {})", function, out, min_max_operand(args[i]));
    }
    return out;
  }

  Dialect dialect_;
  const std::function<bool(const Expr&)>& nonnegative_;
};

}  // namespace

std::string Expr::str() const {
  static const std::function<bool(const Expr&)> kNone;
  return Printer(Dialect::kStr, kNone).print(*this).text;
}

std::string to_cpp(const Expr& e, const std::function<bool(const Expr&)>& nonnegative) {
  return Printer(Dialect::kCpp, nonnegative).print(e).text;
}

std::string to_cuda(const Expr& e, const std::function<bool(const Expr&)>& nonnegative) {
  return Printer(Dialect::kCuda, nonnegative).print(e).text;
}

std::string cpp_identifier(const Expr& symbol) {
  KILN_CHECK(symbol.is_symbol(), "cpp_identifier of a non-symbol expression {}", symbol.str());
  if (symbol.symbol_kind() == SymbolKind::kIndex) return symbol.name();
  return size_identifier(symbol.name());
}

std::string size_identifier(std::string_view name) { return identifier("s", name); }

}  // namespace kiln::sym
