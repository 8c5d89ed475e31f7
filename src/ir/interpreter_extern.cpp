// Buffer memory of the reference interpreter and naive reference implementations of the extern
// kernels: every element is computed by its defining sum, reading inputs through their views'
// strides, so broadcasting and transposed views need no special cases.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "ir/interpreter_memory.h"
#include "support/error.h"

namespace kiln::ir::interp {

using graph::DType;

Scalar Storage::read(int64_t k, const std::string& name) const {
  if (k < 0 || k >= static_cast<int64_t>(data.size())) {
    internal_error("interpreter: read of {}[{}] outside its storage of {} elements", name, k,
                   data.size());
  }
  if (!written[static_cast<size_t>(k)]) {
    internal_error("interpreter: read of {}[{}], which nothing has written", name, k);
  }
  return data[static_cast<size_t>(k)];
}

void Storage::write(int64_t k, Scalar value, const std::string& name) {
  if (k < 0 || k >= static_cast<int64_t>(data.size())) {
    internal_error("interpreter: write of {}[{}] outside its storage of {} elements", name, k,
                   data.size());
  }
  data[static_cast<size_t>(k)] = value;
  written[static_cast<size_t>(k)] = true;
}

int64_t ConcreteLayout::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

int64_t ConcreteLayout::storage_size() const {
  if (numel() == 0) return 0;
  int64_t extent = offset + 1;
  for (size_t k = 0; k < sizes.size(); ++k)
    extent += std::max<int64_t>(0, (sizes[k] - 1) * strides[k]);
  return extent;
}

int64_t ConcreteLayout::at(const std::vector<int64_t>& index) const {
  KILN_CHECK(index.size() == sizes.size(), "index rank {} for layout rank {}", index.size(),
             sizes.size());
  int64_t flat = offset;
  for (size_t k = 0; k < index.size(); ++k) flat += index[k] * strides[k];
  return flat;
}

std::vector<int64_t> evaluate_all(const std::vector<sym::Expr>& exprs,
                                  const sym::Binding& binding) {
  std::vector<int64_t> values;
  values.reserve(exprs.size());
  for (const sym::Expr& e : exprs) values.push_back(sym::evaluate(e, binding));
  return values;
}

ConcreteLayout concretize(const Layout& layout, const sym::Binding& binding) {
  ConcreteLayout c;
  c.sizes = evaluate_all(layout.sizes, binding);
  c.strides = evaluate_all(layout.strides, binding);
  c.offset = sym::evaluate(layout.offset, binding);
  KILN_CHECK(c.sizes.size() == c.strides.size(), "layout has {} sizes but {} strides",
             c.sizes.size(), c.strides.size());
  return c;
}

namespace {

/// An extern input: its storage and evaluated layout.
struct Operand {
  const Storage* storage = nullptr;
  std::string name;
  DType dtype = DType::kFloat32;
  ConcreteLayout layout;

