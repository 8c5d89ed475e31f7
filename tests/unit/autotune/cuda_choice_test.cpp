// CUDA library choices in the autotune cache (src/autotune/cuda_choice.h): a tuning report as
// kiln_rt_cuda.h's report_tuning writes it is stored as one entry per problem and read back as
// the fastest valid index with its library version and GPU; entries of other GPUs, of several
// GPUs when none is named, and of older library versions are not taken; a malformed report line
// is refused naming its line; a bogus cached choice is ignored with a warning.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "autotune/cuda_choice.h"
#include "support/error.h"
#include "support/files.h"

#include "test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

namespace fs = std::filesystem;

const std::string kProblem =
    "f32 tf32 epilogue 4 residual 0 sizes 128,768 k 768 a 768,1 b 768,1 out 768,1";

fs::path write_report(const fs::path& dir, const std::string& text) {
  const fs::path path = dir / "report.txt";
  files::write_atomic(path, text);
  return path;
}

TEST(CudaLibraryChoice, KeyNamesLibraryProblemGpuCapabilityAndVersions) {
  const nlohmann::json key = cuda_library_cache_key("cublaslt", kProblem, "GPU A", 90, 130100);
  EXPECT_EQ(key.at("op"), "cublaslt");
  EXPECT_EQ(key.at("problem"), kProblem);
  EXPECT_EQ(key.at("gpu"), "GPU A");
  EXPECT_EQ(key.at("cc"), 90);
  EXPECT_EQ(key.at("library_version"), 130100);
  EXPECT_EQ(key.at("kiln"), KILN_VERSION);
  EXPECT_NE(cache_key_id(key),
            cache_key_id(cuda_library_cache_key("cublaslt", kProblem, "GPU A", 90, 130200)));
  EXPECT_NE(cache_key_id(key),
            cache_key_id(cuda_library_cache_key("cudnn", kProblem, "GPU A", 90, 130100)));
}

TEST(CudaLibraryChoice, ReportRoundTripsThroughTheCache) {
  const fs::path dir = fresh_dir();
  AutotuneCache cache(dir / "autotune.json");
  // Algorithm 2 failed (-1); algorithm 1 is the fastest; engine 0 of the convolution.
  const fs::path report =
      write_report(dir, "cublaslt\t" + kProblem + "\tGPU A\t90\t130100\t1\t0.5,0.2,-1,0.3\n" +
                            "cudnn\tf32 tf32 nhwc conv\tGPU A\t90\t91400\t0\t0.1,0.4\n");
  EXPECT_EQ(store_cuda_tune_report(report, cache), 2u);

  const CachedResults stored =
      cache.lookup(cuda_library_cache_key("cublaslt", kProblem, "GPU A", 90, 130100));
  ASSERT_EQ(stored.size(), 4u);
  EXPECT_EQ(stored.at("algo 1").ms, 0.2);
  EXPECT_EQ(stored.at("algo 2").error, "failed to run");
  EXPECT_FALSE(stored.at("algo 2").ms);

  const auto blas = lookup_cuda_library_choice(cache, "cublaslt", kProblem, "GPU A");
  ASSERT_TRUE(blas);
  EXPECT_EQ(*blas, (CudaLibraryChoice{1, 130100, "GPU A", 90, 0.2}));
  const auto dnn = lookup_cuda_library_choice(cache, "cudnn", "f32 tf32 nhwc conv", "");
  ASSERT_TRUE(dnn);
  EXPECT_EQ(dnn->index, 0);
  EXPECT_EQ(dnn->version, 91400);
  // Another GPU, another problem, the other library: nothing.
  EXPECT_FALSE(lookup_cuda_library_choice(cache, "cublaslt", kProblem, "GPU B"));
  EXPECT_FALSE(lookup_cuda_library_choice(cache, "cublaslt", kProblem + " ", "GPU A"));
  EXPECT_FALSE(lookup_cuda_library_choice(cache, "cudnn", kProblem, "GPU A"));
}

TEST(CudaLibraryChoice, SeveralGpusNeedOneNamedAndTheNewestVersionWins) {
  const fs::path dir = fresh_dir();
  AutotuneCache cache(dir / "autotune.json");
  store_cuda_tune_report(
      write_report(dir, "cublaslt\t" + kProblem + "\tGPU A\t90\t130100\t0\t0.1,0.2\n" +
                            "cublaslt\t" + kProblem + "\tGPU A\t90\t130200\t1\t0.3,0.2\n"),
      cache);
  // Two versions of one GPU: the newer one's choice.
  auto choice = lookup_cuda_library_choice(cache, "cublaslt", kProblem, "");
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->index, 1);
  EXPECT_EQ(choice->version, 130200);
  // A second GPU: a build machine must say which one it builds for.
  store_cuda_tune_report(
      write_report(dir, "cublaslt\t" + kProblem + "\tGPU B\t80\t130100\t2\t0.3,0.2,0.1\n"), cache);
  EXPECT_FALSE(lookup_cuda_library_choice(cache, "cublaslt", kProblem, ""));
  choice = lookup_cuda_library_choice(cache, "cublaslt", kProblem, "GPU B");
  ASSERT_TRUE(choice);
  EXPECT_EQ(choice->index, 2);
  EXPECT_EQ(choice->arch, 80);
}

