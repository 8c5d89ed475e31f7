/// Canonicalizing builders. Every Expr of a compound kind is made here, so the canonical form
/// is defined in this one file:
///   - Add: a polynomial over atoms; terms sorted by monomial, like terms combined, zero terms
///     dropped, the constant last. Mul distributes over Add (full expansion).
///   - Mul: an optional integer coefficient first, then the atoms sorted.
///   - FloorDiv/CeilDiv/Mod by a constant: the divisor is positive, multiples of it are pulled
///     out, a common factor is cancelled, nested constant divisions merge.
///   - Mod of a FloorDiv is a ModularIndexing; ModularIndexing(x, 1, m) is Mod(x, m).
///   - Min/Max: flattened, constants folded, operands that differ by a constant resolved,
///     duplicates removed, sorted.
/// None of these rules needs range facts; range-dependent rules live in simplify.cpp.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "support/error.h"
#include "sym/expr_node.h"

namespace kiln::sym {
namespace {

// Lexicographic order of factor lists, so 2*x, x*y and x sit next to each other.
int compare_mono(const Expr& a, const Expr& b) {
  auto fa = factors_of(a);
  auto fb = factors_of(b);
  size_t n = std::min(fa.size(), fb.size());
  for (size_t i = 0; i < n; ++i) {
    if (int c = compare(fa[i], fb[i]); c != 0) return c;
  }
  if (fa.size() != fb.size()) return fa.size() < fb.size() ? -1 : 1;
  return 0;
}

Expr mul_mono(const Expr& a, const Expr& b) {
  auto fa = factors_of(a);
  auto fb = factors_of(b);
  std::vector<Expr> merged;
  merged.reserve(fa.size() + fb.size());
  std::merge(fa.begin(), fa.end(), fb.begin(), fb.end(), std::back_inserter(merged),
             [](const Expr& x, const Expr& y) { return compare(x, y) < 0; });
  return make_mono(std::move(merged));
}

Expr scale(const Expr& e, int64_t c) {
  if (c == 0) return 0;
  if (c == 1) return e;
  LinearForm l = to_linear(e);
  for (Term& t : l.terms) t.coef = checked_mul(t.coef, c);
  return from_linear(std::move(l.terms), checked_mul(l.constant, c));
}

// Removes `factors` (a sorted sub-multiset) from the sorted `of`; nullopt if not contained.
std::optional<std::vector<Expr>> remove_factors(std::span<const Expr> of,
                                                std::span<const Expr> factors) {
  std::vector<Expr> rest;
  size_t j = 0;
  for (const Expr& f : of) {
    if (j < factors.size() && f == factors[j]) {
      ++j;
      continue;
    }
    rest.push_back(f);
  }
  if (j != factors.size()) return std::nullopt;
  return rest;
}

int64_t gcd_of(int64_t g, const std::vector<Term>& terms) {
  for (const Term& t : terms) g = std::gcd(g, t.coef);
  return g;
}

// The parts of `a` that are exact multiples of `divisor` (as quotient terms) and the rest.
struct Split {
  std::vector<Term> quotient;
  int64_t quotient_constant = 0;
  std::vector<Term> rest;
  int64_t rest_constant = 0;
};

Split split_multiples(const Expr& a, const Expr& divisor) {
  Split s;
  LinearForm l = to_linear(a);
  if (auto c = divisor.as_integer()) {
    for (const Term& t : l.terms) {
      if (t.coef % *c == 0) {
        s.quotient.push_back({t.coef / *c, t.mono});
      } else {
        s.rest.push_back(t);
      }
    }
    s.quotient_constant = floor_div_int(l.constant, *c);
    s.rest_constant = mod_int(l.constant, *c);
    return s;
  }
  for (const Term& t : l.terms) {
    if (auto q = divide_exact(make_term(t.coef, t.mono), divisor)) {
      LinearForm lq = to_linear(*q);
      s.quotient.insert(s.quotient.end(), lq.terms.begin(), lq.terms.end());
      s.quotient_constant = checked_add(s.quotient_constant, lq.constant);
    } else {
      s.rest.push_back(t);
    }
  }
  s.rest_constant = l.constant;
  return s;
}

// Divides the rest and the constant divisor by their common factor.
void cancel_common_factor(Split& s, int64_t& c) {
  int64_t g = gcd_of(std::gcd(c, s.rest_constant), s.rest);
  if (g <= 1) return;
  for (Term& t : s.rest) t.coef /= g;
  s.rest_constant /= g;
  c /= g;
}

Expr floor_div_by_constant(const Expr& a, int64_t c) {
  Split s = split_multiples(a, c);
  Expr q = from_linear(std::move(s.quotient), s.quotient_constant);
  if (s.rest.empty()) return q;  // 0 <= rest_constant < c
  cancel_common_factor(s, c);
  Expr r = from_linear(std::move(s.rest), s.rest_constant);
  if (c == 1) return q + r;
  const auto& ra = r.args();
  auto int_arg = [&](size_t i) { return ra[i].as_integer().value_or(0); };
  // (x // d) // c -> x // (d*c)
  if (r.kind() == ExprKind::kFloorDiv && int_arg(1) > 0) {
    return q + floor_div(ra[0], checked_mul(int_arg(1), c));
  }
  // (x % (c*m)) // c -> (x // c) % m
  if (r.kind() == ExprKind::kMod && int_arg(1) > 0 && int_arg(1) % c == 0) {
    return q + modular_indexing(ra[0], c, int_arg(1) / c);
  }
  // ((x // d) % (c*m)) // c -> (x // (d*c)) % m
  if (r.kind() == ExprKind::kModularIndexing && int_arg(1) > 0 && int_arg(2) > 0 &&
      int_arg(2) % c == 0) {
    return q + modular_indexing(ra[0], checked_mul(int_arg(1), c), int_arg(2) / c);
  }
  return q + ExprBuilder::node(ExprKind::kFloorDiv, {r, c});
}

Expr ceil_div_by_constant(const Expr& a, int64_t c) {
  Split s = split_multiples(a, c);
  Expr q = from_linear(std::move(s.quotient), s.quotient_constant);
  if (s.rest.empty()) return s.rest_constant == 0 ? q : q + 1;
  cancel_common_factor(s, c);
  Expr r = from_linear(std::move(s.rest), s.rest_constant);
  if (c == 1) return q + r;
  return q + ExprBuilder::node(ExprKind::kCeilDiv, {r, c});
}

// A Mod whose dividend is a FloorDiv is a ModularIndexing.
Expr make_mod_node(const Expr& r, const Expr& m) {
  if (r.kind() == ExprKind::kFloorDiv) {
    return ExprBuilder::node(ExprKind::kModularIndexing, {r.args()[0], r.args()[1], m});
  }
  return ExprBuilder::node(ExprKind::kMod, {r, m});
}

Expr mod_by_constant(const Expr& a, int64_t c) {
  LinearForm l = to_linear(a);
  std::vector<Term> rest;
  for (const Term& t : l.terms) {
    if (int64_t k = mod_int(t.coef, c); k != 0) rest.push_back({k, t.mono});
  }
  int64_t r0 = mod_int(l.constant, c);
  if (rest.empty()) return r0;
  int64_t g = gcd_of(std::gcd(c, r0), rest);
  if (g > 1) {
    for (Term& t : rest) t.coef /= g;
    return g * mod(from_linear(std::move(rest), r0 / g), c / g);
  }
  Expr r = from_linear(std::move(rest), r0);
  const auto& ra = r.args();
  std::optional<int64_t> m;
  if (r.kind() == ExprKind::kMod) m = ra[1].as_integer();
  if (r.kind() == ExprKind::kModularIndexing) m = ra[2].as_integer();
  if (m && *m > 0) {
    if (*m <= c) return r;  // 0 <= r < m <= c
    if (*m % c == 0) {
      return r.kind() == ExprKind::kMod ? mod(ra[0], c) : modular_indexing(ra[0], ra[1], c);
    }
  }
  return make_mod_node(r, c);
}

Expr min_max(ExprKind kind, const Expr& a, const Expr& b) {
  std::vector<Expr> args;
  for (const Expr* e : {&a, &b}) {
    if (e->kind() == kind) {
      args.insert(args.end(), e->args().begin(), e->args().end());
    } else {
      args.push_back(*e);
    }
  }
  // Drop an operand when another differs from it by a constant in the losing direction
  // (this folds constants and removes duplicates too).
  std::vector<bool> dropped(args.size(), false);
  for (size_t i = 0; i < args.size(); ++i) {
    for (size_t j = 0; j < args.size() && !dropped[i]; ++j) {
      if (i == j || dropped[j]) continue;
      auto d = (args[i] - args[j]).as_integer();
      if (!d) continue;
      bool i_loses = kind == ExprKind::kMin ? *d >= 0 : *d <= 0;
      if (i_loses) dropped[i] = true;
    }
  }
  std::vector<Expr> kept;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!dropped[i]) kept.push_back(args[i]);
  }
  if (kept.size() == 1) return kept[0];
  // Sorted, with a constant operand last as in sums.
  std::sort(kept.begin(), kept.end(), [](const Expr& x, const Expr& y) {
    if (x.is_integer() != y.is_integer()) return y.is_integer();
    return x < y;
  });
  return ExprBuilder::node(kind, std::move(kept));
}

}  // namespace

