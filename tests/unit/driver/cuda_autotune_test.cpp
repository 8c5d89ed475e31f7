// CUDA library choices through the autotune cache (autotune/cuda_choice.h, issue 18 item 3).
// Without a GPU: a cache entry for a product's or a convolution's problem (its key's problem
// text written by the runtime's own formatter, kiln_rt_cuda.h, from the shapes the wrapper
// passes) is baked into the wrapper as state.cuda.library_choice, and the wrapper differs from
// the one compiled without the cache by exactly those lines; --autotune off bakes nothing; a
// bogus cached choice is ignored with a warning. With a GPU: `--autotune max` times the
// candidates at the first run and stores them in the cache, a second compile from that cache
// bakes them and a third gives a byte-identical wrapper whose outputs match the first run's; a
// cached index the library does not list falls back to the heuristic's first with a note.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "autotune/cuda_choice.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "cuda_test_util.h"
#include "driver/compile.h"
#include "model_builder.h"
#include "runtime/kiln_rt_cuda.h"
#include "support/files.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;
using graph::Value;
using test_models::ModelBuilder;

using namespace cuda_test;  // NOLINT: the shared fixtures

/// x [2, 16, 6, 6] -> Conv 3x3 pad 1 + bias, Relu -> [2, 8, 6, 6] -> Flatten [2, 288]
/// -> MatMul [288, 10] + bias: one cuDNN and one cuBLASLt call.
graph::Model conv_then_matmul() {
  ModelBuilder m(17);
  Value* x =
      m.input("x", DType::kFloat32, {sym::Expr(2), sym::Expr(16), sym::Expr(6), sym::Expr(6)});
  Value* y = m.op("Conv", {x, m.constant(filled({8, 16, 3, 3}, 1)), m.constant(filled({8}, 2))},
                  {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  y = m.op("Flatten", {m.op("Relu", {y})});
  m.output(m.op(
      "Add", {m.op("MatMul", {y, m.constant(filled({288, 10}, 3))}), m.constant(filled({10}, 4))}));
  return std::move(m.model);
}

/// The problem texts of the model's two calls, as the runtime writes them in its report.
std::string matmul_problem() {
  const int64_t sizes[] = {2, 10}, a[] = {288, 1}, b[] = {10, 1}, out[] = {10, 1};
  return kiln_cuda::matmul_problem_text({2, sizes, 288, a, b, out}, "f32", true,
                                        kiln_cuda::Epilogue::kBias, false);
}
std::string conv_problem() {
  const int64_t x[] = {2, 16, 6, 6}, w[] = {8, 16, 3, 3}, y[] = {2, 8, 6, 6}, one[] = {1, 1};
  // The bias is in the cuDNN graph; the Relu stays a kernel with the Flatten after it.
  return kiln_cuda::conv_problem_text({2, x, w, y, one, one, one, one, false}, "f32", true, true,
                                      false, kiln_cuda::ConvActivation{});
}

std::string compile_wrapper(const graph::Model& model, const fs::path& dir,
                            std::optional<autotune::AutotuneMode> mode = std::nullopt) {
  return compile_cuda_dumped(model, dir, ir::Precision::kTf32, mode).wrapper;
}

TEST(CudaAutotune, CachedChoicesAreBakedIntoTheWrapperAndNothingElseChanges) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const Env gpu_env("KILN_AUTOTUNE_GPU", "Test GPU");
  const graph::Model model = conv_then_matmul();
  const std::string plain = compile_wrapper(model, dir.path / "plain");
  EXPECT_EQ(plain.find("library_choice"), std::string::npos) << plain;
  // The shapes the wrapper passes are those the problem texts above were written from.
  EXPECT_NE(plain.find("const int64_t a_strides[] = {288, 1};"), std::string::npos) << plain;
  EXPECT_NE(plain.find("const int64_t x_dims[] = {2, 16, 6, 6};"), std::string::npos) << plain;
  EXPECT_NE(plain.find("// cuDNN convolution + bias in its graph, TF32 allowed"), std::string::npos)
      << plain;

  // A report as the runtime writes it: algorithm 3 and engine 1 are the fastest.
  files::write_atomic(dir.path / "report.txt",
                      "cublaslt\t" + matmul_problem() + "\tTest GPU\t90\t130100\t3\t" +
                          "0.4,0.5,-1,0.2,0.3\n" + "cudnn\t" + conv_problem() +
                          "\tTest GPU\t90\t91400\t1\t0.2,0.1\n");
  autotune::AutotuneCache cache(dir.path / "autotune.json");
  ASSERT_EQ(autotune::store_cuda_tune_report(dir.path / "report.txt", cache), 2u);

  const std::string tuned = compile_wrapper(model, dir.path / "tuned");
  EXPECT_NE(tuned.find("state.cuda.library_choice(false, 0, 3, 130100);  // autotune cache: "
                       "cuBLASLt algorithm #3, sm_90"),
            std::string::npos)
      << tuned;
  EXPECT_NE(tuned.find("state.cuda.library_choice(true, 0, 1, 91400);  // autotune cache: "
                       "cuDNN engine #1, sm_90"),
            std::string::npos)
      << tuned;
  EXPECT_EQ(count(tuned, "library_choice("), 2u) << tuned;
  EXPECT_EQ(without_lines(tuned, "state.cuda.library_choice("), plain);

  // Deterministic for a given cache; --autotune off takes nothing from it.
  EXPECT_EQ(compile_wrapper(model, dir.path / "again"), tuned);
  EXPECT_EQ(compile_wrapper(model, dir.path / "off", autotune::AutotuneMode::kOff), plain);
}

TEST(CudaAutotune, BogusCachedChoiceIsIgnoredWithAWarning) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const Env gpu_env("KILN_AUTOTUNE_GPU", "Test GPU");
  autotune::AutotuneCache(dir.path / "autotune.json")
      .store(autotune::cuda_library_cache_key("cublaslt", matmul_problem(), "Test GPU", 90, 130100),
             {{"algo -1", autotune::CachedResult{"cublaslt 130100", 0.1, ""}}});
  testing::internal::CaptureStderr();
  const std::string wrapper = compile_wrapper(conv_then_matmul(), dir.path / "bogus");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(wrapper.find("library_choice"), std::string::npos) << wrapper;
  EXPECT_NE(err.find("is ignored (choice 'algo -1' is not 'algo <index>')"), std::string::npos)
      << err;
}

