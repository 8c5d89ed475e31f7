#pragma once
// Kiln runtime: convolution through oneDNN (float32) and a direct loop (float64, which oneDNN
// lacks). Extern kernel "conv": out[N, M, O...] = conv(X[N, C, D...], W[M, C/group, K...]) + B[M].
// Each call site owns a ConvSite that caches the oneDNN primitives (and their own scratchpads) for
// the last shapes it saw, so repeated runs at the same shapes pay for primitive creation once; a
// convolution large enough to share is cut into pieces computed on Kiln's pool (conv_pieces); an
// NCHW convolution with a kernel larger than 1x1 runs on blocked activations, reordered in and
// out.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln_rt.h"

#if defined(KILN_RT_WITH_DNNL)
#include <dnnl.hpp>
#endif

namespace kiln_rt {

struct ConvParams {
  int spatial = 2;  // 1, 2 or 3
  int64_t n = 0, c = 0, m = 0, group = 1;
  int64_t in[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1};
  int64_t dilation[3] = {1, 1, 1};
  int64_t pad_begin[3] = {0, 0, 0};
  int64_t pad_end[3] = {0, 0, 0};
  /// 1: channels-last activations (2-D: X [N, H, W, C], out [N, OH, OW, M]); an int64_t, so that
  /// operator== compares no padding.
  int64_t channels_last = 0;

  bool operator==(const ConvParams& o) const { return std::memcmp(this, &o, sizeof(*this)) == 0; }
};

/// The activation a oneDNN convolution applies to each output element after the bias, as an
/// eltwise post-op (ir::ConvActivation's numbers): 0 none, 1 Relu, 2 Sigmoid, 3 Tanh, 4 Clip to
/// [alpha, beta], 5 LeakyRelu (slope alpha), 6 Elu (alpha), 7 Gelu, 8 Gelu's tanh form, 9 Swish
/// x sigmoid(alpha x).
struct ConvActivation {
  int kind = 0;
  double alpha = 0, beta = 0;

