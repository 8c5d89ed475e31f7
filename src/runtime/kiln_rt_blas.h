#pragma once
// Kiln runtime: matrix multiplication through BLAS (OpenBLAS, OpenMP build, called
// single-threaded from the chunks of Kiln's pool). Extern kernel "matmul": out[..., M, N] = alpha *
// A[..., M, K] @ B[..., K, N] + beta * C, with batch dims broadcast through stride-0 views.

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kiln_rt.h"

/// Concurrent runs of one model serialize their BLAS products on this lock (OpenBLAS's OpenMP
/// build shares its buffers and thread setting between callers); the chunks of one product run
/// concurrently, each a single-threaded call. The GEMM choice that calls OpenBLAS
/// (autotune/choice.cpp) declares the same inline variable, so the library has one.
inline std::mutex kiln_blas_mutex;

namespace kiln_rt {

namespace blas_detail {

inline void blas_call(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                      float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void blas_call(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                      double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
                      double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// C = alpha * op(A) @ op(B) + beta * C, row-major, as single-threaded BLAS calls on blocks of C
/// run on Kiln's pool (parallel_gemm), so OpenBLAS starts no threads of its own.
template <typename T>
inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, T alpha,
                 const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  std::lock_guard<std::mutex> lock(kiln_blas_mutex);
  parallel_gemm(m, n, k, [&](bool by_rows, int64_t first, int64_t last) {
    if (by_rows) {
      const T* a_rows = ta == CblasNoTrans ? a + first * lda : a + first;
      blas_call(ta, tb, last - first, n, k, alpha, a_rows, lda, b, ldb, beta, c + first * ldc, ldc);
    } else {
      const T* b_cols = tb == CblasNoTrans ? b + first : b + first * ldb;
      blas_call(ta, tb, m, last - first, k, alpha, a, lda, b_cols, ldb, beta, c + first, ldc);
    }
  });
}

/// How BLAS reads a 2-D strided matrix of rows x cols: row-major with a leading dimension, or
/// transposed; false when neither (the caller copies).
inline bool blas_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                        CBLAS_TRANSPOSE* trans, int64_t* ld) {
  if (col_stride == 1 || cols == 1) {
    *trans = CblasNoTrans;
    *ld = rows == 1 ? std::max<int64_t>(cols, 1) : std::max<int64_t>(row_stride, cols);
    return rows == 1 || row_stride >= cols;
  }
  if (row_stride == 1 || rows == 1) {
    *trans = CblasTrans;
    *ld = cols == 1 ? std::max<int64_t>(rows, 1) : std::max<int64_t>(col_stride, rows);
    return cols == 1 || col_stride >= rows;
  }
  return false;
}

/// Offset of batch element `b` (row-major over the first rank-2 sizes of `shape`) in a view.
inline int64_t batch_offset(const View& v, const int64_t* shape, int batch_rank, int64_t b) {
  int64_t offset = 0;
  for (int k = batch_rank - 1; k >= 0; --k) {
    offset += (b % shape[k]) * v.strides[k];
    b /= shape[k];
  }
  return offset;
}

/// True when the batch dims and the row dim of `v` fold into one row dim (so a batched product
/// against a shared B is one GEMM with batch * M rows).
inline bool rows_fold(const View& v, int batch_rank) {
  int64_t expect = v.strides[batch_rank] * v.sizes[batch_rank];
  for (int k = batch_rank - 1; k >= 0; --k) {
    if (v.sizes[k] != 1 && v.strides[k] != expect) return false;
    expect *= v.sizes[k];
  }
  return v.strides[batch_rank + 1] == 1;
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define KILN_RT_SMALL_BATCHED_GEMM 1

/// Batched float32 products too small for a BLAS call each (attention's Q K^T and P V: per head
/// 128 x 128 x 64 spent most of its time in OpenBLAS's per-call threading): the pool's threads
/// share (batch element, block of rows) tasks, each packs its B into NR-column panels and runs an
/// MR x NR register-blocked kernel (the GEMM template's 6 x 64 on AVX-512, 6 x 16 on AVX2)
/// reading A in place through its strides. out = alpha * A @ B (+ out when accumulate).
namespace small_gemm {

// constexpr, not inline constexpr, as in kiln_rt_attention.h: an inline variable is a GNU unique
// symbol shared by every variant loaded in the process, and these differ between variants.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kWidth = 16, kVectors = 4;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset(float x) { return _mm512_set1_ps(x); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
#else
using Vec = __m256;
constexpr int kWidth = 8, kVectors = 2;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset(float x) { return _mm256_set1_ps(x); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
#endif
constexpr int kMR = 6, kNR = kWidth * kVectors;
/// Rows per task: a multiple of kMR, small enough that a few heads give every thread work.
constexpr int64_t kRowsPerTask = 48;

/// Whether a batched product of this size takes this path rather than BLAS.
inline bool fits(int64_t batch, int64_t m, int64_t n, int64_t k) {
  return batch > 1 && m * n * k <= (int64_t{1} << 22) && k * (n + kNR) <= (int64_t{1} << 20);
}

/// tile (kMR x kNR, row-major) = A rows [i0, i0 + kMR) (row stride ars, column stride acs)
/// @ the packed panel bp (k rows of kNR).
inline void micro_kernel(int64_t k, const float* a, int64_t ars, int64_t acs, const float* bp,
                         float* tile) {
  Vec acc[kMR][kVectors];
  for (int r = 0; r < kMR; ++r)
    for (int v = 0; v < kVectors; ++v) acc[r][v] = vzero();
  for (int64_t p = 0; p < k; ++p) {
    Vec b[kVectors];
    for (int v = 0; v < kVectors; ++v) b[v] = vload(bp + p * kNR + v * kWidth);
    for (int r = 0; r < kMR; ++r) {
      const Vec x = vset(a[r * ars + p * acs]);
      for (int v = 0; v < kVectors; ++v) acc[r][v] = vfma(x, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < kMR; ++r)
    for (int v = 0; v < kVectors; ++v) vstore(tile + r * kNR + v * kWidth, acc[r][v]);
}

/// One task: rows [r0, r1) of out_b[m, n] = alpha * A_b @ B_b (+ out_b). B is read through its
/// strides (brs, bcs) into `packed` (k * roundup(n, kNR) floats); a last block of fewer than kMR
/// rows is copied into `rest` (kMR * k floats) with zero rows after it.
inline void rows(int64_t r0, int64_t r1, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t ars, int64_t acs, const float* b, int64_t brs, int64_t bcs, float* out,
                 bool accumulate, float* packed, float* rest) {
  const int64_t panels = (n + kNR - 1) / kNR;
  for (int64_t j = 0; j < panels; ++j) {
    float* dst = packed + j * k * kNR;
    const int64_t width = std::min<int64_t>(kNR, n - j * kNR);
    for (int64_t p = 0; p < k; ++p) {
      const float* src = b + p * brs + j * kNR * bcs;
      int64_t q = 0;
      for (; q < width; ++q) dst[p * kNR + q] = src[q * bcs];
      for (; q < kNR; ++q) dst[p * kNR + q] = 0.0f;
    }
  }
  alignas(64) float tile[kMR * kNR];
  for (int64_t i0 = r0; i0 < r1; i0 += kMR) {
    const int64_t mr = std::min<int64_t>(kMR, r1 - i0);
    if (mr < kMR) {
      std::fill(rest, rest + kMR * k, 0.0f);
      for (int64_t r = 0; r < mr; ++r)
        for (int64_t p = 0; p < k; ++p) rest[r * k + p] = a[(i0 + r) * ars + p * acs];
    }
    for (int64_t j = 0; j < panels; ++j) {
      if (mr == kMR) {
        micro_kernel(k, a + i0 * ars, ars, acs, packed + j * k * kNR, tile);
      } else {
        micro_kernel(k, rest, k, 1, packed + j * k * kNR, tile);
      }
      const int64_t width = std::min<int64_t>(kNR, n - j * kNR);
      for (int64_t r = 0; r < mr; ++r) {
        float* o = out + (i0 + r) * n + j * kNR;
        const float* t = tile + r * kNR;
        if (accumulate) {
          for (int64_t q = 0; q < width; ++q) o[q] += alpha * t[q];
        } else {
          for (int64_t q = 0; q < width; ++q) o[q] = alpha * t[q];
        }
      }
    }
  }
}

}  // namespace small_gemm
#endif

}  // namespace blas_detail

/// out (contiguous, rank >= 2) = alpha * a @ b + beta * c. a, b and c are views of the output's
/// rank (batch dims broadcast with stride 0); c may be absent (data == nullptr).
template <typename T>
inline void matmul(const View& a, const View& b, const View* c, T* out, const int64_t* out_shape,
                   int rank, double alpha, double beta) {
  using namespace blas_detail;
  const int batch_rank = rank - 2;
  const int64_t m = out_shape[rank - 2], n = out_shape[rank - 1], k = a.sizes[rank - 1];
  int64_t batch = 1;
  for (int d = 0; d < batch_rank; ++d) batch *= out_shape[d];
  if (batch == 0 || m == 0 || n == 0) return;

  // The bias is written first and accumulated into (beta folded into the copy).
  T gemm_beta = 0;
  if (c != nullptr && c->data != nullptr && beta != 0) {
    const T* cdata = static_cast<const T*>(c->data);
    int64_t total = batch * m * n;
    parallel_for(total > 32768, total, [&](int64_t kiln_lo, int64_t kiln_hi) {
      for (int64_t flat = kiln_lo; flat < kiln_hi; ++flat) {
        int64_t rest = flat, offset = 0;
        for (int d = rank - 1; d >= 0; --d) {
          offset += (rest % out_shape[d]) * c->strides[d];
          rest /= out_shape[d];
        }
        out[flat] = static_cast<T>(beta) * cdata[offset];
      }
    });
    gemm_beta = 1;
  }

  if (k == 0) {
    if (gemm_beta == 0) std::fill(out, out + batch * m * n, T(0));
    return;
  }

#ifdef KILN_RT_SMALL_BATCHED_GEMM
  if constexpr (std::is_same_v<T, float>) {
    if (small_gemm::fits(batch, m, n, k)) {
      const int64_t tasks_per_batch = (m + small_gemm::kRowsPerTask - 1) / small_gemm::kRowsPerTask;
      const int64_t ars = a.strides[rank - 2], acs = a.strides[rank - 1];
      const int64_t brs = b.strides[rank - 2], bcs = b.strides[rank - 1];
      const size_t packed_size =
          static_cast<size_t>(k * ((n + small_gemm::kNR - 1) / small_gemm::kNR) * small_gemm::kNR);
      const int64_t tasks = batch * tasks_per_batch;
      parallel_for(tasks > 1, tasks, [&](int64_t lo, int64_t hi) {
        // Each chunk packs into its own buffers.
        std::vector<float> packed(packed_size), rest(static_cast<size_t>(small_gemm::kMR * k));
        for (int64_t task = lo; task < hi; ++task) {
          const int64_t i = task / tasks_per_batch;
          const int64_t r0 = task % tasks_per_batch * small_gemm::kRowsPerTask;
          const int64_t r1 = std::min(m, r0 + small_gemm::kRowsPerTask);
          small_gemm::rows(
              r0, r1, n, k, static_cast<float>(alpha),
              static_cast<const float*>(a.data) + batch_offset(a, out_shape, batch_rank, i), ars,
              acs, static_cast<const float*>(b.data) + batch_offset(b, out_shape, batch_rank, i),
              brs, bcs, out + i * m * n, gemm_beta != 0, packed.data(), rest.data());
        }
      });
      return;
    }
  }
#endif

  bool b_shared = true;
  for (int d = 0; d < batch_rank; ++d)
    b_shared = b_shared && (b.strides[d] == 0 || out_shape[d] == 1);
  CBLAS_TRANSPOSE tb;
  int64_t ldb;
  std::vector<T> b_copy;
  const T* bdata = static_cast<const T*>(b.data);
  bool b_ok = blas_layout(k, n, b.strides[rank - 2], b.strides[rank - 1], &tb, &ldb);
  if (!b_ok) {
    b_copy.resize(static_cast<size_t>(batch * k * n));
    // Copy per batch into contiguous [batch, K, N].
    for (int64_t i = 0; i < batch; ++i) {
      View one = b;
      one.data = bdata + batch_offset(b, out_shape, batch_rank, i);
      one.rank = 2;
      one.sizes[0] = k;
      one.sizes[1] = n;
      one.strides[0] = b.strides[rank - 2];
      one.strides[1] = b.strides[rank - 1];
      copy_to_contiguous(one, b_copy.data() + i * k * n);
    }
    tb = CblasNoTrans;
    ldb = std::max<int64_t>(n, 1);
    b_shared = false;
  }

  // One GEMM when B is shared across the batch and A's batch and row dims fold together.
  if (b_shared && batch > 1 && rows_fold(a, batch_rank)) {
    gemm(CblasNoTrans, tb, batch * m, n, k, static_cast<T>(alpha), static_cast<const T*>(a.data),
         std::max<int64_t>(a.strides[rank - 2], std::max<int64_t>(k, 1)),
         b_ok ? bdata : b_copy.data(), ldb, gemm_beta, out, n);
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    const T* adata = static_cast<const T*>(a.data) + batch_offset(a, out_shape, batch_rank, i);
    CBLAS_TRANSPOSE ta;
    int64_t lda;
    std::vector<T> a_copy;
    if (!blas_layout(m, k, a.strides[rank - 2], a.strides[rank - 1], &ta, &lda)) {
      View one = a;
      one.data = adata;
      one.rank = 2;
      one.sizes[0] = m;
      one.sizes[1] = k;
      one.strides[0] = a.strides[rank - 2];
      one.strides[1] = a.strides[rank - 1];
      a_copy.resize(static_cast<size_t>(m * k));
      copy_to_contiguous(one, a_copy.data());
      adata = a_copy.data();
      ta = CblasNoTrans;
      lda = std::max<int64_t>(k, 1);
    }
    const T* bi =
        b_ok ? bdata + batch_offset(b, out_shape, batch_rank, i) : b_copy.data() + i * k * n;
    gemm(ta, tb, m, n, k, static_cast<T>(alpha), adata, lda, bi, ldb, gemm_beta, out + i * m * n,
         n);
  }
}

}  // namespace kiln_rt
