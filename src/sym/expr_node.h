#pragma once
/// Internals of sym::Expr shared by the files of src/sym: the node layout, the raw node factory,
/// checked integer arithmetic, the structural order, and the polynomial view of a canonical
/// expression (a constant plus coefficient * monomial terms). Not for use outside src/sym.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sym/expr.h"

namespace kiln::sym {

/// One immutable node. Integer uses `value`, Symbol uses `name` and `symbol_kind`, every other
/// kind uses `args`. `hash` is computed once at construction.
class ExprNode {
 public:
  ExprKind kind = ExprKind::kInteger;
  SymbolKind symbol_kind = SymbolKind::kSize;
  int64_t value = 0;
  std::string name;
  std::vector<Expr> args;
  size_t hash = 0;
};

/// Makes nodes without canonicalizing. Only the builders (builders.cpp) call `node` for
/// compound kinds, with operands already in canonical form and order.
class ExprBuilder {
 public:
  static Expr integer(int64_t value);
  static Expr symbol(std::string_view name, SymbolKind kind);
  static Expr node(ExprKind kind, std::vector<Expr> args);
};

/// Three-way structural comparison: negative, zero or positive. Deterministic across runs.
int compare(const Expr& a, const Expr& b);

/// Checked arithmetic for constant folding; throws InternalError on int64 overflow.
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);
int64_t checked_neg(int64_t a);
/// Floor division, floor modulo (sign of the divisor) and ceiling division, Python-style.
/// Throw InternalError on division by zero or overflow.
int64_t floor_div_int(int64_t a, int64_t b);
int64_t mod_int(int64_t a, int64_t b);
int64_t ceil_div_int(int64_t a, int64_t b);

/// One term of a sum: coef * mono, where mono is a non-constant monomial with coefficient 1
/// (a single atom, or a Mul of atoms without an integer factor).
struct Term {
  int64_t coef = 0;
  Expr mono;
};

/// A canonical expression seen as constant + sum of terms.
struct LinearForm {
  std::vector<Term> terms;
  int64_t constant = 0;
};

LinearForm to_linear(const Expr& e);
/// Canonical sum of the terms (sorted, like terms combined, zeros dropped).
Expr from_linear(std::vector<Term> terms, int64_t constant);
/// The atoms of a monomial: its Mul operands, or the monomial itself.
std::span<const Expr> factors_of(const Expr& mono);
/// Builds the monomial with these (sorted) atoms; an empty list gives 1.
Expr make_mono(std::vector<Expr> factors);
/// coef * mono as a canonical term.
Expr make_term(int64_t coef, const Expr& mono);

/// q with q * divisor == e, found by dividing monomials (exact, no ranges); nullopt if none.
std::optional<Expr> divide_exact(const Expr& e, const Expr& divisor);

/// True when e is >= 0 by construction: nonnegative literals, size and unbacked symbols, and
/// operations that preserve nonnegativity.
bool is_structurally_nonnegative(const Expr& e);

/// The canonical expression of `kind` over `args` (through the builders).
Expr build(ExprKind kind, const std::vector<Expr>& args);

/// Replaces any subexpression found in `replacements` (not only symbols) and re-canonicalizes.
Expr replace_subexprs(const Expr& e, const Substitution& replacements);

}  // namespace kiln::sym