  bool operator==(const ConvActivation& o) const {
    return kind == o.kind && alpha == o.alpha && beta == o.beta;
  }
};

/// Direct convolution: the reference path and the float64 path.
template <typename T>
inline void conv_direct(const ConvParams& p, const T* x, const T* w, const T* bias, T* out) {
  const int64_t cg = p.c / p.group, mg = p.m / p.group;
  const int64_t in_size = p.in[0] * p.in[1] * p.in[2];
  const int64_t out_size = p.out[0] * p.out[1] * p.out[2];
  const int64_t k_size = p.kernel[0] * p.kernel[1] * p.kernel[2];
  parallel_for(p.n * p.m * out_size > 4096, (p.n) * (p.m), [&](int64_t kiln_lo, int64_t kiln_hi) {
    for (int64_t kiln_flat = kiln_lo; kiln_flat < kiln_hi; ++kiln_flat) {
      const int64_t b = kiln_flat / (p.m), oc = kiln_flat % (p.m);
      const int64_t g = oc / mg;
      for (int64_t o = 0; o < out_size; ++o) {
        const int64_t o0 = o / (p.out[1] * p.out[2]), o1 = (o / p.out[2]) % p.out[1],
                      o2 = o % p.out[2];
        T acc = bias ? bias[oc] : T(0);
        for (int64_t ic = 0; ic < cg; ++ic) {
          const T* xc = x + (b * p.c + g * cg + ic) * in_size;
          const T* wc = w + (oc * cg + ic) * k_size;
          for (int64_t k0 = 0; k0 < p.kernel[0]; ++k0) {
            int64_t i0 = o0 * p.stride[0] - p.pad_begin[0] + k0 * p.dilation[0];
            if (i0 < 0 || i0 >= p.in[0]) continue;
            for (int64_t k1 = 0; k1 < p.kernel[1]; ++k1) {
              int64_t i1 = o1 * p.stride[1] - p.pad_begin[1] + k1 * p.dilation[1];
              if (i1 < 0 || i1 >= p.in[1]) continue;
              for (int64_t k2 = 0; k2 < p.kernel[2]; ++k2) {
                int64_t i2 = o2 * p.stride[2] - p.pad_begin[2] + k2 * p.dilation[2];
                if (i2 < 0 || i2 >= p.in[2]) continue;
                acc += xc[(i0 * p.in[1] + i1) * p.in[2] + i2] *
                       wc[(k0 * p.kernel[1] + k1) * p.kernel[2] + k2];
              }
            }
          }
        }
        out[(b * p.m + oc) * out_size + o] = acc;
      }
    }
  });
}

/// One piece of a convolution cut for the pool (conv_pieces): the sub-problem `params` reads X
/// from element x_offset, W from w_offset and the bias from bias_offset, and writes the output
/// from out_offset. Its input and weights are dense in the convolution's layouts, so a library
/// call computes it as a convolution of its own. So is its output when out_pitch is 0; else (a
/// channel slice of channels-last output) the piece computes a dense output of its own, whose
/// pixel p goes to out_offset + p * out_pitch.
struct ConvPiece {
  ConvParams params;
  int64_t x_offset = 0, w_offset = 0, bias_offset = 0, out_offset = 0;
  int64_t out_pitch = 0;
};

/// The fewest multiply-adds a piece of a convolution gets: a single-threaded oneDNN call of
/// 2^18 takes about 10 us on one core, well above what waking a pool thread and a call's own
/// overhead cost. KILN_CONV_PIECE_MACS overrides it (the tests set 1 to cut small convolutions).
/// Hidden: a static of default visibility would be a GNU unique symbol, bound across libraries,
/// also to one since unloaded (see pool()).
__attribute__((visibility("hidden"))) inline int64_t conv_piece_macs() {
  static const int64_t macs = [] {
    const char* env = std::getenv("KILN_CONV_PIECE_MACS");
    const long long v = env != nullptr ? std::atoll(env) : 0;
    return v > 0 ? static_cast<int64_t>(v) : int64_t{1} << 18;
  }();
  return macs;
}

/// The axes along which conv_pieces cuts one image (see there).
enum class ConvAxis { kRows, kChannels, kGroups };

/// Makes `piece` (a copy of the whole) the units [u0, u1) of image n along `axis`: output rows,
/// blocks of 16 output channels or groups. False when a row piece's window lies entirely in the
/// padding (the convolution then stays whole).
inline bool conv_piece_in_image(const ConvParams& p, ConvAxis axis, int64_t n, int64_t u0,
                                int64_t u1, ConvPiece& piece) {
  const int64_t in_size = p.in[0] * p.in[1] * p.in[2];
  const int64_t out_size = p.out[0] * p.out[1] * p.out[2];
  const int64_t k_size = p.kernel[0] * p.kernel[1] * p.kernel[2];
  const int64_t cg = p.c / p.group, mg = p.m / p.group;
  ConvParams& s = piece.params;
  s.n = 1;
  switch (axis) {
    case ConvAxis::kRows: {
      // Output rows [u0, u1) read input rows [lo, hi) (padding included), of which
      // [first, last) are inside the image.
      const int64_t lo = u0 * p.stride[1] - p.pad_begin[1];
      const int64_t hi =
          (u1 - 1) * p.stride[1] - p.pad_begin[1] + (p.kernel[1] - 1) * p.dilation[1] + 1;
      const int64_t first = std::max<int64_t>(lo, 0), last = std::min(hi, p.in[1]);
      if (last <= first) return false;  // a window entirely in the padding
      s.in[1] = last - first;
      s.out[1] = u1 - u0;
      s.pad_begin[1] = first - lo;
      s.pad_end[1] = hi - last;
      piece.x_offset = (n * p.in[1] + first) * p.in[2] * p.c;
      piece.out_offset = (n * p.out[1] + u0) * p.out[2] * p.m;
      break;
    }
    case ConvAxis::kChannels: {
      const int64_t m0 = std::min(16 * u0, p.m), m1 = std::min(16 * u1, p.m);
      s.m = m1 - m0;
      piece.x_offset = n * p.c * in_size;
      piece.w_offset = m0 * p.c * k_size;
      piece.bias_offset = m0;
      if (p.channels_last) {
        piece.out_offset = n * out_size * p.m + m0;
        piece.out_pitch = p.m;
      } else {
        piece.out_offset = (n * p.m + m0) * out_size;
      }
      break;
    }
    case ConvAxis::kGroups: {
      s.group = u1 - u0;
      s.c = s.group * cg;
      s.m = s.group * mg;
      piece.x_offset = (n * p.c + u0 * cg) * in_size;
      piece.w_offset = u0 * mg * cg * k_size;
      piece.bias_offset = u0 * mg;
      piece.out_offset = (n * p.m + u0 * mg) * out_size;
      break;
    }
  }
  return true;
}

/// Cuts convolution `p` into pieces for `threads` threads of the pool, each piece a dense
/// sub-problem (see ConvPiece); one piece (the whole) when one thread is asked for or the work
/// is too small to share.
///   - Images first: with at least `threads` images, pieces are ranges of images.
///   - Else each image is cut along an axis over which its parts stay dense: output channels in
///     blocks of 16 for ungrouped NCHW activations (the input whole), groups for grouped NCHW
///     ones. A channels-last image is cut by output rows (each piece reads the input rows under
///     its window, its top and bottom padding adjusted), unless its weights outweigh its input
///     and twice its output: every row piece reads the whole weights, so (ResNet's 3x3 layers at
///     14 x 14 and 7 x 7, where the weights are 2-9 MB) it is cut by output channels instead,
///     each piece writing a dense output of its own that it copies to its channels (out_pitch).
/// The count per image is the one of about `threads` or 2 x `threads` pieces (more pieces let a
/// thread that is not running hold less of the work) whose balanced ranges, claimed in order by
/// the first free thread, finish first; ties go to more pieces.
inline std::vector<ConvPiece> conv_pieces(const ConvParams& p, int threads) {
  const int64_t in_size = p.in[0] * p.in[1] * p.in[2];
  const int64_t out_size = p.out[0] * p.out[1] * p.out[2];
  const int64_t k_size = p.kernel[0] * p.kernel[1] * p.kernel[2];
  const int64_t cg = p.c / p.group;
  const int64_t macs = p.n * p.m * out_size * cg * k_size;
  std::vector<ConvPiece> whole = {ConvPiece{p}};
  const int64_t min_macs = conv_piece_macs();
  if (threads <= 1 || macs < 2 * min_macs || p.n <= 0) return whole;
  std::vector<ConvPiece> pieces;

  if (p.n >= threads) {
    const int64_t count = std::min<int64_t>({p.n, 2 * int64_t{threads}, macs / min_macs});
    for (int64_t i = 0; i < count; ++i) {
      const int64_t n0 = p.n * i / count, n1 = p.n * (i + 1) / count;
      ConvPiece piece{p};
      piece.params.n = n1 - n0;
      piece.x_offset = n0 * p.c * in_size;
      piece.out_offset = n0 * p.m * out_size;
      pieces.push_back(piece);
    }
    return pieces;
  }

  // Per image: `units` along the axis (rows, blocks of 16 channels or groups).
  ConvAxis axis;
  int64_t units;
  const bool weights_outweigh =
      p.m * cg * k_size > in_size * p.c + 2 * out_size * p.m;  // per image, in elements
  if (p.channels_last && (p.group > 1 || !weights_outweigh)) {
    if (p.spatial != 2) return whole;
    axis = ConvAxis::kRows;
    units = p.out[1];
  } else if (p.group == 1) {
    axis = ConvAxis::kChannels;
    units = (p.m + 15) / 16;
  } else {
    axis = ConvAxis::kGroups;
    units = p.group;
  }
  // The finishing time of `count` balanced ranges of the units over `threads` threads, each
  // range taken by the first free thread in order (as the pool's threads claim chunks).
  auto makespan = [&](int64_t count) {
    std::vector<int64_t> free_at(static_cast<size_t>(threads), 0);
    for (int64_t n = 0; n < p.n; ++n) {
      for (int64_t i = 0; i < count; ++i) {
        auto first = std::min_element(free_at.begin(), free_at.end());
        *first += units * (i + 1) / count - units * i / count;
      }
    }
    return *std::max_element(free_at.begin(), free_at.end());
  };
  const int64_t base = (threads + p.n - 1) / p.n;  // per image, so that every thread has a piece
  int64_t best = 0;
  // A channel-split NCHW convolution of a kernel over 1x1 reorders the whole input into oneDNN's
  // blocked layout in every piece: it takes the fewer pieces.
  const bool blocked_input = !p.channels_last && k_size > 1;
  for (int64_t count : {base, 2 * base}) {
    if (blocked_input && count > base) continue;
    count = std::min(count, units);
    if (count < 2 && p.n == 1) continue;
    if (macs / (p.n * count) < min_macs) continue;
    if (best == 0 || makespan(count) <= makespan(best)) best = count;
  }
  if (best <= 1 && p.n == 1) return whole;
  best = std::max<int64_t>(best, 1);

  for (int64_t n = 0; n < p.n; ++n) {
    for (int64_t i = 0; i < best; ++i) {
      const int64_t u0 = units * i / best, u1 = units * (i + 1) / best;
      ConvPiece piece{p};
      if (!conv_piece_in_image(p, axis, n, u0, u1, piece)) return whole;
      pieces.push_back(piece);
    }
  }
  return pieces;
}

#if defined(KILN_RT_WITH_DNNL)
/// The oneDNN state of one convolution call site. A convolution large enough to share runs on
/// the pool: conv_pieces cuts it into dense sub-problems, each computed by a single-threaded
/// oneDNN call on one of the pool's threads (so oneDNN starts no threads of its own and a run
/// never has more runnable threads than it asked for). The primitives (one per distinct piece
/// shape), the weights reordered for them (once for a constant weight) and each piece's
/// scratchpads are made at the first run of a set of shapes and thread count.
class ConvSite {
 public:
  /// `constant_weights`: w is a model constant, so its reordered copy is kept across runs.
  /// `act`: the activation the primitive applies after the bias (codegen/cpp/cpp_epilogue.h
  /// fuse_onednn_post_ops), so Conv -> Relu6 is this one call.
  void run(const ConvParams& p, const float* x, const float* w, const float* bias, float* out,
           bool constant_weights, const ConvActivation& act = {}) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int threads = requested_threads();
    const bool has_bias = bias != nullptr;
    {
      // oneDNN (OpenMP build) would start an OpenMP team beside Kiln's pool: it creates the
      // primitives and reorders the weights on this thread alone.
      SingleThreadedCall single;
      if (!ready_ || !(p == params_) || threads != threads_ || has_bias != has_bias_ ||
          !(act == act_)) {
        plan(p, threads, has_bias, act);
        reorder_weights(w);
      } else if (!constant_weights || w != weights_src_) {
        reorder_weights(w);
      }
    }
    parallel_for(parts_.size() > 1, static_cast<int64_t>(parts_.size()),
                 [&](int64_t first, int64_t last) {
                   SingleThreadedCall single;
                   for (int64_t i = first; i < last; ++i) run_part(parts_[i], x, bias, out);
                 });
  }

