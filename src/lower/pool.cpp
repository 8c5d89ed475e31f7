/// Pooling lowerings: MaxPool (with its optional Indices output), AveragePool, LpPool,
/// GlobalAveragePool and GlobalMaxPool as loop-IR reductions over the kernel window. Padding is a
/// masked load
/// (-inf / the dtype's lowest value for max, 0 for average); AveragePool divides by the number of
/// window positions inside the input (or inside the padded input with count_include_pad), a
/// closed-form index expression.
///
/// Tests: the ONNX node suite (interpreter_cases.txt).

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

/// The value padding reads as for a max: -inf for floats, the lowest value for integers.
double lowest_value(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
      return std::numeric_limits<int8_t>::lowest();
    case DType::kUInt8:
      return 0;
    case DType::kInt16:
      return std::numeric_limits<int16_t>::lowest();
    case DType::kUInt16:
      return 0;
    case DType::kInt32:
      return std::numeric_limits<int32_t>::lowest();
    case DType::kUInt32:
      return 0;
    case DType::kInt64:
      return static_cast<double>(std::numeric_limits<int64_t>::lowest());
    case DType::kUInt64:
      return 0;
    default:
      return -std::numeric_limits<double>::infinity();
  }
}

/// An input of a pool in NC[D...] layout; realized first when it is not a plain (view of a) load,
/// since overlapping windows read each element several times. A value over channels-last buffers
/// (lower/nn.cpp) is realized channels-last.
TensorValue pool_input(LoweringContext& ctx, const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  if (x.rank() < 3) {
    ctx.fail("expected an input of rank >= 3 (N, C, spatial dims), found rank " +
             std::to_string(x.rank()));
  }
  if (!graph::is_floating(x.dtype) && !graph::is_integer(x.dtype)) {
    ctx.fail("unsupported dtype " + std::string(graph::dtype_name(x.dtype)));
  }
  const LoopBody& body = *x.body;
  if (body.ops().size() == 1 && body.op(0).code == OpCode::kLoad) return x;
  constexpr std::string_view kReason = "pooling input read by overlapping windows";
  if (ctx.reads_channels_last(x)) return ctx.realize_channels_last(x, kReason);
  return ctx.realize(x, kReason);
}

/// Whether a pool of `x` runs channels-last: `x` is a rank-4 view of a channels-last buffer
/// (lower/nn.cpp). Its result is then a channels-last buffer [N, OH, OW, C] too, so that the
/// convolutions after it read it without a reorder, and its loops run over C innermost, the
/// order of the input's memory.
bool pools_channels_last(LoweringContext& ctx, const TensorValue& x) {
  return x.rank() == 4 && ctx.reads_channels_last(x) &&
         ctx.as_buffer(ctx.to_channels_last(x)).has_value();
}

/// A reduction of a pool over `x` into NCHW `shape` (`fn` takes the output index), in that layout.
TensorValue nchw_reduction(LoweringContext& ctx, const TensorValue& x, std::vector<Expr> shape,
                           std::vector<Expr> reduce_shape, ReductionType type,
                           const LoweringContext::ReductionFn& fn) {
  return ctx.reduction(x.dtype, std::move(shape), std::move(reduce_shape), type, fn);
}

/// A reduction of a pool over `x` [N, C, H, W] into NCHW `shape`, whose `fn` takes the NCHW
/// output index; channels-last when pools_channels_last says so (computed as [N, OH, OW, C] and
/// returned as its NCHW view).
TensorValue pool_reduction(LoweringContext& ctx, const TensorValue& x, std::vector<Expr> shape,
                           std::vector<Expr> reduce_shape, ReductionType type,
                           const LoweringContext::ReductionFn& fn) {
  if (!pools_channels_last(ctx, x)) {
    return nchw_reduction(ctx, x, std::move(shape), std::move(reduce_shape), type, fn);
  }
  TensorValue y = ctx.reduction(
      x.dtype, {shape[0], shape[2], shape[3], shape[1]}, std::move(reduce_shape), type,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        return fn(body, {index[0], index[3], index[1], index[2]}, r);
      });
  ctx.mark_channels_last(*ctx.as_buffer(y));
  return ctx.from_channels_last(y);
}

/// The largest window a channels-last MaxPool unrolls into one pointwise kernel.
constexpr int64_t kUnrolledWindow = 16;

