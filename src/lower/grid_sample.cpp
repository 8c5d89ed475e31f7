/// GridSample (opsets 16 and 20) through the loop IR, as PyTorch's grid_sampler defines it (the
/// suite's expected outputs come from it): each output pixel unnormalizes its grid coordinates
/// (align_corners or not), applies the padding mode (zeros, border, reflection) and samples the
/// input with nearest (round half to even), linear (2 taps per spatial dim) or bicubic (16 taps,
/// A = -0.75, images only) interpolation. Taps outside the input contribute 0. GridSample-20
/// also samples volumes: X [N, C, D, H, W] with a grid [N, D_out, H_out, W_out, 3].
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <functional>
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
using ir::ValueId;
using sym::Expr;

namespace {

enum class Padding { kZeros, kBorder, kReflection };

class GridSampler {
 public:
  GridSampler(LoweringContext& ctx, const TensorValue& x, Padding padding, bool align_corners)
      : ctx_(ctx), x_(x), padding_(padding), align_(align_corners) {}

  /// Grid coordinate -> input coordinate along a dim of `size` (static or symbolic).
  ValueId unnormalize(const FloatMath& m, ValueId g, ValueId size) const {
    ValueId one = m.c(1);
    if (align_) return m.mul(m.div(m.add(g, one), m.c(2)), m.sub(size, one));
    return m.div(m.sub(m.mul(m.add(g, one), size), one), m.c(2));
  }

  /// Applies border or reflection padding to a coordinate (zeros leaves it).
  ValueId pad(const FloatMath& m, ValueId v, ValueId size) const {
    if (padding_ == Padding::kZeros) return v;
    ValueId last = m.sub(size, m.c(1));
    if (padding_ == Padding::kReflection) {
      v = align_ ? reflect(m, v, m.c(0), m.mul(m.c(2), last))
                 : reflect(m, v, m.c(-1), m.sub(m.mul(m.c(2), size), m.c(1)));
    }
    return m.body.binary(OpCode::kMinimum, m.body.binary(OpCode::kMaximum, v, m.c(0)), last);
  }

  /// x[n, c, p...] where p (float, whole numbers; one per spatial dim, outermost first) is inside
  /// the input, else 0.
  ValueId tap(const FloatMath& m, const std::vector<Expr>& nc,
              const std::vector<ValueId>& position) const {
    ValueId inside = ir::kNoValue;
    std::vector<Expr> at = nc;
    for (size_t k = 0; k < position.size(); ++k) {
      const size_t d = k + 2;
      ValueId i = m.body.cast(position[k], DType::kInt64);
      ValueId n = m.body.index_expr(x_.shape[d]);
      ValueId ok = m.body.binary(OpCode::kAnd,
                                 m.body.binary(OpCode::kGe, i, m.body.constant(0, DType::kInt64)),
                                 m.body.binary(OpCode::kLt, i, n));
      inside = and_mask(m.body, inside, ok);
      // Clamped so that the load stays in bounds; `inside` zeroes it where it was not.
      ValueId clamped = m.body.binary(
          OpCode::kMinimum, m.body.binary(OpCode::kMaximum, i, m.body.constant(0, DType::kInt64)),
          m.body.binary(OpCode::kSub, n, m.body.constant(1, DType::kInt64)));
      at.push_back(m.body.op(m.body.indirect(clamped, x_.shape[d])).symbol);
    }
    ValueId v = m.body.cast(ctx_.load_at(m.body, x_, at), m.dtype);
    return m.body.where(inside, v, m.c(0));
  }

 private:
  /// Reflects v into [low, high] given as twice their values (PyTorch's reflect_coordinates).
  static ValueId reflect(const FloatMath& m, ValueId v, ValueId twice_low, ValueId twice_high) {
    ValueId lo = m.div(twice_low, m.c(2));
    ValueId span = m.div(m.sub(twice_high, twice_low), m.c(2));
    ValueId d = m.body.unary(OpCode::kAbs, m.sub(v, lo));
    ValueId extra = m.body.binary(OpCode::kFmod, d, span);
    ValueId flips = m.floor(m.div(d, span));
    ValueId even = m.body.binary(OpCode::kEq, m.body.binary(OpCode::kFmod, flips, m.c(2)), m.c(0));
    ValueId r = m.body.where(even, m.add(extra, lo), m.add(m.sub(span, extra), lo));
    // A one-element axis (span 0) reflects onto its only position.
    return m.body.where(m.body.binary(OpCode::kEq, span, m.c(0)), m.c(0), r);
  }