 private:
  /// A reorder between the model's plain layout and the primitive's blocked one; inactive when
  /// the primitive takes the plain layout. Its scratchpad is the part's (parts run concurrently).
  struct LayoutReorder {
    bool active = false;
    dnnl::reorder primitive;
    dnnl::memory::desc scratchpad_md;

    void build(const dnnl::engine& engine, const dnnl::memory::desc& from,
               const dnnl::memory::desc& to) {
      active = from != to;
      if (!active) return;
      dnnl::reorder::primitive_desc pd(engine, from, engine, to, user_scratchpad());
      primitive = dnnl::reorder(pd);
      scratchpad_md = pd.scratchpad_desc();
    }
  };

  /// The primitive of one piece shape.
  struct Kernel {
    ConvParams params;
    dnnl::convolution_forward primitive;
    dnnl::memory::desc src_md, dst_md, bias_md, user_w_md, weights_md, scratchpad_md;
    dnnl::memory::desc primitive_src_md, primitive_dst_md;  // the layouts the primitive takes
    // The activations in the primitive's layout when it is not the plain one (see build()).
    LayoutReorder src_in, dst_out;
  };

  /// The weights (from element `offset` of the model's) reordered for the kernels whose
  /// user_w_md and weights_md these are.
  struct PackedWeights {
    int64_t offset = 0;
    dnnl::memory::desc user_md;
    dnnl::memory memory;
  };

