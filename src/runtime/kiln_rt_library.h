#pragma once
// Kiln runtime: library-style kernels that do not fit the loop IR (selection, factorization).
// Inputs are contiguous; each function is called by the wrapper with the shapes it bound.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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
  parallel_for(outer * inner > 64, (outer) * (inner), [&](int64_t kiln_lo, int64_t kiln_hi) {
    for (int64_t kiln_flat = kiln_lo; kiln_flat < kiln_hi; ++kiln_flat) {
      const int64_t o = kiln_flat / (inner), i = kiln_flat % (inner);
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
  });
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
    parallel_for(B * G * H * (I + H) > 65536, B, [&](int64_t kiln_lo, int64_t kiln_hi) {
      for (int64_t n = kiln_lo; n < kiln_hi; ++n) {
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
              double i = gx[j] + gh[j], o = gx[H + j] + gh[H + j],
                     f = gx[2 * H + j] + gh[2 * H + j];
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
    });
  }
}

}  // namespace kiln_rt

namespace kiln_rt {

/// Determinants of `count` square matrices of size n (contiguous), by LU with partial pivoting
/// in double precision.
template <typename T>
inline void det(const T* x, int64_t count, int64_t n, T* out) {
  parallel_for(count * n * n * n > 65536, count, [&](int64_t kiln_lo, int64_t kiln_hi) {
    for (int64_t m = kiln_lo; m < kiln_hi; ++m) {
      std::vector<double> a(x + m * n * n, x + (m + 1) * n * n);
      double d = 1;
      for (int64_t c = 0; c < n && d != 0; ++c) {
        int64_t pivot = c;
        for (int64_t r = c + 1; r < n; ++r) {
          if (std::abs(a[r * n + c]) > std::abs(a[pivot * n + c])) pivot = r;
        }
        if (a[pivot * n + c] == 0) {
          d = 0;
          break;
        }
        if (pivot != c) {
          for (int64_t k = 0; k < n; ++k) std::swap(a[c * n + k], a[pivot * n + k]);
          d = -d;
        }
        d *= a[c * n + c];
        for (int64_t r = c + 1; r < n; ++r) {
          double f = a[r * n + c] / a[c * n + c];
          for (int64_t k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
        }
      }
      out[m] = static_cast<T>(d);
    }
  });
}

/// RoiAlign: out [rois, C, oh, ow] from X [N, C, H, W], boxes [rois, 4] (x1, y1, x2, y2) and
/// batch_indices, averaging (or taking the max of) bilinear samples on a grid of sampling_ratio
/// (0: adaptive, ceil(roi size / output size)) points per bin.
struct RoiAlignParams {
  int64_t n = 0, c = 0, h = 0, w = 0, rois = 0, oh = 1, ow = 1;
  int64_t sampling_ratio = 0;
  double spatial_scale = 1;
  bool half_pixel = true;
  bool max_mode = false;
};

template <typename T, typename I>
inline void roi_align(const RoiAlignParams& p, const T* x, const T* boxes, const I* batch, T* out) {
  const double offset = p.half_pixel ? 0.5 : 0;
  for (int64_t r = 0; r < p.rois; ++r) {
    const int64_t b = static_cast<int64_t>(batch[r]);
    if (b < 0 || b >= p.n) {
      fail("RoiAlign: batch index %lld of roi %lld is out of range [0, %lld)",
           static_cast<long long>(b), static_cast<long long>(r), static_cast<long long>(p.n));
    }
    const double x1 = boxes[r * 4] * p.spatial_scale - offset;
    const double y1 = boxes[r * 4 + 1] * p.spatial_scale - offset;
    double rw = boxes[r * 4 + 2] * p.spatial_scale - offset - x1;
    double rh = boxes[r * 4 + 3] * p.spatial_scale - offset - y1;
    if (!p.half_pixel) {
      rw = std::max(rw, 1.0);
      rh = std::max(rh, 1.0);
    }
    const double bin_h = rh / p.oh, bin_w = rw / p.ow;
    const int64_t gh = p.sampling_ratio > 0 ? p.sampling_ratio : int64_t(std::ceil(rh / p.oh));
    const int64_t gw = p.sampling_ratio > 0 ? p.sampling_ratio : int64_t(std::ceil(rw / p.ow));
    const double count = std::max<int64_t>(gh * gw, 1);
    parallel_for(p.c * p.oh * p.ow * gh * gw > 65536, p.c, [&](int64_t kiln_lo, int64_t kiln_hi) {
      for (int64_t ch = kiln_lo; ch < kiln_hi; ++ch) {
        const T* plane = x + (b * p.c + ch) * p.h * p.w;
        for (int64_t ph = 0; ph < p.oh; ++ph) {
          for (int64_t pw = 0; pw < p.ow; ++pw) {
            double acc = 0, best = -std::numeric_limits<double>::infinity();
            for (int64_t iy = 0; iy < gh; ++iy) {
              double y = y1 + ph * bin_h + (iy + 0.5) * bin_h / gh;
              for (int64_t ix = 0; ix < gw; ++ix) {
                double xx = x1 + pw * bin_w + (ix + 0.5) * bin_w / gw;
                if (y < -1.0 || y > p.h || xx < -1.0 || xx > p.w) {
                  best = std::max(best, 0.0);
                  continue;
                }
                double yc = std::max(y, 0.0), xc = std::max(xx, 0.0);
                int64_t y0 = static_cast<int64_t>(yc), x0 = static_cast<int64_t>(xc), yh, xh;
                if (y0 >= p.h - 1) {
                  yh = y0 = p.h - 1;
                  yc = double(y0);
                } else {
                  yh = y0 + 1;
                }
                if (x0 >= p.w - 1) {
                  xh = x0 = p.w - 1;
                  xc = double(x0);
                } else {
                  xh = x0 + 1;
                }
                const double ly = yc - y0, lx = xc - x0, hy = 1 - ly, hx = 1 - lx;
                const double v[4] = {hy * hx * plane[y0 * p.w + x0], hy * lx * plane[y0 * p.w + xh],
                                     ly * hx * plane[yh * p.w + x0],
                                     ly * lx * plane[yh * p.w + xh]};
                if (p.max_mode) {
                  for (double t : v) best = std::max(best, t);
                } else {
                  acc += v[0] + v[1] + v[2] + v[3];
                }
              }
            }
            out[((r * p.c + ch) * p.oh + ph) * p.ow + pw] =
                static_cast<T>(p.max_mode ? best : acc / count);
          }
        }
      }
    });
  }
}

}  // namespace kiln_rt

namespace kiln_rt {

/// TfIdfVectorizer over int rows: counts the pool's n-grams (min_gram..max_gram items, items
/// max_skip_count + 1 apart at most; unigrams once per position) per row into their output
/// columns, then TF (counts), IDF (weight where present) or TFIDF (count * weight).
struct TfIdfParams {
  int64_t min_gram = 1, max_gram = 1, max_skip = 0;
  int32_t mode = 0;  // 0 TF, 1 IDF, 2 TFIDF
  const int64_t* pool = nullptr;
  int64_t pool_size = 0;
  const int64_t* ngram_counts = nullptr;  // start of each n-gram level in the pool
  int64_t levels = 0;
  const int64_t* ngram_indexes = nullptr;  // output column of each n-gram, in pool order
  const double* weights = nullptr;         // per n-gram (null: 1)
};

template <typename T>
inline void tfidf(const TfIdfParams& p, const T* x, int64_t rows, int64_t cols, float* out,
                  int64_t out_cols) {
  std::fill(out, out + rows * out_cols, 0.0f);
  // The n-gram numbering continues across levels: level n's first n-gram follows level n-1's.
  std::vector<int64_t> first_ngram(static_cast<size_t>(p.levels) + 1, 0);
  for (int64_t n = 1; n <= p.levels; ++n) {
    int64_t begin = p.ngram_counts[n - 1];
    int64_t end = n < p.levels ? p.ngram_counts[n] : p.pool_size;
    first_ngram[n] = first_ngram[n - 1] + (end - begin) / n;
  }
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    float* o = out + r * out_cols;
    for (int64_t n = p.min_gram; n <= std::min(p.max_gram, p.levels); ++n) {
      const int64_t begin = p.ngram_counts[n - 1];
      const int64_t end = n < p.levels ? p.ngram_counts[n] : p.pool_size;
      for (int64_t skip = 0; skip <= (n == 1 ? 0 : p.max_skip); ++skip) {
        const int64_t stride = skip + 1;
        for (int64_t i = 0; i + (n - 1) * stride < cols; ++i) {
          for (int64_t g = begin; g + n <= end; g += n) {
            bool match = true;
            for (int64_t k = 0; k < n && match; ++k) {
              match = static_cast<int64_t>(row[i + k * stride]) == p.pool[g + k];
            }
            if (match) o[p.ngram_indexes[first_ngram[n - 1] + (g - begin) / n]] += 1;
          }
        }
      }
    }
    for (int64_t g = 0; g < first_ngram[p.levels]; ++g) {
      const int64_t c = p.ngram_indexes[g];
      const float w = p.weights ? static_cast<float>(p.weights[g]) : 1.0f;
      if (p.mode == 1) o[c] = o[c] > 0 ? w : 0;
      if (p.mode == 2) o[c] = o[c] * w;
    }
  }
}

}  // namespace kiln_rt

