/// The signal-processing ops of opset 17 (DFT also 20, its axis an input), in the loop IR: DFT and
/// STFT as reductions over the samples (a direct transform, x[n] times the twiddle e^(-+2 pi i k n
/// / N) with k n taken mod N so the angle stays exact, summed in double), the window generators
/// (HannWindow, HammingWindow, BlackmanWindow) elementwise, and MelWeightMatrix computed at compile
/// time from its scalar arguments.
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lower/elementwise.h"
#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using ir::LoopBody;
using ir::OpCode;
using ir::ReductionType;
using ir::ValueId;
using sym::Expr;

namespace {

/// One scalar input's compile-time value.
double scalar_argument(const LoweringContext& ctx, const TensorValue& v, const std::string& what) {
  std::optional<double> value = known_scalar(v);
  if (!value) ctx.fail(fmt::format("input '{}' must be known when compiling", what));
  return *value;
}

/// The real or imaginary part (`part` 0 or 1) of sum_n x(n) e^(sign 2 pi i k n / N), where
/// `sample(body, n, c)` loads component c of sample n (c = 1 is 0 for real signals), over
/// `length` samples; `kn` is the output frequency times n as an index expression.
using SampleFn = std::function<ValueId(LoopBody&, const Expr& n, int c)>;

ValueId twiddled(LoopBody& body, DType f, const SampleFn& sample, const Expr& n, const Expr& k,
                 const Expr& size, double sign, int part) {
  FloatMath m{body, f};
  ValueId angle = m.mul(body.cast(body.index_expr(sym::mod(k * n, size)), f),
                        m.div(m.c(sign * 2 * M_PI), body.cast(body.index_expr(size), f)));
  ValueId cos = body.unary(OpCode::kCos, angle), sin = body.unary(OpCode::kSin, angle);
  ValueId re = sample(body, n, 0), im = sample(body, n, 1);
  // (re + i im)(cos + i sin)
  return part == 0 ? m.sub(m.mul(re, cos), m.mul(im, sin)) : m.add(m.mul(re, sin), m.mul(im, cos));
}

/// The length dft_length gives (input 1, absent or empty: none).
std::optional<int64_t> dft_length(const LoweringContext& ctx, const LowerInputs& inputs) {
  const TensorValue* length = optional_input(inputs, 1);
  if (length == nullptr || (length->rank() == 1 && length->shape[0] == Expr(0))) {
    return std::nullopt;
  }
  return static_cast<int64_t>(scalar_argument(ctx, *length, "dft_length"));
}

/// Inverse and onesided: the input holds the first half of a Hermitian spectrum (numpy's irfft),
/// X[k] for k <= n / 2 with n = dft_length (default 2 (L - 1) for L given frequencies); the
/// other half is X[n - k] conjugated. The output is the real signal [.., n, .., 1]:
/// x[t] = 1/n sum_k Re(X[k] e^(2 pi i k t / n)).
TensorValue inverse_real_dft(LoweringContext& ctx, const TensorValue& x, const LowerInputs& inputs,
                             size_t axis) {
  if (x.shape.back() != Expr(2)) ctx.fail("inverse onesided DFT needs a complex input [.., 2]");
  const int64_t given = require_static_dim(ctx, x.shape[axis], "the length of the DFT axis");
  const int64_t n = dft_length(ctx, inputs).value_or(2 * (given - 1));
  if (n <= 0) ctx.fail(fmt::format("the inverse onesided DFT has length {}", n));
  std::vector<Expr> shape = x.shape;
  shape[axis] = Expr(n);
  shape.back() = Expr(1);
  const DType f = DType::kFloat64;
  TensorValue sum = ctx.reduction(
      f, shape, {Expr(n)}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& o, const std::vector<Expr>& r) {
        FloatMath m{body, f};
        const Expr& k = r[0];
        const Expr mirrored = sym::min(k, Expr(n) - k);  // X[n - k] past the half
        auto component = [&](int c) {
          std::vector<Expr> at = o;
          at[axis] = mirrored;
          at.back() = Expr(c);
          ValueId mask = in_range(body, mirrored, Expr(0), x.shape[axis]);
          return body.cast(load_masked(ctx, body, x, at, mask, 0), f);
        };
        ValueId re = component(0), im = component(1);
        ValueId upper = body.binary(OpCode::kGt, body.index_expr(k),
                                    body.constant(static_cast<double>(n / 2), DType::kInt64));
        im = body.where(upper, m.sub(m.c(0), im), im);
        ValueId angle = m.mul(body.cast(body.index_expr(sym::mod(k * o[axis], Expr(n))), f),
                              m.c(2 * M_PI / static_cast<double>(n)));
        // Re((re + i im)(cos + i sin)) = re cos - im sin.
        return m.sub(m.mul(re, body.unary(OpCode::kCos, angle)),
                     m.mul(im, body.unary(OpCode::kSin, angle)));
      });
  return ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    ValueId v = body.binary(OpCode::kDiv, ctx.load_at(body, sum, o),
                            body.constant(static_cast<double>(n), f));
    return body.cast(v, x.dtype);
  });
}

