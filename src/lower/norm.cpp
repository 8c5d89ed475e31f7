/// Normalization lowerings: LayerNormalization, RMSNormalization, BatchNormalization (inference),
/// InstanceNormalization, GroupNormalization, MeanVarianceNormalization and LpNormalization. Mean
/// and variance come from Welford reductions (numerically sound, unlike E[x^2] - E[x]^2), or for
/// LayerNormalization from the two-pass sum(x) / n and sum((x - mean)^2) / n (see moments()),
/// then a pointwise normalize * scale + bias that consumers inline.
///
/// Tests: tests/unit/lower/suite_ops_test.cpp (ONNX node suite through the interpreter).

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "lower/elementwise.h"
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

/// Mean and population variance of x over the dims marked in `reduced`, as values of x's shape
/// with the reduced dims set to 1, in dtype `acc`.
struct Moments {
  std::vector<bool> reduced;
  TensorValue mean;
  TensorValue var;

  /// The index into mean / var for an element of x.
  std::vector<Expr> at(const std::vector<Expr>& x_index) const {
    std::vector<Expr> out = x_index;
    for (size_t d = 0; d < reduced.size(); ++d) {
      if (reduced[d]) out[d] = 0;
    }
    return out;
  }
};

/// With `two_pass` (LayerNormalization on the CPU), mean = sum(x) / n, then var = sum((x - mean)^2)
/// / n: the textbook two-pass form, exact up to the sums' rounding (the centered squares cannot
/// cancel), and fast: each pass is a vector add or FMA per element, where Welford's update
/// divides by the running count on the loop-carried chain (measured on the encoder's
/// LayerNorms: see the commit). Its two loops read a row that the first brought into L1. Without
/// it, the Welford reductions (one divide per element, but sound over very long reductions such
/// as BatchNormalization's N x H x W in float32).
Moments moments(LoweringContext& ctx, const TensorValue& x, std::vector<bool> reduced, DType acc,
                bool two_pass = false) {
  std::vector<Expr> keep_shape, reduce_shape;
  for (size_t d = 0; d < x.rank(); ++d) {
    keep_shape.push_back(reduced[d] ? Expr(1) : x.shape[d]);
    if (reduced[d]) reduce_shape.push_back(x.shape[d]);
  }
  if (reduce_shape.empty()) reduce_shape.push_back(1);
  auto input_index = [&](const std::vector<Expr>& index, const std::vector<Expr>& r) {
    std::vector<Expr> in = index;
    size_t j = 0;
    for (size_t d = 0; d < reduced.size(); ++d) {
      if (reduced[d]) in[d] = r[j++];
    }
    return in;
  };
  auto element = [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
    return body.cast(ctx.load_at(body, x, input_index(index, r)), acc);
  };
  Moments m;
  m.reduced = reduced;  // `element` reads `reduced` until both reductions are built
  if (!two_pass) {
    m.mean = ctx.reduction(acc, keep_shape, reduce_shape, ReductionType::kWelfordMean, element);
    m.var = ctx.reduction(acc, keep_shape, reduce_shape, ReductionType::kWelfordVar, element);
    return m;
  }
  const Expr count = sym::product(reduce_shape);
  // sum / n (0 / 0 = NaN over an empty reduction, as Welford's result): a product by the
  // constant 1 / n when n is known (within an ulp of the quotient; the kernels' vector loops take
  // it), else a division by the size at run time.
  const std::optional<int64_t> known_count = count.as_integer();
  auto per_element = [&](const TensorValue& sum) {
    return ctx.pointwise(acc, keep_shape, [&](LoopBody& body, const std::vector<Expr>& index) {
      ValueId total = ctx.load_at(body, sum, index);
      if (known_count && *known_count > 0) {
        return body.binary(OpCode::kMul, total,
                           body.constant(1.0 / static_cast<double>(*known_count), acc));
      }
      return body.binary(OpCode::kDiv, total, body.cast(body.index_expr(count), acc));
    });
  };
  m.mean = per_element(ctx.reduction(acc, keep_shape, reduce_shape, ReductionType::kSum, element));
  const TensorValue mean = m.mean;
  m.var = per_element(ctx.reduction(
      acc, keep_shape, reduce_shape, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        ValueId diff =
            body.binary(OpCode::kSub, element(body, index, r), ctx.load_at(body, mean, index));
        return body.binary(OpCode::kMul, diff, diff);
      }));
  return m;
}

