#pragma once
/// sym::Analyzer answers every question about integer expressions: value ranges, simplification
/// under ranges, and statically_known_* queries. The queries are sound: true means proven,
/// false means "not proven" (the caller must not treat false as proof of the negation).
///
/// Facts: size and unbacked symbols are >= 0 by default; an index variable gets its range from
/// bind_index(i, extent), i.e. 0 <= i < extent where extent may itself be symbolic.

#include <cstdint>
#include <limits>
#include <map>
#include <optional>

#include "sym/expr.h"

namespace kiln::sym {

/// A closed integer interval; kNegInf / kPosInf stand for unbounded ends.
struct Range {
  static constexpr int64_t kNegInf = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kPosInf = std::numeric_limits<int64_t>::max();
  int64_t lo = kNegInf;
  int64_t hi = kPosInf;
  bool is_bounded() const { return lo != kNegInf && hi != kPosInf; }
  bool contains(int64_t v) const { return lo <= v && v <= hi; }
};

class Analyzer {
 public:
  /// Declares lo <= symbol <= hi (intersected with what is already known).
  void bind_range(const Expr& symbol, Range range);
  /// Declares 0 <= index < extent; extent may be symbolic.
  void bind_index(const Expr& index, const Expr& extent);

  /// Sound bounds of `e` under the known facts.
  Range range(const Expr& e) const;

  /// Rewrites `e` using range facts: FloorDiv/Mod/ModularIndexing rules, e.g.
  /// (x // 4) * 4 + x % 4 -> x; (i*N + j) // N -> i and (i*N + j) % N -> j when 0 <= j < N;
  /// x % N -> x and x // N -> 0 when 0 <= x < N; Min/Max when ordered. Idempotent.
  Expr simplify(const Expr& e) const;

  bool statically_known_equal(const Expr& a, const Expr& b) const;
  bool statically_known_lt(const Expr& a, const Expr& b) const;
  bool statically_known_leq(const Expr& a, const Expr& b) const;
  bool statically_known_nonnegative(const Expr& e) const;
  /// True when e is provably a multiple of k (k != 0).
  bool statically_known_multiple_of(const Expr& e, const Expr& k) const;
  /// The constant value of e if provable.
  std::optional<int64_t> constant_value(const Expr& e) const;

 private:
  friend struct AnalyzerAccess;  // src/sym internals (symbolic bounds, simplifier)
  std::map<Expr, Range> ranges_;
  std::map<Expr, Expr> extents_;
};

}  // namespace kiln::sym
