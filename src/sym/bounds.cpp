/// Sound statically_known_* queries. Intervals alone cannot prove j < N for an index j bound to
/// the symbolic extent N, so proves_nonnegative also replaces, one at a time, an atom that occurs
/// linearly by its symbolic bound: where every coefficient of the atom is >= 0 the expression
/// only grows with it, so putting the atom's lower bound in gives a lower bound of the whole,
/// and likewise with the upper bound where every coefficient is <= 0. Each step keeps a
/// pointwise lower bound, so a nonnegative interval at any step proves the original.

#include <cstdint>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "support/error.h"
#include "sym/analyzer_internal.h"
#include "sym/expr_node.h"

namespace kiln::sym {
namespace {

constexpr int kMaxBoundSteps = 6;

struct AtomBounds {
  std::optional<Expr> lower;
  std::optional<Expr> upper;
};

// Symbolic bounds of atoms that have them: index variables and remainders.
AtomBounds bounds_of(const Analyzer& an, const Expr& atom) {
  AtomBounds b;
  // Only atoms with a symbolic bound: constant bounds are what the final interval uses anyway,
  // and substituting them early would lose correlations (N - j - 1 with j < N).
  if (atom.is_symbol()) {
    const auto& extents = AnalyzerAccess::extents(an);
    auto it = extents.find(atom);
    if (it == extents.end()) return b;
    Range r = an.range(atom);
    if (r.lo != Range::kNegInf) b.lower = Expr(r.lo);
    b.upper = it->second - 1;
    return b;
  }
  // A divisor known >= 0 is >= 1 wherever the expression is defined (division by zero is not),
  // like the ranges of FloorDiv and Mod assume.
  if (atom.kind() == ExprKind::kFloorDiv && an.range(atom.args()[1]).lo >= 0) {
    // Monotone in the dividend for a positive divisor.
    const Expr& x = atom.args()[0];
    const Expr& d = atom.args()[1];
    if (an.range(x).lo >= 0) b.lower = Expr(0);
    const auto& extents = AnalyzerAccess::extents(an);
    if (auto it = extents.find(x); it != extents.end()) b.upper = floor_div(it->second - 1, d);
    return b;
  }
  const Expr* divisor = nullptr;
  if (atom.kind() == ExprKind::kMod) divisor = &atom.args()[1];
  if (atom.kind() == ExprKind::kModularIndexing) divisor = &atom.args()[2];
  if (divisor && an.range(*divisor).lo >= 0) {
    b.lower = Expr(0);
    b.upper = *divisor - 1;
  }
  return b;
}

bool contains(const Expr& e, const Expr& sub) {
  if (e == sub) return true;
  for (const Expr& a : e.args()) {
    if (contains(a, sub)) return true;
  }
  return false;
}

// +1 when e grows with `atom` (all coefficients >= 0), -1 when it shrinks, 0 when unknown or
// when the atom occurs other than as a single direct factor of terms.
int direction(const Analyzer& an, const LinearForm& l, const Expr& atom) {
  bool grows = true;
  bool shrinks = true;
  for (const Term& t : l.terms) {
    int count = 0;
    std::vector<Expr> rest;
    for (const Expr& f : factors_of(t.mono)) {
      if (f == atom) {
        ++count;
        continue;
      }
      if (contains(f, atom)) return 0;
      rest.push_back(f);
    }
    if (count == 0) continue;
    if (count > 1) return 0;
    Range r = an.range(make_mono(std::move(rest)) * t.coef);
    grows = grows && r.lo >= 0;
    shrinks = shrinks && r.hi <= 0;
  }
  if (grows) return 1;
  if (shrinks) return -1;
  return 0;
}

// One substitution step: e with one atom replaced by a bound that keeps a lower bound of e.
std::optional<Expr> lower_bound_step(const Analyzer& an, const Expr& e) {
  LinearForm l = to_linear(e);
  for (const Term& t : l.terms) {
    for (const Expr& atom : factors_of(t.mono)) {
      AtomBounds b = bounds_of(an, atom);
      if (!b.lower && !b.upper) continue;
      int dir = direction(an, l, atom);
      const std::optional<Expr>& bound = dir > 0 ? b.lower : b.upper;
      if (dir == 0 || !bound || contains(*bound, atom)) continue;
      return replace_subexprs(e, {{atom, *bound}});
    }
  }
  return std::nullopt;
}

bool is_multiple_of_constant(const Analyzer& an, const Expr& e, int64_t k) {
  if (k == 1 || k == -1) return true;
  Range r = an.range(e);
  if (r.lo == r.hi && r.is_bounded()) return r.lo % k == 0;
  const auto& args = e.args();
  auto all = [&](size_t from) {
    for (size_t i = from; i < args.size(); ++i) {
      if (!is_multiple_of_constant(an, args[i], k)) return false;
    }
    return true;
  };
  switch (e.kind()) {
    case ExprKind::kAdd:
    case ExprKind::kMin:
    case ExprKind::kMax:
    case ExprKind::kMod:  // a - b*q with a and b multiples
      return all(0);
    case ExprKind::kMul: {
      LinearForm l = to_linear(e);
      int64_t need = k / std::gcd(k, l.terms[0].coef);
      for (const Expr& f : factors_of(l.terms[0].mono)) {
        if (need == 1) break;
        if (is_multiple_of_constant(an, f, need)) need = 1;
      }
      return need == 1 || need == -1;
    }
    default:
      return false;
  }
}

bool is_multiple_of_expr(const Analyzer& an, const Expr& e, const Expr& k) {
  if (e == Expr(0) || e == k || divide_exact(e, k)) return true;
  const auto& args = e.args();
  switch (e.kind()) {
    case ExprKind::kAdd:
    case ExprKind::kMin:
    case ExprKind::kMax:
    case ExprKind::kMod:
      for (const Expr& a : args) {
        if (!is_multiple_of_expr(an, a, k)) return false;
      }
      return true;
    default:
      return false;
  }
}

}  // namespace

bool proves_nonnegative(const Analyzer& an, const Expr& e) {
  if (an.range(e).lo >= 0) return true;
  Expr current = e;
  for (int step = 0; step < kMaxBoundSteps; ++step) {
    auto next = lower_bound_step(an, current);
    if (!next) return false;
    current = *next;
    if (an.range(current).lo >= 0) return true;
  }
  return false;
}

Expr Analyzer::simplify(const Expr& e) const { return simplify_with(*this, e); }

bool Analyzer::statically_known_nonnegative(const Expr& e) const {
  if (proves_nonnegative(*this, e)) return true;
  Expr s = simplify(e);
  return s != e && proves_nonnegative(*this, s);
}

bool Analyzer::statically_known_leq(const Expr& a, const Expr& b) const {
  return statically_known_nonnegative(b - a);
}

bool Analyzer::statically_known_lt(const Expr& a, const Expr& b) const {
  return statically_known_nonnegative(b - a - 1);
}

bool Analyzer::statically_known_equal(const Expr& a, const Expr& b) const {
  if (a == b) return true;
  Expr d = a - b;
  if (constant_value(d) == 0) return true;
  return statically_known_nonnegative(d) && statically_known_nonnegative(-d);
}

std::optional<int64_t> Analyzer::constant_value(const Expr& e) const {
  if (auto v = e.as_integer()) return v;
  Range r = range(e);
  if (r.lo == r.hi && r.is_bounded()) return r.lo;
  Expr s = simplify(e);
  if (auto v = s.as_integer()) return v;
  r = range(s);
  if (r.lo == r.hi && r.is_bounded()) return r.lo;
  return std::nullopt;
}

bool Analyzer::statically_known_multiple_of(const Expr& e, const Expr& k) const {
  KILN_CHECK(k != Expr(0), "statically_known_multiple_of({}, 0): k must be nonzero", e.str());
  if (auto kc = constant_value(k)) {
    if (*kc == 0) return false;
    return is_multiple_of_constant(*this, e, *kc) ||
           is_multiple_of_constant(*this, simplify(e), *kc);
  }
  return is_multiple_of_expr(*this, e, k) || is_multiple_of_expr(*this, simplify(e), k);
}

}  // namespace kiln::sym