  /// A piece, with what its call alone uses.
  struct Part {
    ConvPiece piece;
    size_t kernel = 0, weights = 0;
    dnnl::stream stream;
    dnnl::memory scratchpad, src_in_scratchpad, dst_out_scratchpad, blocked_src, blocked_dst;
    dnnl::memory own_dst;  // the dense output of a piece with an out_pitch
  };

  static dnnl::memory::dims dims_of(const ConvParams& p, int64_t lead0, int64_t lead1,
                                    const int64_t* spatial) {
    dnnl::memory::dims d = {lead0, lead1};
    for (int k = 3 - p.spatial; k < 3; ++k) d.push_back(spatial[k]);
    return d;
  }

  void plan(const ConvParams& p, int threads, bool has_bias, const ConvActivation& act) {
    ready_ = false;
    kernels_.clear();
    weights_.clear();
    parts_.clear();
    has_bias_ = has_bias;
    act_ = act;
    for (const ConvPiece& piece : conv_pieces(p, threads)) {
      Part part;
      part.piece = piece;
      part.kernel = kernels_.size();
      for (size_t k = 0; k < kernels_.size(); ++k) {
        if (kernels_[k].params == piece.params) part.kernel = k;
      }
      if (part.kernel == kernels_.size()) kernels_.push_back(build(piece.params));
      const Kernel& kernel = kernels_[part.kernel];
      part.weights = weights_.size();
      for (size_t k = 0; k < weights_.size(); ++k) {
        if (weights_[k].offset == piece.w_offset && weights_[k].user_md == kernel.user_w_md &&
            weights_[k].memory.get_desc() == kernel.weights_md) {
          part.weights = k;
        }
      }
      if (part.weights == weights_.size()) {
        weights_.push_back(
            {piece.w_offset, kernel.user_w_md, dnnl::memory(kernel.weights_md, engine_)});
      }
      part.stream = dnnl::stream(engine_);
      part.scratchpad = dnnl::memory(kernel.scratchpad_md, engine_);
      if (kernel.src_in.active) {
        part.src_in_scratchpad = dnnl::memory(kernel.src_in.scratchpad_md, engine_);
        part.blocked_src = dnnl::memory(kernel.primitive_src_md, engine_);
      }
      if (kernel.dst_out.active) {
        part.dst_out_scratchpad = dnnl::memory(kernel.dst_out.scratchpad_md, engine_);
        part.blocked_dst = dnnl::memory(kernel.primitive_dst_md, engine_);
      }
      if (piece.out_pitch != 0) part.own_dst = dnnl::memory(kernel.dst_md, engine_);
      parts_.push_back(std::move(part));
    }
    params_ = p;
    threads_ = threads;
    ready_ = true;
  }