std::vector<TensorValue> lower_dft(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  require_dtype(ctx, x.dtype, kFloats, "input 'input'");
  const size_t rank = x.rank();
  if (rank < 3 || (x.shape.back() != Expr(1) && x.shape.back() != Expr(2))) {
    ctx.fail("expected an input [batch, ..., 1 or 2] (real or complex)");
  }
  size_t axis;
  if (node.opset() >= 20) {
    // DFT-20: the axis is input 2 (default -2, the last signal axis), counted over all dims.
    int64_t a = -2;
    const TensorValue* axis_input = optional_input(inputs, 2);
    if (axis_input != nullptr && !(axis_input->rank() == 1 && axis_input->shape[0] == Expr(0))) {
      a = static_cast<int64_t>(scalar_argument(ctx, *axis_input, "axis"));
    }
    axis = static_cast<size_t>(ctx.normalize_axis(a, static_cast<int64_t>(rank)));
    if (axis == rank - 1) ctx.fail("input 'axis' names the real / imaginary dim");
  } else {
    axis = static_cast<size_t>(
        ctx.normalize_axis(node.attr_int("axis", 1), static_cast<int64_t>(rank) - 1));
  }
  if (axis == 0) ctx.fail("axis must not be the batch axis");
  const bool inverse = node.attr_int("inverse", 0) != 0;
  const bool onesided = node.attr_int("onesided", 0) != 0;
  const bool complex = x.shape.back() == Expr(2);
  if (inverse && onesided) return {inverse_real_dft(ctx, x, inputs, axis)};
  Expr n = x.shape[axis];
  if (std::optional<int64_t> length = dft_length(ctx, inputs)) n = Expr(*length);
  std::vector<Expr> shape = x.shape;
  shape[axis] = onesided ? ctx.analyzer().simplify(sym::floor_div(n, Expr(2)) + 1) : n;
  shape.back() = Expr(2);
  const DType f = DType::kFloat64;  // sums of many twiddled samples: float32 loses the zeros
  // Samples past the input's length are zeros (dft_length pads); fewer are read when shorter.
  auto sample_at = [&](const std::vector<Expr>& o) {
    return [&, o](LoopBody& body, const Expr& t, int c) {
      if (c == 1 && !complex) return body.constant(0, f);
      std::vector<Expr> at = o;
      at[axis] = t;
      at.back() = Expr(c);
      ValueId mask = in_range(body, t, Expr(0), x.shape[axis]);
      return body.cast(load_masked(ctx, body, x, at, mask, 0), f);
    };
  };
  TensorValue sum = ctx.reduction(
      f, shape, {n}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& o, const std::vector<Expr>& r) {
        int part = o.back() == Expr(0) ? 0 : -1;
        ValueId re = twiddled(body, f, sample_at(o), r[0], o[axis], n, inverse ? 1 : -1, 0);
        ValueId im = twiddled(body, f, sample_at(o), r[0], o[axis], n, inverse ? 1 : -1, 1);
        if (part == 0) return re;
        ValueId is_re =
            body.binary(OpCode::kEq, body.index_expr(o.back()), body.constant(0, DType::kInt64));
        return body.where(is_re, re, im);
      });
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    ValueId v = ctx.load_at(body, sum, o);
    if (inverse) v = body.binary(OpCode::kDiv, v, body.cast(body.index_expr(n), f));
    return body.cast(v, x.dtype);
  })};
}