  Scalar at(const std::vector<int64_t>& index) const {
    return storage->read(layout.at(index), name);
  }
  double real_at(const std::vector<int64_t>& index) const { return to_double(at(index), dtype); }
  size_t rank() const { return layout.sizes.size(); }
};

Operand operand(const ExternCall& call, size_t k, const Storages& storages,
                const sym::Binding& binding) {
  KILN_CHECK(k < call.inputs.size() && call.inputs[k].has_value(), "{} input {} is missing",
             call.name(), k);
  const View& view = *call.inputs[k];
  auto it = storages.find(view.buffer);
  KILN_CHECK(it != storages.end(), "{} reads buffer {} before it exists", call.name(), view.buffer);
  KILN_CHECK(it->second.dtype == view.dtype, "{} view of {} says {} but the buffer is {}",
             call.name(), view.buffer, graph::dtype_name(view.dtype),
             graph::dtype_name(it->second.dtype));
  return Operand{&it->second, view.buffer, view.dtype, concretize(view.layout, binding)};
}

bool has_input(const ExternCall& call, size_t k) {
  return k < call.inputs.size() && call.inputs[k].has_value();
}

/// The index into `op` for output index `out` under right-aligned broadcasting: the leading
/// `op_dims` dims of `op` align with the leading `out_dims` output dims (size-1 dims read 0);
/// other dims of `op` are left 0 for the caller to set.
std::vector<int64_t> broadcast_to(const std::vector<int64_t>& out, size_t out_dims,
                                  const Operand& op, size_t op_dims) {
  KILN_CHECK(op_dims <= out_dims, "operand {} has more batch dims than the output", op.name);
  std::vector<int64_t> index(op.rank(), 0);
  for (size_t k = 0; k < op_dims; ++k) {
    index[k] = op.layout.sizes[k] == 1 ? 0 : out[out_dims - op_dims + k];
  }
  return index;
}

void write_output(Storage& out, const ConcreteLayout& layout, const std::vector<int64_t>& index,
                  double value, const std::string& name) {
  out.write(layout.at(index), from_double(value, out.dtype), name);
}

/// matmul: out[..., m, n] = alpha * sum_k A[..., m, k] * B[..., k, n] + beta * C[...].
void run_matmul(const Buffer& buffer, const MatMulCall& params, Storages& storages,
                const sym::Binding& binding) {
  const ExternCall& call = buffer.call;
  Operand a = operand(call, 0, storages, binding);
  Operand b = operand(call, 1, storages, binding);
  ConcreteLayout out_layout = concretize(buffer.layout, binding);
  size_t rank = out_layout.sizes.size();
  KILN_CHECK(a.rank() >= 2 && b.rank() >= 2 && rank >= 2 && a.rank() <= rank && b.rank() <= rank,
             "matmul ranks A {} B {} out {}", a.rank(), b.rank(), rank);
  int64_t depth = a.layout.sizes[a.rank() - 1];
  KILN_CHECK(b.layout.sizes[b.rank() - 2] == depth, "matmul inner sizes {} vs {}", depth,
             b.layout.sizes[b.rank() - 2]);
  const double alpha = params.alpha, beta = params.beta;
  bool has_bias = has_input(call, 2);
  Operand c = has_bias ? operand(call, 2, storages, binding) : Operand{};
  // Input 3: a residual the CUDA backend fused (codegen/cuda/cuda_matmul.h), laid out as the
  // output and added with weight 1: out = act(alpha * A @ B + beta * C + R).
  bool has_residual = has_input(call, 3);
  Operand r = has_residual ? operand(call, 3, storages, binding) : Operand{};
  bool integer = !is_float_dtype(a.dtype) && !is_float_dtype(buffer.dtype);
  Storage& out = storages.at(buffer.name);
  for_each_index(out_layout.sizes, [&](const std::vector<int64_t>& index) {
    std::vector<int64_t> ai = broadcast_to(index, rank - 2, a, a.rank() - 2);
    std::vector<int64_t> bi = broadcast_to(index, rank - 2, b, b.rank() - 2);
    ai[a.rank() - 2] = index[rank - 2];
    bi[b.rank() - 1] = index[rank - 1];
    double sum = 0;
    uint64_t isum = 0;  // wraps like the integer arithmetic of the generated code
    for (int64_t k = 0; k < depth; ++k) {
      ai[a.rank() - 1] = k;
      bi[b.rank() - 2] = k;
      if (integer) {
        isum += static_cast<uint64_t>(a.at(ai).i) * static_cast<uint64_t>(b.at(bi).i);
      } else {
        sum += a.real_at(ai) * b.real_at(bi);
      }
    }
    double value = integer ? static_cast<double>(static_cast<int64_t>(isum)) : sum;
    value *= alpha;
    if (has_bias) value += beta * c.real_at(broadcast_to(index, rank, c, c.rank()));
    if (has_residual) value += r.real_at(broadcast_to(index, rank, r, r.rank()));
    switch (params.activation) {
      case MatMulActivation::kNone:
        break;
      case MatMulActivation::kRelu:
        value = value > 0 ? value : 0;
        break;
      case MatMulActivation::kGeluTanh: {
        const double inner = std::sqrt(2.0 / M_PI) * (value + 0.044715 * value * value * value);
        value = 0.5 * value * (1.0 + std::tanh(inner));
        break;
      }
    }
    if (integer && alpha == 1.0 && !has_bias && params.activation == MatMulActivation::kNone) {
      out.write(out_layout.at(index), Scalar{0, wrap_int(static_cast<int64_t>(isum), out.dtype)},
                buffer.name);
      return;
    }
    write_output(out, out_layout, index, value, buffer.name);
  });
}

struct ConvParams {
  std::vector<int64_t> strides, pads, dilations;
  int64_t group = 1;
};

ConvParams conv_params(const ConvCall& call, size_t spatial) {
  ConvParams p;
  p.strides = call.strides;
  p.pads = call.pads;
  p.dilations = call.dilations;
  p.group = call.group;
  if (p.strides.empty()) p.strides.assign(spatial, 1);
  if (p.pads.empty()) p.pads.assign(2 * spatial, 0);
  if (p.dilations.empty()) p.dilations.assign(spatial, 1);
  KILN_CHECK(p.strides.size() == spatial && p.pads.size() == 2 * spatial &&
                 p.dilations.size() == spatial && p.group >= 1,
             "conv attributes do not match {} spatial dims", spatial);
  return p;
}

/// conv with a choice (lower/conv_select.h): inputs X and the weight as the choice prepared it
/// for its problem (ConvChoice::weight_offset and bias_offset say where W[m, t] and the bias
/// are). A grouped problem's output channel m reads the C / G input channels of its group. A
/// channels-last problem has X [N, H, W, C] and the output [N, OH, OW, M].
void run_conv_prepared(const Buffer& buffer, const autotune::ConvChoice& choice, Storages& storages,
                       const sym::Binding& binding) {
  const ExternCall& call = buffer.call;
  Operand x = operand(call, 0, storages, binding);
  Operand w = operand(call, 1, storages, binding);
  const autotune::ConvProblem& p = choice.problem();
  const int64_t channels = p.c / p.group, h = p.h, wd = p.w, m_count = p.m, kh = p.kh, kw = p.kw;
  const bool last = p.channels_last;
  ConcreteLayout out_layout = concretize(buffer.layout, binding);
  Storage& out = storages.at(buffer.name);
  for_each_index(out_layout.sizes, [&](const std::vector<int64_t>& o) {
    const int64_t m = last ? o[3] : o[1], oh = last ? o[1] : o[2], ow = last ? o[2] : o[3];
    const int64_t first = m / (m_count / p.group) * channels;
    double sum = w.real_at({choice.bias_offset(m)});
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t ki = 0; ki < kh; ++ki) {
        const int64_t i = oh * p.stride_h - p.pad_top + ki * p.dilation_h;
        if (i < 0 || i >= h) continue;
        for (int64_t kj = 0; kj < kw; ++kj) {
          const int64_t jj = ow * p.stride_w - p.pad_left + kj * p.dilation_w;
          if (jj < 0 || jj >= wd) continue;
          const int64_t t = (c * kh + ki) * kw + kj;
          const double xv =
              last ? x.real_at({o[0], i, jj, first + c}) : x.real_at({o[0], first + c, i, jj});
          sum += xv * w.real_at({choice.weight_offset(m, t)});
        }
      }
    }
    write_output(out, out_layout, o, sum, buffer.name);
  });
}