std::span<const Expr> factors_of(const Expr& mono) {
  if (mono.kind() == ExprKind::kMul) return mono.args();
  return {&mono, 1};
}

Expr make_mono(std::vector<Expr> factors) {
  if (factors.empty()) return 1;
  if (factors.size() == 1) return factors[0];
  return ExprBuilder::node(ExprKind::kMul, std::move(factors));
}

Expr make_term(int64_t coef, const Expr& mono) {
  if (coef == 0) return 0;
  if (coef == 1) return mono;
  std::vector<Expr> args{Expr(coef)};
  for (const Expr& f : factors_of(mono)) args.push_back(f);
  return ExprBuilder::node(ExprKind::kMul, std::move(args));
}

LinearForm to_linear(const Expr& e) {
  LinearForm l;
  auto add_term = [&](const Expr& t) {
    if (auto v = t.as_integer()) {
      l.constant = checked_add(l.constant, *v);
      return;
    }
    if (t.kind() == ExprKind::kMul && t.args()[0].is_integer()) {
      std::vector<Expr> rest(t.args().begin() + 1, t.args().end());
      l.terms.push_back({*t.args()[0].as_integer(), make_mono(std::move(rest))});
      return;
    }
    l.terms.push_back({1, t});
  };
  if (e.kind() == ExprKind::kAdd) {
    for (const Expr& t : e.args()) add_term(t);
  } else {
    add_term(e);
  }
  return l;
}

