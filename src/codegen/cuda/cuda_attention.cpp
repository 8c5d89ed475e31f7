#include "codegen/cuda/cuda_attention.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "codegen/cpp/cpp_host_text.h"
#include "support/error.h"

namespace kiln::codegen {

std::string cuda_attention_kernel_name(int64_t d, int64_t dv) {
  return fmt::format("kiln_attention_f32_d{}_v{}", d, dv);
}

std::string cuda_attention_source(const std::set<std::pair<int64_t, int64_t>>& heads) {
  std::string text = R"(
// Fused attention (codegen/cuda/cuda_attention.h): kiln_cuda::AttentionParams's device side,
// the same fields in the same order.
struct KilnAttentionParams {
  const float* q;
  const float* kt;
  const float* v;
  const void* mask;
  float* out;
  int64_t lq, lk, d, dv;
  int64_t batch[6];
  int64_t q_strides[8];
  int64_t kt_strides[8];
  int64_t v_strides[8];
  int64_t mask_strides[8];
  int32_t batch_rank;
  int32_t mask_kind;  // 0 none, 1 keep where true, 2 keep where false, 3 add (float32)
  float scale;
  float fill;
};

#define KILN_ATT_WARPS 4  // warps per block
#define KILN_ATT_ROWS 2   // query rows per warp
#define KILN_ATT_KEYS 32  // keys per tile: one per lane

// The kernel for heads of D and DV (compile-time: the loops over them unroll).
template <int D, int DV>
__device__ __forceinline__ void kiln_attention(const KilnAttentionParams& p) {
  constexpr int ROWS = KILN_ATT_ROWS, KEYS = KILN_ATT_KEYS, COLS = (DV + 31) / 32;
  constexpr int THREADS = KILN_ATT_WARPS * 32, PER_BLOCK = KILN_ATT_WARPS * ROWS;
  __shared__ float qs[PER_BLOCK][D];
  __shared__ float ks[D][KEYS + 1];  // padded: conflict-free written along D or along keys
  __shared__ float vs[KEYS][DV];
  const float neg_inf = __int_as_float(0xff800000);
  const int64_t qblocks = (p.lq + PER_BLOCK - 1) / PER_BLOCK;
  const int64_t b = blockIdx.x / qblocks;
  const int64_t row0 = (blockIdx.x % qblocks) * PER_BLOCK;
  // Where batch element b starts in each view (broadcast dims have stride 0).
  int64_t oq = 0, ok = 0, ov = 0, om = 0, rest = b;
  for (int k = p.batch_rank - 1; k >= 0; --k) {
    const int64_t i = rest % p.batch[k];
    rest /= p.batch[k];
    oq += i * p.q_strides[k];
    ok += i * p.kt_strides[k];
    ov += i * p.v_strides[k];
    om += i * p.mask_strides[k];
  }
  const int r = p.batch_rank;
  const int64_t q_i = p.q_strides[r], q_c = p.q_strides[r + 1];
  const int64_t k_c = p.kt_strides[r], k_j = p.kt_strides[r + 1];
  const int64_t v_j = p.v_strides[r], v_c = p.v_strides[r + 1];
  const int64_t m_i = p.mask_strides[r], m_j = p.mask_strides[r + 1];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // The block's query rows, zeros past Lq.
  for (int e = tid; e < PER_BLOCK * D; e += THREADS) {
    const int row = e / D, c = e % D;
    const int64_t i = row0 + row;
    qs[row][c] = i < p.lq ? p.q[oq + i * q_i + c * q_c] : 0.0f;
  }
  float m[ROWS], l[ROWS], acc[ROWS][COLS];
#pragma unroll
  for (int w = 0; w < ROWS; ++w) {
    m[w] = neg_inf;
    l[w] = 0.0f;
#pragma unroll
    for (int t = 0; t < COLS; ++t) acc[w][t] = 0.0f;
  }
  // K^T is read along D when that is its contiguous dim (K's rows, as exporters write it).
  const bool k_along_d = k_c == 1;
  for (int64_t j0 = 0; j0 < p.lk; j0 += KEYS) {
    __syncthreads();  // the last tile's readers are done (the first time: qs is written)
    for (int e = tid; e < KEYS * D; e += THREADS) {
      const int c = k_along_d ? e % D : e / KEYS;
      const int j = k_along_d ? e / D : e % KEYS;
      const int64_t key = j0 + j;
      ks[c][j] = key < p.lk ? p.kt[ok + c * k_c + key * k_j] : 0.0f;
    }
    for (int e = tid; e < KEYS * DV; e += THREADS) {
      const int c = e % DV, j = e / DV;
      const int64_t key = j0 + j;
      vs[j][c] = key < p.lk ? p.v[ov + key * v_j + c * v_c] : 0.0f;
    }
    __syncthreads();
    // Lane j: key j0 + j's score for each of the warp's rows (two partial sums a row).
    float s[ROWS][2];
#pragma unroll
    for (int w = 0; w < ROWS; ++w) s[w][0] = s[w][1] = 0.0f;
#pragma unroll
    for (int c = 0; c < D; ++c) {
      const float k = ks[c][lane];
#pragma unroll
      for (int w = 0; w < ROWS; ++w)
        s[w][c & 1] = fmaf(qs[warp * ROWS + w][c], k, s[w][c & 1]);
    }
    const int64_t key = j0 + lane;
    float prob[ROWS];
#pragma unroll
    for (int w = 0; w < ROWS; ++w) {
      const int64_t i = row0 + warp * ROWS + w;
      float x = (s[w][0] + s[w][1]) * p.scale;
      if (p.mask_kind != 0 && key < p.lk && i < p.lq) {
        const int64_t at = om + i * m_i + key * m_j;
        if (p.mask_kind == 3) {
          x += static_cast<const float*>(p.mask)[at];
        } else {
          const bool set = static_cast<const unsigned char*>(p.mask)[at] != 0;
          if (set != (p.mask_kind == 1)) x = p.fill;
        }
      }
      if (key >= p.lk) x = neg_inf;  // past the last key: no weight
      float tile_max = x;
#pragma unroll
      for (int o = 16; o > 0; o /= 2)
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
      // Online softmax: rescale what the row has when its max grows. A row with no finite
      // score yet keeps 0 (and ends 0 / 0 = NaN if it never gets one, as Softmax gives).
      const float m_new = fmaxf(m[w], tile_max);
      const float scale_old = m_new == neg_inf ? 1.0f : expf(m[w] - m_new);
      const float e = m_new == neg_inf ? 0.0f : expf(x - m_new);
      float sum = e;
#pragma unroll
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l[w] = l[w] * scale_old + sum;
      m[w] = m_new;
#pragma unroll
      for (int t = 0; t < COLS; ++t) acc[w][t] *= scale_old;
      prob[w] = e;
    }
    // P V: key j's weight from lane j, times V's row j (past Lk both weight and row are 0).
#pragma unroll
    for (int j = 0; j < KEYS; ++j) {
      float pj[ROWS];
#pragma unroll
      for (int w = 0; w < ROWS; ++w) pj[w] = __shfl_sync(0xffffffffu, prob[w], j);
#pragma unroll
      for (int t = 0; t < COLS; ++t) {
        const int c = lane + 32 * t;
        if (c < DV) {
          const float value = vs[j][c];
#pragma unroll
          for (int w = 0; w < ROWS; ++w) acc[w][t] = fmaf(pj[w], value, acc[w][t]);
        }
      }
    }
  }
#pragma unroll
  for (int w = 0; w < ROWS; ++w) {
    const int64_t i = row0 + warp * ROWS + w;
    if (i >= p.lq) continue;
    float* out = p.out + (b * p.lq + i) * DV;
#pragma unroll
    for (int t = 0; t < COLS; ++t) {
      const int c = lane + 32 * t;
      // No keys: an empty sum, 0 (as MatMul over an empty Softmax gives).
      if (c < DV) out[c] = p.lk == 0 ? 0.0f : acc[w][t] / l[w];
    }
  }
}
)";
  for (const auto& [d, dv] : heads) {
    text += fmt::format(
        "\nextern \"C\" __global__ void __launch_bounds__(KILN_ATT_WARPS * 32)\n{}(const "
        "KilnAttentionParams p) {{\n  kiln_attention<{}, {}>(p);\n}}\n",
        cuda_attention_kernel_name(d, dv), d, dv);
  }
  return text;
}

