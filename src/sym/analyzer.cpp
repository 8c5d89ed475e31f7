/// Analyzer facts and interval arithmetic. Every operation saturates to kNegInf / kPosInf instead
/// of wrapping, and treats those two values as unbounded ends, so a range is always sound.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>

#include "support/error.h"
#include "sym/analyzer_internal.h"
#include "sym/expr_node.h"

namespace kiln::sym {
namespace {

constexpr int64_t kNeg = Range::kNegInf;
constexpr int64_t kPos = Range::kPosInf;
constexpr int kMaxExtentDepth = 8;

const Range kUnknown{kNeg, kPos};

bool is_inf(int64_t v) { return v == kNeg || v == kPos; }

int64_t clamp_overflow(bool negative) { return negative ? kNeg : kPos; }

// a + b where an infinite operand `dominant` wins (kNeg for lower ends, kPos for upper ends).
int64_t add_end(int64_t a, int64_t b, int64_t dominant) {
  if (a == dominant || b == dominant) return dominant;
  if (is_inf(a)) return a;
  if (is_inf(b)) return b;
  int64_t r;
  if (__builtin_add_overflow(a, b, &r) || is_inf(r)) return clamp_overflow(a < 0);
  return r;
}

int64_t neg_end(int64_t v) {
  if (v == kNeg) return kPos;
  if (v == kPos) return kNeg;
  return -v;
}

int64_t mul_end(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;  // an unbounded end still stands for finite values
  bool negative = (a < 0) != (b < 0);
  if (is_inf(a) || is_inf(b)) return clamp_overflow(negative);
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r) || is_inf(r)) return clamp_overflow(negative);
  return r;
}

// floor(x / y) for y >= 1 (y may be kPos).
int64_t floor_div_end(int64_t x, int64_t y) {
  if (is_inf(x)) return x;
  if (y == kPos) return x >= 0 ? 0 : -1;
  return floor_div_int(x, y);
}

Range add_range(Range a, Range b) { return {add_end(a.lo, b.lo, kNeg), add_end(a.hi, b.hi, kPos)}; }

Range neg_range(Range a) { return {neg_end(a.hi), neg_end(a.lo)}; }

Range mul_range(Range a, Range b) {
  int64_t c[] = {mul_end(a.lo, b.lo), mul_end(a.lo, b.hi), mul_end(a.hi, b.lo),
                 mul_end(a.hi, b.hi)};
  return {*std::min_element(std::begin(c), std::end(c)),
          *std::max_element(std::begin(c), std::end(c))};
}

Range hull(Range a, Range b) { return {std::min(a.lo, b.lo), std::max(a.hi, b.hi)}; }
Range intersect(Range a, Range b) { return {std::max(a.lo, b.lo), std::min(a.hi, b.hi)}; }

// floor(a / b) for b >= 1.
Range floor_div_positive(Range a, Range b) {
  return {std::min(floor_div_end(a.lo, b.lo), floor_div_end(a.lo, b.hi)),
          std::max(floor_div_end(a.hi, b.lo), floor_div_end(a.hi, b.hi))};
}

Range floor_div_range(Range a, Range b) {
  if (b.lo >= 1) return floor_div_positive(a, b);
  if (b.hi <= -1) return floor_div_positive(neg_range(a), neg_range(b));
  // b may be 0, where division is undefined: cover both signs of the divisor.
  std::optional<Range> r;
  if (b.hi >= 1) r = floor_div_positive(a, {1, b.hi});
  if (b.lo <= -1) {
    Range n = floor_div_positive(neg_range(a), {1, neg_end(b.lo)});
    r = r ? hull(*r, n) : n;
  }
  return r.value_or(kUnknown);
}

