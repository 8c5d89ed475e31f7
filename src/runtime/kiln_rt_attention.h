#pragma once
// Kiln runtime: scaled dot-product attention as one fused kernel (extern call "attention",
// ir::AttentionCall; lower/attention_fusion.cpp recognizes the pattern in a graph):
//   out[b, i, :] = sum_j softmax_j(s[b, i, j]) V[b, j, :],  s = mask(scale * (Q K^T)[b, i, j])
//
// The score matrix never goes to memory. Threads share (batch element, range of query blocks)
// tasks; a task packs its K^T into panels of kNR keys and its V into rows padded to whole vectors,
// then, per block of kBlockQ queries, walks the keys in tiles of kBlockK with an online softmax:
// a tile's scores (kBlockQ x kBlockK, in L1) come from an kMR x kNR register-blocked product; each
// row keeps its running max m and sum l; when the max grows, the row's sum and its output
// accumulator are scaled by exp(m_old - m_new) before the tile's exp(s - m_new) @ V is added.
// The output is the accumulator divided by l at the end.
//
// A row whose every score is -inf keeps l = 0 and gives 0 / 0 = NaN, as the unfused Softmax does
// (its max is -inf and exp(-inf - -inf) is NaN). A tile whose scores are all the masked `fill`
// (a causal mask's upper triangle) is skipped when each row's running max already exceeds fill by
// more than 128: exp(fill - m) is then 0 in float32, exactly what the unfused Softmax adds for
// those keys (unless V holds an infinity there, which 0 * inf would turn into NaN).
//
// Vectorized for AVX-512 (16 lanes, 4 x 16 keys per panel) and AVX2 (8 lanes, 2 x 8); without
// either (a build for baseline x86-64 or another CPU) the same code runs on one-lane "vectors".

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln_rt.h"

