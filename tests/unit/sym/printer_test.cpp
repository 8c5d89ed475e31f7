/// Expr::str(), to_cpp and to_cuda; the C++ prelude is compiled with the printed expressions and
/// checked against evaluate().

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "sym/analyzer.h"
#include "sym/expr.h"
#include "sym/prelude.h"

namespace kiln::sym {
namespace {

Expr x = Expr::symbol("x"), y = Expr::symbol("y");
Expr i = Expr::symbol("i", SymbolKind::kIndex), v = Expr::symbol("v", SymbolKind::kIndex);

TEST(Printer, Str) {
  EXPECT_EQ((x * 4 + 1).str(), "4*x + 1");
  EXPECT_EQ((x * 4 + modular_indexing(i, 3, 5)).str(), "4*x + (i // 3) % 5");
  EXPECT_EQ((x - y * 2 - 3).str(), "x - 2*y - 3");
  EXPECT_EQ((-x).str(), "-x");
  EXPECT_EQ((floor_div(x, 4) * 4).str(), "4*(x // 4)");
  EXPECT_EQ(floor_div(x + 1, y).str(), "(x + 1) // y");
  EXPECT_EQ(mod(x * y, 7).str(), "(x*y) % 7");
  EXPECT_EQ(ceil_div(x, 4).str(), "ceildiv(x, 4)");
  EXPECT_EQ(min(x, max(y, 2)).str(), "min(x, max(y, 2))");
  EXPECT_EQ(Expr(-5).str(), "-5");
  EXPECT_EQ(Expr().str(), "0");
}

TEST(Printer, CppPlainOperatorsOnlyWhenNonnegative) {
  // Size symbols are nonnegative by construction; v is an unbound index.
  EXPECT_EQ(to_cpp(floor_div(x, 4)), "s_x / 4");
  EXPECT_EQ(to_cpp(mod(x, y)), "s_x % s_y");
  EXPECT_EQ(to_cpp(floor_div(v, 4)), "kiln_floordiv(v, 4)");
  EXPECT_EQ(to_cpp(mod(v - 1, 4)), "kiln_mod(v + 3, 4)");
  EXPECT_EQ(to_cpp(ceil_div(v, 4)), "kiln_ceildiv(v, 4)");
  EXPECT_EQ(to_cpp(ceil_div(x, 4)), "(s_x + 4 - 1) / 4");
  EXPECT_EQ(to_cpp(modular_indexing(v, 2, 3)), "kiln_mod(kiln_floordiv(v, 2), 3)");
  EXPECT_EQ(to_cpp(floor_div(v, 4) * 4 + 1), "4*kiln_floordiv(v, 4) + 1");
  // The predicate (e.g. an Analyzer's) lifts the restriction.
  Analyzer an;
  an.bind_index(v, 16);
  auto nonneg = [&](const Expr& e) { return an.statically_known_nonnegative(e); };
  EXPECT_EQ(to_cpp(floor_div(v, 4), nonneg), "v / 4");
  EXPECT_EQ(to_cpp(modular_indexing(v, 2, 3), nonneg), "(v / 2) % 3");
  EXPECT_EQ(to_cpp(floor_div(x, 4) * 4, nonneg), "4*(s_x / 4)");
}

TEST(Printer, CppMinMaxAndLiterals) {
  EXPECT_EQ(to_cpp(min(x, 3)), "std::min<int64_t>(s_x, 3)");
  EXPECT_EQ(to_cpp(max(max(x, y), 0)), "std::max<int64_t>(std::max<int64_t>(s_x, s_y), 0)");
  EXPECT_EQ(to_cpp(x + int64_t{5000000000}), "s_x + 5000000000LL");
  EXPECT_EQ(to_cpp(x * int64_t{5000000000}), "5000000000LL*s_x");
  EXPECT_EQ(to_cpp(Expr(std::numeric_limits<int64_t>::min())), "(-9223372036854775807LL - 1)");
  EXPECT_EQ(to_cpp(Expr(2147483647)), "2147483647");
  EXPECT_EQ(to_cpp(Expr(int64_t{2147483648})), "2147483648LL");
}

// Size symbols take their names from the model's dim params: they print through the one
// sanitizer, so any name gives a valid identifier that no Kiln name (an index "i0") can shadow.
TEST(Printer, SizeSymbolsPrintAsSanitizedIdentifiers) {
  EXPECT_EQ(to_cpp(Expr::symbol("p2o.DynamicDimension.0") * 2), "2*sxp2o_2eDynamicDimension_2e0");
  EXPECT_EQ(to_cpp(Expr::symbol("i0") + Expr::symbol("i0", SymbolKind::kIndex)), "s_i0 + i0");
  EXPECT_EQ(to_cuda(Expr::symbol("new\nline")), "sxnew_0aline");
  EXPECT_EQ(Expr::symbol("p2o.DynamicDimension.0").str(), "p2o.DynamicDimension.0");
}

TEST(Printer, Cuda) {
  EXPECT_EQ(to_cuda(min(x, 3)), "min(s_x, static_cast<int64_t>(3))");
  EXPECT_EQ(to_cuda(max(x, y + 1)), "max(s_x, s_y + 1)");
  EXPECT_EQ(to_cuda(floor_div(v, 4)), "kiln_floordiv(v, 4)");
  EXPECT_EQ(to_cuda(mod(x, 4)), "s_x % 4");
  EXPECT_NE(cuda_prelude().find("__device__"), std::string_view::npos);
}

// Compiles the prelude with printed expressions and compares their values with evaluate().
TEST(Printer, CppPreludeCompilesAndAgrees) {
  if (std::system("c++ --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no C++ compiler";
  Expr w = Expr::symbol("w", SymbolKind::kIndex);
  std::vector<Expr> exprs = {
      floor_div(v, 4),
      mod(v, 4),
      ceil_div(v, 4),
      floor_div(v * 3 + w, 7),
      mod(v - w, 5),
      ceil_div(v, w),
      modular_indexing(v, 3, 4),
      min(v, w) + max(v, 3),
      floor_div(x, 3) * 3 + 1,
      mod(x * 5, 3),
      ceil_div(x, 7),
      min(x, int64_t{5000000000}),
  };
  std::vector<Binding> bindings;
  for (int64_t a : {-9, -4, -1, 0, 3, 8}) {
    for (int64_t b : {-5, -3, 2, 6}) bindings.push_back({{"v", a}, {"w", b}, {"x", a * a}});
  }
  std::ostringstream program;
  program << cpp_prelude() << "#include <cstdio>\nint main() {\n";
  for (const Binding& bd : bindings) {
    program << "  {\n    int64_t v = " << bd.at("v") << ", w = " << bd.at("w")
            << ", s_x = " << bd.at("x") << ";\n    (void)v; (void)w; (void)s_x;\n";
    for (const Expr& e : exprs) {
      program << "    std::printf(\"%lld\\n\", static_cast<long long>(" << to_cpp(e) << "));\n";
    }
    program << "  }\n";
  }
  program << "}\n";
  std::string dir = KILN_BUILD_DIR "/test-tmp/sym_prelude";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/prelude_check.cpp") << program.str();
  std::string build = "c++ -std=c++20 -Wall -Wextra -Werror -o " + dir + "/prelude_check " + dir +
                      "/prelude_check.cpp";
  ASSERT_EQ(std::system(build.c_str()), 0) << program.str();
  std::FILE* out = popen((dir + "/prelude_check").c_str(), "r");
  ASSERT_NE(out, nullptr);
  for (const Binding& bd : bindings) {
    for (const Expr& e : exprs) {
      long long got = 0;
      ASSERT_EQ(std::fscanf(out, "%lld", &got), 1);
      EXPECT_EQ(got, evaluate(e, bd)) << to_cpp(e) << " at v=" << bd.at("v") << " w=" << bd.at("w");
    }
  }
  pclose(out);
}

}  // namespace
}  // namespace kiln::sym
