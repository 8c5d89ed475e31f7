/// Analyzer ranges and statically_known_* queries, including the "don't know" answers.

#include <gtest/gtest.h>

#include <cstdint>

#include "support/error.h"
#include "sym/analyzer.h"
#include "sym/expr.h"

namespace kiln::sym {
namespace {

constexpr int64_t kNegInf = Range::kNegInf;
constexpr int64_t kPosInf = Range::kPosInf;

class AnalyzerTest : public ::testing::Test {
 protected:
  Expr x = Expr::symbol("x"), y = Expr::symbol("y"), N = Expr::symbol("N");
  Expr M = Expr::symbol("M"), u = Expr::symbol("u", SymbolKind::kUnbacked);
  Expr i = Expr::symbol("i", SymbolKind::kIndex), j = Expr::symbol("j", SymbolKind::kIndex);
  Expr q = Expr::symbol("q", SymbolKind::kIndex);
  Analyzer an;

  void SetUp() override {
    an.bind_index(j, N);
    an.bind_index(i, M);
  }

  void expect_range(const Expr& e, int64_t lo, int64_t hi) {
    Range r = an.range(e);
    EXPECT_EQ(r.lo, lo) << e.str();
    EXPECT_EQ(r.hi, hi) << e.str();
  }
};

TEST_F(AnalyzerTest, DefaultFacts) {
  expect_range(x, 0, kPosInf);
  expect_range(u, 0, kPosInf);
  expect_range(q, kNegInf, kPosInf);  // an unbound index variable is unknown
  expect_range(j, 0, kPosInf);
  expect_range(Expr(5), 5, 5);
}

TEST_F(AnalyzerTest, IntervalArithmetic) {
  Expr y = Expr::symbol("v", SymbolKind::kIndex);  // may be negative
  an.bind_range(x, {2, 10});
  an.bind_range(y, {-3, 4});
  an.bind_range(x, {0, 8});  // intersected with what is known
  expect_range(x, 2, 8);
  expect_range(x + y, -1, 12);
  expect_range(x - y, -2, 11);
  expect_range(x * y, -24, 32);
  expect_range(floor_div(y, 2), -2, 2);
  expect_range(mod(y, 3), 0, 2);
  expect_range(mod(x, 16), 2, 8);
  expect_range(ceil_div(x, 3), 1, 3);
  expect_range(modular_indexing(x, 2, 3), 0, 2);
  expect_range(min(x, y), -3, 4);
  expect_range(max(x, y), 2, 8);
  expect_range(floor_div(x, N), 0, 8);
}

TEST_F(AnalyzerTest, SymbolicExtent) {
  an.bind_range(N, {1, 32});
  expect_range(j, 0, 31);
  Expr k = Expr::symbol("k", SymbolKind::kIndex);
  an.bind_index(k, N * 2);
  expect_range(k, 0, 63);
}

TEST_F(AnalyzerTest, OverflowSaturates) {
  int64_t big = int64_t{1} << 62;
  an.bind_range(x, {big, big + 10});  // x*4 and x + x leave int64
  expect_range(x * 4, kPosInf, kPosInf);
  expect_range(x + x, kPosInf, kPosInf);
  expect_range(-x * 4, kNegInf, kNegInf);
  expect_range(y * 4, 0, kPosInf);
  expect_range(y - x, -big - 10, kPosInf);
  EXPECT_TRUE(an.range(x * x).lo > 0);
}

TEST_F(AnalyzerTest, KnownLessThanExtent) {
  EXPECT_TRUE(an.statically_known_lt(j, N));
  EXPECT_TRUE(an.statically_known_leq(j + 1, N));
  EXPECT_TRUE(an.statically_known_lt(i * N + j, N * M));
  EXPECT_TRUE(an.statically_known_lt(mod(x, N), N));
  EXPECT_TRUE(an.statically_known_nonnegative(N - j - 1));
  EXPECT_TRUE(an.statically_known_lt(modular_indexing(x, 4, N), N));
  EXPECT_FALSE(an.statically_known_lt(j, N - 1));
  EXPECT_FALSE(an.statically_known_leq(N, j));
}

TEST_F(AnalyzerTest, DontKnowAnswers) {
  // Two unrelated size symbols: neither order is known.
  EXPECT_FALSE(an.statically_known_lt(x, y));
  EXPECT_FALSE(an.statically_known_leq(y, x));
  EXPECT_FALSE(an.statically_known_leq(x, y));
  EXPECT_FALSE(an.statically_known_equal(x, y));
  EXPECT_FALSE(an.statically_known_nonnegative(x - 1));
  EXPECT_FALSE(an.statically_known_nonnegative(q));
  EXPECT_FALSE(an.statically_known_multiple_of(x, 2));
  EXPECT_FALSE(an.statically_known_multiple_of(x + 1, x));
  EXPECT_FALSE(an.constant_value(x).has_value());
}

TEST_F(AnalyzerTest, KnownAnswers) {
  EXPECT_TRUE(an.statically_known_nonnegative(x));
  EXPECT_TRUE(an.statically_known_nonnegative(x * y + floor_div(x, 3)));
  EXPECT_TRUE(an.statically_known_leq(x, x + y));
  EXPECT_TRUE(an.statically_known_lt(x, x + 1));
  EXPECT_TRUE(an.statically_known_equal(floor_div(x, 4) * 4 + mod(x, 4), x));
  EXPECT_TRUE(an.statically_known_equal((x + 1) * 2, x * 2 + 2));
  EXPECT_TRUE(an.statically_known_equal(mod(i * N + j, N), j));
  EXPECT_TRUE(an.statically_known_multiple_of(x * 6 + y * 4, 2));
  EXPECT_TRUE(an.statically_known_multiple_of(x * 6 + 3, 3));
  EXPECT_TRUE(an.statically_known_multiple_of(x * 3 * y, 3));
  EXPECT_TRUE(an.statically_known_multiple_of(x * N + N * 2, N));
  EXPECT_TRUE(an.statically_known_multiple_of(x * y * 4, x * 2));
  EXPECT_TRUE(an.statically_known_multiple_of(x * x + x * 2, x + 2));
  EXPECT_TRUE(an.statically_known_multiple_of(floor_div(x, 4) * 4, 4));
  EXPECT_TRUE(an.statically_known_multiple_of(min(x * 4, y * 8), 4));
  EXPECT_THROW(an.statically_known_multiple_of(x, 0), InternalError);
  EXPECT_EQ(an.constant_value(mod(j, N) - j), 0);
  an.bind_range(M, {7, 7});
  EXPECT_EQ(an.constant_value(M * 2), 14);
  EXPECT_TRUE(an.statically_known_multiple_of(x * M, 7));
}

TEST_F(AnalyzerTest, BindErrors) {
  EXPECT_THROW(an.bind_range(x + 1, {0, 1}), InternalError);
  EXPECT_THROW(an.bind_index(q, q + 1), InternalError);
}

TEST_F(AnalyzerTest, SimplifyIsIdempotentAndKeepsUnknowns) {
  Expr e = floor_div(x, y) * y + mod(x, y);
  EXPECT_EQ(an.simplify(e), x);
  Expr unknown = floor_div(x, y) + mod(x, 3);
  EXPECT_EQ(an.simplify(unknown), unknown);
  EXPECT_EQ(an.simplify(an.simplify(unknown)), an.simplify(unknown));
}

}  // namespace
}  // namespace kiln::sym