Expr from_linear(std::vector<Term> terms, int64_t constant) {
  std::stable_sort(terms.begin(), terms.end(),
                   [](const Term& x, const Term& y) { return compare_mono(x.mono, y.mono) < 0; });
  std::vector<Expr> args;
  for (size_t i = 0; i < terms.size();) {
    int64_t coef = 0;
    size_t j = i;
    for (; j < terms.size() && compare_mono(terms[j].mono, terms[i].mono) == 0; ++j) {
      coef = checked_add(coef, terms[j].coef);
    }
    if (coef != 0) args.push_back(make_term(coef, terms[i].mono));
    i = j;
  }
  if (args.empty()) return constant;
  if (args.size() == 1 && constant == 0) return args[0];
  if (constant != 0) args.push_back(constant);
  return ExprBuilder::node(ExprKind::kAdd, std::move(args));
}

std::optional<Expr> divide_exact(const Expr& e, const Expr& divisor) {
  if (auto c = divisor.as_integer()) {
    if (*c == 0) return std::nullopt;
    LinearForm l = to_linear(e);
    if (l.constant % *c != 0) return std::nullopt;
    for (Term& t : l.terms) {
      if (t.coef % *c != 0) return std::nullopt;
      t.coef /= *c;
    }
    return from_linear(std::move(l.terms), l.constant / *c);
  }
  if (e == Expr(0)) return Expr(0);
  LinearForm le = to_linear(e);
  LinearForm ld = to_linear(divisor);
  if (le.terms.empty()) return std::nullopt;
  if (divisor.kind() == ExprKind::kAdd) {
    // A one-monomial quotient guessed from the first or the last terms, then checked exactly.
    for (bool last : {false, true}) {
      const Term& te = last ? le.terms.back() : le.terms.front();
      const Term& td = last ? ld.terms.back() : ld.terms.front();
      auto q = divide_exact(make_term(te.coef, te.mono), make_term(td.coef, td.mono));
      if (q && *q * divisor == e) return q;
    }
    return std::nullopt;
  }
  if (le.constant != 0) return std::nullopt;
  const Term& d = ld.terms[0];
  std::vector<Term> quotient;
  for (const Term& t : le.terms) {
    if (t.coef % d.coef != 0) return std::nullopt;
    auto rest = remove_factors(factors_of(t.mono), factors_of(d.mono));
    if (!rest) return std::nullopt;
    quotient.push_back({t.coef / d.coef, make_mono(std::move(*rest))});
  }
  // A quotient monomial may be empty (the constant 1 times its coefficient).
  Expr result = 0;
  for (const Term& t : quotient) result += t.mono * t.coef;
  return result;
}

Expr operator+(const Expr& a, const Expr& b) {
  auto x = a.as_integer();
  auto y = b.as_integer();
  if (x && y) return checked_add(*x, *y);
  if (x == 0) return b;
  if (y == 0) return a;
  LinearForm la = to_linear(a);
  LinearForm lb = to_linear(b);
  la.terms.insert(la.terms.end(), lb.terms.begin(), lb.terms.end());
  return from_linear(std::move(la.terms), checked_add(la.constant, lb.constant));
}

Expr operator-(const Expr& a) { return scale(a, -1); }
Expr operator-(const Expr& a, const Expr& b) { return a + scale(b, -1); }