/// 1 / sqrt(var + epsilon).
ValueId inv_std(LoopBody& body, ValueId var, double epsilon) {
  ValueId eps = body.constant(epsilon, body.dtype(var));
  return body.unary(OpCode::kReciprocal,
                    body.unary(OpCode::kSqrt, body.binary(OpCode::kAdd, var, eps)));
}

/// The dtype a normalization computes in: float64 for float64 inputs, float32 otherwise.
DType stash_dtype(DType dtype) {
  return dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
}

/// The dtype the model declares for output k of the node (for the optional statistics outputs).
DType output_dtype(const graph::Node& node, size_t k, DType fallback) {
  const graph::Value* out = node.output(k);
  if (out == nullptr || out->type().dtype == DType::kUndefined) return fallback;
  return out->type().dtype;
}

std::vector<TensorValue> lower_layer_norm(LoweringContext& ctx, const graph::Node& node,
                                          const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& scale = required_input(ctx, inputs, 1, "Scale");
  const TensorValue* bias = optional_input(inputs, 2);
  require_dtype(ctx, x.dtype, kFloats, "input X");
  int64_t rank = static_cast<int64_t>(x.rank());
  int64_t axis = ctx.normalize_axis(node.attr_int("axis", -1), rank);
  double epsilon = node.attr_float("epsilon", 1e-5f);
  std::vector<bool> reduced(x.rank(), false);
  for (int64_t d = axis; d < rank; ++d) reduced[static_cast<size_t>(d)] = true;
  DType acc = stash_dtype(x.dtype);
  // Two passes on the CPU, where they were measured faster; on CUDA one Welford reduction per
  // row, combined across the warp by shuffles (codegen/cuda/cuda_kernel.cpp).
  const bool two_pass = ctx.options().device == ir::Device::kCpu;
  Moments m = moments(ctx, x, reduced, acc, two_pass);
  TensorValue y =
      ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
        ValueId v = body.cast(ctx.load_at(body, x, index), acc);
        ValueId diff = body.binary(OpCode::kSub, v, ctx.load_at(body, m.mean, m.at(index)));
        ValueId inv = inv_std(body, ctx.load_at(body, m.var, m.at(index)), epsilon);
        ValueId normalized =
            body.cast(body.binary(OpCode::kMul, diff, inv), compute_dtype(x.dtype));
        ValueId w = ctx.load_at(body, scale, LoweringContext::broadcast_index(index, scale.shape));
        ValueId out = body.binary(OpCode::kMul, normalized, body.cast(w, compute_dtype(x.dtype)));
        if (bias == nullptr) return out;
        ValueId b = ctx.load_at(body, *bias, LoweringContext::broadcast_index(index, bias->shape));
        return body.binary(OpCode::kAdd, out, body.cast(b, compute_dtype(x.dtype)));
      });
  DType stats = output_dtype(node, 1, acc);
  TensorValue mean =
      ctx.pointwise(stats, m.mean.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
        return ctx.load_at(body, m.mean, index);
      });
  TensorValue inv = ctx.pointwise(output_dtype(node, 2, acc), m.var.shape,
                                  [&](LoopBody& body, const std::vector<Expr>& index) {
                                    return inv_std(body, ctx.load_at(body, m.var, index), epsilon);
                                  });
  return {y, mean, inv};
}