/// conv: out[n, m, o...] = B[m] + sum_{c, k...} X[n, g*C/group + c, o*s - pad + k*d] * W[m, c, k].
/// The activation a convolution on CUDA fused (ConvCall::activation), in double.
double conv_activation(const ConvCall& params, double v) {
  switch (params.activation) {
    case ConvActivation::kNone:
      return v;
    case ConvActivation::kRelu:
      return std::max(v, 0.0);
    case ConvActivation::kSigmoid:
      return 1 / (1 + std::exp(-v));
    case ConvActivation::kTanh:
      return std::tanh(v);
    case ConvActivation::kClip:
      return std::min(std::max(v, params.alpha), params.beta);
    case ConvActivation::kLeakyRelu:
      return v < 0 ? params.alpha * v : v;
    case ConvActivation::kElu:
      return v < 0 ? params.alpha * std::expm1(v) : v;
    case ConvActivation::kGelu:
      return 0.5 * v * (1 + std::erf(v * M_SQRT1_2));
    case ConvActivation::kGeluTanh:
      return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case ConvActivation::kSwish:
      return v / (1 + std::exp(-params.alpha * v));
  }
  return v;
}

void run_conv(const Buffer& buffer, const ConvCall& params, Storages& storages,
              const sym::Binding& binding) {
  const ExternCall& call = buffer.call;
  if (params.choice) return run_conv_prepared(buffer, *params.choice, storages, binding);
  Operand x = operand(call, 0, storages, binding);
  Operand w = operand(call, 1, storages, binding);
  bool has_bias = has_input(call, 2);
  Operand bias = has_bias ? operand(call, 2, storages, binding) : Operand{};
  Operand residual = params.residual ? operand(call, 3, storages, binding) : Operand{};
  ConcreteLayout out_layout = concretize(buffer.layout, binding);
  size_t rank = x.rank();
  KILN_CHECK(rank >= 3 && rank <= 5 && w.rank() == rank && out_layout.sizes.size() == rank,
             "conv ranks X {} W {} out {}", rank, w.rank(), out_layout.sizes.size());
  // A channels-last call (2-D): X [N, H, W, C] and the output [N, OH, OW, M], read and written
  // here through their NCHW indices.
  const bool last = params.channels_last;
  KILN_CHECK(!last || rank == 4, "a channels-last conv of rank {}", rank);
  auto nchw = [&](const std::vector<int64_t>& v) {
    return last ? std::vector<int64_t>{v[0], v[3], v[1], v[2]} : v;
  };
  auto physical = [&](const std::vector<int64_t>& v) {
    return last ? std::vector<int64_t>{v[0], v[2], v[3], v[1]} : v;
  };
  const std::vector<int64_t> x_sizes = nchw(x.layout.sizes), out_sizes = nchw(out_layout.sizes);
  size_t spatial = rank - 2;
  ConvParams p = conv_params(params, spatial);
  // A weight packed channels-last (2-D): W [M, KH, KW, C / group], indexed here as [M, C, KH, KW].
  const bool weight_last = params.weight_channels_last;
  KILN_CHECK(!weight_last || rank == 4, "a channels-last conv weight of rank {}", rank);
  int64_t out_channels = w.layout.sizes[0];
  int64_t group_channels = w.layout.sizes[weight_last ? 3 : 1];
  KILN_CHECK(x_sizes[1] == group_channels * p.group && out_channels % p.group == 0,
             "conv channels: X has {}, W {} x group {}", x_sizes[1], group_channels, p.group);
  for (size_t d = 0; d < spatial; ++d) {
    int64_t extent = x_sizes[2 + d] + p.pads[d] + p.pads[spatial + d] -
                     p.dilations[d] * (w.layout.sizes[(weight_last ? 1 : 2) + d] - 1) - 1;
    KILN_CHECK(out_sizes[2 + d] == extent / p.strides[d] + 1,
               "conv output dim {} is {}, expected {}", d, out_sizes[2 + d],
               extent / p.strides[d] + 1);
  }
  const std::vector<int64_t> w_sizes =
      weight_last ? std::vector<int64_t>{w.layout.sizes[0], w.layout.sizes[3], w.layout.sizes[1],
                                         w.layout.sizes[2]}
                  : w.layout.sizes;
  std::vector<int64_t> kernel_sizes(w_sizes.begin() + 2, w_sizes.end());
  Storage& out = storages.at(buffer.name);
  for_each_index(out_sizes, [&](const std::vector<int64_t>& o) {
    int64_t m = o[1];
    int64_t g = m / (out_channels / p.group);
    double sum = has_bias ? bias.real_at({m}) : 0.0;
    std::vector<int64_t> xi(rank), wi(rank);
    xi[0] = o[0];
    wi[0] = m;
    for (int64_t c = 0; c < group_channels; ++c) {
      xi[1] = g * group_channels + c;
      wi[1] = c;
      for_each_index(kernel_sizes, [&](const std::vector<int64_t>& k) {
        for (size_t d = 0; d < spatial; ++d) {
          int64_t pos = o[2 + d] * p.strides[d] - p.pads[d] + k[d] * p.dilations[d];
          if (pos < 0 || pos >= x_sizes[2 + d]) return;
          xi[2 + d] = pos;
          wi[2 + d] = k[d];
        }
        sum += x.real_at(physical(xi)) *
               w.real_at(weight_last ? std::vector<int64_t>{wi[0], wi[2], wi[3], wi[1]} : wi);
      });
    }
    // The epilogue fused into the call (the residual on CUDA only): + residual, then the
    // activation.
    if (params.residual) sum += residual.real_at(physical(o));
    if (params.relu_post_ops > 0) sum = std::max(sum, 0.0);
    sum = conv_activation(params, sum);
    write_output(out, out_layout, physical(o), sum, buffer.name);
  });
}