namespace kiln_rt {

/// The mask kinds, numbered as ir::AttentionMask.
enum AttentionMaskKind : int32_t {
  kAttentionNoMask = 0,
  kAttentionKeepWhereTrue = 1,   // bool: s where mask, else fill
  kAttentionKeepWhereFalse = 2,  // bool: fill where mask, else s
  kAttentionAddMask = 3,         // float32: s + mask
};

/// The call's operands. Every view has rank batch_rank + 2: q [.., Lq, D], kt [.., D, Lk],
/// v [.., Lk, Dv], mask [.., Lq, Lk] (bool or float32), broadcast batch dims with stride 0.
struct AttentionArgs {
  int32_t batch_rank = 0;
  int64_t batch[kMaxRank] = {};
  int64_t lq = 0, lk = 0, d = 0, dv = 0;
  View q, kt, v, mask;
  int32_t mask_kind = kAttentionNoMask;
  float scale = 1.0f;
  float fill = 0.0f;
};

namespace attention_detail {

// The constants below are constexpr, not inline constexpr: an inline variable is a GNU unique
// symbol, which the dynamic loader binds to one definition per process even across variants
// dlopen'ed with RTLD_LOCAL, so the x86-64-v3 variant read the x86-64-v4 one's kKeyVectors (4)
// wherever it was ODR-used (std::min, at -O1). Internal linkage keeps each variant's own.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kWidth = 16, kKeyVectors = 4;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset(float x) { return _mm512_set1_ps(x); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vround(Vec a) {
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// 2^k for whole k in [-127, 128] (k = -127 gives 0, k = 128 infinity).
inline Vec vexp2i(Vec k) {
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(bits);
}
inline Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline float hmax(Vec a) { return _mm512_reduce_max_ps(a); }
inline float hsum(Vec a) { return _mm512_reduce_add_ps(a); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kWidth = 8, kKeyVectors = 2;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset(float x) { return _mm256_set1_ps(x); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vround(Vec a) {
  return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// 2^k for whole k in [-127, 128] (k = -127 gives 0, k = 128 infinity).
inline Vec vexp2i(Vec k) {
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(bits);
}
inline Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline float hmax(Vec a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline float hsum(Vec a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#else
using Vec = float;
constexpr int kWidth = 1, kKeyVectors = 4;
inline Vec vzero() { return 0.0f; }
inline Vec vset(float x) { return x; }
inline Vec vload(const float* p) { return *p; }
inline void vstore(float* p, Vec v) { *p = v; }
inline Vec vfma(Vec a, Vec b, Vec c) { return a * b + c; }
inline Vec vmul(Vec a, Vec b) { return a * b; }
inline Vec vsub(Vec a, Vec b) { return a - b; }
inline Vec vadd(Vec a, Vec b) { return a + b; }
inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }
inline Vec vexp(Vec a) { return std::exp(a); }
inline float hmax(Vec a) { return a; }
inline float hsum(Vec a) { return a; }
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
/// exp(x) a vector at a time, within 1.5 ulp of the exact value over [-87.3, 1] (the softmax's
/// arguments are <= 0; below about -87.7, where the result is a subnormal, it gives 0; NaN stays
/// NaN; tests/unit/codegen/attention_exp_test.cpp): x = k ln 2 + r with |r| <= ln 2 / 2 (ln 2 in
/// two parts, the first exact in k ln 2), exp(r) as 1 + r + r^2 p(r) with p of degree 5 (Cephes'
/// expf coefficients), times 2^k built in the exponent bits. In place of Sleef's expf, the
/// attention of a transformer encoder layer (4 heads of 64, sequence 128) ran 9 % faster at AVX2
/// and 4 % at AVX-512 (AMD EPYC Zen 4, 2 threads).
inline Vec vexp(Vec x) {
  // The clamps keep k within [-127, 128]; max and min return their second operand, x, when it is
  // NaN.
  x = vmin(vset(88.7f), vmax(vset(-88.0f), x));
  const Vec k = vround(vmul(x, vset(1.44269504088896341f)));
  Vec r = vfma(k, vset(-0.693359375f), x);
  r = vfma(k, vset(2.12194440e-4f), r);
  Vec p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset(1.0f)));
  return vmul(p, vexp2i(k));
}
#endif

/// Rows per register block, keys per packed K^T panel, queries per block, keys per tile.
// AVX2: 6 rows (12 of the 16 registers accumulate), AVX-512: 4 (16 of 32; 6 measured slower).
#if defined(__AVX2__) && !defined(__AVX512F__)
constexpr int kMR = 6;
constexpr int64_t kBlockQ = 48;
#else
constexpr int kMR = 4;
constexpr int64_t kBlockQ = 32;
#endif
constexpr int kNR = kWidth * kKeyVectors;
constexpr int64_t kBlockK = 128;
static_assert(kBlockQ % kMR == 0 && kBlockK % kNR == 0 && kBlockK % kWidth == 0);

/// s[c] = mask[c * stride] == keep ? s[c] : fill for c < n (a Where on the scores).
inline void apply_bool_mask(float* s, const bool* mask, int64_t stride, int64_t n, bool keep,
                            float fill) {
  int64_t c = 0;
  if (stride == 1) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    const Vec f = vset(fill);
    for (; c + 16 <= n; c += 16) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mask + c));
      const __mmask16 set = _mm_test_epi8_mask(bytes, bytes);
      const __mmask16 kept = keep ? set : static_cast<__mmask16>(~set);
      vstore(s + c, _mm512_mask_blend_ps(kept, f, vload(s + c)));
    }
#elif defined(__AVX2__) && !defined(__AVX512F__)
    const Vec f = vset(fill);
    for (; c + 8 <= n; c += 8) {
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mask + c));
      const __m256 unset = _mm256_castsi256_ps(
          _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_setzero_si256()));
      // blendv takes its second operand where `unset` is set.
      vstore(s + c, keep ? _mm256_blendv_ps(vload(s + c), f, unset)
                         : _mm256_blendv_ps(f, vload(s + c), unset));
    }
#endif
  }
  for (; c < n; ++c) s[c] = mask[c * stride] == keep ? s[c] : fill;
}

