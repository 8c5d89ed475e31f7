// GEMM choices (src/autotune/choice.h): every real choice of gemm_choices renders a kernel that,
// compiled with its linkage through the code cache and called on its prepared weight, matches a
// double-precision reference at awkward sizes (M, N, K of 1 and not multiples of any block), with
// and without a bias + Relu epilogue; names and hash keys identify the choices.
//
// Tolerance as in gemm_template_test.cpp: |C - ref| <= 8 * eps(float32) * sqrt(K) *
// sum_k |A[m, k] * B[k, n]|.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "autotune/choice.h"
#include "autotune/runtime_headers.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"

#include "test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

namespace fs = std::filesystem;

codecache::CompilerConfig config_for(const GemmChoice& choice) {
  codecache::CompilerConfig config;
  const ChoiceLinkage link = choice.linkage();
  config.include_dirs.assign(link.include_dirs.begin(), link.include_dirs.end());
  add_runtime(config);
  config.libraries = link.libraries;
  return config;
}

// Checks C (M x N) against A @ B in double, with bias + Relu when `bias` is given.
void expect_matches(const std::vector<float>& a, const std::vector<float>& b,
                    const std::vector<float>& c, int64_t m, int64_t n, int64_t k, const float* bias,
                    const std::string& what) {
  const double eps = std::numeric_limits<float>::epsilon();
  int failures = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double term = double{a[i * k + p]} * b[p * n + j];
        sum += term;
        magnitude += std::abs(term);
      }
      const double expected = bias == nullptr ? sum : std::max(sum + bias[j], 0.0);
      const double tolerance =
          8 * eps * std::sqrt(double(std::max<int64_t>(k, 1))) * (magnitude + 1) + 1e-30;
      const double got = c[i * n + j];
      if (!(std::abs(got - expected) <= tolerance) && ++failures <= 3) {
        ADD_FAILURE() << what << ": C[" << i << ", " << j << "] = " << got << ", expected "
                      << expected;
      }
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

TEST(GemmChoices, HeuristicFirstThenLibrariesThenTemplatesWithDistinctNamesAndKeys) {
  const GemmProblem problem{.n = 768, .k = 256};
  const std::vector<GemmChoicePtr> choices = gemm_choices(128, problem, 4);
  ASSERT_GE(choices.size(), 4u);
  const GemmConfig heuristic = gemm_default_config(128, problem, 4, host_template_isa());
  EXPECT_EQ(choices[0]->name(), "template " + heuristic.name());
  ASSERT_NE(choices[0]->template_config(), nullptr);
  EXPECT_EQ(*choices[0]->template_config(), heuristic);
  EXPECT_EQ(choices[1]->name(), "openblas");
  EXPECT_EQ(choices[1]->backend(), "extern");
  EXPECT_EQ(choices[1]->template_config(), nullptr);
  EXPECT_EQ(choices[2]->name(), "onednn");
  std::set<std::string> names, keys;
  for (const GemmChoicePtr& choice : choices) {
    EXPECT_TRUE(names.insert(choice->name()).second) << choice->name();
    EXPECT_TRUE(keys.insert(choice->hash_key()).second) << choice->name();
    EXPECT_EQ(choice->hash_key(), choice->hash_key());
  }
  // The key follows the code: another problem renders other code.
  EXPECT_NE(make_openblas_choice(problem)->hash_key(),
            make_openblas_choice({.n = 768, .k = 255})->hash_key());
}

TEST(GemmChoices, LibrariesKeepTheWeightTemplatesPrepackIt) {
  const GemmProblem problem{.n = 20, .k = 6};
  const std::vector<float> b = random_matrix(problem.k, problem.n, 3);
  EXPECT_EQ(make_openblas_choice(problem)->prepare(b.data(), 6, 20), b);
  EXPECT_EQ(make_onednn_choice(problem)->prepare(b.data(), 6, 20), b);
  const GemmConfig config = gemm_default_config(4, problem, 1, TemplateIsa::kAvx2);
  EXPECT_EQ(make_template_choice(config, problem)->prepare(b.data(), 6, 20),
            prepack_b(config, problem, b.data()));
}

// Every choice of gemm_choices for each problem; M varies at run time.
TEST(GemmChoices, EveryChoiceIsCorrectAtAwkwardSizes) {
  struct Case {
    GemmProblem problem;
    std::vector<int64_t> ms;
  };
  const std::vector<Case> cases = {
      {{.n = 1, .k = 1}, {1, 7}},
      {{.n = 1, .k = 37}, {1, 13}},
      {{.n = 45, .k = 1}, {1, 5}},
      {{.n = 53, .k = 70}, {1, 3, 50}},
  };
  const TemplateEpilogue bias_relu{
      .expr = "std::max(v + bias[n], 0.0f)", .args = {"bias"}, .vector_expr = {}};
  codecache::CodeCache cache(fresh_dir() / "code");
  const int threads = omp_get_max_threads();
  for (const Case& c : cases) {
    const std::vector<GemmChoicePtr> choices = gemm_choices(c.ms.back(), c.problem, threads);
    std::vector<codecache::LibrarySpec> specs;
    for (const GemmChoicePtr& choice : choices) {
      specs.push_back({{{"gemm.cpp", choice->render("gemm")}}, config_for(*choice)});
      specs.push_back(
          {{{"gemm.cpp", choice->render("gemm_bias_relu", bias_relu)}}, config_for(*choice)});
    }
    const std::vector<fs::path> paths = cache.compile_many(specs);
    const std::vector<float> b = random_matrix(c.problem.k, c.problem.n, 11);
    const std::vector<float> bias = random_matrix(1, c.problem.n, 12);
    for (size_t i = 0; i < choices.size(); ++i) {
      const std::vector<float> prepared = choices[i]->prepare(b.data(), c.problem.k, c.problem.n);
      codecache::LoadedLibrary plain(paths[2 * i]);
      codecache::LoadedLibrary fused(paths[2 * i + 1]);
      for (int64_t m : c.ms) {
        const std::string what = choices[i]->name() + " at M=" + std::to_string(m) +
                                 " N=" + std::to_string(c.problem.n) +
                                 " K=" + std::to_string(c.problem.k);
        const std::vector<float> a = random_matrix(m, c.problem.k, 13);
        std::vector<float> out(static_cast<size_t>(m * c.problem.n),
                               std::numeric_limits<float>::quiet_NaN());
        plain.symbol<GemmFn>("gemm")(m, a.data(), prepared.data(), out.data());
        expect_matches(a, b, out, m, c.problem.n, c.problem.k, nullptr, what);
        std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
        fused.symbol<GemmBiasFn>("gemm_bias_relu")(m, a.data(), prepared.data(), out.data(),
                                                   bias.data());
        expect_matches(a, b, out, m, c.problem.n, c.problem.k, bias.data(),
                       what + " with bias + relu");
      }
    }
  }
}

}  // namespace
}  // namespace kiln::autotune
