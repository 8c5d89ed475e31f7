// Kiln's tensor-core GEMM template (codegen/cuda/cuda_gemm_template.h, issue 19 item 4).
// Without a GPU: its tile table is the runtime's; the index algebra of its tile copies, fragment
// loads and accumulator stores, replayed on the host against the PTX ISA's fragment layouts of
// mma.m16n8k8 / m16n8k16, computes the product (every element once); NVRTC compiles every
// configuration at every precision for sm_80 and sm_90; a cached template choice faster than
// cuBLASLt's is baked into the wrapper and the module carries the kernels, and a compile without
// one is unchanged. With a GPU: every configuration, with and without split-K, at TF32, float16
// and bfloat16, matches a double reference at awkward sizes with each epilogue.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "autotune/cuda_choice.h"
#include "codegen/cuda/cuda_gemm_template.h"
#include "codegen/cuda/cuda_kernel.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "cuda_test_util.h"
#include "driver/compile.h"
#include "model_builder.h"
#include "runtime/kiln_half.h"
#include "runtime/kiln_rt_cuda.h"
#include "support/files.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;
using codegen::CudaGemmConfig;
using codegen::CudaGemmPrecision;
using graph::DType;
using graph::Tensor;
using graph::Value;
using test_models::ModelBuilder;

using namespace cuda_test;  // NOLINT: the shared fixtures

TEST(CudaGemmTemplate, ConfigurationsAreTheRuntimes) {
  const std::vector<CudaGemmConfig>& configs = codegen::cuda_gemm_configs();
  ASSERT_EQ(configs.size(), static_cast<size_t>(kiln_cuda::kGemmConfigCount));
  for (size_t c = 0; c < configs.size(); ++c) {
    const kiln_cuda::GemmConfig& r = kiln_cuda::kGemmConfigs[c];
    EXPECT_EQ(configs[c].bm, r.bm) << c;
    EXPECT_EQ(configs[c].bn, r.bn) << c;
    EXPECT_EQ(configs[c].bk, r.bk) << c;
    EXPECT_EQ(configs[c].warps_m, r.warps_m) << c;
    EXPECT_EQ(configs[c].warps_n, r.warps_n) << c;
    EXPECT_EQ(configs[c].stages, r.stages) << c;
    // Whole mma tiles per warp, whole 16-byte chunks per tile row.
    EXPECT_EQ(r.bm % (16 * r.warps_m), 0) << c;
    EXPECT_EQ(r.bn % (8 * r.warps_n), 0) << c;
    EXPECT_EQ(r.bk % 16, 0) << c;
    // Within what an A100 block may have (163 KiB), at 4-byte elements and either B layout.
    EXPECT_LE(kiln_cuda::gemm_shared_bytes(r, 4, true), 163 * 1024) << c;
    EXPECT_LE(kiln_cuda::gemm_shared_bytes(r, 4, false), 163 * 1024) << c;
  }
}

// ---- The kernel's index algebra on the host --------------------------------------------------

/// Where the PTX ISA puts the elements of one mma's fragments (lane = 4 g + t): for A (16 x KM),
/// register `reg` of `lane` holds element `half` (0 for TF32) at the returned (row, col); for B
/// (KM x 8) at (k, n); for the accumulator C (16 x 8) element e at (row, col).
struct Ptx {
  bool half;  // m16n8k16 (f16/bf16, two elements a register) or m16n8k8 (tf32)
  int k() const { return half ? 16 : 8; }
  std::pair<int, int> a(int lane, int reg, int h) const {
    const int g = lane / 4, t = lane % 4;
    if (!half) return {g + 8 * (reg % 2), t + 4 * (reg / 2)};
    return {g + 8 * (reg % 2), 2 * t + h + 8 * (reg / 2)};
  }
  std::pair<int, int> b(int lane, int reg, int h) const {
    const int g = lane / 4, t = lane % 4;
    if (!half) return {t + 4 * reg, g};
    return {2 * t + h + 8 * reg, g};
  }
  static std::pair<int, int> c(int lane, int e) {
    return {lane / 4 + 8 * (e / 2), 2 * (lane % 4) + e % 2};
  }
};

