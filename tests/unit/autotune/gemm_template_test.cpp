// The C++ GEMM template (src/autotune/gemm_template.h): kernels rendered for several configs are
// compiled through the code cache (-O3 -march=x86-64-v3 -fopenmp; AVX-512 configs turn their ISA
// on with #pragma GCC target and run only on hosts that have it), loaded and compared with a
// double-precision reference at awkward sizes (M, N, K of 1, not multiples of the blocks, more
// than one block of each), with and without a bias + Relu epilogue.
//
// Tolerance: |C - ref| <= 8 * eps(float32) * sqrt(K) * sum_k |A[m, k] * B[k, n]| + 1e-30, the
// usual bound for a float32 dot product whose rounding errors add like a random walk (the
// blocked kernel sums K in KC chunks and FMA chains, not in the reference's order).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "autotune/gemm_template.h"
#include "autotune/runtime_headers.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"
#include "support/error.h"

#include "test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

namespace fs = std::filesystem;

codecache::CompilerConfig test_compiler_config() {
  codecache::CompilerConfig config;
  config.flags = {"-O3", "-march=x86-64-v3", "-fopenmp", "-shared", "-fPIC", "-std=c++17"};
  add_runtime(config);
  return config;
}

// Checks C (M x N) against A @ B in double, then `epilogue` applied per element when given.
template <typename Epilogue>
void expect_matches(const std::vector<float>& a, const std::vector<float>& b,
                    const std::vector<float>& c, int64_t m, int64_t n, int64_t k,
                    const std::string& what, Epilogue epilogue) {
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
      const double expected = epilogue(sum, j);
      const double tolerance =
          8 * eps * std::sqrt(double(std::max<int64_t>(k, 1))) * magnitude + 1e-30;
      const double got = c[i * n + j];
      if (!(std::abs(got - expected) <= tolerance) && ++failures <= 5) {
        ADD_FAILURE() << what << ": C[" << i << ", " << j << "] = " << got << ", expected "
                      << expected << " (tolerance " << tolerance << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

void expect_matches(const std::vector<float>& a, const std::vector<float>& b,
                    const std::vector<float>& c, int64_t m, int64_t n, int64_t k,
                    const std::string& what) {
  expect_matches(a, b, c, m, n, k, what, [](double v, int64_t) { return v; });
}

// The test links libgomp itself (and asks it for the thread count) so that unloading a kernel
// library never unloads the OpenMP runtime under its idle worker threads.
int threads() { return omp_get_max_threads(); }

bool can_run(const GemmConfig& config) {
  return config.isa == TemplateIsa::kAvx2 || host_template_isa() == TemplateIsa::kAvx512;
}

// Small blocks so that little problems cross every block edge: more than one K block, M block
// and N block, with remainders in each; every register block, loop order, thread split and both
// ways of reading A.
std::vector<GemmConfig> small_block_configs() {
  std::vector<GemmConfig> configs;
  GemmConfig c6x16{.isa = TemplateIsa::kAvx2, .mr = 6, .nr = 16, .mc = 12, .nc = 32, .kc = 16};
  configs.push_back(c6x16);
  GemmConfig c4x24{.isa = TemplateIsa::kAvx2, .mr = 4, .nr = 24, .mc = 8, .nc = 48, .kc = 5};
  c4x24.loop_order = GemmLoopOrder::kMrOuter;
  c4x24.thread_split = GemmThreadSplit::kM;
  configs.push_back(c4x24);
  GemmConfig c8x8{.isa = TemplateIsa::kAvx2, .mr = 8, .nr = 8, .mc = 16, .nc = 16, .kc = 32};
  c8x8.thread_split = GemmThreadSplit::kN;
  configs.push_back(c8x8);
  configs.push_back({.isa = TemplateIsa::kAvx2, .mr = 1, .nr = 48, .mc = 3, .nc = 48, .kc = 7});
  // A one-row block with its rows outermost, as the default runs it at batch 1.
  GemmConfig row1x64{.isa = TemplateIsa::kAvx512, .mr = 1, .nr = 64, .mc = 2, .nc = 128, .kc = 11};
  row1x64.loop_order = GemmLoopOrder::kMrOuter;
  row1x64.pack_a = false;
  configs.push_back(row1x64);
  configs.push_back(
      {.isa = TemplateIsa::kAvx512, .mr = 12, .nr = 32, .mc = 24, .nc = 64, .kc = 16});
  GemmConfig direct6x16 = c6x16;
  direct6x16.pack_a = false;
  configs.push_back(direct6x16);
  GemmConfig direct14x32{
      .isa = TemplateIsa::kAvx512, .mr = 14, .nr = 32, .mc = 28, .nc = 32, .kc = 8};
  direct14x32.pack_a = false;
  direct14x32.loop_order = GemmLoopOrder::kMrOuter;
  configs.push_back(direct14x32);
  GemmConfig c8x48{.isa = TemplateIsa::kAvx512, .mr = 8, .nr = 48, .mc = 16, .nc = 96, .kc = 9};
  c8x48.loop_order = GemmLoopOrder::kMrOuter;
  configs.push_back(c8x48);
  GemmConfig direct14x16{
      .isa = TemplateIsa::kAvx512, .mr = 14, .nr = 16, .mc = 28, .nc = 32, .kc = 16};
  direct14x16.pack_a = false;
  direct14x16.thread_split = GemmThreadSplit::kM;
  configs.push_back(direct14x16);
  GemmConfig direct7x48{
      .isa = TemplateIsa::kAvx512, .mr = 7, .nr = 48, .mc = 14, .nc = 48, .kc = 6};
  direct7x48.pack_a = false;
  configs.push_back(direct7x48);
  return configs;
}

TEST(GemmTemplate, PrepackPutsEachPanelWhereTheKernelReadsIt) {
  const GemmConfig config{
      .isa = TemplateIsa::kAvx2, .mr = 6, .nr = 16, .mc = 12, .nc = 32, .kc = 4};
  const GemmProblem problem{.n = 20, .k = 6};
  const std::vector<float> b = random_matrix(problem.k, problem.n, 1);
  const std::vector<float> packed = prepack_b(config, problem, b.data());
  ASSERT_EQ(static_cast<int64_t>(packed.size()), packed_b_size(config, problem));
  ASSERT_EQ(packed.size(), size_t{6 * 32});
  // K blocks of depth 4 and 2; N panels at 0 and 16 (the second 4 wide, then zeros).
  for (int64_t p = 0; p < problem.k; ++p) {
    const int64_t p0 = p / 4 * 4, kc = std::min<int64_t>(4, problem.k - p0);
    for (int64_t j = 0; j < 32; ++j) {
      const int64_t j0 = j / 16 * 16;
      const float expected = j < problem.n ? b[p * problem.n + j] : 0.0f;
      EXPECT_EQ(packed[p0 * 32 + j0 * kc + (p - p0) * 16 + (j - j0)], expected)
          << "k " << p << ", n " << j;
    }
  }
}

TEST(GemmTemplate, ConfigsAreValidAndTheDefaultComesFirst) {
  for (TemplateIsa isa : {TemplateIsa::kAvx2, TemplateIsa::kAvx512}) {
    for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{
             {128, 768, 768}, {1, 1000, 2048}, {3136, 64, 576}, {1, 1, 1}, {2048, 2048, 2048}}) {
      const GemmProblem problem{.n = n, .k = k};
      const std::vector<GemmConfig> configs = gemm_configs(m, problem, 2, isa);
      ASSERT_FALSE(configs.empty());
      EXPECT_EQ(configs.front(), gemm_default_config(m, problem, 2, isa));
      for (const GemmConfig& config : configs) {
        EXPECT_NO_THROW(check_gemm_config(config)) << config.name();
        EXPECT_TRUE(isa == TemplateIsa::kAvx512 || config.isa == TemplateIsa::kAvx2)
            << config.name();
      }
    }
  }
}

// The default's columns split evenly between the threads where a register block allows it: at N =
// 256 on 2 threads AVX2's 4 x 24 block would leave one thread 6 of 11 panels, 6 x 16 gives each 8.
// Where 4 x 24 splits evenly (N = 768: 16 panels each) it stays first.
TEST(GemmTemplate, DefaultSplitsTheColumnsEvenly) {
  const GemmConfig narrow = gemm_default_config(128, {.n = 256, .k = 1024}, 2, TemplateIsa::kAvx2);
  EXPECT_EQ(narrow.mr, 6) << narrow.name();
  EXPECT_EQ(narrow.nr, 16) << narrow.name();
  EXPECT_EQ(narrow.nc, 128) << narrow.name();
  const GemmConfig wide = gemm_default_config(128, {.n = 768, .k = 256}, 2, TemplateIsa::kAvx2);
  EXPECT_EQ(wide.mr, 4) << wide.name();
  EXPECT_EQ(wide.nc, 384) << wide.name();
}

// At batch 1 the default is a one-row block with its rows outermost (so without the next-panel
// prefetch): AVX-512's 1 x 64, AVX2's 1 x 32 where 1 x 48 would give a thread more columns (N =
// 256 on 2 threads: 128 against 144), and 1 x 48 where 1 x 64 pads N = 32 to 64.
TEST(GemmTemplate, DefaultAtBatchOneIsARowBlockWithRowsOutermost) {
  const GemmProblem mlp{.n = 256, .k = 3264};
  const GemmConfig wide = gemm_default_config(1, mlp, 2, TemplateIsa::kAvx512);
  EXPECT_EQ(wide.isa, TemplateIsa::kAvx512) << wide.name();
  EXPECT_EQ(wide.mr, 1) << wide.name();
  EXPECT_EQ(wide.nr, 64) << wide.name();
  EXPECT_EQ(wide.loop_order, GemmLoopOrder::kMrOuter) << wide.name();
  const GemmConfig avx2 = gemm_default_config(1, mlp, 2, TemplateIsa::kAvx2);
  EXPECT_EQ(avx2.nr, 32) << avx2.name();
  EXPECT_EQ(avx2.loop_order, GemmLoopOrder::kMrOuter) << avx2.name();
  const GemmConfig narrow = gemm_default_config(1, {.n = 32, .k = 128}, 2, TemplateIsa::kAvx512);
  EXPECT_EQ(narrow.isa, TemplateIsa::kAvx2) << narrow.name();
  EXPECT_EQ(narrow.nr, 48) << narrow.name();
  // Taller problems keep their blocks and order.
  const GemmConfig tall = gemm_default_config(128, mlp, 2, TemplateIsa::kAvx512);
  EXPECT_GT(tall.mr, 1) << tall.name();
  EXPECT_EQ(tall.loop_order, GemmLoopOrder::kNrOuter) << tall.name();
}

TEST(GemmTemplate, BadConfigsAreRejected) {
  EXPECT_THROW(check_gemm_config({.isa = TemplateIsa::kAvx2, .mr = 6, .nr = 12}), InternalError);
  EXPECT_THROW(check_gemm_config({.isa = TemplateIsa::kAvx2, .mr = 8, .nr = 16}), InternalError);
  EXPECT_THROW(check_gemm_config({.isa = TemplateIsa::kAvx2, .mr = 6, .nr = 16, .mc = 100}),
               InternalError);
  EXPECT_THROW(check_gemm_config({.isa = TemplateIsa::kAvx2, .mr = 6, .nr = 16, .nc = 100}),
               InternalError);
  EXPECT_THROW(
      check_gemm_config({.isa = TemplateIsa::kAvx2, .mr = 6, .nr = 16, .mc = 960, .kc = 4096}),
      InternalError);
}

// Every small-block config, compiled once per (N, K), run at several M (M is a run-time argument).
TEST(GemmTemplate, MatchesTheReferenceAtAwkwardSizes) {
  codecache::CodeCache cache(fresh_dir() / "cache");
  // 67 x 301 (80 KB of B) is above the size where the panels-outer kernels prefetch the next
  // panel, with K a multiple of no block's prefetch stride.
  const std::vector<std::pair<int64_t, int64_t>> nks = {{1, 1},  {7, 17},   {17, 1},
                                                        {1, 67}, {67, 301}, {50, 33}};
  const std::vector<int64_t> ms = {1, 7, 17, 67};
  std::vector<codecache::LibrarySpec> specs;
  std::vector<std::pair<GemmConfig, GemmProblem>> cases;
  for (const GemmConfig& config : small_block_configs()) {
    if (!can_run(config)) continue;
    for (const auto& [n, k] : nks) {
      const GemmProblem problem{.n = n, .k = k};
      const std::string source = render_gemm(config, problem, "gemm");
      if (n * k * 4 > (64 << 10)) {
        EXPECT_EQ(source.find("_MM_HINT_T1") != std::string::npos,
                  config.loop_order == GemmLoopOrder::kNrOuter)
            << config.name();
      }
      specs.push_back({{{"gemm.cpp", source}}, test_compiler_config()});
      cases.emplace_back(config, problem);
    }
  }
  const std::vector<fs::path> libraries = cache.compile_many(specs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [config, problem] = cases[i];
    codecache::LoadedLibrary library(libraries[i]);
    auto* gemm = library.symbol<GemmFn>("gemm");
    const std::vector<float> b = random_matrix(problem.k, problem.n, 7);
    const std::vector<float> packed = prepack_b(config, problem, b.data());
    for (int64_t m : ms) {
      const std::vector<float> a = random_matrix(m, problem.k, 11);
      std::vector<float> c(static_cast<size_t>(m * problem.n), std::nanf(""));
      gemm(m, a.data(), packed.data(), c.data());
      expect_matches(a, b, c, m, problem.n, problem.k,
                     config.name() + " M=" + std::to_string(m) + " N=" + std::to_string(problem.n) +
                         " K=" + std::to_string(problem.k));
    }
  }
}

// The heuristic defaults at real blocks (K spanning several K blocks, N several N blocks), each
// run at its M hint and at other M (M is a run-time argument: a symbolic batch later).
TEST(GemmTemplate, DefaultConfigsMatchTheReference) {
  codecache::CodeCache cache(fresh_dir() / "cache");
  const std::vector<std::array<int64_t, 3>> shapes = {
      {67, 131, 300}, {200, 67, 1}, {1, 1000, 257}, {250, 600, 700}};
  std::vector<codecache::LibrarySpec> specs;
  std::vector<GemmConfig> configs;
  for (const auto& [m, n, k] : shapes) {
    configs.push_back(gemm_default_config(m, {.n = n, .k = k}, threads(), host_template_isa()));
    specs.push_back({{{"gemm.cpp", render_gemm(configs.back(), {.n = n, .k = k}, "gemm")}},
                     test_compiler_config()});
  }
  const std::vector<fs::path> libraries = cache.compile_many(specs);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& [m_hint, n, k] = shapes[i];
    codecache::LoadedLibrary library(libraries[i]);
    auto* gemm = library.symbol<GemmFn>("gemm");
    const std::vector<float> b = random_matrix(k, n, 4);
    const std::vector<float> packed = prepack_b(configs[i], {.n = n, .k = k}, b.data());
    for (int64_t m : {m_hint, int64_t{1}, int64_t{13}, 2 * m_hint + 5}) {
      const std::vector<float> a = random_matrix(m, k, 3);
      std::vector<float> c(static_cast<size_t>(m * n), std::nanf(""));
      gemm(m, a.data(), packed.data(), c.data());
      expect_matches(a, b, c, m, n, k, configs[i].name() + " M=" + std::to_string(m));
    }
  }
}