/// A window over the spatial dims of a pool's input.
struct Window {
  WindowGeometry g;
  std::vector<Expr> spatial;  // input spatial sizes
  bool may_leave_input = false;

  /// The input coordinate along spatial dim j of output position `o` and window offset `r`.
  Expr coordinate(size_t j, const Expr& o, const Expr& r) const {
    return o * g.strides[j] - g.pads[j] + r * g.dilations[j];
  }
};

Window pool_window(LoweringContext& ctx, const graph::Node& node, const TensorValue& x) {
  Window w;
  w.spatial.assign(x.shape.begin() + 2, x.shape.end());
  if (!node.has_attribute("kernel_shape")) ctx.fail("missing required attribute 'kernel_shape'");
  bool ceil_mode = node.opset() >= 10 && node.attr_int("ceil_mode", 0) != 0;
  w.g = window_geometry(ctx, node, w.spatial, node.attr_ints("kernel_shape", {}), ceil_mode);
  w.may_leave_input = ceil_mode;
  for (int64_t p : w.g.pads) w.may_leave_input = w.may_leave_input || p != 0;
  return w;
}

/// Loads the input at the window element (index = [n, c, o...], r = window offsets), masked
/// outside the input.
ValueId window_load(LoweringContext& ctx, LoopBody& body, const TensorValue& x, const Window& w,
                    const std::vector<Expr>& index, const std::vector<Expr>& r, double other) {
  std::vector<Expr> at = {index[0], index[1]};
  ValueId mask = ir::kNoValue;
  for (size_t j = 0; j < w.spatial.size(); ++j) {
    Expr e = w.coordinate(j, index[j + 2], r[j]);
    at.push_back(e);
    if (w.may_leave_input) mask = and_mask(body, mask, in_range(body, e, 0, w.spatial[j]));
  }
  return load_masked(ctx, body, x, at, mask, other);
}

std::vector<Expr> pool_shape(const TensorValue& x, const std::vector<Expr>& spatial_out) {
  std::vector<Expr> shape = {x.shape[0], x.shape[1]};
  shape.insert(shape.end(), spatial_out.begin(), spatial_out.end());
  return shape;
}

/// MaxPool's Indices: the flat index in X of each window's first maximum (row-major, or
/// column-major over the spatial dims with storage_order 1).
TensorValue max_pool_indices(LoweringContext& ctx, const graph::Node& node, const TensorValue& x,
                             const Window& w) {
  size_t n = w.spatial.size();
  Expr window_size = 1;
  for (int64_t k : w.g.kernel) window_size *= k;
  std::vector<Expr> shape = pool_shape(x, w.g.out);
  // One flattened reduction variable keeps the argmax position unambiguous.
  auto offsets = [&](const Expr& flat) {
    std::vector<Expr> r(n);
    Expr stride = 1;
    for (size_t j = n; j-- > 0;) {
      r[j] = j == 0 ? sym::floor_div(flat, stride)
                    : sym::modular_indexing(flat, stride, w.g.kernel[j]);
      stride *= w.g.kernel[j];
    }
    return r;
  };
  TensorValue arg = ctx.reduction(
      DType::kInt64, shape, {window_size}, ReductionType::kArgMax,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        return window_load(ctx, body, x, w, index, offsets(r[0]), lowest_value(x.dtype));
      });
  bool column_major = node.attr_int("storage_order", 0) != 0;
  return ctx.pointwise(DType::kInt64, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId pos = body.indirect(ctx.load_at(body, arg, index), window_size);
    std::vector<Expr> r = offsets(body.op(pos).symbol);
    Expr flat = (index[0] * x.shape[1] + index[1]) * sym::product(w.spatial);
    Expr stride = 1;
    for (size_t k = 0; k < n; ++k) {
      size_t j = column_major ? k : n - 1 - k;
      flat += w.coordinate(j, index[j + 2], r[j]) * stride;
      stride *= w.spatial[j];
    }
    return body.index_expr(flat);
  });
}

/// Whether every window of a 2-D pool holds an input element along each dim and its taps are
/// consecutive (unit dilations, each pad smaller than the kernel), so that a tap outside the input
/// may read the input's nearest element: that element is a tap of the same window. A window
/// reaches past the input's end by less than the kernel: at most the end pad without ceil_mode,
/// and with it, window_geometry keeps only windows that start before the input's end.
bool clamped_taps(const Window& w) {
  if (w.spatial.size() != 2) return false;
  for (size_t j = 0; j < 2; ++j) {
    if (w.g.dilations[j] != 1 || w.g.pads[j] >= w.g.kernel[j] || w.g.pads[j + 2] >= w.g.kernel[j]) {
      return false;
    }
  }
  return true;
}