TEST(CudaGemmTemplate, PtxFragmentLayoutsCoverEachTileOnce) {
  for (bool half : {false, true}) {
    const Ptx ptx{half};
    const int per = half ? 2 : 1;
    std::vector<int> a(16 * ptx.k(), 0), b(ptx.k() * 8, 0), c(16 * 8, 0);
    for (int lane = 0; lane < 32; ++lane) {
      for (int reg = 0; reg < 4; ++reg)
        for (int h = 0; h < per; ++h) {
          auto [r, k] = ptx.a(lane, reg, h);
          ++a.at(static_cast<size_t>(r * ptx.k() + k));
        }
      for (int reg = 0; reg < 2; ++reg)
        for (int h = 0; h < per; ++h) {
          auto [k, n] = ptx.b(lane, reg, h);
          ++b.at(static_cast<size_t>(k * 8 + n));
        }
      for (int e = 0; e < 4; ++e) {
        auto [r, n] = Ptx::c(lane, e);
        ++c.at(static_cast<size_t>(r * 8 + n));
      }
    }
    for (int v : a) EXPECT_EQ(v, 1) << half;
    for (int v : b) EXPECT_EQ(v, 1) << half;
    for (int v : c) EXPECT_EQ(v, 1) << half;
  }
}

/// The template's kernel replayed on the host, statement for statement where it computes an
/// index (load_tile, frag_a, frag_b, the accumulator's store and the split-K reduction), each
/// mma computed from the fragments through the PTX layouts above. Shared memory starts as NaN,
/// so that a fragment read of an element no copy wrote poisons the result. Returns out
/// (M x N, row-major) and counts each element's stores in `stores`.
std::vector<float> emulate(const kiln_cuda::GemmConfig& c, bool half, bool b_nk, int64_t m,
                           int64_t n, int64_t k, const std::vector<float>& a,
                           const std::vector<float>& b, int64_t splits_wanted,
                           std::vector<int>& stores) {
  const Ptx ptx{half};
  const int elem = half ? 2 : 4;
  const int pad = 16 / elem, chunk = 16 / elem;
  const int stride_a = c.bk + pad, stride_b = b_nk ? c.bk + pad : c.bn + 8;
  const int64_t lda = k, ldb = b_nk ? k : n, ldo = n;
  int64_t piece = (k + c.bk - 1) / c.bk * c.bk, splits = 1;
  if (splits_wanted > 1) {
    piece = ((k + c.bk - 1) / c.bk + splits_wanted - 1) / splits_wanted * c.bk;
    splits = (k + piece - 1) / piece;
  }
  std::vector<float> partial(static_cast<size_t>(splits * m * n), 0.0f), out(m * n, 0.0f);
  stores.assign(static_cast<size_t>(m * n), 0);
  // load_tile: ROWS x COLS from g[(row0 + r) * ld + col0 + c], zeros out of bounds.
  auto load_tile = [&](std::vector<float>& s, const std::vector<float>& g, int rows, int cols,
                       int stride, int64_t ld, int64_t row0, int64_t row_end, int64_t col0,
                       int64_t col_end) {
    const int per_row = cols / chunk;
    for (int ci = 0; ci < rows * per_row; ++ci) {
      const int r = ci / per_row, cc = (ci % per_row) * chunk;
      const int64_t row = row0 + r, col = col0 + cc;
      int64_t valid = row < row_end ? col_end - col : 0;
      valid = std::clamp<int64_t>(valid, 0, chunk);
      for (int e = 0; e < chunk; ++e)
        s.at(static_cast<size_t>(r * stride + cc + e)) =
            e < valid ? g.at(static_cast<size_t>(row * ld + col + e)) : 0.0f;
    }
  };
  const int warps = c.warps_m * c.warps_n, mi_count = c.bm / c.warps_m / 16,
            ni_count = c.bn / c.warps_n / 8;
  for (int64_t z = 0; z < splits; ++z)
    for (int64_t by = 0; by < (m + c.bm - 1) / c.bm; ++by)
      for (int64_t bx = 0; bx < (n + c.bn - 1) / c.bn; ++bx) {
        const int64_t piece_index = z, m0 = by * c.bm, n0 = bx * c.bn;
        const int64_t kbeg = piece_index * piece, kend = std::min(k, kbeg + piece);
        const int ktiles = kend > kbeg ? static_cast<int>((kend - kbeg + c.bk - 1) / c.bk) : 0;
        std::vector<float> acc(static_cast<size_t>(warps * mi_count * ni_count * 32 * 4), 0.0f);
        for (int kt = 0; kt < ktiles; ++kt) {
          std::vector<float> sa(static_cast<size_t>(c.bm * stride_a), NAN),
              sb(static_cast<size_t>(b_nk ? c.bn * stride_b : c.bk * stride_b), NAN);
          const int64_t k0 = kbeg + kt * c.bk;
          load_tile(sa, a, c.bm, c.bk, stride_a, lda, m0, m, k0, kend);
          if (b_nk) {
            load_tile(sb, b, c.bn, c.bk, stride_b, ldb, n0, n, k0, kend);
          } else {
            load_tile(sb, b, c.bk, c.bn, stride_b, ldb, k0, kend, n0, n);
          }
          for (int warp = 0; warp < warps; ++warp) {
            const int wm = (warp / c.warps_n) * (c.bm / c.warps_m),
                      wn = (warp % c.warps_n) * (c.bn / c.warps_n);
            for (int kk = 0; kk < c.bk; kk += ptx.k()) {
              // Fragments as frag_a / frag_b read them: [lane][register][element].
              auto frag_a = [&](int lane, int row) {
                const int g = lane / 4, t = lane % 4;
                std::vector<float> f(8);
                auto at = [&](int r, int col) {
                  return sa.at(static_cast<size_t>((row + g + r) * stride_a + kk + col));
                };
                if (!half) {
                  f[0] = at(0, t);
                  f[2] = at(8, t);
                  f[4] = at(0, t + 4);
                  f[6] = at(8, t + 4);
                } else {
                  for (int h = 0; h < 2; ++h) {
                    f[0 + h] = at(0, 2 * t + h);
                    f[2 + h] = at(8, 2 * t + h);
                    f[4 + h] = at(0, 2 * t + 8 + h);
                    f[6 + h] = at(8, 2 * t + 8 + h);
                  }
                }
                return f;
              };
              auto frag_b = [&](int lane, int col) {
                const int g = lane / 4, t = lane % 4;
                std::vector<float> f(4);
                // Element (kq, nq) of the tile as the kernel addresses it.
                auto at = [&](int kq, int nq) {
                  return b_nk ? sb.at(static_cast<size_t>((col + nq) * stride_b + kk + kq))
                              : sb.at(static_cast<size_t>((kk + kq) * stride_b + col + nq));
                };
                if (!half) {
                  f[0] = at(t, g);
                  f[2] = at(t + 4, g);
                } else {
                  f[0] = at(2 * t, g);
                  f[1] = at(2 * t + 1, g);
                  f[2] = at(2 * t + 8, g);
                  f[3] = at(2 * t + 9, g);
                }
                return f;
              };
              for (int i = 0; i < mi_count; ++i)
                for (int j = 0; j < ni_count; ++j) {
                  // The mma: A and B put together from the lanes' registers by the PTX layouts.
                  std::vector<double> am(16 * 16, 0), bm(16 * 8, 0);
                  for (int lane = 0; lane < 32; ++lane) {
                    const std::vector<float> fa = frag_a(lane, wm + i * 16);
                    const std::vector<float> fb = frag_b(lane, wn + j * 8);
                    for (int reg = 0; reg < 4; ++reg)
                      for (int h = 0; h < (half ? 2 : 1); ++h) {
                        auto [r, q] = ptx.a(lane, reg, h);
                        am[static_cast<size_t>(r * 16 + q)] = fa[static_cast<size_t>(2 * reg + h)];
                      }
                    for (int reg = 0; reg < 2; ++reg)
                      for (int h = 0; h < (half ? 2 : 1); ++h) {
                        auto [q, col] = ptx.b(lane, reg, h);
                        bm[static_cast<size_t>(q * 8 + col)] = fb[static_cast<size_t>(2 * reg + h)];
                      }
                  }
                  for (int lane = 0; lane < 32; ++lane)
                    for (int e = 0; e < 4; ++e) {
                      auto [r, col] = Ptx::c(lane, e);
                      double sum = 0;
                      for (int q = 0; q < ptx.k(); ++q)
                        sum += am[static_cast<size_t>(r * 16 + q)] *
                               bm[static_cast<size_t>(q * 8 + col)];
                      acc[static_cast<size_t>(
                          (((warp * mi_count + i) * ni_count + j) * 32 + lane) * 4 + e)] +=
                          static_cast<float>(sum);
                    }
                }
            }
          }
        }
        // The store: accumulator e of tile (i, j) at row g (+8 for e >= 2), column 2t + (e & 1).
        for (int warp = 0; warp < warps; ++warp) {
          const int wm = (warp / c.warps_n) * (c.bm / c.warps_m),
                    wn = (warp % c.warps_n) * (c.bn / c.warps_n);
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, t = lane % 4;
            for (int i = 0; i < mi_count; ++i)
              for (int j = 0; j < ni_count; ++j)
                for (int e = 0; e < 4; ++e) {
                  const int64_t row = m0 + wm + i * 16 + g + (e >= 2 ? 8 : 0);
                  const int64_t col = n0 + wn + j * 8 + 2 * t + (e & 1);
                  if (row >= m || col >= n) continue;
                  const float v = acc[static_cast<size_t>(
                      (((warp * mi_count + i) * ni_count + j) * 32 + lane) * 4 + e)];
                  partial[static_cast<size_t>((piece_index * m + row) * n + col)] = v;
                  if (piece_index == 0) ++stores[static_cast<size_t>(row * ldo + col)];
                }
          }
        }
      }
  // The reduction (one piece: the store itself).
  for (int64_t i = 0; i < m * n; ++i) {
    float sum = 0;
    for (int64_t s = 0; s < splits; ++s) sum += partial[static_cast<size_t>(s * m * n + i)];
    out[static_cast<size_t>(i)] = sum;
  }
  return out;
}

