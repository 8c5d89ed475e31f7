/// Analyzer::simplify: bottom-up rewriting with range-dependent rules. Children are simplified
/// first, the node is rebuilt through the canonicalizing builders, then the rules of its kind
/// (kRules below, one rule per entry) are tried in order; a rule's result is simplified again.
/// Rules that need no facts are already applied by the builders (builders.cpp).

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "support/error.h"
#include "sym/analyzer_internal.h"
#include "sym/expr_node.h"

namespace kiln::sym {
namespace {

constexpr int kMaxRewriteDepth = 32;
constexpr int kMaxPasses = 4;

using Rewrite = std::optional<Expr>;

// FloorDiv(x, d) is (x, d, no modulus), Mod(x, m) is (x, 1, m), ModularIndexing is (x, d, m).
struct DivMod {
  Expr x;
  Expr d;
  std::optional<Expr> m;
};

std::optional<DivMod> as_div_mod(const Expr& atom) {
  const auto& a = atom.args();
  switch (atom.kind()) {
    case ExprKind::kFloorDiv:
      return DivMod{a[0], a[1], std::nullopt};
    case ExprKind::kMod:
      return DivMod{a[0], 1, a[1]};
    case ExprKind::kModularIndexing:
      return DivMod{a[0], a[1], a[2]};
    default:
      return std::nullopt;
  }
}

// Dividend and divisor of a Mod or ModularIndexing node.
std::pair<Expr, Expr> mod_operands(const Expr& e) {
  const auto& a = e.args();
  if (e.kind() == ExprKind::kModularIndexing) {
    return {ExprBuilder::node(ExprKind::kFloorDiv, {a[0], a[1]}), a[2]};
  }
  return {a[0], a[1]};
}

Expr without_factor(const Term& t, const Expr& factor) {
  std::vector<Expr> rest;
  bool removed = false;
  for (const Expr& f : factors_of(t.mono)) {
    if (!removed && f == factor) {
      removed = true;
      continue;
    }
    rest.push_back(f);
  }
  return make_mono(std::move(rest)) * t.coef;
}

// ---- Add --------------------------------------------------------------------------------------

// K*((x // d) % m) + K*m*((x // (d*m)) % m2) -> K*((x // d) % (m*m2)), where a missing modulus
// is infinite; this covers K*(x % c) + K*c*(x // c) -> K*x. Positive d, m, m2 are needed except
// in that last case, which holds for every nonzero c.
Rewrite merge_remainder_pairs(const Analyzer& an, const Expr& e) {
  LinearForm l = to_linear(e);
  struct Piece {
    size_t term;
    DivMod dm;
    Expr cofactor;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < l.terms.size(); ++i) {
    for (const Expr& f : factors_of(l.terms[i].mono)) {
      if (auto dm = as_div_mod(f)) pieces.push_back({i, *dm, without_factor(l.terms[i], f)});
    }
  }
  for (const Piece& p : pieces) {
    if (!p.dm.m) continue;
    const Expr& m = *p.dm.m;
    for (const Piece& q : pieces) {
      if (q.term == p.term || q.dm.x != p.dm.x || q.dm.d != p.dm.d * m) continue;
      if (q.cofactor != p.cofactor * m) continue;
      bool plain = p.dm.d == Expr(1) && !q.dm.m;
      bool positive = proves_positive(an, p.dm.d) && proves_positive(an, m) &&
                      (!q.dm.m || proves_positive(an, *q.dm.m));
      if (!plain && !positive) continue;
      Expr merged =
          q.dm.m ? modular_indexing(p.dm.x, p.dm.d, m * *q.dm.m) : floor_div(p.dm.x, p.dm.d);
      Expr sum = p.cofactor * merged + l.constant;
      for (size_t i = 0; i < l.terms.size(); ++i) {
        if (i != p.term && i != q.term) sum += make_term(l.terms[i].coef, l.terms[i].mono);
      }
      return sum;
    }
  }
  return std::nullopt;
}

// ---- Common factor of a dividend and its divisor ----------------------------------------------

// gcd of a term and a monomial divisor: gcd of coefficients times the shared atoms.
std::optional<Expr> monomial_gcd(const Term& t, const Expr& divisor) {
  LinearForm d = to_linear(divisor);
  if (d.terms.empty()) return Expr(std::gcd(t.coef, d.constant));
  if (d.terms.size() != 1 || d.constant != 0) return std::nullopt;
  std::vector<Expr> shared;
  auto tf = factors_of(t.mono);
  auto df = factors_of(d.terms[0].mono);
  size_t i = 0, j = 0;
  while (i < tf.size() && j < df.size()) {
    int c = compare(tf[i], df[j]);
    if (c == 0) shared.push_back(tf[i]);
    i += c <= 0;
    j += c >= 0;
  }
  return make_mono(std::move(shared)) * std::gcd(t.coef, d.terms[0].coef);
}

// a = g*A + R with b = g*c', g > 0, c' > 0 and 0 <= R < g (TVM's canonical simplifier): then
// a // b == A // c' and a % b == g*(A % c') + R.
struct FactorSplit {
  Expr g, quotient, remainder, divisor;
};

std::optional<FactorSplit> split_common_factor(const Analyzer& an, const Expr& a, const Expr& b) {
  LinearForm l = to_linear(a);
  std::vector<Expr> tried;
  for (const Term& t : l.terms) {
    auto g = monomial_gcd(t, b);
    if (!g || *g == Expr(1) || *g == b || std::find(tried.begin(), tried.end(), *g) != tried.end())
      continue;
    tried.push_back(*g);
    auto c = divide_exact(b, *g);
    if (!c) continue;
    Expr quotient = 0;
    Expr remainder = 0;
    for (const Term& s : l.terms) {
      Expr term = make_term(s.coef, s.mono);
      if (auto q = divide_exact(term, *g)) {
        quotient += *q;
      } else {
        remainder += term;
      }
    }
    if (auto gc = g->as_integer()) {
      quotient += floor_div_int(l.constant, *gc);
      remainder += mod_int(l.constant, *gc);
    } else {
      remainder += l.constant;
    }
    if (quotient == Expr(0)) continue;
    if (!proves_positive(an, *g) || !proves_positive(an, *c)) continue;
    if (!proves_nonnegative(an, remainder) || !proves_lt(an, remainder, *g)) continue;
    return FactorSplit{*g, quotient, remainder, *c};
  }
  return std::nullopt;
}

// ---- FloorDiv ---------------------------------------------------------------------------------

// 0 <= a < b: a // b -> 0
Rewrite floor_div_small(const Analyzer& an, const Expr& e) {
  const Expr& a = e.args()[0];
  const Expr& b = e.args()[1];
  if (proves_nonnegative(an, a) && proves_lt(an, a, b)) return Expr(0);
  return std::nullopt;
}

// (g*A + R) // (g*c) -> A // c when 0 <= R < g
Rewrite floor_div_common_factor(const Analyzer& an, const Expr& e) {
  auto s = split_common_factor(an, e.args()[0], e.args()[1]);
  if (!s) return std::nullopt;
  return floor_div(s->quotient, s->divisor);
}

// (x // d) // b -> x // (d*b) for positive d and b
Rewrite floor_div_nested(const Analyzer& an, const Expr& e) {
  const Expr& a = e.args()[0];
  const Expr& b = e.args()[1];
  if (a.kind() != ExprKind::kFloorDiv) return std::nullopt;
  const Expr& d = a.args()[1];
  if (!proves_positive(an, d) || !proves_positive(an, b)) return std::nullopt;
  return floor_div(a.args()[0], d * b);
}

// (x % (b*k)) // b -> (x // b) % k and ((x // d) % (b*k)) // b -> (x // (d*b)) % k, positive
Rewrite floor_div_of_remainder(const Analyzer& an, const Expr& e) {
  auto dm = as_div_mod(e.args()[0]);
  const Expr& b = e.args()[1];
  if (!dm || !dm->m) return std::nullopt;
  auto k = divide_exact(*dm->m, b);
  if (!k || !proves_positive(an, b) || !proves_positive(an, *k) || !proves_positive(an, dm->d)) {
    return std::nullopt;
  }
  return modular_indexing(dm->x, dm->d * b, *k);
}

// ---- Mod and ModularIndexing ------------------------------------------------------------------

// 0 <= a < b: a % b -> a
Rewrite mod_small(const Analyzer& an, const Expr& e) {
  auto [a, b] = mod_operands(e);
  if (proves_nonnegative(an, a) && proves_lt(an, a, b)) return a;
  return std::nullopt;
}

// a % b -> a - q*b when b is a known positive constant and q*b <= a < (q+1)*b
Rewrite mod_constant_quotient(const Analyzer& an, const Expr& e) {
  auto [a, b] = mod_operands(e);
  Range rb = an.range(b);
  Range ra = an.range(a);
  if (rb.lo != rb.hi || rb.lo < 1 || !ra.is_bounded()) return std::nullopt;
  int64_t q = floor_div_int(ra.lo, rb.lo);
  if (q != floor_div_int(ra.hi, rb.lo)) return std::nullopt;
  return a - b * q;
}

// (g*A + R) % (g*c) -> g*(A % c) + R when 0 <= R < g
Rewrite mod_common_factor(const Analyzer& an, const Expr& e) {
  auto [a, b] = mod_operands(e);
  auto s = split_common_factor(an, a, b);
  if (!s) return std::nullopt;
  return s->g * mod(s->quotient, s->divisor) + s->remainder;
}

// (x % (b*k)) % b -> x % b, and likewise for ModularIndexing, for positive b and k
Rewrite mod_nested(const Analyzer& an, const Expr& e) {
  auto [a, b] = mod_operands(e);
  auto dm = as_div_mod(a);
  if (!dm || !dm->m) return std::nullopt;
  auto k = divide_exact(*dm->m, b);
  if (!k || !proves_positive(an, b) || !proves_positive(an, *k)) return std::nullopt;
  return modular_indexing(dm->x, dm->d, b);
}

// ---- CeilDiv ----------------------------------------------------------------------------------

// 0 < a <= b: ceildiv(a, b) -> 1
Rewrite ceil_div_small(const Analyzer& an, const Expr& e) {
  const Expr& a = e.args()[0];
  const Expr& b = e.args()[1];
  if (proves_positive(an, a) && proves_leq(an, a, b)) return Expr(1);
  return std::nullopt;
}

// -b < a <= 0: ceildiv(a, b) -> 0
Rewrite ceil_div_nonpositive(const Analyzer& an, const Expr& e) {
  const Expr& a = e.args()[0];
  const Expr& b = e.args()[1];
  if (proves_nonnegative(an, -a) && proves_lt(an, -a, b)) return Expr(0);
  return std::nullopt;
}

// ---- Min and Max ------------------------------------------------------------------------------

// min(a, b, ...) drops b when a <= b is known; max drops b when b <= a is known.
Rewrite min_max_ordered(const Analyzer& an, const Expr& e) {
  const auto& args = e.args();
  bool is_min = e.kind() == ExprKind::kMin;
  for (size_t j = 0; j < args.size(); ++j) {
    for (size_t i = 0; i < args.size(); ++i) {
      if (i == j) continue;
      bool dominated = is_min ? proves_leq(an, args[i], args[j]) : proves_leq(an, args[j], args[i]);
      if (!dominated) continue;
      Expr r = args[i];
      for (size_t k = 0; k < args.size(); ++k) {
        if (k != i && k != j) r = is_min ? min(r, args[k]) : max(r, args[k]);
      }
      return r;
    }
  }
  return std::nullopt;
}

// ---- Any kind ---------------------------------------------------------------------------------

// An expression whose range is a single value is that value.
Rewrite constant_range(const Analyzer& an, const Expr& e) {
  Range r = an.range(e);
  if (r.lo == r.hi && r.is_bounded()) return Expr(r.lo);
  return std::nullopt;
}

// ---- The rule table ---------------------------------------------------------------------------

enum class Family { kAny, kAdd, kFloorDiv, kMod, kCeilDiv, kMinMax };

Family family_of(ExprKind kind) {
  switch (kind) {
    case ExprKind::kAdd:
      return Family::kAdd;
    case ExprKind::kFloorDiv:
      return Family::kFloorDiv;
    case ExprKind::kMod:
    case ExprKind::kModularIndexing:
      return Family::kMod;
    case ExprKind::kCeilDiv:
      return Family::kCeilDiv;
    case ExprKind::kMin:
    case ExprKind::kMax:
      return Family::kMinMax;
    default:
      return Family::kAny;
  }
}

struct Rule {
  Family family;
  const char* name;
  Rewrite (*apply)(const Analyzer&, const Expr&);
};

constexpr Rule kRules[] = {
    {Family::kAny, "constant range", constant_range},
    {Family::kAdd, "merge x%m and m*(x//m) pieces", merge_remainder_pairs},
    {Family::kFloorDiv, "0 <= a < b: a // b -> 0", floor_div_small},
    {Family::kFloorDiv, "(g*A + R) // (g*c) -> A // c", floor_div_common_factor},
    {Family::kFloorDiv, "(x // d) // b -> x // (d*b)", floor_div_nested},
    {Family::kFloorDiv, "(x % (b*k)) // b -> (x // b) % k", floor_div_of_remainder},
    {Family::kMod, "0 <= a < b: a % b -> a", mod_small},
    {Family::kMod, "a % c -> a - q*c for a known quotient", mod_constant_quotient},
    {Family::kMod, "(g*A + R) % (g*c) -> g*(A % c) + R", mod_common_factor},
    {Family::kMod, "(x % (b*k)) % b -> x % b", mod_nested},
    {Family::kCeilDiv, "0 < a <= b: ceildiv(a, b) -> 1", ceil_div_small},
    {Family::kCeilDiv, "-b < a <= 0: ceildiv(a, b) -> 0", ceil_div_nonpositive},
    {Family::kMinMax, "drop operands known not to win", min_max_ordered},
};

class Simplifier {
 public:
  explicit Simplifier(const Analyzer& an) : an_(an) {}

