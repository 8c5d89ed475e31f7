#pragma once
/// AVX2 vectors for generated kernels: VecF32 (8 floats) and VecMask (8 lanes of all-ones or
/// zero bits, the result of comparisons), with the arithmetic, comparisons, blends and
/// transcendental functions (through Sleef's AVX2 entry points) that the op table uses, and
/// horizontal reductions. Compile with -mavx2 -mfma (or -march=native) and link -lsleef.
/// Self-contained (used by code compiled outside Kiln's build).

#include <immintrin.h>
#include <sleef.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kiln_half.h"
#include "kiln_scalar.h"

namespace kiln::vec {

inline constexpr int64_t kWidth = 8;

struct VecF32 {
  __m256 v;
  static VecF32 loadu(const float* p) { return {_mm256_loadu_ps(p)}; }
  /// p[0], p[stride], ..., p[7 * stride]: a row of a transpose.
  static VecF32 load_strided(const float* p, int64_t stride) {
    return {_mm256_setr_ps(p[0], p[stride], p[2 * stride], p[3 * stride], p[4 * stride],
                           p[5 * stride], p[6 * stride], p[7 * stride])};
  }
  static VecF32 broadcast(float x) { return {_mm256_set1_ps(x)}; }
  void storeu(float* p) const { _mm256_storeu_ps(p, v); }
};

struct VecMask {
  __m256 v;
  static VecMask broadcast(bool b) { return {_mm256_castsi256_ps(_mm256_set1_epi32(b ? -1 : 0))}; }
  /// Eight bools (one byte each, any nonzero byte true) as lanes.
  static VecMask loadu(const bool* p) {
    const __m256i bytes =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return {_mm256_castsi256_ps(_mm256_cmpgt_epi32(bytes, _mm256_setzero_si256()))};
  }
};

// ---- arithmetic ----
inline VecF32 operator+(VecF32 a, VecF32 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VecF32 operator-(VecF32 a, VecF32 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline VecF32 operator*(VecF32 a, VecF32 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline VecF32 operator/(VecF32 a, VecF32 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline VecF32 operator-(VecF32 a) { return {_mm256_xor_ps(a.v, _mm256_set1_ps(-0.0f))}; }
inline VecF32 abs(VecF32 a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }

// ---- masks ----
inline VecMask isnan(VecF32 a) { return {_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)}; }
inline VecMask isposinf(VecF32 a) {
  return {_mm256_cmp_ps(a.v, _mm256_set1_ps(std::numeric_limits<float>::infinity()), _CMP_EQ_OQ)};
}
inline VecMask isneginf(VecF32 a) {
  return {_mm256_cmp_ps(a.v, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ)};
}
inline VecMask eq(VecF32 a, VecF32 b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ)}; }
inline VecMask ne(VecF32 a, VecF32 b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_NEQ_UQ)}; }
inline VecMask lt(VecF32 a, VecF32 b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ)}; }
inline VecMask le(VecF32 a, VecF32 b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_LE_OQ)}; }
inline VecMask gt(VecF32 a, VecF32 b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ)}; }
inline VecMask ge(VecF32 a, VecF32 b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_GE_OQ)}; }
inline VecMask eq(VecMask a, VecMask b) {
  return {_mm256_xor_ps(_mm256_xor_ps(a.v, b.v), VecMask::broadcast(true).v)};
}
inline VecMask ne(VecMask a, VecMask b) { return {_mm256_xor_ps(a.v, b.v)}; }
inline VecMask land(VecMask a, VecMask b) { return {_mm256_and_ps(a.v, b.v)}; }
inline VecMask lor(VecMask a, VecMask b) { return {_mm256_or_ps(a.v, b.v)}; }
inline VecMask lxor(VecMask a, VecMask b) { return {_mm256_xor_ps(a.v, b.v)}; }
inline VecMask lnot(VecMask a) { return {_mm256_xor_ps(a.v, VecMask::broadcast(true).v)}; }
/// cond ? a : b, per lane.
inline VecF32 where(VecMask cond, VecF32 a, VecF32 b) {
  return {_mm256_blendv_ps(b.v, a.v, cond.v)};
}
inline VecMask where(VecMask cond, VecMask a, VecMask b) {
  return {_mm256_blendv_ps(b.v, a.v, cond.v)};
}
inline VecF32 to_float(VecMask m) { return {_mm256_and_ps(m.v, _mm256_set1_ps(1.0f))}; }
inline VecMask to_mask(VecF32 a) { return ne(a, VecF32::broadcast(0.0f)); }

// ---- min / max (NaN-propagating) ----
inline VecF32 maximum(VecF32 a, VecF32 b) {
  __m256 r = _mm256_max_ps(a.v, b.v);  // b when either is NaN
  return {_mm256_blendv_ps(r, a.v, isnan(a).v)};
}
inline VecF32 minimum(VecF32 a, VecF32 b) {
  __m256 r = _mm256_min_ps(a.v, b.v);
  return {_mm256_blendv_ps(r, a.v, isnan(a).v)};
}
// maximum and minimum with a b that is a number (not NaN; a Clip bound): max and min return
// their second operand when either is NaN, so with b first a NaN in a stays.
inline VecF32 maximum_num(VecF32 a, VecF32 b) { return {_mm256_max_ps(b.v, a.v)}; }
inline VecF32 minimum_num(VecF32 a, VecF32 b) { return {_mm256_min_ps(b.v, a.v)}; }
inline VecF32 relu(VecF32 a) { return {_mm256_max_ps(_mm256_setzero_ps(), a.v)}; }  // NaN stays

