/// Analyzer::simplify as a table: input expression under fixed facts, expected canonical text.

#include <gtest/gtest.h>

#include <vector>

#include "sym/analyzer.h"
#include "sym/expr.h"

namespace kiln::sym {
namespace {

struct Row {
  const char* rule;
  Expr input;
  const char* expected;
};

// Facts shared by every row:
//   x, y, N, M: size symbols (>= 0); P in [1, 64]; s in [1, inf)
//   j in [0, N), i in [0, M), k in [0, 8), t in [0, 24), u in [0, N*M), w in [0, 4)
class SimplifyTable : public ::testing::Test {
 protected:
  Expr x = Expr::symbol("x"), y = Expr::symbol("y");
  Expr N = Expr::symbol("N"), M = Expr::symbol("M");
  Expr P = Expr::symbol("P"), s = Expr::symbol("s");
  Expr i = Expr::symbol("i", SymbolKind::kIndex), j = Expr::symbol("j", SymbolKind::kIndex);
  Expr k = Expr::symbol("k", SymbolKind::kIndex), t = Expr::symbol("t", SymbolKind::kIndex);
  Expr u = Expr::symbol("u", SymbolKind::kIndex), w = Expr::symbol("w", SymbolKind::kIndex);
  Analyzer an;

  void SetUp() override {
    an.bind_range(P, {1, 64});
    an.bind_range(s, {1, Range::kPosInf});
    an.bind_index(j, N);
    an.bind_index(i, M);
    an.bind_index(k, 8);
    an.bind_index(t, 24);
    an.bind_index(u, N * M);
    an.bind_index(w, 4);
  }

  std::vector<Row> rows() {
    return {
        // constant folding and like terms (builders)
        {"fold", Expr(3) * 4 + 5, "17"},
        {"like terms", x * 2 + x * 3, "5*x"},
        {"cancel", x + y - x, "y"},
        {"x*0", x * 0 + 1, "1"},
        {"distribute", (x + 1) * 4, "4*x + 4"},
        // FloorDiv
        {"floordiv const", floor_div(Expr(-7), 2), "-4"},
        {"floordiv by 1", floor_div(x, 1), "x"},
        {"floordiv pulls multiples", floor_div(x * 4 + y * 8 + 5, 4), "x + 2*y + 1"},
        {"floordiv common factor", floor_div(x * 6 + 4, 4), "(3*x) // 2 + 1"},
        {"nested floordiv const", floor_div(floor_div(x, 4), 3), "x // 12"},
        {"nested floordiv symbolic", floor_div(floor_div(x, s), P), "x // (P*s)"},
        {"floordiv small", floor_div(j, N), "0"},
        {"floordiv small const", floor_div(k, 8), "0"},
        {"(i*N + j) // N", floor_div(i * N + j, N), "i"},
        {"(i*N + j) // N, M unrelated", floor_div(i * N + j + N, N), "i + 1"},
        {"TVM remainder drop", floor_div(k * 4 + w, 8), "k // 2"},
        {"TVM remainder drop symbolic", floor_div(i * N * 3 + j, N * 3), "i"},
        {"floordiv of mod", floor_div(mod(x, 12), 4), "(x // 4) % 3"},
        {"floordiv of mod symbolic", floor_div(mod(x, P * s), P), "(x // P) % s"},
        {"floordiv constant quotient", floor_div(k + 8, 8), "1"},
        // Mod and ModularIndexing
        {"mod const", mod(Expr(-7), 3), "2"},
        {"mod drops multiples", mod(x * 4 + y + 9, 4), "(y + 1) % 4"},
        {"mod common factor", mod(x * 4, 8), "4*(x % 2)"},
        {"nested mod const", mod(mod(x, 12), 4), "x % 4"},
        {"nested mod symbolic", mod(mod(x, P * s), P), "x % P"},
        {"mod small", mod(j, N), "j"},
        {"(i*N + j) % N", mod(i * N + j, N), "j"},
        {"x % N with x < N", mod(k, 8), "k"},
        {"mod shifted", mod(k + 8, 8), "k"},
        {"TVM mod remainder", mod(k * 4 + w, 8), "w + 4*(k % 2)"},
        {"mod of mod smaller", mod(mod(x, 4), 8), "x % 4"},
        {"modular_indexing(x, 1, big)", modular_indexing(t, 1, 24), "t"},
        {"modular_indexing(x, 1, m)", modular_indexing(x, 1, 5), "x % 5"},
        {"modular_indexing small", modular_indexing(t, 8, 3), "t // 8"},
        {"modular_indexing symbolic", modular_indexing(u, N, M), "u // N"},
        {"modular_indexing of flat index", modular_indexing(i * N + j, N, M), "i"},
        {"modular_indexing nested", mod(modular_indexing(x, 2, 12), 4), "(x // 2) % 4"},
        // merging remainder pieces
        {"(x // 4)*4 + x % 4", floor_div(x, 4) * 4 + mod(x, 4), "x"},
        {"(x // N)*N + x % N", floor_div(x, N) * N + mod(x, N), "x"},
        {"scaled merge", floor_div(x, 4) * 12 + mod(x, 4) * 3 + 1, "3*x + 1"},
        {"merge to mod", modular_indexing(x, 2, 3) * 2 + mod(x, 2), "x % 6"},
        {"merge to floordiv", floor_div(x, 6) * 6 + modular_indexing(x, 2, 3) * 2, "2*(x // 2)"},
        {"reshape of reshape",
         floor_div(t, 12) * 12 + modular_indexing(t, 4, 3) * 4 + modular_indexing(t, 1, 4), "t"},
        {"reshape of reshape symbolic", floor_div(u, N) * N + mod(u, N), "u"},
        // CeilDiv
        {"ceildiv const", ceil_div(Expr(7), 2), "4"},
        {"ceildiv pulls multiples", ceil_div(x * 4 + 1, 4), "x + 1"},
        {"ceildiv small", ceil_div(w + 1, 4), "1"},
        {"ceildiv zero", ceil_div(-w, 4), "0"},
        {"ceildiv kept", ceil_div(x, 4), "ceildiv(x, 4)"},
        // Min and Max
        {"min const", min(Expr(3), 5), "3"},
        {"max const", max(Expr(3), 5), "5"},
        {"min flatten", min(min(x, 3), min(y, 2)), "min(x, y, 2)"},
        {"min constant offset", min(x, x + 1), "x"},
        {"max ordered by range", max(x, -1), "x"},
        {"min ordered by index", min(j, N), "j"},
        {"max ordered by index", max(j + 1, N), "N"},
        {"min unknown", min(x, y), "min(x, y)"},
    };
  }
};

TEST_F(SimplifyTable, EveryRow) {
  int count = 0;
  for (const Row& row : rows()) {
    SCOPED_TRACE(row.rule);
    Expr once = an.simplify(row.input);
    EXPECT_EQ(once.str(), row.expected) << "input " << row.input.str();
    EXPECT_EQ(an.simplify(once), once) << "not idempotent on " << row.input.str();
    ++count;
  }
  EXPECT_GE(count, 40);
}

}  // namespace
}  // namespace kiln::sym