std::vector<TensorValue> lower_stft(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& inputs) {
  const TensorValue& signal = required_input(ctx, inputs, 0, "signal");
  require_dtype(ctx, signal.dtype, kFloats, "input 'signal'");
  if (signal.rank() != 3 || (signal.shape[2] != Expr(1) && signal.shape[2] != Expr(2))) {
    ctx.fail("expected a signal [batch, length, 1 or 2]");
  }
  const int64_t step = static_cast<int64_t>(
      scalar_argument(ctx, required_input(ctx, inputs, 1, "frame_step"), "frame_step"));
  const TensorValue* window = optional_input(inputs, 2);
  const TensorValue* length_input = optional_input(inputs, 3);
  Expr length;
  if (length_input != nullptr) {
    length = Expr(static_cast<int64_t>(scalar_argument(ctx, *length_input, "frame_length")));
  } else if (window != nullptr && window->rank() == 1) {
    length = window->shape[0];
  } else {
    ctx.fail("one of window and frame_length must be given");
  }
  if (step <= 0) ctx.fail(fmt::format("frame_step must be positive, found {}", step));
  const bool onesided = node.attr_int("onesided", 1) != 0;
  const bool complex = signal.shape[2] == Expr(2);
  Expr frames = ctx.analyzer().simplify(sym::floor_div(signal.shape[1] - length, Expr(step)) + 1);
  Expr bins = onesided ? ctx.analyzer().simplify(sym::floor_div(length, Expr(2)) + 1) : length;
  std::vector<Expr> shape = {signal.shape[0], frames, bins, Expr(2)};
  const DType f = DType::kFloat64;
  TensorValue sum = ctx.reduction(
      f, shape, {length}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& o, const std::vector<Expr>& r) {
        SampleFn sample = [&](LoopBody& b, const Expr& t, int c) {
          if (c == 1 && !complex) return b.constant(0, f);
          ValueId v = b.cast(ctx.load_at(b, signal, {o[0], o[1] * step + t, Expr(c)}), f);
          if (window == nullptr) return v;
          return b.binary(OpCode::kMul, v, b.cast(ctx.load_at(b, *window, {t}), f));
        };
        ValueId re = twiddled(body, f, sample, r[0], o[2], length, -1, 0);
        ValueId im = twiddled(body, f, sample, r[0], o[2], length, -1, 1);
        ValueId is_re =
            body.binary(OpCode::kEq, body.index_expr(o[3]), body.constant(0, DType::kInt64));
        return body.where(is_re, re, im);
      });
  return {ctx.pointwise(signal.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    return body.cast(ctx.load_at(body, sum, o), signal.dtype);
  })};
}

/// a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N), N = size (periodic) or size - 1, computed in
/// double and cast to output_datatype.
std::vector<TensorValue> lower_window(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  std::vector<int64_t> size =
      require_static_ints(ctx, required_input(ctx, inputs, 0, "size"), "input 'size'");
  if (size.size() != 1 || size[0] < 0) ctx.fail("input 'size' must be one non-negative value");
  std::optional<DType> out =
      graph::dtype_from_onnx(static_cast<int32_t>(node.attr_int("output_datatype", 1)));
  if (!out || !(graph::is_floating(*out) || graph::is_integer(*out))) {
    ctx.fail("attribute 'output_datatype' must name a numeric type");
  }
  double a0 = 0.5, a1 = 0.5, a2 = 0;
  if (node.op_type() == "HammingWindow") a0 = 25.0 / 46, a1 = 21.0 / 46;
  if (node.op_type() == "BlackmanWindow") a0 = 0.42, a2 = 0.08;
  const bool periodic = node.attr_int("periodic", 1) != 0;
  const double n = static_cast<double>(periodic ? size[0] : size[0] - 1);
  const double step = n > 0 ? 2 * M_PI / n : 0;
  return {ctx.pointwise(*out, {Expr(size[0])}, [&](LoopBody& body, const std::vector<Expr>& i) {
    FloatMath m{body, DType::kFloat64};
    ValueId angle = m.mul(body.cast(body.index_expr(i[0]), DType::kFloat64), m.c(step));
    ValueId v = m.sub(m.c(a0), m.mul(m.c(a1), body.unary(OpCode::kCos, angle)));
    if (a2 != 0) {
      v = m.add(v, m.mul(m.c(a2), body.unary(OpCode::kCos, m.mul(m.c(2), angle))));
    }
    return body.cast(v, *out);
  })};
}