// ---- math ----
inline VecF32 exp(VecF32 a) { return {Sleef_expf8_u10avx2(a.v)}; }
inline VecF32 log(VecF32 a) { return {Sleef_logf8_u10avx2(a.v)}; }
inline VecF32 sqrt(VecF32 a) { return {_mm256_sqrt_ps(a.v)}; }
inline VecF32 rsqrt(VecF32 a) { return VecF32::broadcast(1.0f) / sqrt(a); }
inline VecF32 reciprocal(VecF32 a) { return VecF32::broadcast(1.0f) / a; }
inline VecF32 tanh(VecF32 a) { return {Sleef_tanhf8_u10avx2(a.v)}; }
inline VecF32 sigmoid(VecF32 a) {
  VecF32 one = VecF32::broadcast(1.0f);
  return one / (one + exp(-a));
}
inline VecF32 erf(VecF32 a) { return {Sleef_erff8_u10avx2(a.v)}; }
inline VecF32 floor(VecF32 a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
}
inline VecF32 ceil(VecF32 a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)};
}
inline VecF32 round_even(VecF32 a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline VecF32 sign(VecF32 a) {
  VecF32 zero = VecF32::broadcast(0.0f);
  VecF32 s = to_float(gt(a, zero)) - to_float(lt(a, zero));
  return where(isnan(a), a, s);
}
inline VecF32 sin(VecF32 a) { return {Sleef_sinf8_u10avx2(a.v)}; }
inline VecF32 cos(VecF32 a) { return {Sleef_cosf8_u10avx2(a.v)}; }
inline VecF32 tan(VecF32 a) { return {Sleef_tanf8_u10avx2(a.v)}; }
inline VecF32 asin(VecF32 a) { return {Sleef_asinf8_u10avx2(a.v)}; }
inline VecF32 acos(VecF32 a) { return {Sleef_acosf8_u10avx2(a.v)}; }
inline VecF32 atan(VecF32 a) { return {Sleef_atanf8_u10avx2(a.v)}; }
inline VecF32 sinh(VecF32 a) { return {Sleef_sinhf8_u10avx2(a.v)}; }
inline VecF32 cosh(VecF32 a) { return {Sleef_coshf8_u10avx2(a.v)}; }
inline VecF32 asinh(VecF32 a) { return {Sleef_asinhf8_u10avx2(a.v)}; }
inline VecF32 acosh(VecF32 a) { return {Sleef_acoshf8_u10avx2(a.v)}; }
inline VecF32 atanh(VecF32 a) { return {Sleef_atanhf8_u10avx2(a.v)}; }
inline VecF32 log1p(VecF32 a) { return {Sleef_log1pf8_u10avx2(a.v)}; }
inline VecF32 expm1(VecF32 a) { return {Sleef_expm1f8_u10avx2(a.v)}; }
inline VecF32 softplus(VecF32 a) { return relu(a) + log1p(exp(-abs(a))); }
inline VecF32 pow(VecF32 a, VecF32 b) { return {Sleef_powf8_u10avx2(a.v, b.v)}; }
inline VecF32 fmod(VecF32 a, VecF32 b) { return {Sleef_fmodf8_avx2(a.v, b.v)}; }
inline VecF32 floor_mod(VecF32 a, VecF32 b) {
  VecF32 r = fmod(a, b);
  VecF32 zero = VecF32::broadcast(0.0f);
  VecMask fix = land(ne(r, zero), ne(lt(r, zero), lt(b, zero)));
  return where(fix, r + b, r);
}

// ---- horizontal reductions ----
inline float lane(VecF32 a, int k) {
  alignas(32) float t[kWidth];
  _mm256_store_ps(t, a.v);
  return t[k];
}
inline float hsum(VecF32 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline float hprod(VecF32 a) {
  float r = 1.0f;
  for (int k = 0; k < kWidth; ++k) r *= lane(a, k);
  return r;
}
inline float hmax(VecF32 a) {
  float r = lane(a, 0);
  for (int k = 1; k < kWidth; ++k) r = kiln::maximum(r, lane(a, k));
  return r;
}
inline float hmin(VecF32 a) {
  float r = lane(a, 0);
  for (int k = 1; k < kWidth; ++k) r = kiln::minimum(r, lane(a, k));
  return r;
}
inline bool hany(VecMask m) { return _mm256_movemask_ps(m.v) != 0; }
inline bool hall(VecMask m) { return _mm256_movemask_ps(m.v) == 0xFF; }

/// Welford state per lane; every lane sees the same number of elements.
struct WelfordVec {
  VecF32 mean = VecF32::broadcast(0.0f);
  VecF32 m2 = VecF32::broadcast(0.0f);
  int64_t n = 0;

  void update(VecF32 x) {
    ++n;
    VecF32 delta = x - mean;
    mean = mean + delta / VecF32::broadcast(static_cast<float>(n));
    m2 = m2 + delta * (x - mean);
  }
  /// Folds the lanes into a scalar accumulator.
  void combine_into(kiln::Welford<float>& acc) const {
    for (int k = 0; k < kWidth; ++k) acc.combine(lane(mean, k), lane(m2, k), n);
  }
};

}  // namespace kiln::vec