/// gemm: out[..., m, n] = sum_k A[..., m, k] * B[k, n], with B as the choice prepared it: the
/// template's packed panels when the choice is the template (autotune/gemm_template.h
/// prepack_b: per KC block of depth kc, per NR panel, kc rows of NR floats; panel (p0, j0) at
/// p0 * roundup(N, NR) + j0 * kc), else row-major [K, N].
void run_gemm(const Buffer& buffer, const GemmCall& params, Storages& storages,
              const sym::Binding& binding) {
  const ExternCall& call = buffer.call;
  Operand a = operand(call, 0, storages, binding);
  Operand packed = operand(call, 1, storages, binding);
  const int64_t n = params.n, depth = params.k;
  const autotune::GemmConfig* config = params.choice->template_config();
  const bool packed_layout = config != nullptr;
  const int64_t nr = config ? config->nr : 1, kc = config ? config->kc : 1;
  const int64_t n_padded = (n + nr - 1) / nr * nr;
  auto b_at = [&](int64_t p, int64_t j) {
    if (!packed_layout) return packed.real_at({p * n + j});
    const int64_t p0 = p / kc * kc, j0 = j / nr * nr;
    const int64_t block = std::min(kc, depth - p0);
    return packed.real_at({p0 * n_padded + j0 * block + (p - p0) * nr + (j - j0)});
  };
  ConcreteLayout out_layout = concretize(buffer.layout, binding);
  const size_t rank = out_layout.sizes.size();
  Storage& out = storages.at(buffer.name);
  for_each_index(out_layout.sizes, [&](const std::vector<int64_t>& index) {
    std::vector<int64_t> ai = index;
    double sum = 0;
    for (int64_t k = 0; k < depth; ++k) {
      ai[rank - 1] = k;
      sum += a.real_at(ai) * b_at(k, index[rank - 1]);
    }
    write_output(out, out_layout, index, sum, buffer.name);
  });
}