namespace kiln_rt {

/// out[0] = how many of the first n elements of x are non-zero (true).
template <typename T>
inline void count_nonzero(const T* x, int64_t n, int64_t* out) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += x[i] != T(0);
  out[0] = count;
}

/// The flat positions of the non-zero elements among the first n of x, in order.
template <typename T>
inline void nonzero_positions(const T* x, int64_t n, int64_t* out) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != T(0)) out[k++] = i;
  }
}

}  // namespace kiln_rt

namespace kiln_rt {

/// NonMaxSuppression per batch and class: boxes scoring above score_threshold, best first (the
/// lower index first among equal scores), each kept unless its IoU with a kept box exceeds
/// iou_threshold, at most max_per_class. Writes [batch, class, box] rows to `out` (when given)
/// and returns their number. center_point_box: boxes are [x_center, y_center, w, h], else two
/// opposite corners [y1, x1, y2, x2].
template <typename T>
inline int64_t nms(const T* boxes, const T* scores, int64_t batches, int64_t classes,
                   int64_t spatial, int64_t max_per_class, double iou_threshold,
                   const double* score_threshold, bool center_point_box, int64_t* out) {
  auto corners = [&](const T* b, double* c) {  // y_min, x_min, y_max, x_max
    if (center_point_box) {
      c[0] = b[1] - b[3] / 2.0, c[1] = b[0] - b[2] / 2.0, c[2] = b[1] + b[3] / 2.0,
      c[3] = b[0] + b[2] / 2.0;
    } else {
      c[0] = std::min<double>(b[0], b[2]), c[1] = std::min<double>(b[1], b[3]),
      c[2] = std::max<double>(b[0], b[2]), c[3] = std::max<double>(b[1], b[3]);
    }
  };
  auto iou = [&](const double* a, const double* b) {
    double h = std::min(a[2], b[2]) - std::max(a[0], b[0]);
    double w = std::min(a[3], b[3]) - std::max(a[1], b[1]);
    if (h <= 0 || w <= 0) return 0.0;
    double inter = h * w;
    double uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
    return uni > 0 ? inter / uni : 0.0;
  };
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<double> box(static_cast<size_t>(spatial) * 4);
    for (int64_t i = 0; i < spatial; ++i) corners(boxes + (b * spatial + i) * 4, &box[i * 4]);
    for (int64_t c = 0; c < classes; ++c) {
      const T* s = scores + (b * classes + c) * spatial;
      std::vector<int64_t> order;
      for (int64_t i = 0; i < spatial; ++i) {
        if (!score_threshold || static_cast<double>(s[i]) > *score_threshold) order.push_back(i);
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t x, int64_t y) { return s[x] > s[y]; });
      std::vector<int64_t> kept;
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= max_per_class) break;
        bool keep = true;
        for (int64_t k : kept) keep = keep && iou(&box[i * 4], &box[k * 4]) <= iou_threshold;
        if (!keep) continue;
        kept.push_back(i);
        if (out) {
          out[count * 3] = b, out[count * 3 + 1] = c, out[count * 3 + 2] = i;
        }
        ++count;
      }
    }
  }
  return count;
}

}  // namespace kiln_rt