std::optional<std::pair<int64_t, int64_t>> cuda_attention_heads(const ir::ExternCall& call) {
  if (call.as<ir::AttentionCall>() == nullptr || call.inputs.size() < 3 || !call.inputs[0] ||
      !call.inputs[2]) {
    return std::nullopt;
  }
  const std::optional<int64_t> d = call.inputs[0]->layout.sizes.back().as_integer();
  const std::optional<int64_t> dv = call.inputs[2]->layout.sizes.back().as_integer();
  if (!d || !dv) return std::nullopt;
  return std::make_pair(*d, *dv);
}

namespace {

/// A float constant as C++ text (infinities spelled out).
std::string float_text(double x) {
  if (std::isinf(x)) {
    return x > 0 ? "std::numeric_limits<float>::infinity()"
                 : "-std::numeric_limits<float>::infinity()";
  }
  return fmt::format("static_cast<float>({})", x);
}

}  // namespace

void write_cuda_attention(IndentedBuffer& out, const ir::Buffer& buffer, const std::string& label) {
  const ir::AttentionCall& call = *buffer.call.as<ir::AttentionCall>();
  const auto& in = buffer.call.inputs;
  const bool masked = call.mask != ir::AttentionMask::kNone;
  KILN_CHECK(in.size() >= (masked ? 4u : 3u) && in[0] && in[1] && in[2] && (!masked || in[3]),
             "attention {}: expected inputs Q, K^T, V{}", buffer.name, masked ? " and a mask" : "");
  KILN_CHECK(buffer.dtype == graph::DType::kFloat32, "attention {}: float32 only, not {}",
             buffer.name, graph::dtype_name(buffer.dtype));
  const size_t rank = buffer.layout.rank();
  KILN_CHECK(rank >= 2 && rank <= 8, "attention {}: rank {} (2 to 8 on CUDA)", buffer.name, rank);
  const ir::View &q = *in[0], &kt = *in[1], &v = *in[2];
  const std::optional<std::pair<int64_t, int64_t>> heads = cuda_attention_heads(buffer.call);
  KILN_CHECK(heads && heads->first >= 1 && heads->first <= kCudaAttentionMaxHead &&
                 heads->second >= 1 && heads->second <= kCudaAttentionMaxHead,
             "attention {}: heads of 1 to {} known when compiling on CUDA", buffer.name,
             kCudaAttentionMaxHead);
  const std::string kernel = "k_" + cuda_attention_kernel_name(heads->first, heads->second);
  out.linef("// fused attention (Kiln's kernel, float32), scores scaled by {}{}", call.scale,
            masked ? ", masked" : "");
  out.line("kiln_cuda::AttentionParams att{};");
  out.linef("att.q = {};", data_pointer(q));
  out.linef("att.kt = {};", data_pointer(kt));
  out.linef("att.v = {};", data_pointer(v));
  out.linef("att.mask = {};", masked ? data_pointer(*in[3]) : "nullptr");
  out.linef("att.out = {};", buffer.name);
  out.linef("att.lq = {}; att.lk = {}; att.d = {}; att.dv = {};",
            cexpr(buffer.layout.sizes[rank - 2]), cexpr(kt.layout.sizes[rank - 1]),
            cexpr(q.layout.sizes[rank - 1]), cexpr(v.layout.sizes[rank - 1]));
  out.linef("att.batch_rank = {};", rank - 2);
  for (size_t k = 0; k + 2 < rank; ++k)
    out.linef("att.batch[{}] = {};", k, cexpr(buffer.layout.sizes[k]));
  auto strides = [&](const char* field, const ir::View& view) {
    for (size_t k = 0; k < rank; ++k)
      out.linef("att.{}[{}] = {};", field, k, cexpr(view.layout.strides[k]));
  };
  strides("q_strides", q);
  strides("kt_strides", kt);
  strides("v_strides", v);
  if (masked) strides("mask_strides", *in[3]);
  out.linef("att.mask_kind = {};", static_cast<int>(call.mask));
  out.linef("att.scale = static_cast<float>({});", call.scale);
  out.linef("att.fill = {};", float_text(call.fill));
  out.linef("state.cuda.attention({}, att, {});", kernel, cpp_quote(label));
  // A profiled run waits for each call, so that its event times the kernel, not its launch.
  out.linef("if (profile != nullptr) state.cuda.synchronize({});", cpp_quote(label));
}

}  // namespace kiln::codegen
