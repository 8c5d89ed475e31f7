// The fused attention's exp (runtime/kiln_rt_attention.h, attention_detail::vexp) against
// double-precision std::exp, as the generated libraries compile it: a small program including
// the header is built with g++ for x86-64-v3 (AVX2) and, on a CPU with AVX-512, x86-64-v4, and
// run. Over [-87.3, 1] (every 211th float, about 5 million of each sign) it is within 1.5 ULP (1.23
// measured, at -71.009); at the softmax's special arguments it gives exp(-inf) = 0, exp(0) = 1
// and NaN for NaN, and below -88 (a subnormal result) 0.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "codegen/cpp/cpp_kernel.h"

namespace {

namespace fs = std::filesystem;

constexpr const char* kProgram = R"(#include "kiln_rt_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

using namespace kiln_rt::attention_detail;

float vexp1(float x) {
  float in[kWidth], out[kWidth];
  for (int i = 0; i < kWidth; ++i) in[i] = x;
  vstore(out, vexp(vload(in)));
  return out[0];
}

// |vexp(x) - exp(x)| in units of the last place of exp(x) rounded to float.
double ulp_error(float x) {
  const double exact = std::exp(static_cast<double>(x));
  const float rounded = static_cast<float>(exact);
  const double ulp =
      static_cast<double>(std::nextafter(rounded, std::numeric_limits<float>::max())) - rounded;
  return std::fabs(static_cast<double>(vexp1(x)) - exact) / ulp;
}

int main() {
  // Every 211th float of [-87.3, 1]: about 5 million of each sign.
  double worst = 0;
  float worst_at = 0;
  const float lowest = -87.3f, highest = 1.0f;
  uint32_t low_bits, high_bits;
  std::memcpy(&low_bits, &lowest, sizeof low_bits);
  std::memcpy(&high_bits, &highest, sizeof high_bits);
  for (uint32_t bits = 0; bits <= std::max(low_bits & 0x7fffffffu, high_bits); bits += 211) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      if (bits > (sign ? low_bits & 0x7fffffffu : high_bits)) continue;
      const uint32_t b = bits | sign;
      float x;
      std::memcpy(&x, &b, sizeof x);
      const double error = ulp_error(x);
      if (error > worst) {
        worst = error;
        worst_at = x;
      }
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  std::printf("worst %.4f at %.9g\n", worst, worst_at);
  std::printf("special %d %d %d %d\n", vexp1(-inf) == 0.0f, vexp1(0.0f) == 1.0f,
              std::isnan(vexp1(std::numeric_limits<float>::quiet_NaN())) ? 1 : 0,
              vexp1(-88.5f) == 0.0f);
}
)";

// Builds and runs kProgram for `march`; returns its output.
std::string run_for(const std::string& march) {
  const fs::path dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "attention_exp" / march;
  fs::create_directories(dir);
  std::ofstream(dir / "main.cpp") << kProgram;
  const std::string command = fmt::format(
      "g++ -std=c++17 -O2 -march={} -Wall -Wextra -I{} -o {} {} > {} 2>&1 && {} > "
      "{} 2>&1",
      march, kiln::codegen::cpp_runtime_include_dir().string(), (dir / "main").string(),
      (dir / "main.cpp").string(), (dir / "compile.log").string(), (dir / "main").string(),
      (dir / "out.txt").string());
  const int rc = std::system(command.c_str());
  std::stringstream log, out;
  log << std::ifstream(dir / "compile.log").rdbuf();
  out << std::ifstream(dir / "out.txt").rdbuf();
  EXPECT_EQ(rc, 0) << log.str() << out.str();
  return out.str();
}

void expect_accurate(const std::string& march) {
  const std::string out = run_for(march);
  double worst = -1;
  int neg_inf = 0, zero = 0, nan = 0, tiny = 0;
  ASSERT_EQ(std::sscanf(out.c_str(), "worst %lf at %*f\nspecial %d %d %d %d", &worst, &neg_inf,
                        &zero, &nan, &tiny),
            5)
      << out;
  EXPECT_LE(worst, 1.5) << march;
  EXPECT_EQ(neg_inf, 1) << march << ": exp(-inf) is not 0";
  EXPECT_EQ(zero, 1) << march << ": exp(0) is not 1";
  EXPECT_EQ(nan, 1) << march << ": exp(NaN) is not NaN";
  EXPECT_EQ(tiny, 1) << march << ": exp(-88.5) is not 0";
}

TEST(AttentionExp, WithinOneAndAHalfUlpAtAvx2) { expect_accurate("x86-64-v3"); }

TEST(AttentionExp, WithinOneAndAHalfUlpAtAvx512) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl")) {
    GTEST_SKIP() << "no AVX-512 on this CPU";
  }
  expect_accurate("x86-64-v4");
}

}  // namespace