namespace kiln_rt {

/// Unique over the n slices x[o, k, i] (k < n) of x viewed as [outer, n, inner]: the distinct
/// slices, sorted (lexicographically) or in order of first occurrence. Returns their count u and
/// writes output `which` when `out` is given: 0 the slices [outer, u, inner] (T), 1 the first
/// occurrence of each [u], 2 each slice's position among them [n], 3 their counts [u] (int64).
template <typename T>
inline int64_t unique(const T* x, int64_t outer, int64_t n, int64_t inner, bool sorted, int which,
                      void* out) {
  auto less = [&](int64_t a, int64_t b) {  // lexicographic over (o, i)
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        T va = x[(o * n + a) * inner + i], vb = x[(o * n + b) * inner + i];
        if (va != vb) return va < vb;
      }
    }
    return false;
  };
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), less);
  // Groups of equal slices, each with its first occurrence (the lowest index: stable sort).
  std::vector<int64_t> first, group_of(static_cast<size_t>(n)), counts;
  for (size_t k = 0; k < order.size(); ++k) {
    if (k == 0 || less(order[k - 1], order[k])) {
      first.push_back(order[k]);
      counts.push_back(0);
    }
    group_of[order[k]] = static_cast<int64_t>(first.size()) - 1;
    ++counts.back();
  }
  const int64_t u = static_cast<int64_t>(first.size());
  std::vector<int64_t> rank(static_cast<size_t>(u));  // group -> output position
  std::iota(rank.begin(), rank.end(), 0);
  if (!sorted) {
    std::vector<int64_t> by_first(rank);
    std::sort(by_first.begin(), by_first.end(),
              [&](int64_t a, int64_t b) { return first[a] < first[b]; });
    for (int64_t p = 0; p < u; ++p) rank[by_first[p]] = p;
  }
  if (out == nullptr) return u;
  auto* ints = static_cast<int64_t*>(out);
  for (int64_t g = 0; g < u; ++g) {
    const int64_t p = rank[g];
    if (which == 0) {
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t i = 0; i < inner; ++i) {
          static_cast<T*>(out)[(o * u + p) * inner + i] = x[(o * n + first[g]) * inner + i];
        }
      }
    }
    if (which == 1) ints[p] = first[g];
    if (which == 3) ints[p] = counts[g];
  }
  if (which == 2) {
    for (int64_t k = 0; k < n; ++k) ints[k] = rank[group_of[k]];
  }
  return u;
}