// On the GPU: --autotune max fills the cache at the first run, the next compile bakes the
// choices, a third compile is byte-identical, and the outputs agree (TF32: 2e-3 relative to the
// output's largest magnitude, the same problem run with other algorithms).
TEST(CudaAutotune, AutotuneMaxStoresChoicesThatTheNextCompileBakesReproducibly) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const graph::Model model = conv_then_matmul();
  const Tensor x = filled({2, 16, 6, 6}, 5);
  CompileOptions options;
  options.device = ir::Device::kCuda;
  options.autotune = autotune::AutotuneMode::kMax;
  options.cache_dir = dir.path / "cache";
  options.dump_dir = dir.path / "max";
  const std::vector<Tensor> tuned_out = compile(model, options).run({x});
  autotune::AutotuneCache cache(dir.path / "autotune.json");
  const std::string gpu = autotune::cuda_autotune_gpu();
  ASSERT_FALSE(gpu.empty());
  EXPECT_TRUE(autotune::lookup_cuda_library_choice(cache, "cublaslt", matmul_problem(), gpu))
      << files::read(dir.path / "autotune.json");
  EXPECT_TRUE(autotune::lookup_cuda_library_choice(cache, "cudnn", conv_problem(), gpu))
      << files::read(dir.path / "autotune.json");

  options.autotune = autotune::AutotuneMode::kDefault;
  options.dump_dir = dir.path / "second";
  const std::vector<Tensor> baked_out = compile(model, options).run({x});
  options.dump_dir = dir.path / "third";
  compile(model, options);
  const std::string second = files::read(dir.path / "second" / "5_wrapper.cpp");
  // The product's choice may be Kiln's GEMM template (timed beside cuBLASLt's algorithms).
  EXPECT_EQ(count(second, "state.cuda.library_choice(") +
                count(second, "state.cuda.gemm_template_choice("),
            2u)
      << second;
  EXPECT_EQ(files::read(dir.path / "third" / "5_wrapper.cpp"), second);
  EXPECT_EQ(files::read(dir.path / "third" / "5_kernels.cu"),
            files::read(dir.path / "second" / "5_kernels.cu"));
  ASSERT_EQ(tuned_out.size(), 1u);
  ASSERT_EQ(baked_out.size(), 1u);
  const auto a = tuned_out[0].values<float>(), b = baked_out[0].values<float>();
  ASSERT_EQ(a.size(), b.size());
  double scale = 0;
  for (float v : a) scale = std::max(scale, std::abs(static_cast<double>(v)));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3 * scale + 1e-6) << i;
}

TEST(CudaAutotune, CachedIndexTheLibraryDoesNotListFallsBackWithANote) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const Env gpu_env("KILN_AUTOTUNE_GPU", "Test GPU");
  const graph::Model model = conv_then_matmul();
  const Tensor x = filled({2, 16, 6, 6}, 5);
  CompileOptions options;
  options.device = ir::Device::kCuda;
  options.cache_dir = dir.path / "cache";
  options.autotune = autotune::AutotuneMode::kOff;
  const std::vector<Tensor> reference = compile(model, options).run({x});
  // Choices timed with library version 1, which no library here is: both calls fall back.
  files::write_atomic(dir.path / "report.txt", "cublaslt\t" + matmul_problem() +
                                                   "\tTest GPU\t90\t1\t0\t0.1\n" + "cudnn\t" +
                                                   conv_problem() + "\tTest GPU\t90\t1\t0\t0.1\n");
  autotune::AutotuneCache cache(dir.path / "autotune.json");
  autotune::store_cuda_tune_report(dir.path / "report.txt", cache);
  options.autotune = autotune::AutotuneMode::kDefault;
  options.dump_dir = dir.path / "stale";
  CompiledModel stale = compile(model, options);
  EXPECT_EQ(count(files::read(dir.path / "stale" / "5_wrapper.cpp"), "library_choice("), 2u);
  testing::internal::CaptureStderr();
  const std::vector<Tensor> out = stale.run({x});
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("the autotune cache's cuBLASLt algorithm #0 (timed with cuBLASLt 1) is not "
                     "valid for cuBLASLt"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("the autotune cache's cuDNN engine #0 (timed with cuDNN 1) is not valid"),
            std::string::npos)
      << err;
  ASSERT_EQ(out.size(), 1u);
  const auto a = reference[0].values<float>(), b = out[0].values<float>();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
}

}  // namespace
}  // namespace kiln::driver