/// RMSNormalization-23: x / sqrt(mean(x^2 over dims axis..) + epsilon) * scale, computed in
/// float32 (float64 for float64 inputs), as its stash_type 1 says.
std::vector<TensorValue> lower_rms_norm(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& scale = required_input(ctx, inputs, 1, "scale");
  require_dtype(ctx, x.dtype, kFloats, "input X");
  if (node.attr_int("stash_type", 1) != 1) {
    ctx.fail("attribute 'stash_type' must be 1 (float32 statistics)");
  }
  const size_t rank = x.rank();
  const size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", -1), static_cast<int64_t>(rank)));
  const double epsilon = node.attr_float("epsilon", 1e-5f);
  const DType acc = stash_dtype(x.dtype);
  std::vector<Expr> keep_shape(x.shape.begin(), x.shape.begin() + axis);
  std::vector<Expr> reduce_shape(x.shape.begin() + axis, x.shape.end());
  Expr count = sym::product(reduce_shape);
  keep_shape.resize(rank, Expr(1));
  if (reduce_shape.empty()) reduce_shape.push_back(1);
  TensorValue squares = ctx.reduction(
      acc, keep_shape, reduce_shape, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        std::vector<Expr> in(index.begin(), index.begin() + axis);
        in.insert(in.end(), r.begin(), r.begin() + (rank - axis));
        ValueId v = body.cast(ctx.load_at(body, x, in), acc);
        return body.binary(OpCode::kMul, v, v);
      });
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    std::vector<Expr> at = index;
    for (size_t d = axis; d < rank; ++d) at[d] = 0;
    ValueId mean = body.binary(OpCode::kDiv, ctx.load_at(body, squares, at),
                               body.cast(body.index_expr(count), acc));
    ValueId v = body.binary(OpCode::kMul, body.cast(ctx.load_at(body, x, index), acc),
                            inv_std(body, mean, epsilon));
    ValueId normalized = body.cast(v, compute_dtype(x.dtype));
    ValueId w = ctx.load_at(body, scale, LoweringContext::broadcast_index(index, scale.shape));
    return body.binary(OpCode::kMul, normalized, body.cast(w, compute_dtype(x.dtype)));
  })};
}

/// The element of a per-channel parameter for an element of x: p[c] for 1-D parameters, or
/// p[index[1:]] for the spatial=0 form of BatchNormalization before opset 9.
ValueId channel_param(LoweringContext& ctx, LoopBody& body, const TensorValue& p,
                      const std::vector<Expr>& index, DType dtype) {
  std::vector<Expr> at(index.begin() + 1, index.end());
  if (p.rank() == 1) at = {index[1]};
  if (p.rank() != at.size()) ctx.fail("per-channel parameters have an unexpected rank");
  return body.cast(ctx.load_at(body, p, LoweringContext::broadcast_index(at, p.shape)), dtype);
}

/// True when the node asks for training mode. From opset 14 that is the training_mode
/// attribute; older opsets' extra statistics outputs (a different, deprecated contract) are
/// refused with a clear message.
bool is_training(const LoweringContext& ctx, const graph::Node& node) {
  if (node.opset() >= 14) return node.attr_int("training_mode", 0) != 0;
  bool extra_outputs = false;
  for (size_t k = 1; k < node.outputs().size(); ++k) {
    extra_outputs = extra_outputs || node.output(k) != nullptr;
  }
  if (extra_outputs) {
    ctx.fail(
        fmt::format("the running-statistics outputs of opset {} are not supported; use "
                    "opset 14 or later (training_mode) or export the model for inference",
                    node.opset()));
  }
  return false;
}

/// (x - mean) / sqrt(var + epsilon) * scale + bias, per channel (dim 1).
TensorValue normalize_channels(
    LoweringContext& ctx, const TensorValue& x, const TensorValue& mean, const TensorValue& var,
    const TensorValue& scale, const TensorValue& bias, double epsilon,
    const std::function<std::vector<Expr>(const std::vector<Expr>&)>& stat_index) {
  DType dt = compute_dtype(x.dtype);
  auto stat = [&](LoopBody& body, const TensorValue& p, const std::vector<Expr>& index) {
    if (stat_index) return body.cast(ctx.load_at(body, p, stat_index(index)), dt);
    return channel_param(ctx, body, p, index, dt);
  };
  return ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId v = ctx.load_at(body, x, index);
    ValueId diff = body.binary(OpCode::kSub, v, stat(body, mean, index));
    ValueId inv = inv_std(body, stat(body, var, index), epsilon);
    ValueId normalized = body.binary(OpCode::kMul, diff, inv);
    ValueId scaled =
        body.binary(OpCode::kMul, normalized, channel_param(ctx, body, scale, index, dt));
    return body.binary(OpCode::kAdd, scaled, channel_param(ctx, body, bias, index, dt));
  });
}

