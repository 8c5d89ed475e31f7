#include "codegen/cuda/cuda_gemm_template.h"

#include <fmt/format.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kiln::codegen {

namespace {

/// The template itself, the same for every precision and configuration (the instantiations
/// follow it). Fragment layouts are the PTX ISA's for mma.m16n8k8 (.tf32) and mma.m16n8k16
/// (.f16/.bf16), lane = 4 * g + t: A (16 x K) row g or g + 8, B (K x 8) column g, C (16 x 8)
/// rows g and g + 8, columns 2t and 2t + 1. tests/unit/codegen/cuda_gemm_template_test.cpp
/// checks on the host that the loads and stores below cover every tile element exactly once.
constexpr const char* kTemplate = R"(
// Kiln's tensor-core GEMM (codegen/cuda/cuda_gemm_template.h).
namespace kiln_gemm {

// The operands of one launch: kiln_rt_cuda.h's GemmParams, field for field.
struct Params {
  const void* a;         // [batches][M][K], rows lda apart
  const void* b;         // [batches][K][N] (kn) or [batches][N][K] (nk), rows ldb apart
  void* out;             // [batches][M][N], rows ldo apart
  const void* bias;      // N elements added to each row, or null
  const void* residual;  // laid out as out, or null
  float* partial;        // split-K: [splits][batches][M][N] float32 sums
  int64_t m, n, k;
  int64_t lda, ldb, ldo;
  int64_t a_batch, b_batch, o_batch;
  int64_t k_piece;  // K of one split piece: a multiple of the tile's depth
  int32_t batches;
  int32_t splits;
  int32_t act;  // 0: none, 1: Relu, 2: Gelu (tanh form)
  int32_t vec;  // 1: operand rows and bases 16-byte aligned, copied by 16-byte cp.async
  float alpha;
  int32_t unused;
};

// The precisions: the element type in memory and the depth of one mma.
struct Tf32 {
  using T = float;
  static constexpr int kMmaK = 8;
};
struct F16 {
  using T = unsigned short;
  static constexpr int kMmaK = 16;
};
struct Bf16 {
  using T = unsigned short;
  static constexpr int kMmaK = 16;
};

__device__ __forceinline__ float bits_float(unsigned u) {
  float f;
  asm("mov.b32 %0, %1;" : "=f"(f) : "r"(u));
  return f;
}
__device__ __forceinline__ float to_f32(Tf32, float x) { return x; }
__device__ __forceinline__ float to_f32(F16, unsigned short x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
}
__device__ __forceinline__ float to_f32(Bf16, unsigned short x) {
  return bits_float(static_cast<unsigned>(x) << 16);
}
__device__ __forceinline__ float from_f32(Tf32, float x) { return x; }
__device__ __forceinline__ unsigned short from_f32(F16, float x) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
__device__ __forceinline__ unsigned short from_f32(Bf16, float x) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned long long a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return static_cast<unsigned>(a);
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copies the ROWS x COLS tile whose element (r, c) is g[(row0 + r) * ld + col0 + c] into
// s[r * STRIDE + c], zeros where row0 + r >= row_end or col0 + c >= col_end. In 16-byte chunks
// along the rows: cp.async of the chunk's valid bytes (the rest zero-filled) when `vec`, else
// element loads stored by the thread.
template <class P, int ROWS, int COLS, int STRIDE, int THREADS>
__device__ __forceinline__ void load_tile(typename P::T* s, const typename P::T* g, int64_t ld,
                                          int64_t row0, int64_t row_end, int64_t col0,
                                          int64_t col_end, bool vec, int tid) {
  using T = typename P::T;
  constexpr int kChunk = 16 / static_cast<int>(sizeof(T));
  constexpr int kChunksPerRow = COLS / kChunk;
#pragma unroll
  for (int c = tid; c < ROWS * kChunksPerRow; c += THREADS) {
    const int r = c / kChunksPerRow, cc = (c % kChunksPerRow) * kChunk;
    const int64_t row = row0 + r, col = col0 + cc;
    int64_t valid = row < row_end ? col_end - col : 0;
    valid = valid < 0 ? 0 : valid > kChunk ? kChunk : valid;
    const T* src = g + (valid > 0 ? row * ld + col : 0);
    T* dst = s + r * STRIDE + cc;
    if (vec) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
                   "l"(src), "r"(static_cast<int>(valid * static_cast<int64_t>(sizeof(T)))));
    } else {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) dst[e] = e < valid ? src[e] : T(0);
    }
  }
}