TEST(CudaGemmTemplate, HostReplayOfTheIndexAlgebraComputesTheProduct) {
  struct Case {
    int config;
    int64_t m, n, k, splits;
  };
  // Odd sizes: partial tiles in M, N and K, K shorter than a slice, split pieces of K.
  const Case cases[] = {{2, 7, 100, 17, 1},   {3, 33, 70, 45, 1}, {1, 70, 130, 96, 2},
                        {0, 129, 136, 40, 1}, {3, 1, 8, 1, 1},    {2, 65, 9, 200, 4}};
  for (const Case& cs : cases)
    for (bool half : {false, true})
      for (bool b_nk : {false, true}) {
        std::vector<float> a(static_cast<size_t>(cs.m * cs.k)), b(static_cast<size_t>(cs.k * cs.n));
        for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(std::sin(0.7 * i + 0.1));
        for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(std::cos(0.3 * i + 0.2));
        std::vector<int> stores;
        const std::vector<float> out = emulate(kiln_cuda::kGemmConfigs[cs.config], half, b_nk, cs.m,
                                               cs.n, cs.k, a, b, cs.splits, stores);
        for (int64_t i = 0; i < cs.m; ++i)
          for (int64_t j = 0; j < cs.n; ++j) {
            double ref = 0;
            for (int64_t q = 0; q < cs.k; ++q) {
              const double bv = b_nk ? b[static_cast<size_t>(j * cs.k + q)]
                                     : b[static_cast<size_t>(q * cs.n + j)];
              ref += a[static_cast<size_t>(i * cs.k + q)] * bv;
            }
            const size_t at = static_cast<size_t>(i * cs.n + j);
            ASSERT_EQ(stores[at], 1) << cs.config << " " << i << "," << j;
            // float32 sums of at most 200 products of magnitude <= 1.
            ASSERT_NEAR(out[at], ref, 1e-4) << "config " << cs.config << " half " << half
                                            << " b_nk " << b_nk << " at " << i << "," << j;
          }
      }
}

