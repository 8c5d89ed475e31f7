// kiln_fast_math.h's erf and tanh (the forms template epilogues inline) against double-precision
// std::erf and std::tanh: tanh within 1.5 ULP, erf within 7.5 ULP and 5e-7 absolute (its
// rational form trades accuracy near 1 for speed; kiln_fast_math.h says by how much), over a
// sweep of [-9, 9] (every 211th float: about 10 million of each sign, tiny and denormal ones
// included), and libm's values at 0, +-inf and NaN. Compiled for the build's baseline ISA (no
// FMA), so it checks the rounding of the plain float arithmetic; the generated kernels contract
// it into FMAs, which measured within the same bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "runtime/kiln_fast_math.h"

namespace {

/// |got - exact| in units of the last place of exact rounded to float.
double ulp_error(float got, double exact) {
  const float rounded = static_cast<float>(exact);
  const float magnitude = std::fabs(rounded);
  double ulp =
      static_cast<double>(std::nextafter(magnitude, std::numeric_limits<float>::max())) - magnitude;
  return std::fabs(static_cast<double>(got) - exact) / ulp;
}

template <typename Fast, typename Exact>
void expect_within(Fast fast, Exact exact, const char* name, double max_ulp, double max_abs) {
  double worst = 0, worst_abs = 0;
  float worst_at = 0;
  for (uint32_t bits = 0; bits < 0x41100000u; bits += 211) {  // 0x41100000 = 9.0f
    float x;
    std::memcpy(&x, &bits, sizeof x);
    for (float v : {x, -x}) {
      const float got = fast(v);
      const double want = exact(static_cast<double>(v));
      worst_abs = std::max(worst_abs, std::fabs(static_cast<double>(got) - want));
      const double error = ulp_error(got, want);
      if (error > worst) {
        worst = error;
        worst_at = v;
      }
    }
  }
  EXPECT_LE(worst, max_ulp) << name << " at " << worst_at;
  EXPECT_LE(worst_abs, max_abs) << name;
}

TEST(FastMath, ErfWithinSevenAndAHalfUlp) {
  expect_within(
      kiln_fast_erf, [](double x) { return std::erf(x); }, "erf", 7.5, 5e-7);
}

TEST(FastMath, TanhWithinOneAndAHalfUlp) {
  expect_within(
      kiln_fast_tanh, [](double x) { return std::tanh(x); }, "tanh", 1.5, 1.2e-7);
}

TEST(FastMath, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(kiln_fast_erf(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(kiln_fast_erf(-0.0f)));
  EXPECT_EQ(kiln_fast_erf(inf), 1.0f);
  EXPECT_EQ(kiln_fast_erf(-inf), -1.0f);
  EXPECT_EQ(kiln_fast_erf(50.0f), 1.0f);
  EXPECT_TRUE(std::isnan(kiln_fast_erf(nan)));
  EXPECT_EQ(kiln_fast_tanh(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(kiln_fast_tanh(-0.0f)));
  EXPECT_EQ(kiln_fast_tanh(inf), 1.0f);
  EXPECT_EQ(kiln_fast_tanh(-inf), -1.0f);
  EXPECT_EQ(kiln_fast_tanh(-1e30f), -1.0f);
  EXPECT_TRUE(std::isnan(kiln_fast_tanh(nan)));
}

}  // namespace