/// attention: per output row, the scores s_j = mask(scale * Q[.., i, :] . K^T[.., :, j]), their
/// softmax (in double; a row of -inf scores gives NaN, as Softmax does) and its product with V.
/// The views are broadcast to the output's batch dims already.
void run_attention(const Buffer& buffer, const AttentionCall& params, Storages& storages,
                   const sym::Binding& binding) {
  const ExternCall& call = buffer.call;
  Operand q = operand(call, 0, storages, binding);
  Operand kt = operand(call, 1, storages, binding);
  Operand v = operand(call, 2, storages, binding);
  const bool masked = params.mask != AttentionMask::kNone;
  Operand mask = masked ? operand(call, 3, storages, binding) : Operand{};
  ConcreteLayout out_layout = concretize(buffer.layout, binding);
  const size_t rank = out_layout.sizes.size();
  KILN_CHECK(rank >= 2 && q.rank() == rank && kt.rank() == rank && v.rank() == rank,
             "attention ranks Q {} K^T {} V {} out {}", q.rank(), kt.rank(), v.rank(), rank);
  const int64_t d = q.layout.sizes[rank - 1], lk = kt.layout.sizes[rank - 1];
  const int64_t dv = out_layout.sizes[rank - 1];
  std::vector<int64_t> row_shape(out_layout.sizes.begin(), out_layout.sizes.end() - 1);
  Storage& out = storages.at(buffer.name);
  for_each_index(row_shape, [&](const std::vector<int64_t>& row) {
    std::vector<int64_t> at = row;
    at.push_back(0);
    std::vector<double> s(static_cast<size_t>(lk));
    double max = -INFINITY;
    for (int64_t j = 0; j < lk; ++j) {
      double dot = 0;
      std::vector<int64_t> qi = at, ki = at;
      ki[rank - 2] = 0;
      for (int64_t k = 0; k < d; ++k) {
        qi[rank - 1] = k;
        ki[rank - 2] = k;
        ki[rank - 1] = j;
        dot += q.real_at(qi) * kt.real_at(ki);
      }
      double x = params.scale * dot;
      if (masked) {
        std::vector<int64_t> mi = at;
        mi[rank - 1] = j;
        const double m = mask.real_at(mi);
        switch (params.mask) {
          case AttentionMask::kKeepWhereTrue:
            x = m != 0 ? x : params.fill;
            break;
          case AttentionMask::kKeepWhereFalse:
            x = m != 0 ? params.fill : x;
            break;
          case AttentionMask::kAdd:
            x += m;
            break;
          case AttentionMask::kNone:
            break;
        }
      }
      s[static_cast<size_t>(j)] = x;
      max = std::max(max, x);
    }
    double sum = 0;
    for (double& x : s) {
      x = std::exp(x - max);
      sum += x;
    }
    for (int64_t c = 0; c < dv; ++c) {
      double value = 0;
      std::vector<int64_t> vi = at;
      vi[rank - 1] = c;
      for (int64_t j = 0; j < lk; ++j) {
        vi[rank - 2] = j;
        value += s[static_cast<size_t>(j)] * v.real_at(vi);
      }
      at[rank - 1] = c;
      // No keys: the product over an empty axis, 0.
      write_output(out, out_layout, at, lk == 0 ? 0.0 : value / sum, buffer.name);
    }
  });
}

}  // namespace