/// c[kMR x NV vectors] (row stride ldc) = (c +) a[kMR x k] (row stride lda) @ b[k x NV vectors]
/// (row stride ldb).
template <int NV>
inline void micro_kernel(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                         float* c, int64_t ldc, bool accumulate) {
  Vec acc[kMR][NV];
  for (int r = 0; r < kMR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? vload(c + r * ldc + v * kWidth) : vzero();
  for (int64_t p = 0; p < k; ++p) {
    Vec bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = vload(b + p * ldb + v * kWidth);
    for (int r = 0; r < kMR; ++r) {
      const Vec x = vset(a[r * lda + p]);
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(x, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < kMR; ++r)
    for (int v = 0; v < NV; ++v) vstore(c + r * ldc + v * kWidth, acc[r][v]);
}

/// The same with NV chosen at run time (1..kKeyVectors): the output accumulator's last chunk.
inline void micro_kernel_n(int nv, int64_t k, const float* a, int64_t lda, const float* b,
                           int64_t ldb, float* c, int64_t ldc) {
  switch (nv) {
    case 1:
      return micro_kernel<1>(k, a, lda, b, ldb, c, ldc, true);
    case 2:
      return micro_kernel<2>(k, a, lda, b, ldb, c, ldc, true);
    case 3:
      if constexpr (kKeyVectors >= 3) return micro_kernel<3>(k, a, lda, b, ldb, c, ldc, true);
      break;
    default:
      if constexpr (kKeyVectors >= 4) return micro_kernel<4>(k, a, lda, b, ldb, c, ldc, true);
      break;
  }
}

/// Offset of batch element `flat` (row-major over `batch`) in a view.
inline int64_t batch_offset(const View& v, const int64_t* batch, int batch_rank, int64_t flat) {
  int64_t offset = 0;
  for (int k = batch_rank - 1; k >= 0; --k) {
    offset += (flat % batch[k]) * v.strides[k];
    flat /= batch[k];
  }
  return offset;
}

/// Per-thread buffers of one task.
struct Scratch {
  std::vector<float> kp, vp, qp, s, o, m, l;
};

/// One task: query blocks [qb0, qb1) of batch element `flat`.
inline void task(const AttentionArgs& a, int64_t flat, int64_t qb0, int64_t qb1, float* out,
                 Scratch& w) {
  const int br = a.batch_rank;
  const int64_t lk = a.lk, d = a.d, dv = a.dv;
  const int64_t panels = (lk + kNR - 1) / kNR;
  const int64_t dvp = (dv + kWidth - 1) / kWidth * kWidth;
  const int out_vectors = static_cast<int>(dvp / kWidth);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float* q = static_cast<const float*>(a.q.data) + batch_offset(a.q, a.batch, br, flat);
  const float* kt = static_cast<const float*>(a.kt.data) + batch_offset(a.kt, a.batch, br, flat);
  const float* v = static_cast<const float*>(a.v.data) + batch_offset(a.v, a.batch, br, flat);
  const int64_t qrs = a.q.strides[br], qcs = a.q.strides[br + 1];
  const int64_t krs = a.kt.strides[br], kcs = a.kt.strides[br + 1];
  const int64_t vrs = a.v.strides[br], vcs = a.v.strides[br + 1];
  const bool masked = a.mask_kind != kAttentionNoMask;
  const int64_t mrs = masked ? a.mask.strides[br] : 0, mcs = masked ? a.mask.strides[br + 1] : 0;
  const int64_t mask_offset = masked ? batch_offset(a.mask, a.batch, br, flat) : 0;
  const bool* bool_mask =
      a.mask_kind == kAttentionKeepWhereTrue || a.mask_kind == kAttentionKeepWhereFalse
          ? static_cast<const bool*>(a.mask.data) + mask_offset
          : nullptr;
  const float* add_mask = a.mask_kind == kAttentionAddMask
                              ? static_cast<const float*>(a.mask.data) + mask_offset
                              : nullptr;
  const bool keep_value = a.mask_kind == kAttentionKeepWhereTrue;
  // A tile of masked keys adds exactly 0 once every row's max is above fill + 128.
  const bool can_skip = bool_mask != nullptr && std::isfinite(a.fill);

  // K^T into panels of kNR keys (zeros past Lk), V into rows of dvp (zeros past Dv).
  w.kp.resize(static_cast<size_t>(panels * d * kNR));
  w.vp.resize(static_cast<size_t>(lk * dvp));
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t width = std::min<int64_t>(kNR, lk - p * kNR);
    for (int64_t k = 0; k < d; ++k) {
      float* dst = w.kp.data() + (p * d + k) * kNR;
      const float* src = kt + k * krs + p * kNR * kcs;
      int64_t c = 0;
      if (kcs == 1) {
        for (; c < width; ++c) dst[c] = src[c];
      } else {
        for (; c < width; ++c) dst[c] = src[c * kcs];
      }
      for (; c < kNR; ++c) dst[c] = 0.0f;
    }
  }
  for (int64_t j = 0; j < lk; ++j) {
    float* dst = w.vp.data() + j * dvp;
    const float* src = v + j * vrs;
    int64_t c = 0;
    if (vcs == 1) {
      for (; c < dv; ++c) dst[c] = src[c];
    } else {
      for (; c < dv; ++c) dst[c] = src[c * vcs];
    }
    for (; c < dvp; ++c) dst[c] = 0.0f;
  }
  w.qp.resize(static_cast<size_t>(kBlockQ * d));
  w.s.resize(static_cast<size_t>(kBlockQ * kBlockK));
  w.o.resize(static_cast<size_t>(kBlockQ * dvp));
  w.m.resize(kBlockQ);
  w.l.resize(kBlockQ);
  float* const s = w.s.data();
  float* const o = w.o.data();
  float* const m = w.m.data();
  float* const l = w.l.data();

  for (int64_t qb = qb0; qb < qb1; ++qb) {
    const int64_t i0 = qb * kBlockQ;
    const int64_t rows = std::min<int64_t>(kBlockQ, a.lq - i0);
    const int64_t rows_p = (rows + kMR - 1) / kMR * kMR;
    for (int64_t r = 0; r < rows_p; ++r) {
      float* dst = w.qp.data() + r * d;
      if (r >= rows) {
        std::fill(dst, dst + d, 0.0f);
        continue;
      }
      const float* src = q + (i0 + r) * qrs;
      if (qcs == 1) {
        std::copy(src, src + d, dst);
      } else {
        for (int64_t k = 0; k < d; ++k) dst[k] = src[k * qcs];
      }
    }
    std::fill(m, m + kBlockQ, neg_inf);
    std::fill(l, l + kBlockQ, 0.0f);
    std::fill(o, o + rows_p * dvp, 0.0f);

    for (int64_t j0 = 0; j0 < lk; j0 += kBlockK) {
      const int64_t n = std::min<int64_t>(kBlockK, lk - j0);
      const int64_t tile_panels = (n + kNR - 1) / kNR;
      // Panels whose keys a bool mask hides from every row of the block (a causal mask's upper
      // triangle) need no product: Where replaces those scores with `fill` whatever they are.
      bool hidden[kBlockK / kNR] = {};
      int64_t last_live = -1;  // the last panel some row sees
      for (int64_t p = 0; p < tile_panels; ++p) {
        bool all = bool_mask != nullptr;
        const int64_t c0 = p * kNR, c1 = std::min<int64_t>(n, c0 + kNR);
        for (int64_t r = 0; r < rows && all; ++r) {
          const bool* mr = bool_mask + (i0 + r) * mrs + (j0 + c0) * mcs;
          for (int64_t c = 0; c < c1 - c0 && all; ++c) all = mr[c * mcs] != keep_value;
        }
        hidden[p] = all;
        if (!all) last_live = p;
      }
      if (can_skip && last_live < 0) {
        // Every score of the tile is fill: it adds exp(fill - m) = 0 once each max exceeds it.
        bool skip = true;
        for (int64_t r = 0; r < rows && skip; ++r) skip = m[r] > a.fill + 128.0f;
        if (skip) continue;
      }
      // Scores of the tile: S[r, c] = Q[r, :] . K^T[:, j0 + c] over whole panels.
      for (int64_t r0 = 0; r0 < rows_p; r0 += kMR) {
        for (int64_t p = 0; p < tile_panels; ++p) {
          if (hidden[p]) continue;
          micro_kernel<kKeyVectors>(d, w.qp.data() + r0 * d, d,
                                    w.kp.data() + (j0 / kNR + p) * d * kNR, kNR,
                                    s + r0 * kBlockK + p * kNR, kBlockK, false);
        }
      }
      // Scale and mask, then the online softmax of each row; P overwrites S.
      const int64_t n_vec = (n + kWidth - 1) / kWidth * kWidth;
      const Vec scale = vset(a.scale);
      for (int64_t r = 0; r < rows; ++r) {
        float* sr = s + r * kBlockK;
        for (int64_t c = 0; c < n_vec; c += kWidth) vstore(sr + c, vmul(vload(sr + c), scale));
        if (bool_mask != nullptr) {
          const bool* mr = bool_mask + (i0 + r) * mrs + j0 * mcs;
          for (int64_t p = 0; p < tile_panels; ++p) {
            const int64_t c0 = p * kNR, c1 = std::min<int64_t>(n, c0 + kNR);
            if (hidden[p]) {
              std::fill(sr + c0, sr + c1, a.fill);
            } else {
              apply_bool_mask(sr + c0, mr + c0 * mcs, mcs, c1 - c0, keep_value, a.fill);
            }
          }
        } else if (add_mask != nullptr) {
          const float* mr = add_mask + (i0 + r) * mrs + j0 * mcs;
          if (mcs == 1) {
            int64_t c = 0;
            for (; c + kWidth <= n; c += kWidth) vstore(sr + c, vadd(vload(sr + c), vload(mr + c)));
            for (; c < n; ++c) sr[c] += mr[c];
          } else {
            for (int64_t c = 0; c < n; ++c) sr[c] += mr[c * mcs];
          }
        }
        for (int64_t c = n; c < n_vec; ++c) sr[c] = neg_inf;
        Vec mx = vset(neg_inf);
        for (int64_t c = 0; c < n_vec; c += kWidth) mx = vmax(mx, vload(sr + c));
        const float m_new = std::max(m[r], hmax(mx));
        if (m_new == neg_inf) {
          // Every score so far is -inf: the tile adds nothing (a row that stays so gives NaN).
          std::fill(sr, sr + n_vec, 0.0f);
          continue;
        }
        const float correction = std::exp(m[r] - m_new);
        const Vec mv = vset(m_new);
        Vec sum = vzero();
        for (int64_t c = 0; c < n_vec; c += kWidth) {
          const Vec e = vexp(vsub(vload(sr + c), mv));
          vstore(sr + c, e);
          sum = vadd(sum, e);
        }
        l[r] = l[r] * correction + hsum(sum);
        m[r] = m_new;
        if (correction != 1.0f) {
          float* orow = o + r * dvp;
          const Vec cv = vset(correction);
          for (int64_t c = 0; c < dvp; c += kWidth) vstore(orow + c, vmul(vload(orow + c), cv));
        }
      }
      // Padding rows (past `rows`) hold the scores of zero queries, 0: they add 0 @ V.
      for (int64_t r = rows; r < rows_p; ++r) std::fill(s + r * kBlockK, s + r * kBlockK + n, 0.f);
      // Hidden panels after the last live one add exactly 0 @ V when every row's max exceeds
      // fill by 128 (exp underflows to 0): the product stops at the last live panel.
      int64_t n_pv = n;
      if (can_skip && last_live + 1 < tile_panels) {
        bool zero = true;
        for (int64_t r = 0; r < rows && zero; ++r) zero = m[r] > a.fill + 128.0f;
        if (zero) n_pv = std::min<int64_t>(n, (last_live + 1) * kNR);
      }
      // O += P @ V[j0 : j0 + n].
      for (int64_t r0 = 0; r0 < rows_p; r0 += kMR) {
        for (int vc = 0; vc < out_vectors; vc += kKeyVectors) {
          const int nv = std::min(kKeyVectors, out_vectors - vc);
          const float* bv = w.vp.data() + j0 * dvp + vc * kWidth;
          float* ov = o + r0 * dvp + vc * kWidth;
          if (nv == kKeyVectors) {
            micro_kernel<kKeyVectors>(n_pv, s + r0 * kBlockK, kBlockK, bv, dvp, ov, dvp, true);
          } else {
            micro_kernel_n(nv, n_pv, s + r0 * kBlockK, kBlockK, bv, dvp, ov, dvp);
          }
        }
      }
    }
    // out = O / l (0 / 0 = NaN for a row of -inf scores).
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / l[r];
      const float* orow = o + r * dvp;
      float* dst = out + (i0 + r) * dv;
      for (int64_t c = 0; c < dv; ++c) dst[c] = orow[c] * inv;
    }
  }
}

}  // namespace attention_detail