/// Training mode (opset >= 14): normalize with the batch statistics (mean and population
/// variance over every dim but the channel) and return the updated running statistics
/// running = input * momentum + batch * (1 - momentum).
std::vector<TensorValue> batch_norm_training(LoweringContext& ctx, const graph::Node& node,
                                             const TensorValue& x, const TensorValue& scale,
                                             const TensorValue& bias, const TensorValue& mean,
                                             const TensorValue& var, double epsilon) {
  std::vector<bool> reduced(x.rank(), true);
  reduced[1] = false;
  DType acc = stash_dtype(x.dtype);
  Moments m = moments(ctx, x, reduced, acc);
  TensorValue y = normalize_channels(ctx, x, m.mean, m.var, scale, bias, epsilon,
                                     [&m](const std::vector<Expr>& index) { return m.at(index); });
  double momentum = node.attr_float("momentum", 0.9f);
  auto running = [&](const TensorValue& input, const TensorValue& batch, size_t k) {
    return ctx.pointwise(output_dtype(node, k, input.dtype), input.shape,
                         [&](LoopBody& body, const std::vector<Expr>& index) {
                           std::vector<Expr> at(x.rank(), Expr(0));
                           at[1] = index[0];
                           ValueId old_v = body.cast(ctx.load_at(body, input, index), acc);
                           ValueId new_v = ctx.load_at(body, batch, at);
                           ValueId keep = body.constant(momentum, acc);
                           ValueId take = body.constant(1.0 - momentum, acc);
                           return body.binary(OpCode::kAdd, body.binary(OpCode::kMul, old_v, keep),
                                              body.binary(OpCode::kMul, new_v, take));
                         });
  };
  return {y, running(mean, m.mean, 1), running(var, m.var, 2)};
}

/// The float32 data of a value that is a whole constant buffer (or a known scalar, broadcast to
/// `n`), or empty.
std::vector<float> constant_floats(LoweringContext& ctx, const TensorValue& v, int64_t n) {
  if (v.known_float && v.known_float->size() == static_cast<size_t>(n)) {
    return std::vector<float>(v.known_float->begin(), v.known_float->end());
  }
  std::optional<std::string> name = ctx.as_buffer(v);
  const ir::Buffer* b = name ? ctx.program().find(*name) : nullptr;
  if (b == nullptr || b->kind != ir::BufferKind::kConstant || b->dtype != DType::kFloat32 ||
      b->constant->numel() != n) {
    return {};
  }
  std::span<const float> values = b->constant->values<float>();
  return std::vector<float>(values.begin(), values.end());
}

/// Inference BatchNormalization right after a float32 convolution with a constant weight (and
/// bias), that nothing else reads, folds into the convolution's weight and bias when compiling:
/// w' = w * s, b' = (b - mean) * s + beta with s = scale / sqrt(var + epsilon) per output
/// channel. The convolution is then the only call, and what follows can fuse into it.
std::optional<TensorValue> fold_into_conv(LoweringContext& ctx, const graph::Node& node,
                                          const TensorValue& x, const TensorValue& scale,
                                          const TensorValue& beta, const TensorValue& mean,
                                          const TensorValue& var, double epsilon) {
  const graph::Value* input = node.input(0);
  if (input == nullptr || input->users().size() != 1 || x.dtype != DType::kFloat32) {
    return std::nullopt;
  }
  std::optional<std::string> name = ctx.as_buffer(x);
  // A channels-last convolution's output is read through an NCHW view (lower/nn.cpp).
  const bool last = !name && x.rank() == 4 && ctx.reads_channels_last(x);
  if (last) name = ctx.as_buffer(ctx.to_channels_last(x));
  const ir::Buffer* conv = name ? ctx.program().find(*name) : nullptr;
  if (conv == nullptr || conv->kind != ir::BufferKind::kExtern ||
      conv->call.as<ir::ConvCall>() == nullptr ||
      conv->call.as<ir::ConvCall>()->channels_last != last) {
    return std::nullopt;
  }
  const ir::ExternCall& call = conv->call;
  const ir::Buffer* w = ctx.program().find(call.inputs.at(1)->buffer);
  if (w == nullptr || w->kind != ir::BufferKind::kConstant || w->dtype != DType::kFloat32 ||
      !call.inputs[1]->layout.is_contiguous() || call.inputs[1]->layout.offset != sym::Expr(0)) {
    return std::nullopt;
  }
  const graph::Tensor& weight = *w->constant;
  const int64_t m = weight.dims().at(0);
  std::vector<float> s = constant_floats(ctx, scale, m), b = constant_floats(ctx, beta, m),
                     mu = constant_floats(ctx, mean, m), v = constant_floats(ctx, var, m);
  if (s.empty() || b.empty() || mu.empty() || v.empty()) return std::nullopt;
  std::vector<float> old_bias(static_cast<size_t>(m), 0.0f);
  if (call.inputs.size() > 2 && call.inputs[2]) {
    const ir::Buffer* bb = ctx.program().find(call.inputs[2]->buffer);
    if (bb == nullptr || bb->kind != ir::BufferKind::kConstant || bb->constant->numel() != m) {
      return std::nullopt;
    }
    std::span<const float> values = bb->constant->values<float>();
    old_bias.assign(values.begin(), values.end());
  }
  auto new_weight = std::make_shared<graph::Tensor>(DType::kFloat32, weight.dims());
  auto new_bias = std::make_shared<graph::Tensor>(DType::kFloat32, std::vector<int64_t>{m});
  std::span<const float> wv = weight.values<float>();
  std::span<float> nw = new_weight->mutable_values<float>(), nb = new_bias->mutable_values<float>();
  const int64_t per_channel = weight.numel() / m;
  for (int64_t c = 0; c < m; ++c) {
    const double f = s[c] / std::sqrt(static_cast<double>(v[c]) + epsilon);
    for (int64_t i = 0; i < per_channel; ++i) {
      nw[c * per_channel + i] = static_cast<float>(wv[c * per_channel + i] * f);
    }
    nb[c] = static_cast<float>((old_bias[c] - mu[c]) * f + b[c]);
  }
  std::vector<std::optional<ir::View>> views = {call.inputs[0],
                                                ctx.as_view(ctx.from_constant(new_weight), true),
                                                ctx.as_view(ctx.from_constant(new_bias), true)};
  TensorValue folded =
      ctx.extern_call(call.op, DType::kFloat32, conv->layout.sizes, std::move(views));
  if (!last) return folded;
  ctx.mark_channels_last(*ctx.as_buffer(folded));
  return ctx.from_channels_last(folded);
}

