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
/// every float of [-8, 8] and the tiny and denormal ones: within 1.4 ULP (tests/unit/codegen/
/// fast_math_test.cpp checks 1.5 on a sweep), NaN and +-inf as libm gives them. The coefficients
/// are least-squares Chebyshev fits in double, rounded to float.

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

/// erf(x): for |x| < 0.875, x + x P(x^2); above, 1 - e^(Q(|x|) - x^2), Q fitted to
/// log(erfc(a)) + a^2 on [0.875, 4] (erf(4) rounds to 1 in float).
inline float kiln_fast_erf(float x) {
  const float a = std::fabs(x);
  const float a2 = a * a;
  float p = 8.800110442e-05f;
  p = p * a2 - 8.238209099e-04f;
  p = p * a2 + 5.208945946e-03f;
  p = p * a2 - 2.686240204e-02f;
  p = p * a2 + 1.128374665e-01f;
  p = p * a2 - 3.761263689e-01f;
  p = p * a2 + 1.283791669e-01f;
  const float small = a + a * p;
  const float al = kiln_simd_detail::select(a < 4.0f, a, 4.0f);
  float q = -5.661292227e-08f;
  q = q * al + 1.351103161e-06f;
  q = q * al - 1.255175263e-05f;
  q = q * al + 4.020208396e-05f;
  q = q * al + 2.608958534e-04f;
  q = q * al - 3.884624707e-03f;
  q = q * al + 2.487775091e-02f;
  q = q * al - 1.082596968e-01f;
  q = q * al + 3.667995374e-01f;
  q = q * al - 1.129633289e+00f;
  q = q * al + 2.049691301e-04f;
  const float big = 1.0f - kiln_simd_detail::exp_core(q - al * al);
  const float r = std::copysign(kiln_simd_detail::select(a < 0.875f, small, big), x);
  return kiln_simd_detail::select(x != x, x, r);
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
