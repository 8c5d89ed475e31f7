#pragma once
// Shared fixtures of the autotune unit tests: a fresh scratch directory per test, seeded random
// matrices, and the signatures of rendered GEMM kernels.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace kiln::autotune::test {

using GemmFn = void(int64_t, const float*, const float*, float*);
using GemmBiasFn = void(int64_t, const float*, const float*, float*, const float*);

/// build/test-tmp/autotune-<suite>-<test>, emptied.
inline std::filesystem::path fresh_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir =
      std::filesystem::path(KILN_BUILD_DIR) / "test-tmp" /
      (std::string("autotune-") + info->test_suite_name() + "-" + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// rows x cols values uniform in [-1, 1), row-major, from `seed`.
inline std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  return values;
}

}  // namespace kiln::autotune::test