/// Inference BatchNormalization of float32 with constant parameters that does not fold into a
/// convolution (after a Concat, as DenseNet's; after an Add): y = x * a + b per channel, with
/// a = scale / sqrt(var + epsilon) and b = beta - mean * a computed when compiling, in place of
/// a square root and a division per element.
std::optional<TensorValue> constant_affine(LoweringContext& ctx, const TensorValue& x,
                                           const TensorValue& scale, const TensorValue& beta,
                                           const TensorValue& mean, const TensorValue& var,
                                           double epsilon) {
  const std::optional<int64_t> channels = x.shape[1].as_integer();
  if (x.dtype != DType::kFloat32 || !channels || scale.rank() != 1) return std::nullopt;
  const int64_t m = *channels;
  std::vector<float> s = constant_floats(ctx, scale, m), b = constant_floats(ctx, beta, m),
                     mu = constant_floats(ctx, mean, m), v = constant_floats(ctx, var, m);
  if (s.empty() || b.empty() || mu.empty() || v.empty()) return std::nullopt;
  auto a_values = std::make_shared<graph::Tensor>(DType::kFloat32, std::vector<int64_t>{m});
  auto b_values = std::make_shared<graph::Tensor>(DType::kFloat32, std::vector<int64_t>{m});
  std::span<float> av = a_values->mutable_values<float>(), bv = b_values->mutable_values<float>();
  for (int64_t c = 0; c < m; ++c) {
    const double f = s[c] / std::sqrt(static_cast<double>(v[c]) + epsilon);
    av[c] = static_cast<float>(f);
    bv[c] = static_cast<float>(b[c] - mu[c] * f);
  }
  const TensorValue a = ctx.from_constant(a_values), shift = ctx.from_constant(b_values);
  return ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId scaled = body.binary(OpCode::kMul, ctx.load_at(body, x, index),
                                 channel_param(ctx, body, a, index, DType::kFloat32));
    return body.binary(OpCode::kAdd, scaled,
                       channel_param(ctx, body, shift, index, DType::kFloat32));
  });
}

std::vector<TensorValue> lower_batch_norm(LoweringContext& ctx, const graph::Node& node,
                                          const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& scale = required_input(ctx, inputs, 1, "scale");
  const TensorValue& bias = required_input(ctx, inputs, 2, "B");
  const TensorValue& mean = required_input(ctx, inputs, 3, "input_mean");
  const TensorValue& var = required_input(ctx, inputs, 4, "input_var");
  require_dtype(ctx, x.dtype, kFloats, "input X");
  if (x.rank() < 2) ctx.fail(fmt::format("X must have rank at least 2, found {}", x.rank()));
  double epsilon = node.attr_float("epsilon", 1e-5f);
  if (is_training(ctx, node)) {
    if (mean.rank() != 1 || var.rank() != 1) ctx.fail("running statistics must be 1-D");
    return batch_norm_training(ctx, node, x, scale, bias, mean, var, epsilon);
  }
  if (std::optional<TensorValue> folded =
          fold_into_conv(ctx, node, x, scale, bias, mean, var, epsilon)) {
    return {*folded};
  }
  if (std::optional<TensorValue> affine =
          constant_affine(ctx, x, scale, bias, mean, var, epsilon)) {
    return {*affine};
  }
  return {normalize_channels(ctx, x, mean, var, scale, bias, epsilon, nullptr)};
}