void run_extern(const Buffer& buffer, Storages& storages, const sym::Binding& binding) {
  // The reference implementation of each kind of library call (ir/library_call.h); the kinds
  // the interpreter has none for are named, so that a new kind must be placed here.
  auto none = [&](const auto& call) {
    internal_error("interpreter: no reference implementation of library call '{}' (buffer {})",
                   call.name(), buffer.name);
  };
  std::visit(Overloaded{
                 [&](const MatMulCall& c) { run_matmul(buffer, c, storages, binding); },
                 [&](const GemmCall& c) { run_gemm(buffer, c, storages, binding); },
                 [&](const ConvCall& c) { run_conv(buffer, c, storages, binding); },
                 [&](const AttentionCall& c) { run_attention(buffer, c, storages, binding); },
                 [&](const TopKCall& c) { none(c); },
                 [&](const RnnCall& c) { none(c); },
                 [&](const DetCall& c) { none(c); },
                 [&](const RoiAlignCall& c) { none(c); },
                 [&](const TfIdfCall& c) { none(c); },
                 [&](const UniqueCall& c) { none(c); },
                 [&](const NmsCall& c) { none(c); },
                 [&](const ShapeValuesCall& c) { none(c); },
                 [&](const ReshapeDimsCall& c) { none(c); },
                 [&](const ExpandDimsCall& c) { none(c); },
                 [&](const RangeCountCall& c) { none(c); },
                 [&](const CountNonZeroCall& c) { none(c); },
                 [&](const NonZeroPositionsCall& c) { none(c); },
                 [&](const IfCall& c) { none(c); },
                 [&](const LoopCall& c) { none(c); },
                 [&](const ScanCall& c) { none(c); },
                 [&](const ControlResultCall& c) { none(c); },
             },
             buffer.call.op);
}

}  // namespace kiln::ir::interp