TEST(CudaGemmTemplate, NvrtcCompilesEveryConfigurationAndPrecisionForSm80AndSm90) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  const std::string source =
      codegen::cuda_kernel_prelude() +
      codegen::cuda_gemm_template_source(
          {CudaGemmPrecision::kTf32, CudaGemmPrecision::kF16, CudaGemmPrecision::kBf16});
  // The same text every time (no model's names in it).
  EXPECT_EQ(source,
            codegen::cuda_kernel_prelude() +
                codegen::cuda_gemm_template_source(
                    {CudaGemmPrecision::kBf16, CudaGemmPrecision::kF16, CudaGemmPrecision::kTf32}));
  for (CudaGemmPrecision p :
       {CudaGemmPrecision::kTf32, CudaGemmPrecision::kF16, CudaGemmPrecision::kBf16}) {
    for (int c = 0; c < kiln_cuda::kGemmConfigCount; ++c)
      for (bool nk : {false, true})
        EXPECT_EQ(count(source, "void __launch_bounds__(" +
                                    std::to_string(32 * kiln_cuda::kGemmConfigs[c].warps_m *
                                                   kiln_cuda::kGemmConfigs[c].warps_n) +
                                    ") " + codegen::cuda_gemm_kernel_name(p, c, nk) + "("),
                  1u);
    EXPECT_EQ(count(source,
                    std::string("kiln_gemm_reduce_") + codegen::cuda_gemm_precision_name(p) + "("),
              1u);
  }
  // A compile error is an internal error quoting NVRTC's log. The cubins are kept in the build
  // folder's code cache (keyed by the source, the architecture and NVRTC's version): a rerun
  // with the same template and NVRTC takes them from there.
  const std::vector<codegen::CudaBinary> binaries = codegen::nvrtc_compile(
      source, {80, 90}, fs::path(KILN_BUILD_DIR) / "test-tmp" / "driver" / "gemm-template-nvrtc");
  ASSERT_EQ(binaries.size(), 2u);
  EXPECT_EQ(binaries[0].arch, 80);
  EXPECT_EQ(binaries[1].arch, 90);
  for (const codegen::CudaBinary& b : binaries) EXPECT_GT(b.cubin.size(), 1000u);
}

// ---- A cached template choice, baked ----------------------------------------------------------