std::vector<TensorValue> lower_instance_norm(LoweringContext& ctx, const graph::Node& node,
                                             const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  const TensorValue& scale = required_input(ctx, inputs, 1, "scale");
  const TensorValue& bias = required_input(ctx, inputs, 2, "B");
  require_dtype(ctx, x.dtype, kFloats, "input 'input'");
  if (x.rank() < 3) ctx.fail(fmt::format("input must have rank at least 3, found {}", x.rank()));
  double epsilon = node.attr_float("epsilon", 1e-5f);
  std::vector<bool> reduced(x.rank(), true);
  reduced[0] = reduced[1] = false;
  DType acc = stash_dtype(x.dtype);
  Moments m = moments(ctx, x, reduced, acc);
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId v = body.cast(ctx.load_at(body, x, index), acc);
    ValueId diff = body.binary(OpCode::kSub, v, ctx.load_at(body, m.mean, m.at(index)));
    ValueId inv = inv_std(body, ctx.load_at(body, m.var, m.at(index)), epsilon);
    ValueId normalized = body.binary(OpCode::kMul, diff, inv);
    ValueId scaled =
        body.binary(OpCode::kMul, normalized, channel_param(ctx, body, scale, index, acc));
    return body.binary(OpCode::kAdd, scaled, channel_param(ctx, body, bias, index, acc));
  })};
}

/// (x - mean) / (sqrt(var) + 1e-9) over `axes` (default [0, 2, 3]), as ONNX's function body.
std::vector<TensorValue> lower_mvn(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, kFloats, "input X");
  std::vector<int64_t> axes = node.attr_ints("axes", {0, 2, 3});
  std::vector<bool> reduced(x.rank(), false);
  for (int64_t axis : axes) {
    reduced[static_cast<size_t>(ctx.normalize_axis(axis, static_cast<int64_t>(x.rank())))] = true;
  }
  DType acc = stash_dtype(x.dtype);
  Moments m = moments(ctx, x, reduced, acc);
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId v = body.cast(ctx.load_at(body, x, index), acc);
    ValueId diff = body.binary(OpCode::kSub, v, ctx.load_at(body, m.mean, m.at(index)));
    ValueId std = body.unary(OpCode::kSqrt, ctx.load_at(body, m.var, m.at(index)));
    ValueId denominator = body.binary(OpCode::kAdd, std, body.constant(1e-9, acc));
    return body.binary(OpCode::kDiv, diff, denominator);
  })};
}