__device__ __forceinline__ unsigned tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ unsigned pair(const unsigned short* p) {
  return *reinterpret_cast<const unsigned*>(p);
}

// A's fragment for the 16 rows from `row` and the mma's K from `kk` (s: the A tile, rows S apart).
template <int S>
__device__ __forceinline__ void frag_a(Tf32, unsigned* f, const float* s, int row, int kk, int g,
                                       int t) {
  const float* p = s + (row + g) * S + kk + t;
  f[0] = tf32(p[0]);
  f[1] = tf32(p[8 * S]);
  f[2] = tf32(p[4]);
  f[3] = tf32(p[8 * S + 4]);
}
template <int S, class P>
__device__ __forceinline__ void frag_a(P, unsigned* f, const unsigned short* s, int row, int kk,
                                       int g, int t) {
  const unsigned short* p = s + (row + g) * S + kk + 2 * t;
  f[0] = pair(p);
  f[1] = pair(p + 8 * S);
  f[2] = pair(p + 8);
  f[3] = pair(p + 8 * S + 8);
}
// B's fragment for the 8 columns from `col`: B_NK, the tile is [N][K] (rows S apart), else [K][N].
template <int S, bool B_NK>
__device__ __forceinline__ void frag_b(Tf32, unsigned* f, const float* s, int col, int kk, int g,
                                       int t) {
  if (B_NK) {
    const float* p = s + (col + g) * S + kk + t;
    f[0] = tf32(p[0]);
    f[1] = tf32(p[4]);
  } else {
    const float* p = s + (kk + t) * S + col + g;
    f[0] = tf32(p[0]);
    f[1] = tf32(p[4 * S]);
  }
}
template <int S, bool B_NK, class P>
__device__ __forceinline__ void frag_b(P, unsigned* f, const unsigned short* s, int col, int kk,
                                       int g, int t) {
  if (B_NK) {
    const unsigned short* p = s + (col + g) * S + kk + 2 * t;
    f[0] = pair(p);
    f[1] = pair(p + 8);
  } else {
    const unsigned short* p = s + (kk + 2 * t) * S + col + g;
    f[0] = static_cast<unsigned>(p[0]) | static_cast<unsigned>(p[S]) << 16;
    f[1] = static_cast<unsigned>(p[8 * S]) | static_cast<unsigned>(p[9 * S]) << 16;
  }
}

)";

/// The rest of the template, after the mma functions (mma_functions()).
constexpr const char* kTemplateBody = R"(
// The epilogue of element (m, n) of batch `batch`: act(alpha * sum + bias[n] + residual), in
// float32, stored in the element type.
template <class P>
__device__ __forceinline__ void finish(const Params& p, int64_t batch, int64_t m, int64_t n,
                                       float sum) {
  using T = typename P::T;
  float v = p.alpha * sum;
  if (p.bias != nullptr) v += to_f32(P(), static_cast<const T*>(p.bias)[n]);
  const int64_t at = batch * p.o_batch + m * p.ldo + n;
  if (p.residual != nullptr) v += to_f32(P(), static_cast<const T*>(p.residual)[at]);
  if (p.act == 1) {
    v = v > 0.0f ? v : 0.0f;
  } else if (p.act == 2) {
    v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  }
  static_cast<T*>(p.out)[at] = from_f32(P(), v);
}