Expr operator*(const Expr& a, const Expr& b) {
  if (auto x = a.as_integer()) return scale(b, *x);
  if (auto y = b.as_integer()) return scale(a, *y);
  LinearForm la = to_linear(a);
  LinearForm lb = to_linear(b);
  std::vector<Term> terms;
  int64_t constant = checked_mul(la.constant, lb.constant);
  for (const Term& s : la.terms) {
    if (lb.constant != 0) terms.push_back({checked_mul(s.coef, lb.constant), s.mono});
    for (const Term& t : lb.terms) {
      terms.push_back({checked_mul(s.coef, t.coef), mul_mono(s.mono, t.mono)});
    }
  }
  if (la.constant != 0) {
    for (const Term& t : lb.terms) terms.push_back({checked_mul(la.constant, t.coef), t.mono});
  }
  return from_linear(std::move(terms), constant);
}

Expr& operator+=(Expr& a, const Expr& b) { return a = a + b; }
Expr& operator*=(Expr& a, const Expr& b) { return a = a * b; }

Expr floor_div(const Expr& a, const Expr& b) {
  auto x = a.as_integer();
  auto y = b.as_integer();
  if (y == 0) internal_error("symbolic floor division by zero: {} // 0", a.str());
  if (x && y) return floor_div_int(*x, *y);
  if (y == 1) return a;
  if (x == 0) return 0;
  if (a == b) return 1;
  if (y && *y < 0) return floor_div(-a, checked_neg(*y));
  if (y) return floor_div_by_constant(a, *y);
  if (auto q = divide_exact(a, b)) return *q;
  Split s = split_multiples(a, b);
  Expr q = from_linear(std::move(s.quotient), s.quotient_constant);
  if (s.rest.empty() && s.rest_constant == 0) return q;
  Expr r = from_linear(std::move(s.rest), s.rest_constant);
  return q + ExprBuilder::node(ExprKind::kFloorDiv, {r, b});
}

Expr ceil_div(const Expr& a, const Expr& b) {
  auto x = a.as_integer();
  auto y = b.as_integer();
  if (y == 0) internal_error("symbolic ceiling division by zero: ceildiv({}, 0)", a.str());
  if (x && y) return ceil_div_int(*x, *y);
  if (y == 1) return a;
  if (x == 0) return 0;
  if (a == b) return 1;
  if (y && *y < 0) return ceil_div(-a, checked_neg(*y));
  if (y) return ceil_div_by_constant(a, *y);
  if (auto q = divide_exact(a, b)) return *q;
  Split s = split_multiples(a, b);
  Expr q = from_linear(std::move(s.quotient), s.quotient_constant);
  if (s.rest.empty() && s.rest_constant == 0) return q;
  Expr r = from_linear(std::move(s.rest), s.rest_constant);
  return q + ExprBuilder::node(ExprKind::kCeilDiv, {r, b});
}

Expr mod(const Expr& a, const Expr& b) {
  auto x = a.as_integer();
  auto y = b.as_integer();
  if (y == 0) internal_error("symbolic modulo by zero: {} % 0", a.str());
  if (x && y) return mod_int(*x, *y);
  if (y == 1 || y == -1 || x == 0 || a == b) return 0;
  if (y && *y < 0) return -mod(-a, checked_neg(*y));
  if (y) return mod_by_constant(a, *y);
  if (divide_exact(a, b)) return 0;
  Split s = split_multiples(a, b);
  if (s.rest.empty() && s.rest_constant == 0) return 0;
  Expr r = from_linear(std::move(s.rest), s.rest_constant);
  bool already_reduced = (r.kind() == ExprKind::kMod && r.args()[1] == b) ||
                         (r.kind() == ExprKind::kModularIndexing && r.args()[2] == b);
  if (already_reduced) return r;
  return make_mod_node(r, b);
}

Expr modular_indexing(const Expr& x, const Expr& div, const Expr& m) {
  return mod(floor_div(x, div), m);
}

Expr min(const Expr& a, const Expr& b) { return min_max(ExprKind::kMin, a, b); }
Expr max(const Expr& a, const Expr& b) { return min_max(ExprKind::kMax, a, b); }

Expr product(const std::vector<Expr>& values) {
  Expr r = 1;
  for (const Expr& v : values) r *= v;
  return r;
}

Expr dot(const std::vector<Expr>& a, const std::vector<Expr>& b) {
  KILN_CHECK(a.size() == b.size(), "dot of lists of different lengths: {} and {}", a.size(),
             b.size());
  Expr r = 0;
  for (size_t i = 0; i < a.size(); ++i) r += a[i] * b[i];
  return r;
}

}  // namespace kiln::sym