/// x [7, 64] -> MatMul [64, 100] + bias -> Relu: one cuBLASLt call with epilogue RELU_BIAS.
graph::Model matmul_bias_relu() {
  ModelBuilder m(17);
  Value* x = m.input("x", DType::kFloat32, {sym::Expr(7), sym::Expr(64)});
  Value* y = m.op(
      "Add", {m.op("MatMul", {x, m.constant(filled({64, 100}, 1))}), m.constant(filled({100}, 2))});
  m.output(m.op("Relu", {y}));
  return std::move(m.model);
}

std::string matmul_problem() {
  const int64_t sizes[] = {7, 100}, a[] = {64, 1}, b[] = {100, 1}, out[] = {100, 1};
  return kiln_cuda::matmul_problem_text({2, sizes, 64, a, b, out}, "f32", true,
                                        kiln_cuda::Epilogue::kReluBias, false);
}

/// compile_cuda_dumped with one code cache for all the test's compiles (the template's kernels
/// are compiled once).
Compiled compile_dumped(const graph::Model& model, const fs::path& dir, const fs::path& cache) {
  if (!has_cuda_device()) setenv("KILN_CUDA_ARCHS", "90", 1);
  CompileOptions options;
  options.device = ir::Device::kCuda;
  options.dump_dir = dir / "dump";
  options.cache_dir = cache;
  CompiledModel compiled = compile(model, options);
  unsetenv("KILN_CUDA_ARCHS");
  return {std::move(compiled), files::read(dir / "dump" / "5_kernels.cu"),
          files::read(dir / "dump" / "5_wrapper.cpp")};
}

TEST(CudaGemmTemplate, CachedTemplateChoiceFasterThanCublasLtIsBaked) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const Env gpu_env("KILN_AUTOTUNE_GPU", "Test GPU");
  const graph::Model model = matmul_bias_relu();
  const Compiled plain = compile_dumped(model, dir.path / "plain", dir.path / "cache");
  EXPECT_EQ(plain.kernels.find("kiln_gemm"), std::string::npos);
  EXPECT_NE(plain.wrapper.find("const int64_t b_strides[] = {100, 1};"), std::string::npos)
      << plain.wrapper;

  // The runtime's report of one tuned run: cuBLASLt's best 0.02 ms, the template's choice 5
  // (64x64x32, split-K) 0.01 ms, its choice 4 failed.
  files::write_atomic(dir.path / "report.txt",
                      "cublaslt\t" + matmul_problem() + "\tTest GPU\t90\t130100\t0\t0.02,0.03\n" +
                          "kiln_gemm\t" + matmul_problem() + "\tTest GPU\t90\t1\t5\t" +
                          "0.05,0.04,0.03,0.025,-1,0.01,0.02,0.015\n");
  autotune::AutotuneCache cache(dir.path / "autotune.json");
  ASSERT_EQ(autotune::store_cuda_tune_report(dir.path / "report.txt", cache), 2u);
  const Compiled baked = compile_dumped(model, dir.path / "baked", dir.path / "cache");
  EXPECT_NE(baked.wrapper.find("state.cuda.gemm_template_choice(0, 5, 1);  // autotune cache: "
                               "Kiln's GEMM template 64x64x32 split-K, sm_90"),
            std::string::npos)
      << baked.wrapper;
  EXPECT_EQ(baked.wrapper.find("library_choice("), std::string::npos) << baked.wrapper;
  EXPECT_EQ(count(baked.kernels, "extern \"C\" __global__ void __launch_bounds__"),
            count(plain.kernels, "extern \"C\" __global__ void __launch_bounds__") + 9u);
  EXPECT_NE(baked.kernels.find("kiln_gemm_tf32_c2_kn(kiln_gemm::Params p)"), std::string::npos);
  EXPECT_EQ(baked.kernels.find("kiln_gemm_f16"), std::string::npos);
  // Deterministic for a given cache.
  EXPECT_EQ(compile_dumped(model, dir.path / "again", dir.path / "cache").wrapper, baked.wrapper);

  // cuBLASLt faster: its algorithm is baked, the template only carried.
  files::write_atomic(dir.path / "report2.txt",
                      "kiln_gemm\t" + matmul_problem() + "\tTest GPU\t90\t1\t5\t" +
                          "0.05,0.04,0.03,0.025,-1,0.03,0.02,0.015\n" + "cublaslt\t" +
                          matmul_problem() + "\tTest GPU\t90\t130100\t1\t0.02,0.01\n");
  ASSERT_EQ(autotune::store_cuda_tune_report(dir.path / "report2.txt", cache), 2u);
  const Compiled library = compile_dumped(model, dir.path / "library", dir.path / "cache");
  EXPECT_NE(library.wrapper.find("state.cuda.library_choice(false, 0, 1, 130100);"),
            std::string::npos)
      << library.wrapper;
  EXPECT_EQ(library.wrapper.find("gemm_template_choice("), std::string::npos);
}

