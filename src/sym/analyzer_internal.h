#pragma once
/// Internals of sym::Analyzer shared by analyzer.cpp, bounds.cpp and simplify.cpp. The proves_*
/// functions never call the simplifier, so the simplifier's rules may use them freely.

#include <map>

#include "sym/analyzer.h"

namespace kiln::sym {

struct AnalyzerAccess {
  static const std::map<Expr, Range>& ranges(const Analyzer& a) { return a.ranges_; }
  static const std::map<Expr, Expr>& extents(const Analyzer& a) { return a.extents_; }
};

/// e >= 0 from ranges plus symbolic bounds (an index is at most its extent - 1, x % m at most
/// m - 1), without simplifying e.
bool proves_nonnegative(const Analyzer& an, const Expr& e);
inline bool proves_leq(const Analyzer& an, const Expr& a, const Expr& b) {
  return proves_nonnegative(an, b - a);
}
inline bool proves_lt(const Analyzer& an, const Expr& a, const Expr& b) {
  return proves_nonnegative(an, b - a - 1);
}
inline bool proves_positive(const Analyzer& an, const Expr& e) {
  return proves_nonnegative(an, e - 1);
}

/// The simplifier behind Analyzer::simplify.
Expr simplify_with(const Analyzer& an, const Expr& e);

}  // namespace kiln::sym