// --- Shapes computed from data (Inductor's dynamic scalars) -----------------------------------
// Each writes int64 sizes that the wrapper binds to size symbols right after the call, checking
// on the way what the lowering assumed of them.

/// out[i] = x[i] for i < n: sizes computed at run time, each in [0, max] (no bound when max < 0).
template <typename T>
inline void shape_values(const T* x, int64_t n, int64_t max, int64_t* out, const char* what) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(x[i]);
    if (v < 0 || (max >= 0 && v > max)) {
      if (max >= 0) {
        fail("%s: element %lld is %lld at run time; expected a size in [0, %lld]", what,
             static_cast<long long>(i), static_cast<long long>(v), static_cast<long long>(max));
      }
      fail("%s: element %lld is %lld at run time; expected a size (>= 0)", what,
           static_cast<long long>(i), static_cast<long long>(v));
    }
    out[i] = v;
  }
}

/// Reshape's target computed at run time: 0 copies the input dim (unless allowzero), one -1 takes
/// what is left; the element counts must agree.
template <typename T>
inline void reshape_dims(const T* shape, int64_t n, const int64_t* in_dims, int64_t in_rank,
                         bool allowzero, int64_t* out, const char* node) {
  int64_t in_numel = 1, known = 1, infer = -1;
  for (int64_t k = 0; k < in_rank; ++k) in_numel *= in_dims[k];
  for (int64_t k = 0; k < n; ++k) {
    int64_t v = static_cast<int64_t>(shape[k]);
    if (v == 0 && !allowzero) {
      if (k >= in_rank)
        fail("%s: shape[%lld] = 0 copies a dim the input lacks", node, (long long)k);
      v = in_dims[k];
    }
    if (v == -1) {
      if (infer >= 0) fail("%s: the computed shape has more than one -1", node);
      infer = k;
      out[k] = 1;
      continue;
    }
    if (v < 0) fail("%s: shape[%lld] is %lld at run time", node, (long long)k, (long long)v);
    out[k] = v;
    known *= v;
  }
  if (infer >= 0) {
    if (known == 0 || in_numel % known != 0) {
      fail("%s: cannot infer the -1 of the computed shape: %lld elements into parts of %lld", node,
           (long long)in_numel, (long long)known);
    }
    out[infer] = in_numel / known;
    known = in_numel;
  }
  if (known != in_numel) {
    fail("%s: the computed shape holds %lld elements, the input %lld", node, (long long)known,
         (long long)in_numel);
  }
}

/// Expand's target computed at run time: the numpy broadcast of the input's dims with it.
template <typename T>
inline void expand_dims(const T* shape, int64_t n, const int64_t* in_dims, int64_t in_rank,
                        int64_t* out, const char* node) {
  const int64_t rank = std::max(n, in_rank);
  for (int64_t k = 0; k < rank; ++k) {
    int64_t a = k - (rank - in_rank) >= 0 ? in_dims[k - (rank - in_rank)] : 1;
    int64_t b = k - (rank - n) >= 0 ? static_cast<int64_t>(shape[k - (rank - n)]) : 1;
    if (b < 0) fail("%s: shape element %lld is %lld at run time", node, (long long)k, (long long)b);
    if (a != b && a != 1 && b != 1) {
      fail("%s: cannot broadcast input dim %lld (%lld) to %lld", node, (long long)k, (long long)a,
           (long long)b);
    }
    out[k] = a == 1 ? b : a;
  }
}

/// Range's element count computed at run time: max(ceil((limit - start) / delta), 0).
template <typename T>
inline void range_count(const T* start, const T* limit, const T* delta, int64_t* out,
                        const char* node) {
  if (*delta == T(0)) fail("%s: delta is 0 at run time", node);
  const double count = std::ceil((static_cast<double>(*limit) - static_cast<double>(*start)) /
                                 static_cast<double>(*delta));
  out[0] = count > 0 ? static_cast<int64_t>(count) : 0;
}

}  // namespace kiln_rt