TEST(GemmTemplate, BiasReluEpilogueIsAppliedOnceAfterTheLastKBlock) {
  codecache::CodeCache cache(fresh_dir() / "cache");
  // Through the tile on the stack (scalar form only) and in registers (with the vector form;
  // edge tiles still take the stack).
  const TemplateEpilogue scalar{
      .expr = "std::max(v + bias[n], 0.0f)", .args = {"bias"}, .vector_expr = {}};
  const TemplateEpilogue vector{
      .expr = scalar.expr,
      .args = scalar.args,
      .vector_expr = "kv_max(kv_add(v, kv_load(bias + n0)), kv_set1(0.0f))"};
  // K = 40 spans three K blocks of the 6x16 config (KC 16) and one of the 8x8 config.
  const GemmProblem problem{.n = 37, .k = 40};
  std::vector<std::string> names;
  std::vector<GemmConfig> configs;
  std::vector<codecache::LibrarySpec> specs;
  for (const GemmConfig& config : small_block_configs()) {
    if (!can_run(config)) continue;
    for (const TemplateEpilogue* epilogue : {&scalar, &vector}) {
      configs.push_back(config);
      names.push_back(config.name() + (epilogue == &vector ? " vector" : " scalar"));
      specs.push_back({{{"gemm.cpp", render_gemm(config, problem, "gemm_bias_relu", *epilogue)}},
                       test_compiler_config()});
    }
  }
  const std::vector<fs::path> libraries = cache.compile_many(specs);
  const std::vector<float> b = random_matrix(problem.k, problem.n, 5);
  const std::vector<float> bias = random_matrix(1, problem.n, 6);
  for (size_t i = 0; i < configs.size(); ++i) {
    codecache::LoadedLibrary library(libraries[i]);
    auto* gemm = library.symbol<GemmBiasFn>("gemm_bias_relu");
    const std::vector<float> packed = prepack_b(configs[i], problem, b.data());
    for (int64_t m : {1, 13, 30}) {
      const std::vector<float> a = random_matrix(m, problem.k, 9);
      std::vector<float> c(static_cast<size_t>(m * problem.n), std::nanf(""));
      gemm(m, a.data(), packed.data(), c.data(), bias.data());
      expect_matches(a, b, c, m, problem.n, problem.k,
                     names[i] + " bias+relu M=" + std::to_string(m),
                     [&](double v, int64_t n) { return std::max(v + bias[n], 0.0); });
    }
  }
}