std::vector<TensorValue> lower_max_pool(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  TensorValue x = pool_input(ctx, inputs);
  Window w = pool_window(ctx, node, x);
  std::vector<Expr> kernel(w.g.kernel.begin(), w.g.kernel.end());
  // A channels-last MaxPool of a small window is one pointwise kernel over [N, OH, OW, C], the
  // window's loads unrolled: its innermost loop runs over contiguous channels, so it vectorizes,
  // where a reduction loops over the window inside each channel. A tap outside the input reads
  // the input's nearest element instead, which is a tap of the same window (clamped_taps), so
  // the maximum is unchanged and the loads need no mask (ceil_mode's windows past the end
  // included). With Indices, the values stay NCHW as the indices are.
  if (node.output(1) == nullptr && pools_channels_last(ctx, x) && clamped_taps(w) &&
      w.g.kernel[0] * w.g.kernel[1] <= kUnrolledWindow) {
    const std::vector<Expr> shape = pool_shape(x, w.g.out);
    auto tap = [&](LoopBody& body, const std::vector<Expr>& index, int64_t r0, int64_t r1) {
      std::vector<Expr> at = {index[0], index[3]};
      for (size_t j = 0; j < 2; ++j) {
        Expr e = w.coordinate(j, index[j + 1], j == 0 ? r0 : r1);
        if (w.may_leave_input) e = sym::max(Expr(0), sym::min(e, w.spatial[j] - 1));
        at.push_back(e);
      }
      return ctx.load_at(body, x, at);
    };
    TensorValue last =
        ctx.pointwise(x.dtype, {shape[0], shape[2], shape[3], shape[1]},
                      [&](LoopBody& body, const std::vector<Expr>& index) {
                        ValueId acc = ir::kNoValue;
                        for (int64_t r0 = 0; r0 < w.g.kernel[0]; ++r0) {
                          for (int64_t r1 = 0; r1 < w.g.kernel[1]; ++r1) {
                            ValueId v = tap(body, index, r0, r1);
                            acc = acc == ir::kNoValue ? v : body.binary(OpCode::kMaximum, acc, v);
                          }
                        }
                        return acc;
                      });
    TensorValue y = ctx.realize(last, "channels-last MaxPool");
    ctx.mark_channels_last(*ctx.as_buffer(y));
    return {ctx.from_channels_last(y)};
  }
  TensorValue y = (node.output(1) == nullptr ? pool_reduction : nchw_reduction)(
      ctx, x, pool_shape(x, w.g.out), kernel, ReductionType::kMax,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        return window_load(ctx, body, x, w, index, r, lowest_value(x.dtype));
      });
  if (node.output(1) == nullptr) return {y};
  return {y, max_pool_indices(ctx, node, x, w)};
}

/// The number of window positions along dim j inside [lo, hi).
Expr window_count(const Window& w, size_t j, const Expr& o, const Expr& lo, const Expr& hi) {
  Expr start = w.coordinate(j, o, 0);
  int64_t d = w.g.dilations[j];
  if (d == 1) return sym::min(start + w.g.kernel[j], hi) - sym::max(start, lo);
  // Offsets r with lo <= start + r * d < hi; a non-positive first bound clamps to 0 whichever
  // way ceil_div rounds it.
  Expr first = sym::max(Expr(0), sym::ceil_div(lo - start, d));
  Expr last = sym::min(Expr(w.g.kernel[j]), sym::ceil_div(hi - start, d));
  return last - first;
}

