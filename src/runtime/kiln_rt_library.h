#pragma once
// Kiln runtime: library-style kernels that do not fit the loop IR (selection, factorization).
// Inputs are contiguous; each function is called by the wrapper with the shapes it bound.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kiln_rt.h"

namespace kiln_rt {

/// TopK indices: for every slice of x along `axis` (shape[axis] elements, the other dims
/// outer/inner), the indices of its k largest (or smallest) elements, best first; equal values
/// keep their order (the lower index first), NaN counts as the largest.
template <typename T>
inline void topk_indices(const T* x, const int64_t* shape, int rank, int axis, int64_t k,
                         bool largest, int64_t* out) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[d];
  for (int d = axis + 1; d < rank; ++d) inner *= shape[d];
  const int64_t n = shape[axis];
  if (k > n)
    fail("TopK: k = %lld exceeds the axis size %lld", static_cast<long long>(k),
         static_cast<long long>(n));
#pragma omp parallel for collapse(2) if (outer * inner > 64)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const T* base = x + o * n * inner + i;
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      auto better = [&](int64_t a, int64_t b) {
        double va = static_cast<double>(base[a * inner]), vb = static_cast<double>(base[b * inner]);
        bool na = std::isnan(va), nb = std::isnan(vb);
        if (na || nb)
          return largest ? (na && !nb) || (na && nb && a < b) : (nb && !na) || (na && nb && a < b);
        if (va != vb) return largest ? va > vb : va < vb;
        return a < b;
      };
      std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
      for (int64_t j = 0; j < k; ++j) out[(o * k + j) * inner + i] = order[static_cast<size_t>(j)];
    }
  }
}

}  // namespace kiln_rt