Range mod_range(Range a, Range b) {
  if (b.lo >= 1) {
    if (a.lo >= 0 && a.hi < b.lo) return a;  // a % b == a
    if (b.lo == b.hi && a.is_bounded() && floor_div_int(a.lo, b.lo) == floor_div_int(a.hi, b.lo)) {
      int64_t shift = floor_div_int(a.lo, b.lo) * b.lo;
      return {a.lo - shift, a.hi - shift};
    }
    Range r{0, b.hi == kPos ? kPos : b.hi - 1};
    if (a.lo >= 0) r.hi = std::min(r.hi, a.hi);
    return r;
  }
  if (b.hi <= -1) return {b.lo == kNeg ? kNeg : b.lo + 1, 0};
  return {b.lo == kNeg ? kNeg : std::min<int64_t>(b.lo + 1, 0),
          b.hi == kPos ? kPos : std::max<int64_t>(b.hi - 1, 0)};
}

Range range_of(const Analyzer& an, const Expr& e, int depth);

Range symbol_range(const Analyzer& an, const Expr& s, int depth) {
  const auto& ranges = AnalyzerAccess::ranges(an);
  Range r = kUnknown;
  if (s.symbol_kind() != SymbolKind::kIndex) r.lo = 0;
  if (auto it = ranges.find(s); it != ranges.end()) r = intersect(r, it->second);
  const auto& extents = AnalyzerAccess::extents(an);
  if (auto it = extents.find(s); it != extents.end() && depth < kMaxExtentDepth) {
    Range extent = range_of(an, it->second, depth + 1);
    r = intersect(r, {0, extent.hi == kPos ? kPos : add_end(extent.hi, -1, kPos)});
  }
  return r;
}

Range range_of(const Analyzer& an, const Expr& e, int depth) {
  const auto& args = e.args();
  auto arg = [&](size_t i) { return range_of(an, args[i], depth); };
  switch (e.kind()) {
    case ExprKind::kInteger: {
      int64_t v = *e.as_integer();
      return {v, v};
    }
    case ExprKind::kSymbol:
      return symbol_range(an, e, depth);
    case ExprKind::kAdd: {
      Range r{0, 0};
      for (size_t i = 0; i < args.size(); ++i) r = add_range(r, arg(i));
      return r;
    }
    case ExprKind::kMul: {
      Range r{1, 1};
      for (size_t i = 0; i < args.size(); ++i) r = mul_range(r, arg(i));
      return r;
    }
    case ExprKind::kFloorDiv:
      return floor_div_range(arg(0), arg(1));
    case ExprKind::kCeilDiv:
      return neg_range(floor_div_range(neg_range(arg(0)), arg(1)));
    case ExprKind::kMod:
      return mod_range(arg(0), arg(1));
    case ExprKind::kModularIndexing:
      return mod_range(floor_div_range(arg(0), arg(1)), arg(2));
    case ExprKind::kMin:
    case ExprKind::kMax: {
      Range r = arg(0);
      for (size_t i = 1; i < args.size(); ++i) {
        Range x = arg(i);
        r = e.kind() == ExprKind::kMin ? Range{std::min(r.lo, x.lo), std::min(r.hi, x.hi)}
                                       : Range{std::max(r.lo, x.lo), std::max(r.hi, x.hi)};
      }
      return r;
    }
  }
  return kUnknown;
}

}  // namespace

void Analyzer::bind_range(const Expr& symbol, Range range) {
  KILN_CHECK(symbol.is_symbol(), "bind_range needs a symbol, got {}", symbol.str());
  auto [it, inserted] = ranges_.try_emplace(symbol, range);
  if (!inserted) it->second = intersect(it->second, range);
}

void Analyzer::bind_index(const Expr& index, const Expr& extent) {
  KILN_CHECK(index.is_symbol(), "bind_index needs a symbol, got {}", index.str());
  KILN_CHECK(!has_symbol(extent, index), "extent {} of index {} mentions the index", extent.str(),
             index.str());
  extents_.insert_or_assign(index, extent);
}

Range Analyzer::range(const Expr& e) const { return range_of(*this, e, 0); }

}  // namespace kiln::sym