TEST(GemmTemplate, EmptyKWritesTheEpilogueOfZero) {
  codecache::CodeCache cache(fresh_dir() / "cache");
  const GemmConfig config = gemm_default_config(5, {.n = 9, .k = 0}, 2, TemplateIsa::kAvx2);
  const TemplateEpilogue epilogue{
      .expr = "v + bias[n]", .args = {"bias"}, .vector_expr = "kv_add(v, kv_load(bias + n0))"};
  codecache::LoadedLibrary library(cache.compile_shared_library(
      render_gemm(config, {.n = 9, .k = 0}, "gemm", epilogue), test_compiler_config()));
  auto* gemm = library.symbol<GemmBiasFn>("gemm");
  const std::vector<float> bias = random_matrix(1, 9, 2);
  std::vector<float> c(5 * 9, std::nanf(""));
  gemm(5, nullptr, nullptr, c.data(), bias.data());
  for (int64_t i = 0; i < 5 * 9; ++i) EXPECT_EQ(c[i], bias[i % 9]);
}

TEST(GemmTemplate, RenderedSourceIsReadable) {
  const GemmConfig config{
      .isa = TemplateIsa::kAvx2, .mr = 6, .nr = 16, .mc = 96, .nc = 768, .kc = 256};
  const std::string source = render_gemm(config, {.n = 768, .k = 768}, "kiln_gemm_0");
  EXPECT_NE(source.find("extern \"C\" void kiln_gemm_0(int64_t M, const float* A, const float* "
                        "Bp, float* C)"),
            std::string::npos);
  EXPECT_NE(source.find("c5_1 = _mm256_fmadd_ps(a5, b1, c5_1);"), std::string::npos);
  EXPECT_EQ(source.find("c6_0"), std::string::npos);
  // The (N block, M block) tiles are shared out on Kiln's pool (kiln_rt_pool.h).
  EXPECT_NE(source.find("kiln_rt::parallel_for(parallel, n_blocks * m_blocks,"), std::string::npos);
}

}  // namespace
}  // namespace kiln::autotune
