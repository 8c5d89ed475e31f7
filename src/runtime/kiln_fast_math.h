#pragma once
/// float32 erf and tanh as inline, branch-free polynomials for code written as scalar C++ over
/// one element that the auto-vectorizer runs a vector at a time: the epilogues of the GEMM and
/// convolution templates (codegen/cpp/cpp_epilogue.cpp; kiln_simd_math.h includes this header).
/// Self-contained (no Sleef, no intrinsics), so tests can check it alone.
///
/// Sleef's u10 erf and tanh cost about 100 cycles per vector (double-float arithmetic inside);
/// a GELU epilogue spent more time in them than in its GEMM. These are written as branch-free
/// float arithmetic that the vectorizer turns into a few dozen vector instructions, inlined into
/// the loop (selects become blends). Accuracy, measured against double-precision erf/tanh over
/// every float of [-9, 9], tiny and denormal ones included (tests/unit/codegen/fast_math_test.cpp
/// checks a sweep): tanh within 1.4 ULP; erf within 7 ULP and 5e-7 absolute (5.8 ULP and 4e-7
/// with FMA contraction), 4 ULP relative below 0.5; NaN and +-inf as libm gives them.
/// tanh's coefficients are least-squares Chebyshev fits in double, rounded to float; erf's are a
/// rational least-squares fit in double, reweighted toward the least maximum relative error, its
/// coefficients rounded to float one at a time with the others refitted.

#include <cmath>
#include <cstdint>

namespace kiln_simd_detail {

/// c ? a : b through the bits, so that no branch (and no conditional evaluation) is left for the
/// vectorizer to convert: with -ftrapping-math GCC does not if-convert a float comparison on
/// AVX2, and a loop with a branch stays scalar.
inline float select(bool c, float a, float b) {
  const int32_t m = -static_cast<int32_t>(c);
  return __builtin_bit_cast(
      float, (__builtin_bit_cast(int32_t, a) & m) | (__builtin_bit_cast(int32_t, b) & ~m));
}

/// e^y for y in [-87, 87]: y = k ln 2 + r (|r| <= ln 2 / 2, ln 2 in two parts), then e^r by
/// its Taylor polynomial to r^7 and 2^k through the exponent bits.
inline float exp_core(float y) {
  const float k = (y * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = y - k * 0.693145751953125f;
  r = r - k * 1.428606765330187e-06f;
  float p = 1.98412698e-4f;
  p = p * r + 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  return p * __builtin_bit_cast(float, bits);
}

}  // namespace kiln_simd_detail

/// erf(x) = x P(x^2) / Q(x^2), x clamped to [-4, 4] (erf(4) rounds to 1 in float): one rational
/// function over the whole range, 12 multiply-adds and a division, where two branches (a series
/// near 0, 1 - e^(...) above) cost 2.5x as much in a GELU epilogue. Relative error near 0 is
/// small, and the float arithmetic's rounding leaves at most 5e-7 absolute (7 ULP) where erf
/// approaches 1, between 3 and 4.
inline float kiln_fast_erf(float x) {
  const float low = kiln_simd_detail::select(x > -4.0f, x, -4.0f);
  const float y = kiln_simd_detail::select(x < 4.0f, low, 4.0f);
  const float t = y * y;
  float p = 7.626872957e-06f;
  p = p * t + 4.320628650e-04f;
  p = p * t + 4.246444907e-03f;
  p = p * t + 5.608778819e-02f;
  p = p * t + 1.918786615e-01f;
  p = p * t + 1.128379226e+00f;
  float q = 3.055765774e-07f;
  q = q * t + 7.862575148e-05f;
  q = q * t + 1.451882999e-03f;
  q = q * t + 1.640565693e-02f;
  q = q * t + 1.174977571e-01f;
  q = q * t + 5.033820868e-01f;
  q = q * t + 1.0f;
  return kiln_simd_detail::select(x != x, x, y * (p / q));
}

/// tanh(x): for |x| < 0.625, x + x^3 P(x^2); above, 1 - 2 / (e^(2|x|) + 1) (2|x| capped at 40,
/// where tanh is 1 in float).
inline float kiln_fast_tanh(float x) {
  const float a = std::fabs(x);
  const float a2 = a * a;
  float p = -8.792939103e-04f;
  p = p * a2 + 3.325013023e-03f;
  p = p * a2 - 8.798682977e-03f;
  p = p * a2 + 2.186133073e-02f;
  p = p * a2 - 5.396775928e-02f;
  p = p * a2 + 1.333333220e-01f;
  p = p * a2 - 3.333333333e-01f;
  const float small = a + a * a2 * p;
  const float t = kiln_simd_detail::select(2.0f * a < 40.0f, 2.0f * a, 40.0f);
  const float big = 1.0f - 2.0f / (kiln_simd_detail::exp_core(t) + 1.0f);
  const float r = std::copysign(kiln_simd_detail::select(a < 0.625f, small, big), x);
  return kiln_simd_detail::select(x != x, x, r);
}