/// Runs the fused attention into `out` (contiguous [batch.., Lq, Dv]).
inline void attention(const AttentionArgs& a, float* out) {
  using namespace attention_detail;
  int64_t batch = 1;
  for (int k = 0; k < a.batch_rank; ++k) batch *= a.batch[k];
  if (batch == 0 || a.lq == 0 || a.dv == 0) return;
  if (a.lk == 0) {
    // Softmax over no keys: ONNX's Softmax of an empty axis, then a product over K = 0.
    std::fill(out, out + batch * a.lq * a.dv, 0.0f);
    return;
  }
  const int64_t blocks = (a.lq + kBlockQ - 1) / kBlockQ;
  // Enough tasks for every thread: split each batch element's query blocks into `parts` ranges
  // (each range packs K and V once).
  const int64_t threads = requested_threads();
  const int64_t parts = std::clamp<int64_t>((2 * threads + batch - 1) / batch, 1, blocks);
  const int64_t tasks = batch * parts;
  const int64_t flops = batch * a.lq * a.lk * (a.d + a.dv);
  parallel_for(tasks > 1 && flops > (int64_t{1} << 16), tasks, [&](int64_t lo, int64_t hi) {
    Scratch scratch;
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t flat = t / parts, part = t % parts;
      task(a, flat, blocks * part / parts, blocks * (part + 1) / parts, out + flat * a.lq * a.dv,
           scratch);
    }
  });
}

}  // namespace kiln_rt