TEST(CudaLibraryChoice, MalformedReportLineIsRefusedNamingTheLine) {
  const fs::path dir = fresh_dir();
  AutotuneCache cache(dir / "autotune.json");
  const fs::path report =
      write_report(dir, "cublaslt\t" + kProblem + "\tGPU A\t90\t130100\t0\t0.1\nnot a line\n");
  try {
    store_cuda_tune_report(report, cache);
    FAIL() << "a malformed line was stored";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("report.txt:2: not a CUDA tuning report line"),
              std::string::npos)
        << e.what();
  }
  const fs::path bad_time = write_report(dir, "cudnn\tp\tGPU A\t90\t91400\t0\t0.1,fast\n");
  EXPECT_THROW(store_cuda_tune_report(bad_time, cache), UserError);
  // No report (nothing was tuned): nothing stored.
  EXPECT_EQ(store_cuda_tune_report(dir / "missing.txt", cache), 0u);
}

TEST(CudaLibraryChoice, BogusCachedChoiceIsIgnoredWithAWarning) {
  const fs::path dir = fresh_dir();
  AutotuneCache cache(dir / "autotune.json");
  const nlohmann::json key = cuda_library_cache_key("cublaslt", kProblem, "GPU A", 90, 130100);
  cache.store(key, {{"algo one", CachedResult{"cublaslt 130100", 0.1, ""}}});
  testing::internal::CaptureStderr();
  EXPECT_FALSE(lookup_cuda_library_choice(cache, "cublaslt", kProblem, "GPU A"));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("is ignored (choice 'algo one' is not 'algo <index>')"), std::string::npos)
      << err;
  EXPECT_NE(err.find("the library's heuristic choice is used"), std::string::npos) << err;

  // A negative time is not a time.
  AutotuneCache other(dir / "other.json");
  other.store(key, {{"algo 3", CachedResult{"cublaslt 130100", -2.0, ""}}});
  testing::internal::CaptureStderr();
  EXPECT_FALSE(lookup_cuda_library_choice(other, "cublaslt", kProblem, "GPU A"));
  err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("choice 'algo 3' has no valid time"), std::string::npos) << err;
}

// Library "kiln": the launch configurations of Kiln's own kernels, choices "config <i>".
TEST(CudaLibraryChoice, KernelLaunchConfigurationsRoundTripAsConfigChoices) {
  const fs::path dir = fresh_dir();
  AutotuneCache cache(dir / "autotune.json");
  const std::string problem = "reduction 4db6030bdd893182 rows 64 row 768 configs 6";
  const fs::path report =
      write_report(dir, "kiln\t" + problem + "\tGPU A\t90\t13000\t3\t0.5,0.4,0.45,0.2,0.3,0.6\n");
  EXPECT_EQ(store_cuda_tune_report(report, cache), 1u);
  const CachedResults stored =
      cache.lookup(cuda_library_cache_key("kiln", problem, "GPU A", 90, 13000));
  ASSERT_EQ(stored.size(), 6u);
  EXPECT_EQ(stored.at("config 3").ms, 0.2);
  const std::optional<CudaLibraryChoice> choice =
      lookup_cuda_library_choice(cache, "kiln", problem, "GPU A");
  ASSERT_TRUE(choice);
  EXPECT_EQ(*choice, (CudaLibraryChoice{3, 13000, "GPU A", 90, 0.2}));
  // Not a cuBLASLt problem, and "algo <i>" is not a kernel's choice.
  EXPECT_FALSE(lookup_cuda_library_choice(cache, "cublaslt", problem, "GPU A"));
  cache.store(cuda_library_cache_key("kiln", "other", "GPU A", 90, 13000),
              {{"algo 1", CachedResult{"kiln 13000", 0.1, ""}}});
  testing::internal::CaptureStderr();
  EXPECT_FALSE(lookup_cuda_library_choice(cache, "kiln", "other", "GPU A"));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("choice 'algo 1' is not 'config <index>'"), std::string::npos) << err;
}

TEST(CudaLibraryChoice, GpuFromTheEnvironmentFirst) {
  setenv("KILN_AUTOTUNE_GPU", "NVIDIA H100 80GB HBM3", 1);
  EXPECT_EQ(cuda_autotune_gpu(), "NVIDIA H100 80GB HBM3");
  unsetenv("KILN_AUTOTUNE_GPU");
}

}  // namespace
}  // namespace kiln::autotune
