#pragma once
// Kiln runtime: matrix multiplication through BLAS (OpenBLAS, OpenMP build, sharing the OpenMP
// pool with Kiln's kernels). Extern kernel "matmul": out[..., M, N] = alpha * A[..., M, K] @
// B[..., K, N] + beta * C, with batch dims broadcast through stride-0 views.

#include <cblas.h>

#include <mutex>

#include "kiln_rt.h"

/// OpenBLAS's OpenMP build does not support concurrent callers (its buffers and thread pool are
/// shared), so every BLAS call of a model library takes this lock: concurrent runs of one model
/// serialize their BLAS calls. The GEMM choice that calls OpenBLAS (autotune/choice.cpp)
/// declares the same inline variable, so the library has one.
inline std::mutex kiln_blas_mutex;

namespace kiln_rt {

namespace blas_detail {

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                 float* c, int64_t ldc) {
  std::lock_guard<std::mutex> lock(kiln_blas_mutex);
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k,
                 double alpha, const double* a, int64_t lda, const double* b, int64_t ldb,
                 double beta, double* c, int64_t ldc) {
  std::lock_guard<std::mutex> lock(kiln_blas_mutex);
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
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
#pragma omp parallel for if (total > 32768)
    for (int64_t flat = 0; flat < total; ++flat) {
      int64_t rest = flat, offset = 0;
      for (int d = rank - 1; d >= 0; --d) {
        offset += (rest % out_shape[d]) * c->strides[d];
        rest /= out_shape[d];
      }
      out[flat] = static_cast<T>(beta) * cdata[offset];
    }
    gemm_beta = 1;
  }

  if (k == 0) {
    if (gemm_beta == 0) std::fill(out, out + batch * m * n, T(0));
    return;
  }

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