  Kernel build(const ConvParams& p) const {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    Kernel kernel;
    kernel.params = p;
    const tag act = p.channels_last  ? tag::nhwc
                    : p.spatial == 1 ? tag::ncw
                    : p.spatial == 2 ? tag::nchw
                                     : tag::ncdhw;
    const tag wt = p.spatial == 1 ? tag::oiw : p.spatial == 2 ? tag::oihw : tag::oidhw;
    const tag gwt = p.spatial == 1 ? tag::goiw : p.spatial == 2 ? tag::goihw : tag::goidhw;
    kernel.src_md = dnnl::memory::desc(dims_of(p, p.n, p.c, p.in), dt::f32, act);
    kernel.dst_md = dnnl::memory::desc(dims_of(p, p.n, p.m, p.out), dt::f32, act);
    dnnl::memory::dims wdims = dims_of(p, p.m, p.c / p.group, p.kernel);
    kernel.user_w_md = dnnl::memory::desc(wdims, dt::f32, wt);
    if (p.group > 1) {
      wdims = {p.group, p.m / p.group, p.c / p.group};
      for (int k = 3 - p.spatial; k < 3; ++k) wdims.push_back(p.kernel[k]);
      kernel.user_w_md = dnnl::memory::desc(wdims, dt::f32, gwt);
    }
    dnnl::memory::desc any_w_md(wdims, dt::f32, tag::any);
    // On plain NCHW activations oneDNN convolves by im2col + GEMM; its direct convolutions
    // (brgconv, jit) want blocked ones (nChw16c, nChw8c). For kernels larger than 1x1 the direct
    // ones measured 1.5-5x faster at ResNet-50's shapes, reorders in and out included, so those
    // convolutions let oneDNN pick the activation layout and reorder around the call; 1x1
    // convolutions stay on NCHW, where the reorders cost about what they save (made blocked too,
    // ResNet-50 took 10% more CPU time; bench/ort/run.sh).
    // Channels-last activations are a layout oneDNN's direct convolutions take as they are.
    const bool blocked = p.kernel[0] * p.kernel[1] * p.kernel[2] > 1 && !p.channels_last;
    const dnnl::memory::desc conv_src_md =
        blocked ? dnnl::memory::desc(kernel.src_md.dims(), dt::f32, tag::any) : kernel.src_md;
    const dnnl::memory::desc conv_dst_md =
        blocked ? dnnl::memory::desc(kernel.dst_md.dims(), dt::f32, tag::any) : kernel.dst_md;
    kernel.bias_md = dnnl::memory::desc({p.m}, dt::f32, tag::x);
    dnnl::memory::dims strides, dilates, pad_l, pad_r;
    for (int k = 3 - p.spatial; k < 3; ++k) {
      strides.push_back(p.stride[k]);
      dilates.push_back(p.dilation[k] - 1);
      pad_l.push_back(p.pad_begin[k]);
      pad_r.push_back(p.pad_end[k]);
    }
    auto desc = has_bias_
                    ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                      dnnl::algorithm::convolution_direct,
                                                      conv_src_md, any_w_md, kernel.bias_md,
                                                      conv_dst_md, strides, dilates, pad_l, pad_r)
                    : dnnl::convolution_forward::desc(
                          dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                          conv_src_md, any_w_md, conv_dst_md, strides, dilates, pad_l, pad_r);
    dnnl::primitive_attr attr = user_scratchpad();
    if (act_.kind != 0) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, eltwise_algorithm(act_.kind), static_cast<float>(act_.alpha),
                         static_cast<float>(act_.beta));
      attr.set_post_ops(ops);
    }
    dnnl::convolution_forward::primitive_desc pd(desc, attr, engine_);
    kernel.primitive = dnnl::convolution_forward(pd);
    kernel.scratchpad_md = pd.scratchpad_desc();
    kernel.weights_md = pd.weights_desc();
    kernel.primitive_src_md = pd.src_desc();
    kernel.primitive_dst_md = pd.dst_desc();
    kernel.src_in.build(engine_, kernel.src_md, pd.src_desc());
    kernel.dst_out.build(engine_, pd.dst_desc(), kernel.dst_md);
    return kernel;
  }

  /// Reorders the weights into the layouts the primitives prefer.
  void reorder_weights(const float* w) {
    dnnl::stream stream(engine_);
    for (PackedWeights& packed : weights_) {
      dnnl::memory user_w(packed.user_md, engine_, const_cast<float*>(w + packed.offset));
      dnnl::reorder::primitive_desc pd(user_w, packed.memory, user_scratchpad());
      dnnl::memory scratchpad(pd.scratchpad_desc(), engine_);
      dnnl::reorder(pd).execute(stream, {{DNNL_ARG_FROM, user_w},
                                         {DNNL_ARG_TO, packed.memory},
                                         {DNNL_ARG_SCRATCHPAD, scratchpad}});
    }
    stream.wait();
    weights_src_ = w;
  }

  /// One piece's call, on the calling thread alone (the caller holds a SingleThreadedCall).
  void run_part(Part& part, const float* x, const float* bias, float* out) const {
    const Kernel& kernel = kernels_[part.kernel];
    const ConvPiece& piece = part.piece;
    dnnl::memory src(kernel.src_md, engine_, const_cast<float*>(x + piece.x_offset));
    dnnl::memory dst = piece.out_pitch != 0
                           ? part.own_dst
                           : dnnl::memory(kernel.dst_md, engine_, out + piece.out_offset);
    if (kernel.src_in.active) {
      kernel.src_in.primitive.execute(part.stream, {{DNNL_ARG_FROM, src},
                                                    {DNNL_ARG_TO, part.blocked_src},
                                                    {DNNL_ARG_SCRATCHPAD, part.src_in_scratchpad}});
    }
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, kernel.src_in.active ? part.blocked_src : src},
        {DNNL_ARG_WEIGHTS, weights_[part.weights].memory},
        {DNNL_ARG_DST, kernel.dst_out.active ? part.blocked_dst : dst},
        {DNNL_ARG_SCRATCHPAD, part.scratchpad}};
    if (bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(kernel.bias_md, engine_,
                                               const_cast<float*>(bias + piece.bias_offset)));
    }
    kernel.primitive.execute(part.stream, args);
    if (kernel.dst_out.active) {
      kernel.dst_out.primitive.execute(part.stream,
                                       {{DNNL_ARG_FROM, part.blocked_dst},
                                        {DNNL_ARG_TO, dst},
                                        {DNNL_ARG_SCRATCHPAD, part.dst_out_scratchpad}});
    }
    part.stream.wait();
    if (piece.out_pitch != 0) {
      // Channels [m0, m0 + m) of each output pixel, from the piece's dense output.
      const int64_t m = piece.params.m;
      const int64_t pixels =
          piece.params.n * piece.params.out[0] * piece.params.out[1] * piece.params.out[2];
      const float* from = static_cast<const float*>(part.own_dst.get_data_handle());
      for (int64_t px = 0; px < pixels; ++px) {
        std::memcpy(out + piece.out_offset + px * piece.out_pitch, from + px * m,
                    static_cast<size_t>(m) * sizeof(float));
      }
    }
  }

  /// oneDNN's eltwise algorithm of ConvActivation `kind` (1 to 9). Its alpha and beta are the
  /// activation's: LeakyRelu is eltwise_relu with the slope as alpha, Clip eltwise_clip_v2
  /// (min(max(x, alpha), beta)), Swish eltwise_swish (x sigmoid(alpha x)).
  static dnnl::algorithm eltwise_algorithm(int kind) {
    using alg = dnnl::algorithm;
    switch (kind) {
      case 1:
      case 5:
        return alg::eltwise_relu;
      case 2:
        return alg::eltwise_logistic;
      case 3:
        return alg::eltwise_tanh;
      case 4:
        return alg::eltwise_clip_v2;
      case 6:
        return alg::eltwise_elu;
      case 7:
        return alg::eltwise_gelu_erf;
      case 8:
        return alg::eltwise_gelu_tanh;
      case 9:
        return alg::eltwise_swish;
    }
    fail("a convolution's activation %d is not one oneDNN applies", kind);
  }

  /// oneDNN's default scratchpad is one buffer shared by every primitive of the process, which
  /// makes a primitive unsafe to run from a thread other than the one that created it (Debian
  /// builds oneDNN without DNNL_ENABLE_CONCURRENT_EXEC). A site is called from whichever thread
  /// runs the model and its pieces run on the pool's threads, so each primitive gets its
  /// scratchpads from the part that runs it.
  static dnnl::primitive_attr user_scratchpad() {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  std::mutex mutex_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  bool ready_ = false;
  bool has_bias_ = false;
  ConvActivation act_;
  ConvParams params_;
  int threads_ = 0;
  const float* weights_src_ = nullptr;
  std::vector<Kernel> kernels_;
  std::vector<PackedWeights> weights_;
  std::vector<Part> parts_;
};
#endif

}  // namespace kiln_rt