// One block: the BM x BN tile (blockIdx.y, blockIdx.x) of batch blockIdx.z / splits, over split
// piece blockIdx.z % splits of K.
template <class P, int BM, int BN, int BK, int WM, int WN, int STAGES, bool B_NK>
__device__ __forceinline__ void gemm(const Params& p) {
  using T = typename P::T;
  constexpr int kThreads = WM * WN * 32;
  // 16 bytes of padding per row of A (and of B as [N][K]), 8 elements per row of B as [K][N]:
  // rows stay 16-byte aligned for cp.async and the fragment loads hit 32 distinct banks.
  constexpr int kPad = 16 / static_cast<int>(sizeof(T));
  constexpr int kStrideA = BK + kPad;
  constexpr int kStrideB = B_NK ? BK + kPad : BN + 8;
  constexpr int kTileA = BM * kStrideA;
  constexpr int kTileB = B_NK ? BN * kStrideB : BK * kStrideB;
  constexpr int MI = BM / WM / 16, NI = BN / WN / 8;
  extern __shared__ __align__(16) unsigned char kiln_gemm_smem[];
  T* const smem = reinterpret_cast<T*>(kiln_gemm_smem);
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = (warp / WN) * (BM / WM), wn = (warp % WN) * (BN / WN);
  const int64_t batch = static_cast<int64_t>(blockIdx.z) / p.splits;
  const int64_t piece = static_cast<int64_t>(blockIdx.z) % p.splits;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * BM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;
  const T* const a = static_cast<const T*>(p.a) + batch * p.a_batch;
  const T* const b = static_cast<const T*>(p.b) + batch * p.b_batch;
  const int64_t kbeg = piece * p.k_piece;
  const int64_t kend = p.k < kbeg + p.k_piece ? p.k : kbeg + p.k_piece;
  const int ktiles = kend > kbeg ? static_cast<int>((kend - kbeg + BK - 1) / BK) : 0;
  const bool vec = p.vec != 0;

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

  // Slice kt of K into buffer `stage`.
  auto load_stage = [&](int kt, int stage) {
    T* sa = smem + stage * (kTileA + kTileB);
    T* sb = sa + kTileA;
    const int64_t k0 = kbeg + static_cast<int64_t>(kt) * BK;
    load_tile<P, BM, BK, kStrideA, kThreads>(sa, a, p.lda, m0, p.m, k0, kend, vec, tid);
    if constexpr (B_NK) {
      load_tile<P, BN, BK, kStrideB, kThreads>(sb, b, p.ldb, n0, p.n, k0, kend, vec, tid);
    } else {
      load_tile<P, BK, BN, kStrideB, kThreads>(sb, b, p.ldb, k0, kend, n0, p.n, vec, tid);
    }
  };

  // STAGES - 1 slices in flight before the first mma; one cp.async group per slice (empty past
  // the last), so that waiting for all but STAGES - 2 groups waits for slice kt.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    wait_pending<STAGES - 2>();
    __syncthreads();  // slice kt is in; every warp is done with the buffer refilled next
    const int next = kt + STAGES - 1;
    if (next < ktiles) load_stage(next, next % STAGES);
    commit();
    const T* sa = smem + (kt % STAGES) * (kTileA + kTileB);
    const T* sb = sa + kTileA;
#pragma unroll
    for (int kk = 0; kk < BK; kk += P::kMmaK) {
      unsigned af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) frag_a<kStrideA>(P(), af[i], sa, wm + i * 16, kk, g, t);
#pragma unroll
      for (int j = 0; j < NI; ++j) frag_b<kStrideB, B_NK>(P(), bf[j], sb, wn + j * 8, kk, g, t);
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) mma(P(), acc[i][j], af[i], bf[j]);
    }
  }
  wait_pending<0>();

  // Accumulator e of tile (i, j): row g (+8 for e >= 2), column 2t + (e & 1).
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + wm + i * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t n = n0 + wn + j * 8 + 2 * t + (e & 1);
        if (m >= p.m || n >= p.n) continue;
        if (p.splits > 1) {
          p.partial[((piece * p.batches + batch) * p.m + m) * p.n + n] = acc[i][j][e];
        } else {
          finish<P>(p, batch, m, n, acc[i][j][e]);
        }
      }
}

// Split-K: element i of batches x M x N sums its pieces in order, then the epilogue.
template <class P>
__device__ __forceinline__ void reduce(const Params& p) {
  const int64_t total = static_cast<int64_t>(p.batches) * p.m * p.n;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += step) {
    float sum = 0.0f;
    for (int s = 0; s < p.splits; ++s) sum += p.partial[s * total + i];
    const int64_t n = i % p.n, m = (i / p.n) % p.m, batch = i / (p.n * p.m);
    finish<P>(p, batch, m, n, sum);
  }
}

}  // namespace kiln_gemm
)";