std::vector<TensorValue> lower_average_pool(LoweringContext& ctx, const graph::Node& node,
                                            const LowerInputs& inputs) {
  TensorValue x = pool_input(ctx, inputs);
  if (!graph::is_floating(x.dtype)) {
    ctx.fail("unsupported dtype " + std::string(graph::dtype_name(x.dtype)) +
             " (AveragePool takes floating tensors)");
  }
  Window w = pool_window(ctx, node, x);
  for (int64_t d : w.g.dilations) {
    if (d != 1 && node.opset() < 19) {
      ctx.fail("attribute 'dilations' is part of AveragePool from opset 19");
    }
  }
  std::vector<Expr> kernel(w.g.kernel.begin(), w.g.kernel.end());
  std::vector<Expr> shape = pool_shape(x, w.g.out);
  TensorValue sum = pool_reduction(
      ctx, x, shape, kernel, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        return window_load(ctx, body, x, w, index, r, 0);
      });
  bool include_pad = node.opset() >= 7 && node.attr_int("count_include_pad", 0) != 0;
  size_t n = w.spatial.size();
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    Expr count = 1;
    for (size_t j = 0; j < n; ++j) {
      if (!w.may_leave_input) {
        count *= w.g.kernel[j];
        continue;
      }
      Expr lo = include_pad ? Expr(-w.g.pads[j]) : Expr(0);
      Expr hi = include_pad ? w.spatial[j] + w.g.pads[j + n] : w.spatial[j];
      count *= window_count(w, j, index[j + 2], lo, hi);
    }
    ValueId s = ctx.load_at(body, sum, index);
    return body.binary(OpCode::kDiv, s, body.cast(body.index_expr(count), body.dtype(s)));
  })};
}

/// LpPool (opset 18: ceil_mode, dilations): (sum of |x|^p over the window)^(1/p); padding adds
/// nothing.
std::vector<TensorValue> lower_lp_pool(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  TensorValue x = pool_input(ctx, inputs);
  if (!graph::is_floating(x.dtype)) {
    ctx.fail("unsupported dtype " + std::string(graph::dtype_name(x.dtype)) +
             " (LpPool takes floating tensors)");
  }
  const double p = static_cast<double>(node.attr_int("p", 2));
  if (p <= 0) ctx.fail(fmt::format("attribute 'p' is {}; expected a positive order", p));
  Window w = pool_window(ctx, node, x);
  const DType acc = graph::compute_dtype(x.dtype);
  std::vector<Expr> kernel(w.g.kernel.begin(), w.g.kernel.end());
  std::vector<Expr> shape = pool_shape(x, w.g.out);
  TensorValue sum = ctx.reduction(
      acc, shape, kernel, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        ValueId v =
            body.unary(OpCode::kAbs, body.cast(window_load(ctx, body, x, w, index, r, 0), acc));
        return p == 2 ? body.binary(OpCode::kMul, v, v)
                      : body.binary(OpCode::kPow, v, body.constant(p, acc));
      });
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId s = ctx.load_at(body, sum, index);
    ValueId y = p == 2 ? body.unary(OpCode::kSqrt, s)
                       : body.binary(OpCode::kPow, s, body.constant(1 / p, acc));
    return body.cast(y, x.dtype);
  })};
}

/// GlobalMaxPool / GlobalAveragePool: a reduction over every spatial dim to [N, C, 1, ...].
std::vector<TensorValue> lower_global_pool(LoweringContext& ctx, const LowerInputs& inputs,
                                           ReductionType type) {
  TensorValue x = pool_input(ctx, inputs);
  std::vector<Expr> spatial(x.shape.begin() + 2, x.shape.end());
  std::vector<Expr> shape = {x.shape[0], x.shape[1]};
  shape.resize(x.rank(), Expr(1));
  TensorValue reduced = pool_reduction(
      ctx, x, shape, spatial, type,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        std::vector<Expr> at = {index[0], index[1]};
        at.insert(at.end(), r.begin(), r.end());
        return ctx.load_at(body, x, at);
      });
  if (type != ReductionType::kSum) return {reduced};
  Expr count = sym::product(spatial);
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId s = ctx.load_at(body, reduced, index);
    return body.binary(OpCode::kDiv, s, body.cast(body.index_expr(count), body.dtype(s)));
  })};
}

}  // namespace

void register_pool_ops(Registry& registry) {
  registry.add("", "MaxPool", {lower_max_pool, 1, 17});
  registry.add("", "AveragePool", {lower_average_pool, 1, 19});
  registry.add("", "LpPool", {lower_lp_pool, 18, 18});
  registry.add("", "GlobalMaxPool",
               {[](LoweringContext& ctx, const graph::Node&, const LowerInputs& inputs) {
                  return lower_global_pool(ctx, inputs, ReductionType::kMax);
                },
                1, 17});
  registry.add("", "GlobalAveragePool",
               {[](LoweringContext& ctx, const graph::Node&, const LowerInputs& inputs) {
                  return lower_global_pool(ctx, inputs, ReductionType::kSum);
                },
                1, 17});
}

}  // namespace kiln::lower