  Expr run(const Expr& e) {
    Expr current = e;
    for (int pass = 0; pass < kMaxPasses; ++pass) {
      Expr next = rewrite(current, 0);
      if (next == current) break;
      current = next;
    }
    return current;
  }

 private:
  Expr rewrite(const Expr& e, int depth) {
    if (auto it = memo_.find(e); it != memo_.end()) return it->second;
    Expr built = rebuild(e, depth);
    // A builder may return another kind whose new operands have not met their rules yet.
    bool reshaped = built.kind() != e.kind() && depth < kMaxRewriteDepth;
    Expr result = reshaped ? rewrite(built, depth + 1) : apply_rules(built, depth);
    memo_.emplace(e, result);
    return result;
  }

  // e with simplified operands, re-canonicalized.
  Expr rebuild(const Expr& e, int depth) {
    if (e.args().empty()) return e;
    std::vector<Expr> args;
    for (const Expr& a : e.args()) args.push_back(rewrite(a, depth));
    if (e.kind() == ExprKind::kModularIndexing) {
      // Simplify the quotient as a FloorDiv of its own before taking the remainder.
      return mod(rewrite(floor_div(args[0], args[1]), depth + 1), args[2]);
    }
    return build(e.kind(), args);
  }

  Expr apply_rules(const Expr& e, int depth) {
    if (depth >= kMaxRewriteDepth) return e;
    Family family = family_of(e.kind());
    for (const Rule& rule : kRules) {
      if (rule.family != Family::kAny && rule.family != family) continue;
      Rewrite r = rule.apply(an_, e);
      if (!r || *r == e) continue;
      return rewrite(*r, depth + 1);
    }
    return e;
  }

  const Analyzer& an_;
  std::unordered_map<Expr, Expr> memo_;
};

}  // namespace

Expr simplify_with(const Analyzer& an, const Expr& e) { return Simplifier(an).run(e); }

}  // namespace kiln::sym