/// mma(P, c, a, b): c += a @ b for one m16n8k<8|16> tile, one function per precision: its
/// instruction shape and operand type.
std::string mma_functions() {
  std::string text;
  const std::pair<const char*, const char*> forms[] = {
      {"Tf32", "m16n8k8.row.col.f32.tf32.tf32.f32"},
      {"F16", "m16n8k16.row.col.f32.f16.f16.f32"},
      {"Bf16", "m16n8k16.row.col.f32.bf16.bf16.f32"}};
  for (const auto& [tag, form] : forms) {
    text += fmt::format(
        R"(__device__ __forceinline__ void mma({}, float* c, const unsigned* a, const unsigned* b) {{
  asm volatile(
      "mma.sync.aligned.{} {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}
)",
        tag, form);
  }
  return text;
}

/// A precision's names: in kernel names ("tf32") and its struct in the template ("Tf32").
std::pair<const char*, const char*> precision_names(CudaGemmPrecision precision) {
  switch (precision) {
    case CudaGemmPrecision::kF16:
      return {"f16", "F16"};
    case CudaGemmPrecision::kBf16:
      return {"bf16", "Bf16"};
    case CudaGemmPrecision::kTf32:
      break;
  }
  return {"tf32", "Tf32"};
}

/// The kernels of every configuration at `precision`, and its split-K reduction.
std::string instantiations(CudaGemmPrecision precision) {
  std::string source;
  const char* p = precision_names(precision).second;
  const std::vector<CudaGemmConfig>& configs = cuda_gemm_configs();
  for (size_t c = 0; c < configs.size(); ++c) {
    const CudaGemmConfig& k = configs[c];
    for (bool nk : {false, true}) {
      source += fmt::format(
          "extern \"C\" __global__ void __launch_bounds__({}) {}(kiln_gemm::Params p) {{\n"
          "  kiln_gemm::gemm<kiln_gemm::{}, {}, {}, {}, {}, {}, {}, {}>(p);\n}}\n",
          k.warps_m * k.warps_n * 32, cuda_gemm_kernel_name(precision, static_cast<int>(c), nk), p,
          k.bm, k.bn, k.bk, k.warps_m, k.warps_n, k.stages, nk ? "true" : "false");
    }
  }
  source += fmt::format(
      "extern \"C\" __global__ void __launch_bounds__(256) kiln_gemm_reduce_{}(kiln_gemm::Params "
      "p) {{\n  kiln_gemm::reduce<kiln_gemm::{}>(p);\n}}\n",
      cuda_gemm_precision_name(precision), p);
  return source;
}

}  // namespace

const std::vector<CudaGemmConfig>& cuda_gemm_configs() {
  // kiln_rt_cuda.h's kGemmConfigs: the same rows, in the same order.
  static const std::vector<CudaGemmConfig> configs = {
      {128, 128, 32, 2, 4, 3},  // 8 warps of 64 x 32
      {64, 128, 32, 2, 2, 3},   // 4 warps of 32 x 64
      {64, 64, 32, 2, 2, 4},    // 4 warps of 32 x 32
      {32, 64, 32, 1, 4, 4},    // 4 warps of 32 x 16: skinny products
  };
  return configs;
}

const char* cuda_gemm_precision_name(CudaGemmPrecision precision) {
  return precision_names(precision).first;
}

std::string cuda_gemm_kernel_name(CudaGemmPrecision precision, int config, bool b_nk) {
  return fmt::format("kiln_gemm_{}_c{}_{}", cuda_gemm_precision_name(precision), config,
                     b_nk ? "nk" : "kn");
}

std::string cuda_gemm_template_source(const std::set<CudaGemmPrecision>& precisions) {
  std::string source = std::string(kTemplate) + mma_functions() + kTemplateBody;
  for (CudaGemmPrecision precision : precisions) source += instantiations(precision);
  return source;
}

}  // namespace kiln::codegen