// ---- On the GPU: every configuration against a double reference -------------------------------

/// One product for the GPU test: [batch] x M x N x K, B broadcast over the batch or not.
struct Shape {
  int64_t m, n, k, batch;
  bool b_broadcast;
};

/// `v` rounded to TF32 as the template's cvt.rna.tf32.f32 rounds it (10 mantissa bits, to the
/// nearest, ties away from zero): the values the tensor cores multiply. TF32 products are exact
/// in float32, so the reference of these inputs differs from the GPU's only by the float32 sums
/// (for inputs of full float32 precision the TF32 rounding alone gave errors up to 6% of max
/// |ref| on the H100, where the sums of these sines cancel).
float to_tf32(float v) {
  uint32_t bits = kiln::f32_bits(v);
  bits = (bits + 0x1000u) & ~0x1fffu;
  return kiln::f32_from_bits(bits);
}

uint16_t to_half(float v, bool bf16) {
  return bf16 ? kiln::float_to_bf16(v) : kiln::float_to_half(v);
}
float from_half(uint16_t v, bool bf16) {
  return bf16 ? kiln::bf16_to_float(v) : kiln::half_to_float(v);
}

/// Runs every template choice at `precision` over `shapes`, with both layouts of B and the
/// epilogues in turn, through RunState::matmul with the choice given as a cached one, and
/// compares with a double reference of the inputs as the GPU reads them: the largest error
/// relative to the reference's largest magnitude must stay under `tolerance`.
template <typename T>
void check_precision(CudaGemmPrecision precision, const std::vector<Shape>& shapes,
                     double tolerance) {
  constexpr bool half = std::is_same_v<T, uint16_t>;
  const bool bf16 = precision == CudaGemmPrecision::kBf16;
  TempDir dir;
  const std::vector<codegen::CudaBinary> binaries = codegen::nvrtc_compile(
      codegen::cuda_kernel_prelude() + codegen::cuda_gemm_template_source({precision}),
      codegen::cuda_target_archs(), dir.path / "cache");
  std::vector<kiln_cuda::Cubin> cubins;
  for (const codegen::CudaBinary& b : binaries)
    cubins.push_back({b.arch, reinterpret_cast<const unsigned char*>(b.cubin.data()), b.ptx});
  const char* const names[] = {nullptr};
  kiln_cuda::RunState state;
  state.reserve_library_workspace();
  state.begin_run(cubins.data(), cubins.size(), names, 1);
  const kiln_cuda::Epilogue epilogues[] = {
      kiln_cuda::Epilogue::kNone,     kiln_cuda::Epilogue::kRelu, kiln_cuda::Epilogue::kBias,
      kiln_cuda::Epilogue::kReluBias, kiln_cuda::Epilogue::kGelu, kiln_cuda::Epilogue::kGeluBias};
  int site = 0, ran_template = 0;
  for (size_t si = 0; si < shapes.size(); ++si) {
    const Shape& s = shapes[si];
    const int64_t bb = s.b_broadcast ? 1 : s.batch;
    // Inputs as the GPU reads them (rounded to the element type for the half types).
    auto values = [&](int64_t count, double salt) {
      std::vector<T> v(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        const float x = static_cast<float>(std::sin(0.61 * static_cast<double>(i) + salt));
        if constexpr (half) {
          v[static_cast<size_t>(i)] = to_half(x, bf16);
        } else {
          v[static_cast<size_t>(i)] = to_tf32(x);
        }
      }
      return v;
    };
    auto as_double = [&](T x) -> double {
      if constexpr (half) {
        return from_half(x, bf16);
      } else {
        return x;
      }
    };
    const std::vector<T> a = values(s.batch * s.m * s.k, 0.3), b = values(bb * s.k * s.n, 1.1),
                         bias = values(s.n, 2.0), residual = values(s.batch * s.m * s.n, 2.9);
    // The arena holds A, B (once; read as [K][N] or [N][K]), bias, residual and out.
    const int64_t elems =
        static_cast<int64_t>(a.size() + b.size() + bias.size() + 2 * residual.size()) + 5 * 64;
    char* arena = state.arena(elems * static_cast<int64_t>(sizeof(T)));
    T* da = reinterpret_cast<T*>(arena);
    T* db = da + (a.size() + 63) / 64 * 64;
    T* dbias = db + (b.size() + 63) / 64 * 64;
    T* dres = dbias + (bias.size() + 63) / 64 * 64;
    T* dout = dres + (residual.size() + 63) / 64 * 64;
    auto upload = [&](T* d, const std::vector<T>& h) {
      kiln_cuda::check(kiln_cuda::driver().cuMemcpyHtoDAsync(kiln_cuda::device_ptr(d), h.data(),
                                                             h.size() * sizeof(T), state.stream()),
                       "upload");
    };
    upload(da, a);
    upload(db, b);
    upload(dbias, bias);
    upload(dres, residual);
    std::vector<double> ad(a.size()), bd(b.size());
    for (size_t i = 0; i < a.size(); ++i) ad[i] = as_double(a[i]);
    for (size_t i = 0; i < b.size(); ++i) bd[i] = as_double(b[i]);
    for (bool b_nk : {false, true}) {
      // The products of the reference, before the epilogue: b is B [K][N] or its [N][K].
      std::vector<double> ref(static_cast<size_t>(s.batch * s.m * s.n));
      for (int64_t z = 0; z < s.batch; ++z)
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t j = 0; j < s.n; ++j) {
            double sum = 0;
            const int64_t zb = s.b_broadcast ? 0 : z;
            for (int64_t q = 0; q < s.k; ++q) {
              const int64_t bi = b_nk ? (zb * s.n + j) * s.k + q : (zb * s.k + q) * s.n + j;
              sum += ad[static_cast<size_t>((z * s.m + i) * s.k + q)] * bd[static_cast<size_t>(bi)];
            }
            ref[static_cast<size_t>((z * s.m + i) * s.n + j)] = sum;
          }
      const int64_t sizes[] = {s.batch, s.m, s.n};
      const int64_t a_strides[] = {s.m * s.k, s.k, 1};
      const int64_t b_strides[] = {s.b_broadcast ? 0 : s.k * s.n, b_nk ? 1 : s.n, b_nk ? s.k : 1};
      const int64_t out_strides[] = {s.m * s.n, s.n, 1};
      const kiln_cuda::MatMulShape shape{3, sizes, s.k, a_strides, b_strides, out_strides};
      for (int choice = 0; choice < kiln_cuda::kGemmTemplateChoices; ++choice) {
        const size_t combo = (si * 5 + static_cast<size_t>(choice) + (b_nk ? 3 : 0)) % 12;
        const kiln_cuda::Epilogue epilogue = epilogues[combo % 6];
        const bool with_residual = combo >= 6;
        const double alpha = combo % 5 == 0 ? 0.5 : 1.0;
        state.gemm_template_choice(site, choice, kiln_cuda::kGemmTemplateVersion);
        state.matmul<T>(site, shape, da, db, dout, alpha, epilogue, dbias,
                        with_residual ? dres : nullptr, true, "gemm template test", bf16);
        const kiln_cuda::GemmConfig& c = kiln_cuda::kGemmConfigs[choice / 2];
        const bool splits = kiln_cuda::gemm_splits(s.m, s.n, s.k, s.batch, c,
                                                   kiln_cuda::kLibraryWorkspaceBytes) > 1;
        // A split-K choice runs where the shape splits; elsewhere cuBLASLt runs instead.
        const bool expected = choice % 2 == 0 || splits;
        EXPECT_EQ(state.gemm_template_ran(site), expected ? choice : -1)
            << "choice " << choice << " shape " << si;
        ran_template += expected ? 1 : 0;
        ++site;
        std::vector<T> got(static_cast<size_t>(s.batch * s.m * s.n));
        state.download(got.data(), dout, static_cast<int64_t>(got.size()));
        state.synchronize("gemm template test");
        const bool with_bias = epilogue == kiln_cuda::Epilogue::kBias ||
                               epilogue == kiln_cuda::Epilogue::kReluBias ||
                               epilogue == kiln_cuda::Epilogue::kGeluBias;
        const int act =
            epilogue == kiln_cuda::Epilogue::kRelu || epilogue == kiln_cuda::Epilogue::kReluBias ? 1
            : epilogue == kiln_cuda::Epilogue::kGelu || epilogue == kiln_cuda::Epilogue::kGeluBias
                ? 2
                : 0;
        double scale = 0, worst = 0;
        std::vector<double> want(ref.size());
        for (size_t i = 0; i < ref.size(); ++i) {
          double v = alpha * ref[i];
          if (with_bias) v += as_double(bias[i % static_cast<size_t>(s.n)]);
          if (with_residual) v += as_double(residual[i]);
          if (act == 1) v = std::max(v, 0.0);
          if (act == 2)
            v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
          want[i] = v;
          scale = std::max(scale, std::abs(v));
        }
        for (size_t i = 0; i < ref.size(); ++i)
          worst = std::max(worst, std::abs(as_double(got[i]) - want[i]));
        EXPECT_LE(worst, tolerance * std::max(scale, 1e-3))
            << codegen::cuda_gemm_precision_name(precision) << " choice " << choice << " (config "
            << choice / 2 << (choice % 2 ? " split-K" : "") << ") B "
            << (b_nk ? "[N][K]" : "[K][N]") << " epilogue " << static_cast<int>(epilogue)
            << (with_residual ? " + residual" : "") << " batch " << s.batch << " M " << s.m << " N "
            << s.n << " K " << s.k << ": max error " << worst << " against max |ref| " << scale;
      }
    }
  }
  EXPECT_GT(ran_template, 0);
  state.end_run();
}