/// GroupNormalization: mean and variance per (batch, group of C / num_groups channels) over those
/// channels and the spatial dims, computed in float32 (stash_type 1); then scale and bias, per
/// group at opset 18 and per channel from opset 21.
std::vector<TensorValue> lower_group_norm(LoweringContext& ctx, const graph::Node& node,
                                          const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& scale = required_input(ctx, inputs, 1, "scale");
  const TensorValue& bias = required_input(ctx, inputs, 2, "bias");
  require_dtype(ctx, x.dtype, kFloats, "input X");
  if (x.rank() < 2) ctx.fail(fmt::format("X must have rank at least 2, found {}", x.rank()));
  if (node.opset() >= 21 && node.attr_int("stash_type", 1) != 1) {
    ctx.fail(fmt::format("attribute 'stash_type' is {}; only 1 (float32) is supported",
                         node.attr_int("stash_type", 1)));
  }
  if (!node.has_attribute("num_groups")) ctx.fail("missing required attribute 'num_groups'");
  const int64_t groups = node.attr_int("num_groups", 1);
  const int64_t channels = require_static_dim(ctx, x.shape[1], "the channel count of X");
  if (groups <= 0 || channels % groups != 0) {
    ctx.fail(fmt::format("num_groups {} does not divide the {} channels", groups, channels));
  }
  const bool per_channel = node.opset() >= 21;
  const int64_t params = per_channel ? channels : groups;
  for (const TensorValue* p : {&scale, &bias}) {
    if (p->rank() != 1 || p->shape[0] != Expr(params)) {
      ctx.fail(fmt::format("scale and bias must be 1-D of size {} ({}), found {}", params,
                           per_channel ? "the channels" : "num_groups",
                           graph::shape_str(p->shape)));
    }
  }
  const int64_t per_group = channels / groups;
  // X seen as [N, groups, C / groups, spatial...]: the statistics reduce dims 2 and on.
  std::vector<Expr> grouped = {x.shape[0], Expr(groups), Expr(per_group)};
  grouped.insert(grouped.end(), x.shape.begin() + 2, x.shape.end());
  TensorValue xg = reshape_view(ctx, x, grouped);
  std::vector<bool> reduced(grouped.size(), true);
  reduced[0] = reduced[1] = false;
  const DType acc = stash_dtype(x.dtype);
  Moments m = moments(ctx, xg, reduced, acc);
  const double epsilon = node.attr_float("epsilon", 1e-5f);
  const DType dt = compute_dtype(x.dtype);
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    const Expr group = sym::floor_div(index[1], Expr(per_group));
    std::vector<Expr> stat(grouped.size(), Expr(0));
    stat[0] = index[0];
    stat[1] = group;
    ValueId v = body.cast(ctx.load_at(body, x, index), acc);
    ValueId diff = body.binary(OpCode::kSub, v, ctx.load_at(body, m.mean, stat));
    ValueId inv = inv_std(body, ctx.load_at(body, m.var, stat), epsilon);
    ValueId normalized = body.cast(body.binary(OpCode::kMul, diff, inv), dt);
    const Expr at = per_channel ? index[1] : group;
    ValueId w = body.cast(ctx.load_at(body, scale, {at}), dt);
    ValueId b = body.cast(ctx.load_at(body, bias, {at}), dt);
    return body.binary(OpCode::kAdd, body.binary(OpCode::kMul, normalized, w), b);
  })};
}

/// LpNormalization: x / ||x||_p along `axis` (p 1 or 2); a slice whose norm is 0 stays 0.
std::vector<TensorValue> lower_lp_norm(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  require_dtype(ctx, x.dtype, kFloats, "input 'input'");
  if (x.rank() == 0) ctx.fail("expected an input of rank >= 1");
  const size_t axis = static_cast<size_t>(
      ctx.normalize_axis(node.attr_int("axis", -1), static_cast<int64_t>(x.rank())));
  const int64_t p = node.attr_int("p", 2);
  if (p != 1 && p != 2) ctx.fail(fmt::format("attribute 'p' is {}; expected 1 or 2", p));
  const DType acc = stash_dtype(x.dtype);
  std::vector<Expr> keep = x.shape;
  keep[axis] = 1;
  TensorValue sum = ctx.reduction(
      acc, keep, {x.shape[axis]}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        std::vector<Expr> at = index;
        at[axis] = r[0];
        ValueId v = body.cast(ctx.load_at(body, x, at), acc);
        return p == 1 ? body.unary(OpCode::kAbs, v) : body.binary(OpCode::kMul, v, v);
      });
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    std::vector<Expr> at = index;
    at[axis] = 0;
    ValueId norm = ctx.load_at(body, sum, at);
    if (p == 2) norm = body.unary(OpCode::kSqrt, norm);
    ValueId v = body.cast(ctx.load_at(body, x, index), acc);
    ValueId zero = body.constant(0, acc);
    ValueId y =
        body.where(body.binary(OpCode::kEq, norm, zero), zero, body.binary(OpCode::kDiv, v, norm));
    return body.cast(y, x.dtype);
  })};
}

}  // namespace

void register_norm_ops(Registry& registry) {
  registry.add("", "LayerNormalization", {lower_layer_norm, 17, 17});
  registry.add("", "RMSNormalization", {lower_rms_norm, 23, 23});
  registry.add("", "BatchNormalization", {lower_batch_norm, 1, 17});
  registry.add("", "InstanceNormalization", {lower_instance_norm, 1, 17});
  registry.add("", "MeanVarianceNormalization", {lower_mvn, 9, 17});
  registry.add("", "LpNormalization", {lower_lp_norm, 1, 17});
  registry.add("", "GroupNormalization", {lower_group_norm, 18, 21});
}

}  // namespace kiln::lower