namespace kiln_rt {

/// The activations of the recurrent ops (ONNX names), with their alpha and beta.
enum RnnActivation : int32_t {
  kRnnRelu,
  kRnnTanh,
  kRnnSigmoid,
  kRnnAffine,
  kRnnLeakyRelu,
  kRnnThresholdedRelu,
  kRnnScaledTanh,
  kRnnHardSigmoid,
  kRnnElu,
  kRnnSoftsign,
  kRnnSoftplus
};

inline double rnn_activate(int32_t f, double x, double alpha, double beta) {
  switch (f) {
    case kRnnRelu:
      return x > 0 ? x : 0;
    case kRnnTanh:
      return std::tanh(x);
    case kRnnSigmoid:
      return 1 / (1 + std::exp(-x));
    case kRnnAffine:
      return alpha * x + beta;
    case kRnnLeakyRelu:
      return x >= 0 ? x : alpha * x;
    case kRnnThresholdedRelu:
      return x > alpha ? x : 0;
    case kRnnScaledTanh:
      return alpha * std::tanh(beta * x);
    case kRnnHardSigmoid:
      return std::max(0.0, std::min(1.0, alpha * x + beta));
    case kRnnElu:
      return x >= 0 ? x : alpha * (std::exp(x) - 1);
    case kRnnSoftsign:
      return x / (1 + std::abs(x));
    default:
      return std::log1p(std::exp(x));  // kRnnSoftplus
  }
}

/// RNN (kind 0), GRU (1) or LSTM (2), as ONNX defines them. Gates per direction: RNN 1, GRU 3
/// (z, r, h), LSTM 4 (i, o, f, c). `acts` holds gates_activations() functions per direction.
struct RnnParams {
  int32_t kind = 0;
  int64_t seq = 0, batch = 0, input = 0, hidden = 0;
  int32_t dirs = 1;
  bool reverse = false;      // one direction, reversed
  bool batch_major = false;  // layout = 1: X [batch, seq, input], initial states [batch, dirs, H]
  double clip = 0;           // > 0: gate pre-activations clipped to [-clip, clip]
  bool linear_before_reset = false;  // GRU
  bool input_forget = false;         // LSTM: f = 1 - i
  int32_t acts[6] = {};
  double alpha[6] = {}, beta[6] = {};
};

inline int rnn_gates(int32_t kind) { return kind == 0 ? 1 : kind == 1 ? 3 : 4; }
inline int rnn_functions(int32_t kind) { return kind == 0 ? 1 : kind == 1 ? 2 : 3; }

/// out: [seq + 2, dirs, batch, hidden]: Y at each step (0 past a sequence's length), then the last
/// hidden state (Y_h), then the last cell state (Y_c, LSTM; 0 otherwise). Optional inputs are null.
template <typename T>
inline void rnn(const RnnParams& p, const T* x, const T* w, const T* r, const T* b,
                const int32_t* lens, const T* h0, const T* c0, const T* peep, T* out) {
  const int64_t H = p.hidden, I = p.input, B = p.batch, S = p.seq;
  const int G = rnn_gates(p.kind), F = rnn_functions(p.kind);
  std::fill(out, out + (S + 2) * p.dirs * B * H, T(0));
  auto y_at = [&](int64_t row, int d, int64_t n) { return out + ((row * p.dirs + d) * B + n) * H; };
  for (int d = 0; d < p.dirs; ++d) {
    const bool backward = p.reverse || d == 1;
    const T* wd = w + d * G * H * I;
    const T* rd = r + d * G * H * H;
    const T* bd = b ? b + d * 2 * G * H : nullptr;
    const T* pd = peep ? peep + d * 3 * H : nullptr;
    const int32_t* fn = p.acts + d * F;
    const double* al = p.alpha + d * F;
    const double* be = p.beta + d * F;
    auto act = [&](int k, double v) { return rnn_activate(fn[k], v, al[k], be[k]); };
#pragma omp parallel for if (B * G * H * (I + H) > 65536)
    for (int64_t n = 0; n < B; ++n) {
      std::vector<double> h(H, 0), c(H, 0), gx(G * H), gh(G * H);
      auto state_at = [&](const T* s, int64_t j) {
        return p.batch_major ? s[(n * p.dirs + d) * H + j] : s[(d * B + n) * H + j];
      };
      for (int64_t j = 0; j < H; ++j) {
        if (h0) h[j] = state_at(h0, j);
        if (c0) c[j] = state_at(c0, j);
      }
      const int64_t len = lens ? std::min<int64_t>(lens[n], S) : S;
      for (int64_t step = 0; step < len; ++step) {
        const int64_t t = backward ? len - 1 - step : step;
        const T* xt = p.batch_major ? x + (n * S + t) * I : x + (t * B + n) * I;
        for (int64_t g = 0; g < G * H; ++g) {
          double ax = bd ? bd[g] : 0, ah = bd ? bd[G * H + g] : 0;
          for (int64_t k = 0; k < I; ++k) ax += double(xt[k]) * wd[g * I + k];
          gx[g] = ax;
          if (p.kind == 1 && g >= 2 * H) continue;  // GRU: h gate's recurrent part below
          for (int64_t k = 0; k < H; ++k) ah += h[k] * rd[g * H + k];
          gh[g] = ah;
        }
        auto clip = [&](double v) {
          return p.clip > 0 ? std::max(-p.clip, std::min(p.clip, v)) : v;
        };
        std::vector<double> next(H), reset(p.kind == 1 ? H : 0);
        for (int64_t j = 0; j < static_cast<int64_t>(reset.size()); ++j) {
          reset[j] = act(0, clip(gx[H + j] + gh[H + j]));
        }
        for (int64_t j = 0; j < H; ++j) {
          if (p.kind == 0) {
            next[j] = act(0, clip(gx[j] + gh[j]));
          } else if (p.kind == 1) {
            const double z = act(0, clip(gx[j] + gh[j]));
            double rec = bd ? bd[G * H + 2 * H + j] : 0;
            if (p.linear_before_reset) {
              for (int64_t k = 0; k < H; ++k) rec += h[k] * rd[(2 * H + j) * H + k];
              rec *= reset[j];
            } else {
              for (int64_t k = 0; k < H; ++k) rec += reset[k] * h[k] * rd[(2 * H + j) * H + k];
            }
            const double hh = act(1, clip(gx[2 * H + j] + rec));
            next[j] = (1 - z) * hh + z * h[j];
          } else {
            double i = gx[j] + gh[j], o = gx[H + j] + gh[H + j], f = gx[2 * H + j] + gh[2 * H + j];
            if (pd) {
              i += pd[j] * c[j];
              f += pd[2 * H + j] * c[j];
            }
            i = act(0, clip(i));
            f = p.input_forget ? 1 - i : act(0, clip(f));
            const double cc = act(1, clip(gx[3 * H + j] + gh[3 * H + j]));
            c[j] = f * c[j] + i * cc;
            if (pd) o += pd[H + j] * c[j];
            next[j] = act(0, clip(o)) * act(2, c[j]);
          }
        }
        h = next;
        T* yt = y_at(t, d, n);
        for (int64_t j = 0; j < H; ++j) yt[j] = static_cast<T>(h[j]);
      }
      for (int64_t j = 0; j < H; ++j) {
        y_at(S, d, n)[j] = static_cast<T>(h[j]);
        y_at(S + 1, d, n)[j] = static_cast<T>(c[j]);
      }
    }
  }
}

}  // namespace kiln_rt