std::vector<Shape> awkward_shapes() {
  std::vector<Shape> shapes;
  for (int64_t m : {1, 7, 128, 129})
    for (int64_t n : {8, 100, 768})
      for (int64_t k : {1, 17, 768, 3072}) shapes.push_back({m, n, k, 1, false});
  shapes.push_back({7, 100, 17, 2, false});    // strided batch
  shapes.push_back({129, 768, 768, 2, true});  // B broadcast over the batch
  shapes.push_back({64, 64, 3072, 2, false});  // skinny: split-K with a batch
  return shapes;
}

// Tolerances (largest error over max |reference|, the reference computed in double from the
// inputs as the GPU multiplies them): TF32 1e-3 (float32 sums of K up to 3072), float16 2e-3 (the
// output's rounding, 2^-11, and float32 sums), bfloat16 1e-2 (the output's rounding, 2^-8).
TEST(CudaGemmTemplate, Tf32EveryChoiceMatchesADoubleReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  check_precision<float>(CudaGemmPrecision::kTf32, awkward_shapes(), 1e-3);
}

TEST(CudaGemmTemplate, Float16EveryChoiceMatchesADoubleReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  check_precision<uint16_t>(CudaGemmPrecision::kF16, awkward_shapes(), 2e-3);
}

TEST(CudaGemmTemplate, Bfloat16EveryChoiceMatchesADoubleReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  check_precision<uint16_t>(CudaGemmPrecision::kBf16, awkward_shapes(), 1e-2);
}

