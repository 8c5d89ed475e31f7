#pragma once
// Kiln runtime: convolution through oneDNN (float32) and a direct loop (float64, which oneDNN
// lacks). Extern kernel "conv": out[N, M, O...] = conv(X[N, C, D...], W[M, C/group, K...]) + B[M].
// Each call site owns a ConvSite that caches the oneDNN primitive (and its own scratchpad) for the
// last shapes it saw, so repeated runs at the same shapes pay for primitive creation once; a
// convolution with a kernel larger than 1x1 runs on blocked activations, reordered in and out.

#include <mutex>
#include <string>
#include <unordered_map>

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

#if defined(KILN_RT_WITH_DNNL)
/// The oneDNN state of one convolution call site.
class ConvSite {
 public:
  /// `constant_weights`: w is a model constant, so its reordered copy is kept across runs.
  /// `post_ops`: what the primitive applies to each output element after the bias, in order
  /// (sched/template_epilogue.h): 'r' Relu, so Conv -> Relu is this one call.
  void run(const ConvParams& p, const float* x, const float* w, const float* bias, float* out,
           bool constant_weights, const char* post_ops = "") {
    std::lock_guard<std::mutex> lock(mutex_);
    // oneDNN (OpenMP build) would start an OpenMP team beside Kiln's pool: it creates and runs
    // the primitive on this thread alone (the autotuner times it so).
    SingleThreadedCall single;
    const bool has_bias = bias != nullptr;
    if (!ready_ || !(p == params_) || has_bias != has_bias_ || post_ops_ != post_ops) {
      build(p, has_bias, post_ops);
      reorder_weights(w);
    } else if (!constant_weights || w != weights_src_) {
      reorder_weights(w);
    }
    dnnl::memory src(src_md_, engine_, const_cast<float*>(x));
    dnnl::memory dst(dst_md_, engine_, out);
    if (src_in_.active) src_in_.run(stream_, src, blocked_src_);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, src_in_.active ? blocked_src_ : src},
        {DNNL_ARG_WEIGHTS, weights_},
        {DNNL_ARG_DST, dst_out_.active ? blocked_dst_ : dst}};
    if (bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_md_, engine_, const_cast<float*>(bias)));
    }
    args.emplace(DNNL_ARG_SCRATCHPAD, scratchpad_);
    primitive_.execute(stream_, args);
    if (dst_out_.active) dst_out_.run(stream_, blocked_dst_, dst);
    stream_.wait();
  }

 private:
  /// A reorder between the model's plain layout and the primitive's blocked one, with its own
  /// scratchpad; inactive when the primitive takes the plain layout.
  struct LayoutReorder {
    bool active = false;
    dnnl::reorder primitive;
    dnnl::memory scratchpad;

    void build(const dnnl::engine& engine, const dnnl::memory::desc& from,
               const dnnl::memory::desc& to) {
      active = from != to;
      if (!active) return;
      dnnl::reorder::primitive_desc pd(engine, from, engine, to, user_scratchpad());
      primitive = dnnl::reorder(pd);
      scratchpad = dnnl::memory(pd.scratchpad_desc(), engine);
    }
    void run(dnnl::stream& stream, dnnl::memory& from, dnnl::memory& to) const {
      primitive.execute(
          stream, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
    }
  };

  static dnnl::memory::dims dims_of(const ConvParams& p, int64_t lead0, int64_t lead1,
                                    const int64_t* spatial) {
    dnnl::memory::dims d = {lead0, lead1};
    for (int k = 3 - p.spatial; k < 3; ++k) d.push_back(spatial[k]);
    return d;
  }

  void build(const ConvParams& p, bool has_bias, const std::string& post_ops) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const tag act = p.channels_last  ? tag::nhwc
                    : p.spatial == 1 ? tag::ncw
                    : p.spatial == 2 ? tag::nchw
                                     : tag::ncdhw;
    const tag wt = p.spatial == 1 ? tag::oiw : p.spatial == 2 ? tag::oihw : tag::oidhw;
    const tag gwt = p.spatial == 1 ? tag::goiw : p.spatial == 2 ? tag::goihw : tag::goidhw;
    src_md_ = dnnl::memory::desc(dims_of(p, p.n, p.c, p.in), dt::f32, act);
    dst_md_ = dnnl::memory::desc(dims_of(p, p.n, p.m, p.out), dt::f32, act);
    dnnl::memory::dims wdims = dims_of(p, p.m, p.c / p.group, p.kernel);
    dnnl::memory::desc user_w_md(wdims, dt::f32, wt);
    if (p.group > 1) {
      wdims = {p.group, p.m / p.group, p.c / p.group};
      for (int k = 3 - p.spatial; k < 3; ++k) wdims.push_back(p.kernel[k]);
      user_w_md = dnnl::memory::desc(wdims, dt::f32, gwt);
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
        blocked ? dnnl::memory::desc(src_md_.dims(), dt::f32, tag::any) : src_md_;
    const dnnl::memory::desc conv_dst_md =
        blocked ? dnnl::memory::desc(dst_md_.dims(), dt::f32, tag::any) : dst_md_;
    bias_md_ = dnnl::memory::desc({p.m}, dt::f32, tag::x);
    dnnl::memory::dims strides, dilates, pad_l, pad_r;
    for (int k = 3 - p.spatial; k < 3; ++k) {
      strides.push_back(p.stride[k]);
      dilates.push_back(p.dilation[k] - 1);
      pad_l.push_back(p.pad_begin[k]);
      pad_r.push_back(p.pad_end[k]);
    }
    auto desc =
        has_bias ? dnnl::convolution_forward::desc(
                       dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                       conv_src_md, any_w_md, bias_md_, conv_dst_md, strides, dilates, pad_l, pad_r)
                 : dnnl::convolution_forward::desc(
                       dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                       conv_src_md, any_w_md, conv_dst_md, strides, dilates, pad_l, pad_r);
    dnnl::primitive_attr attr = user_scratchpad();
    dnnl::post_ops ops;
    for (char op : post_ops) {
      if (op == 'r') ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    }
    attr.set_post_ops(ops);
    dnnl::convolution_forward::primitive_desc pd(desc, attr, engine_);
    primitive_ = dnnl::convolution_forward(pd);
    scratchpad_ = dnnl::memory(pd.scratchpad_desc(), engine_);
    src_in_.build(engine_, src_md_, pd.src_desc());
    dst_out_.build(engine_, pd.dst_desc(), dst_md_);
    blocked_src_ = src_in_.active ? dnnl::memory(pd.src_desc(), engine_) : dnnl::memory();
    blocked_dst_ = dst_out_.active ? dnnl::memory(pd.dst_desc(), engine_) : dnnl::memory();
    user_w_md_ = user_w_md;
    weights_ = dnnl::memory(pd.weights_desc(), engine_);
    params_ = p;
    has_bias_ = has_bias;
    post_ops_ = post_ops;
    ready_ = true;
  }

  /// Reorders the weights into the layout the primitive prefers.
  void reorder_weights(const float* w) {
    dnnl::memory user_w(user_w_md_, engine_, const_cast<float*>(w));
    dnnl::reorder::primitive_desc pd(user_w, weights_, user_scratchpad());
    dnnl::memory scratchpad(pd.scratchpad_desc(), engine_);
    dnnl::reorder(pd).execute(
        stream_,
        {{DNNL_ARG_FROM, user_w}, {DNNL_ARG_TO, weights_}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
    stream_.wait();
    weights_src_ = w;
  }

  /// oneDNN's default scratchpad is one buffer shared by every primitive of the process, which
  /// makes a primitive unsafe to run from a thread other than the one that created it (Debian
  /// builds oneDNN without DNNL_ENABLE_CONCURRENT_EXEC). A site is called from whichever thread
  /// runs the model, so each primitive gets its own scratchpad (the site's mutex serializes it).
  static dnnl::primitive_attr user_scratchpad() {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  std::mutex mutex_;
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  bool ready_ = false;
  bool has_bias_ = false;
  std::string post_ops_;
  ConvParams params_;
  const float* weights_src_ = nullptr;
  dnnl::memory::desc src_md_, dst_md_, bias_md_, user_w_md_;
  dnnl::memory weights_;
  dnnl::memory scratchpad_;
  // The activations in the primitive's layout when it is not the plain one (see build()).
  LayoutReorder src_in_, dst_out_;
  dnnl::memory blocked_src_, blocked_dst_;
  dnnl::convolution_forward primitive_;
};
#endif

}  // namespace kiln_rt