  LoweringContext& ctx_;
  const TensorValue& x_;
  Padding padding_;
  bool align_;
};

/// The 4 cubic convolution weights for fraction t (A = -0.75).
std::vector<ValueId> cubic_weights(const FloatMath& m, ValueId t) {
  const double a = -0.75;
  auto near = [&](ValueId x) {  // |x| <= 1: ((A + 2) x - (A + 3)) x^2 + 1
    return m.add(m.mul(m.mul(m.sub(m.mul(m.c(a + 2), x), m.c(a + 3)), x), x), m.c(1));
  };
  auto far = [&](ValueId x) {  // 1 < |x| < 2: ((A x - 5A) x + 8A) x - 4A
    return m.sub(m.mul(m.add(m.mul(m.sub(m.mul(m.c(a), x), m.c(5 * a)), x), m.c(8 * a)), x),
                 m.c(4 * a));
  };
  ValueId one = m.c(1);
  return {far(m.add(t, one)), near(t), near(m.sub(one, t)), far(m.sub(m.c(2), t))};
}

std::vector<TensorValue> lower_grid_sample(LoweringContext& ctx, const graph::Node& node,
                                           const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& grid = required_input(ctx, inputs, 1, "grid");
  require_dtype(ctx, x.dtype, kFloats, "input 'X'");
  // Images; from opset 20 also volumes (ONNX 20 allows any rank, Kiln samples 2-D and 3-D).
  const size_t nd = x.rank() >= 2 ? x.rank() - 2 : 0;
  const bool volumes = node.opset() >= 20;
  if ((nd != 2 && !(nd == 3 && volumes)) || grid.rank() != x.rank() ||
      grid.shape.back() != Expr(static_cast<int64_t>(nd))) {
    ctx.fail(
        fmt::format("expected X [N, C, H, W] and grid [N, H_out, W_out, 2]{}, found {} and {}",
                    volumes ? ", or X [N, C, D, H, W] and grid [N, D_out, H_out, W_out, 3]" : "",
                    graph::shape_str(x.shape), graph::shape_str(grid.shape)));
  }
  // GridSample-20 names the modes after any number of dims: linear and cubic.
  const bool renamed = node.opset() >= 20;
  std::string mode = node.attr_string("mode", renamed ? "linear" : "bilinear");
  const std::string padding_name = node.attr_string("padding_mode", "zeros");
  if (renamed && (mode == "linear" || mode == "cubic")) {
    mode = mode == "linear" ? "bilinear" : "bicubic";
  } else if (renamed || (mode != "bilinear" && mode != "nearest" && mode != "bicubic")) {
    if (mode != "nearest") {
      ctx.fail(fmt::format("mode must be {}, found '{}'",
                           renamed ? "linear, nearest or cubic" : "bilinear, nearest or bicubic",
                           mode));
    }
  }
  Padding padding = padding_name == "border"       ? Padding::kBorder
                    : padding_name == "reflection" ? Padding::kReflection
                                                   : Padding::kZeros;
  if (padding == Padding::kZeros && padding_name != "zeros") {
    ctx.fail(
        fmt::format("padding_mode must be zeros, border or reflection, found '{}'", padding_name));
  }
  if (mode == "bicubic" && nd != 2) ctx.fail("the cubic mode samples 4-D inputs (images) only");
  GridSampler sampler(ctx, x, padding, node.attr_int("align_corners", 0) != 0);
  const DType f = compute_dtype(x.dtype);
  std::vector<Expr> shape = {x.shape[0], x.shape[1]};
  shape.insert(shape.end(), grid.shape.begin() + 1, grid.shape.end() - 1);
  return {ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    FloatMath m{body, f};
    std::vector<Expr> nc = {o[0], o[1]};
    // Spatial dim k of X (outermost first) takes grid coordinate nd - 1 - k: the grid lists
    // (x, y) or (x, y, z), the innermost dim first.
    std::vector<ValueId> sizes, g;
    for (size_t k = 0; k < nd; ++k) {
      sizes.push_back(body.cast(body.index_expr(x.shape[k + 2]), f));
      std::vector<Expr> at = {o[0]};
      at.insert(at.end(), o.begin() + 2, o.end());
      at.emplace_back(static_cast<int64_t>(nd - 1 - k));
      g.push_back(sampler.unnormalize(m, body.cast(ctx.load_at(body, grid, at), f), sizes[k]));
    }
    ValueId result;
    if (mode == "bicubic") {
      ValueId gy = g[0], gx = g[1], h = sizes[0], w = sizes[1];
      ValueId x0 = m.floor(gx), y0 = m.floor(gy);
      std::vector<ValueId> wx = cubic_weights(m, m.sub(gx, x0));
      std::vector<ValueId> wy = cubic_weights(m, m.sub(gy, y0));
      result = m.c(0);
      for (int i = 0; i < 4; ++i) {
        ValueId yi = sampler.pad(m, m.add(y0, m.c(i - 1)), h);
        ValueId row = m.c(0);
        for (int j = 0; j < 4; ++j) {
          ValueId xj = sampler.pad(m, m.add(x0, m.c(j - 1)), w);
          row = m.add(row, m.mul(wx[j], sampler.tap(m, nc, {yi, xj})));
        }
        result = m.add(result, m.mul(wy[i], row));
      }
    } else {
      for (size_t k = 0; k < nd; ++k) g[k] = sampler.pad(m, g[k], sizes[k]);
      if (mode == "nearest") {
        std::vector<ValueId> at;
        for (ValueId v : g) at.push_back(body.unary(OpCode::kRound, v));
        result = sampler.tap(m, nc, at);
      } else {
        // 2^nd taps: corner `bits` takes floor + 1 along the dims whose bit is set, weighted by
        // the product of the fractions (t) or their complements (1 - t).
        std::vector<ValueId> lo, t, s;
        for (ValueId v : g) {
          lo.push_back(m.floor(v));
          t.push_back(m.sub(v, lo.back()));
          s.push_back(m.sub(m.c(1), t.back()));
        }
        result = m.c(0);
        for (size_t bits = 0; bits < (size_t{1} << nd); ++bits) {
          std::vector<ValueId> at;
          ValueId weight = ir::kNoValue;
          for (size_t k = 0; k < nd; ++k) {
            const bool up = (bits >> (nd - 1 - k)) & 1;
            at.push_back(up ? m.add(lo[k], m.c(1)) : lo[k]);
            weight = weight == ir::kNoValue ? (up ? t[k] : s[k]) : m.mul(weight, up ? t[k] : s[k]);
          }
          result = m.add(result, m.mul(weight, sampler.tap(m, nc, at)));
        }
      }
    }
    return body.cast(result, x.dtype);
  })};
}

}  // namespace

void register_grid_sample_ops(Registry& registry) {
  registry.add("", "GridSample", {lower_grid_sample, 16, 20});
}

}  // namespace kiln::lower