/// The triangular mel filters as ONNX 1.12 computes them (its reference divides the mel range
/// into num_mel_bins + 2 steps): [dft_length / 2 + 1, num_mel_bins].
std::vector<TensorValue> lower_mel_weight_matrix(LoweringContext& ctx, const graph::Node& node,
                                                 const LowerInputs& inputs) {
  auto arg = [&](size_t i, const char* name) {
    return scalar_argument(ctx, required_input(ctx, inputs, i, name), name);
  };
  const int64_t mel = static_cast<int64_t>(arg(0, "num_mel_bins"));
  const int64_t dft = static_cast<int64_t>(arg(1, "dft_length"));
  const double rate = arg(2, "sample_rate"), lo = arg(3, "lower_edge_hertz"),
               hi = arg(4, "upper_edge_hertz");
  if (mel <= 0 || dft <= 0 || rate <= 0)
    ctx.fail("num_mel_bins, dft_length and sample_rate must be positive");
  std::optional<DType> dtype =
      graph::dtype_from_onnx(static_cast<int32_t>(node.attr_int("output_datatype", 1)));
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) {
    ctx.fail("output_datatype must be float32 or float64");
  }
  const int64_t spectrogram = dft / 2 + 1;
  const double lo_mel = 2595 * std::log10(1 + lo / 700), hi_mel = 2595 * std::log10(1 + hi / 700);
  const double mel_step = (hi_mel - lo_mel) / static_cast<double>(mel + 2);
  std::vector<int64_t> bins;
  for (int64_t k = 0; k < mel + 2; ++k) {
    double hz = 700 * (std::pow(10.0, (static_cast<double>(k) * mel_step + lo_mel) / 2595) - 1);
    bins.push_back(static_cast<int64_t>(std::floor(static_cast<double>(dft + 1) * hz / rate)));
  }
  std::vector<double> weights(static_cast<size_t>(spectrogram * mel), 0.0);
  auto set = [&](int64_t j, int64_t i, double v) {
    if (j < 0 || j >= spectrogram) ctx.fail("the mel filters fall outside the spectrogram bins");
    weights[static_cast<size_t>(j * mel + i)] = v;
  };
  for (int64_t i = 0; i < mel; ++i) {
    const int64_t left = bins[i], center = bins[i + 1], right = bins[i + 2];
    if (center == left) {
      set(center, i, 1);
    } else {
      for (int64_t j = left; j <= center; ++j) set(j, i, double(j - left) / double(center - left));
    }
    for (int64_t j = center; j < right; ++j) set(j, i, double(right - j) / double(right - center));
  }
  auto tensor = std::make_shared<graph::Tensor>(*dtype, std::vector<int64_t>{spectrogram, mel});
  if (*dtype == DType::kFloat32) {
    std::copy(weights.begin(), weights.end(), tensor->mutable_values<float>().begin());
  } else {
    std::copy(weights.begin(), weights.end(), tensor->mutable_values<double>().begin());
  }
  return {ctx.from_constant(tensor)};
}

}  // namespace

void register_signal_ops(Registry& registry) {
  registry.add("", "DFT", {lower_dft, 17, 20});
  registry.add("", "STFT", {lower_stft, 17, 17});
  registry.add("", "MelWeightMatrix", {lower_mel_weight_matrix, 17, 17});
  for (const char* op : {"HannWindow", "HammingWindow", "BlackmanWindow"}) {
    registry.add("", op, {lower_window, 17, 17});
  }
}

}  // namespace kiln::lower
