/// The canonical form: equal expressions compare and hash equal whatever order they were built
/// in; builders fold constants and combine like terms; the order is structural.

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "support/error.h"
#include "sym/expr.h"

namespace kiln::sym {
namespace {

Expr x = Expr::symbol("x"), y = Expr::symbol("y"), z = Expr::symbol("z");
Expr i = Expr::symbol("i", SymbolKind::kIndex);

TEST(Canonical, OrderIndependence) {
  Expr a = x * 2 + y * 3 + z + 1;
  Expr b = Expr(1) + z + y * 3 + x * 2;
  Expr c = (z + 1) + (y + x) * 2 + y;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.hash(), c.hash());
  EXPECT_EQ(a.str(), "2*x + 3*y + z + 1");
  EXPECT_EQ(x * y * z, z * (y * x));
  EXPECT_EQ((x * y).hash(), (y * x).hash());
  EXPECT_EQ(min(x, min(y, z)), min(min(z, x), y));
  EXPECT_EQ(max(x, 3), max(Expr(3), x));
}

TEST(Canonical, LikeTermsAndIdentities) {
  EXPECT_EQ(x * 2 + x * 3, x * 5);
  EXPECT_EQ((x * 2 + x * 3).str(), "5*x");
  EXPECT_EQ(x - x, Expr(0));
  EXPECT_EQ(x * 0, Expr(0));
  EXPECT_EQ(x * 1, x);
  EXPECT_EQ(x + 0, x);
  EXPECT_EQ(-(-x), x);
  EXPECT_EQ((x + y) * (x - y), x * x - y * y);
  EXPECT_EQ((x * x - y * y).str(), "x*x - y*y");
  EXPECT_EQ(product({x, 2, y}), x * y * 2);
  EXPECT_EQ(product({}), Expr(1));
  EXPECT_EQ(dot({x, y}, {3, 4}), x * 3 + y * 4);
  EXPECT_EQ(dot({}, {}), Expr(0));
  EXPECT_THROW(dot({x}, {}), InternalError);
}

TEST(Canonical, ConstantsFold) {
  EXPECT_EQ(Expr(3) * 4 + 5, Expr(17));
  EXPECT_EQ(floor_div(Expr(-7), 2), Expr(-4));
  EXPECT_EQ(mod(Expr(-7), 2), Expr(1));
  EXPECT_EQ(mod(Expr(7), -2), Expr(-1));
  EXPECT_EQ(ceil_div(Expr(-7), 2), Expr(-3));
  EXPECT_EQ(ceil_div(Expr(7), 2), Expr(4));
  EXPECT_EQ(modular_indexing(Expr(23), 4, 3), Expr(2));
  EXPECT_EQ(min(Expr(3), -2), Expr(-2));
  EXPECT_EQ(max(max(Expr(3), x), 7), max(x, 7));
  EXPECT_THROW(floor_div(x, 0), InternalError);
  EXPECT_THROW(mod(x, 0), InternalError);
  EXPECT_THROW(Expr(std::numeric_limits<int64_t>::max()) + 1, InternalError);
}

TEST(Canonical, DivisionNormalForms) {
  EXPECT_EQ(floor_div(x, -4), floor_div(-x, 4));
  EXPECT_EQ(mod(x, -4), -mod(-x, 4));
  EXPECT_EQ(modular_indexing(x, 1, 5), mod(x, 5));
  EXPECT_EQ(mod(floor_div(x, 3), 5), modular_indexing(x, 3, 5));
  EXPECT_EQ(mod(floor_div(x, 3), 5).kind(), ExprKind::kModularIndexing);
  EXPECT_EQ(floor_div(floor_div(x, 2), 3), floor_div(x, 6));
  EXPECT_EQ(mod(x + 5, 4), mod(x + 1, 4));
  EXPECT_EQ(floor_div(x * 4 + y, 4), x + floor_div(y, 4));
  EXPECT_EQ(floor_div(x * y + z, y), x + floor_div(z, y));
  EXPECT_EQ(mod(x * y + z, y), mod(z, y));
  EXPECT_EQ(floor_div(x, x), Expr(1));
  EXPECT_EQ(min(x, x + 2), x);
  EXPECT_EQ(max(x, x + 2), x + 2);
}

TEST(Canonical, StructuralOrderIsDeterministic) {
  // Built in two orders, with names chosen so allocation order differs from name order.
  Expr b1 = Expr::symbol("b"), a1 = Expr::symbol("a");
  Expr a2 = Expr::symbol("a"), b2 = Expr::symbol("b");
  EXPECT_EQ((b1 + a1).str(), "a + b");
  EXPECT_EQ((a2 + b2).str(), "a + b");
  EXPECT_TRUE(a1 < b1);
  EXPECT_FALSE(b1 < a1);
  EXPECT_FALSE(a1 < a2);
  EXPECT_EQ(free_symbols(z + x * y + floor_div(i, x)), (std::vector<Expr>{i, x, y, z}));
  // A size symbol and an index symbol of the same name differ.
  EXPECT_NE(Expr::symbol("n"), Expr::symbol("n", SymbolKind::kIndex));
}

TEST(Canonical, HashSetDeduplicates) {
  std::unordered_set<Expr> set;
  set.insert(x * 2 + y);
  set.insert(y + x + x);
  set.insert(floor_div(x, 4) + 1);
  set.insert(Expr(1) + floor_div(x, 4));
  EXPECT_EQ(set.size(), 2u);
}

TEST(Canonical, BuildingFromThreadsAgrees) {
  std::vector<std::string> results(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &results] {
      Expr acc = 0;
      for (int n = 0; n < 2000; ++n) {
        char name[] = "s0";  // (not "s" + to_string: GCC 12 warns falsely, -Wrestrict)
        name[1] = static_cast<char>('0' + n % 7);
        Expr s = Expr::symbol(name);
        acc = acc + modular_indexing(s * (n % 5 + 1) + n, n % 3 + 1, n % 4 + 2) + min(s, n);
        if (n % 100 == 99) acc = floor_div(acc, 1);
      }
      results[t] = acc.str();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 1; t < 4; ++t) EXPECT_EQ(results[t], results[0]);
}

TEST(Canonical, SubstituteAndEvaluate) {
  Expr e = floor_div(x * 3 + y, 4) + mod(x, y) - min(x, 2);
  EXPECT_EQ(substitute(e, {{x, Expr(5)}, {y, Expr(3)}}), Expr(4 + 2 - 2));
  EXPECT_EQ(substitute(x + y, {{x, y}, {y, x}}), x + y);  // simultaneous
  EXPECT_EQ(substitute(x * 2, {{x, y + 1}}), y * 2 + 2);
  Binding v{{"x", -7}, {"y", 2}};
  EXPECT_EQ(evaluate(floor_div(x, y), v), -4);
  EXPECT_EQ(evaluate(mod(x, y), v), 1);
  EXPECT_EQ(evaluate(ceil_div(x, y), v), -3);
  EXPECT_EQ(evaluate(modular_indexing(x, y, 3), v), 2);
  EXPECT_THROW(evaluate(floor_div(x, y), {{"x", 1}, {"y", 0}}), InternalError);
  EXPECT_THROW(evaluate(mod(x, y), {{"x", 1}, {"y", 0}}), InternalError);
  EXPECT_THROW(evaluate(x, {}), InternalError);
  EXPECT_TRUE(has_symbol(e, y));
  EXPECT_FALSE(has_symbol(e, z));
}

}  // namespace
}  // namespace kiln::sym