// With --autotune max the template's choices are timed beside cuBLASLt's algorithms and stored
// as a "kiln_gemm" entry of the same problem; the next compile bakes the faster of the two and
// its outputs match the tuned run's (TF32: 2e-3 of the largest magnitude).
TEST(CudaGemmTemplate, AutotuneMaxTimesTheTemplateBesideCublasLt) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const graph::Model model = matmul_bias_relu();
  const Tensor x = filled({7, 64}, 5);
  CompileOptions options;
  options.device = ir::Device::kCuda;
  options.autotune = autotune::AutotuneMode::kMax;
  options.cache_dir = dir.path / "cache";
  options.dump_dir = dir.path / "max";
  const std::vector<Tensor> tuned = compile(model, options).run({x});
  EXPECT_NE(files::read(dir.path / "max" / "5_kernels.cu").find("kiln_gemm_tf32_c0_kn"),
            std::string::npos);
  autotune::AutotuneCache cache(dir.path / "autotune.json");
  const std::string gpu = autotune::cuda_autotune_gpu();
  const auto blas = autotune::lookup_cuda_library_choice(cache, "cublaslt", matmul_problem(), gpu);
  const auto kiln = autotune::lookup_cuda_library_choice(cache, "kiln_gemm", matmul_problem(), gpu);
  ASSERT_TRUE(blas) << files::read(dir.path / "autotune.json");
  ASSERT_TRUE(kiln) << files::read(dir.path / "autotune.json");
  std::printf("cuBLASLt %.4f ms, Kiln's template choice %d %.4f ms\n", blas->ms, kiln->index,
              kiln->ms);
  options.autotune = autotune::AutotuneMode::kDefault;
  options.dump_dir = dir.path / "baked";
  const std::vector<Tensor> baked = compile(model, options).run({x});
  const std::string wrapper = files::read(dir.path / "baked" / "5_wrapper.cpp");
  EXPECT_EQ(count(wrapper, kiln->ms < blas->ms ? "state.cuda.gemm_template_choice("
                                               : "state.cuda.library_choice("),
            1u)
      << wrapper;
  const auto p = tuned.at(0).values<float>(), q = baked.at(0).values<float>();
  ASSERT_EQ(p.size(), q.size());
  double scale = 0;
  for (float v : p) scale = std::max(scale, std::abs(static_cast<double>(v)));
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], q[i], 2e-3 * scale + 1e-6) << i;
}

}  // namespace
}  // namespace kiln::driver
