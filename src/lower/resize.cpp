/// Resize (opsets 10 to 19) and Upsample (7, 9) through the loop IR, so that they fuse with their
/// neighbours. Along every resized dim an output index maps to a source coordinate
/// (coordinate_transformation_mode, computed in double step by step as the ONNX reference does);
/// nearest mode rounds it to one source index (nearest_mode), linear and cubic weigh 2 or 4
/// edge-clamped neighbours per dim (cubic_coeff_a, exclude_outside) and sum the weighted loads
/// over the resized dims. tf_crop_and_resize gives extrapolation_value where a coordinate leaves
/// the input. Dims whose scale is 1 under a transform that maps them onto themselves are left
/// alone. Opset 18 adds `axes` (the scales, sizes and roi given for those dims only; the others
/// keep their size), `keep_aspect_ratio_policy` (with sizes: one scale for all those dims, the
/// smallest or the largest of theirs, and sizes rounded half up from it) and `antialias`: when
/// downsampling in linear or cubic mode the filter is widened by 1 / scale (more taps, weights
/// at scale * distance, normalized to sum 1). Opset 19 adds the transform half_pixel_symmetric.
///
/// Along dims of static size, nearest mode computes the source index table at compile time and
/// matches it against floor((o * p + c) / q) for the ratio p/q of the sizes: when it matches
/// (integer up- and down-sampling, most ratios of sizes) the resize is a plain view, with no
/// float math and no indirect load. Scales, sizes and roi must be known at compile time (the
/// output shape depends on them). Resize-10 and Upsample use the asymmetric transform and round
/// down when upsampling, up when downsampling (as ONNX Runtime does).
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
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

enum class Mode { kNearest, kLinear, kCubic };
enum class Rounding { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil, kSimple };
enum class Transform {
  kHalfPixel,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfHalfPixelForNn,
  kTfCropAndResize,
  kHalfPixelSymmetric,
};

struct Settings {
  Mode mode = Mode::kNearest;
  Transform transform = Transform::kHalfPixel;
  Rounding rounding = Rounding::kRoundPreferFloor;  // kSimple: Resize-10 and Upsample
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0;
  bool antialias = false;  // linear and cubic: widen the filter when downsampling
};

/// The output size of each dim and the scale its coordinates are transformed with.
struct Target {
  std::vector<Expr> out;
  std::vector<double> scale;
  bool from_scales = true;  // the scales input (float32) was given, not sizes
  std::vector<double> roi;  // starts, then ends; empty unless tf_crop_and_resize
};

/// x = (pre + ((o + add) * mul1 * mul2) / div) + offset, one double op at a time in this order.
struct CoordMap {
  double add = 0, mul1 = 1, mul2 = 1, div = 1, offset = 0, pre = 0;
};

/// How one dim of the output reads the input.
struct Axis {
  Expr in, out;
  bool identity = false;  // every output index reads its own input index
  CoordMap map;
  Rounding rounding = Rounding::kFloor;  // nearest mode, kSimple resolved
  /// Antialiased linear or cubic taps: the scale (< 1) the filter is widened by, else 0.
  double antialias = 0;
  /// tf_crop_and_resize: the outputs [first, end) whose coordinate lies in the input; unset
  /// when all do.
  std::optional<std::pair<int64_t, int64_t>> valid;
};

/// Nearest source index floor((o * mul + add) / div), clamped into the input where needed.
struct IndexForm {
  int64_t mul = 1, add = 0, div = 1;
  bool clamp_low = false, clamp_high = false;
};

constexpr int64_t kMaxTable = int64_t{1} << 20;  // larger nearest dims skip the view match
constexpr DType kF64 = DType::kFloat64;

// --- Attributes and arguments --------------------------------------------------------------------

template <class T>
T pick(const LoweringContext& ctx, const std::string& attr, const std::string& value,
       const std::vector<std::pair<std::string, T>>& choices) {
  std::string names;
  for (const auto& [name, v] : choices) {
    if (name == value) return v;
    names += (names.empty() ? "" : ", ") + name;
  }
  ctx.fail(fmt::format("attribute '{}' must be one of {}, found '{}'", attr, names, value));
}

/// Resize-10 and Upsample: nearest or linear, asymmetric coordinates.
Settings legacy_settings(const LoweringContext& ctx, const graph::Node& node) {
  Settings s;
  s.mode = pick<Mode>(ctx, "mode", node.attr_string("mode", "nearest"),
                      {{"nearest", Mode::kNearest}, {"linear", Mode::kLinear}});
  s.transform = Transform::kAsymmetric;
  s.rounding = Rounding::kSimple;
  return s;
}

Settings resize_settings(const LoweringContext& ctx, const graph::Node& node) {
  Settings s;
  s.mode =
      pick<Mode>(ctx, "mode", node.attr_string("mode", "nearest"),
                 {{"nearest", Mode::kNearest}, {"linear", Mode::kLinear}, {"cubic", Mode::kCubic}});
  s.transform = pick<Transform>(ctx, "coordinate_transformation_mode",
                                node.attr_string("coordinate_transformation_mode", "half_pixel"),
                                {{"half_pixel", Transform::kHalfPixel},
                                 {"pytorch_half_pixel", Transform::kPytorchHalfPixel},
                                 {"align_corners", Transform::kAlignCorners},
                                 {"asymmetric", Transform::kAsymmetric},
                                 {"tf_half_pixel_for_nn", Transform::kTfHalfPixelForNn},
                                 {"tf_crop_and_resize", Transform::kTfCropAndResize},
                                 {"half_pixel_symmetric", Transform::kHalfPixelSymmetric}});
  if (s.transform == Transform::kHalfPixelSymmetric && node.opset() < 19) {
    ctx.fail("coordinate_transformation_mode 'half_pixel_symmetric' needs opset 19");
  }
  s.rounding =
      pick<Rounding>(ctx, "nearest_mode", node.attr_string("nearest_mode", "round_prefer_floor"),
                     {{"round_prefer_floor", Rounding::kRoundPreferFloor},
                      {"round_prefer_ceil", Rounding::kRoundPreferCeil},
                      {"floor", Rounding::kFloor},
                      {"ceil", Rounding::kCeil}});
  s.cubic_a = node.attr_float("cubic_coeff_a", -0.75f);
  s.exclude_outside = node.attr_int("exclude_outside", 0) != 0;
  s.extrapolation = node.attr_float("extrapolation_value", 0.0f);
  s.antialias = node.attr_int("antialias", 0) != 0;
  if (s.antialias && s.mode == Mode::kNearest) {
    ctx.fail("attribute 'antialias' applies to modes linear and cubic, not nearest");
  }
  return s;
}

/// An optional input that is given and not empty (opset 11 passes empty tensors for "absent").
const TensorValue* present(const TensorValue* value) {
  if (value == nullptr || (value->rank() == 1 && value->shape[0] == Expr(0))) return nullptr;
  return value;
}

std::vector<double> known_floats(const LoweringContext& ctx, const TensorValue& value,
                                 const std::string& what, size_t count) {
  if (!graph::is_floating(value.dtype)) {
    ctx.fail(
        fmt::format("input '{}' must be floating, found {}", what, graph::dtype_name(value.dtype)));
  }
  if (!value.known_float) {
    ctx.fail(fmt::format("input '{}' must be known at compile time (a constant or an initializer)",
                         what));
  }
  if (value.known_float->size() != count) {
    ctx.fail(fmt::format("expected {} values in input '{}', found {}", count, what,
                         value.known_float->size()));
  }
  return *value.known_float;
}

Target target_from_scales(const LoweringContext& ctx, const TensorValue& x,
                          std::vector<double> scales) {
  if (scales.size() != x.rank()) {
    ctx.fail(
        fmt::format("expected {} scales (one per dim of X), found {}", x.rank(), scales.size()));
  }
  Target t;
  for (size_t d = 0; d < x.rank(); ++d) {
    const double s = scales[d];
    if (!(s > 0)) ctx.fail(fmt::format("scale {} of dim {} must be positive", s, d));
    if (auto n = x.shape[d].as_integer()) {
      // In float32, as ONNX shape inference computes it.
      float size = static_cast<float>(*n) * static_cast<float>(s);
      t.out.emplace_back(static_cast<int64_t>(std::floor(size)));
    } else if (s == std::floor(s)) {
      t.out.push_back(x.shape[d] * static_cast<int64_t>(s));
    } else {
      ctx.fail(
          fmt::format("dim {} of symbolic size {} cannot be scaled by {}: the output size "
                      "would not be known",
                      d, x.shape[d].str(), s));
    }
  }
  t.scale = std::move(scales);
  return t;
}

Target target_from_sizes(const LoweringContext& ctx, const TensorValue& x,
                         const std::vector<Expr>& sizes) {
  if (sizes.size() != x.rank()) {
    ctx.fail(fmt::format("expected {} sizes (one per dim of X), found {}", x.rank(), sizes.size()));
  }
  Target t;
  t.from_scales = false;
  t.out = sizes;
  for (size_t d = 0; d < x.rank(); ++d) {
    auto n = x.shape[d].as_integer();
    auto m = sizes[d].as_integer();
    if (sizes[d] == x.shape[d]) {
      t.scale.push_back(1.0);
    } else if (n && m && *n > 0 && *m >= 0) {
      t.scale.push_back(static_cast<double>(*m) / static_cast<double>(*n));
    } else {
      ctx.fail(
          fmt::format("cannot resize dim {} from {} to {} (static sizes needed, input not "
                      "empty, output not negative)",
                      d, x.shape[d].str(), sizes[d].str()));
    }
  }
  return t;
}

// --- Coordinates ---------------------------------------------------------------------------------

/// The map of the ONNX reference (interpolate_1d_with_x) for input size n, scale s and output
/// size m. Its output width is s * n, in float32 when s came as float32 (numpy's promotion), in
/// double otherwise.
CoordMap coord_map(Transform t, double s, int64_t n, int64_t m, bool single, double start,
                   double end) {
  const double w = single ? static_cast<float>(s) * static_cast<float>(n) : s * n;
  const double w1 = single ? static_cast<float>(w) - 1.0f : w - 1;
  const double last = static_cast<double>(n - 1);
  switch (t) {
    case Transform::kHalfPixel:
      return {0.5, 1, 1, s, -0.5};
    case Transform::kPytorchHalfPixel:
      return w == 1 ? CoordMap{0, 0, 1, 1, -0.5} : CoordMap{0.5, 1, 1, s, -0.5};
    case Transform::kAlignCorners:
      return w == 1 ? CoordMap{0, 0, 1, 1, 0} : CoordMap{0, last, 1, w1, 0};
    case Transform::kAsymmetric:
      return {0, 1, 1, s, 0};
    case Transform::kTfHalfPixelForNn:
      return {0.5, 1, 1, s, 0};
    case Transform::kHalfPixelSymmetric: {
      // Half-pixel about the centre of the input, shifted when the output size was rounded.
      const double adjustment = static_cast<double>(m) / w;
      const double centre = static_cast<double>(n) / 2;
      return {0.5, 1, 1, s, -0.5, centre * (1 - adjustment)};
    }
    case Transform::kTfCropAndResize: {
      // roi arithmetic with Python ints stays in float32 in the reference.
      const float span = static_cast<float>(end) - static_cast<float>(start);
      const float base = static_cast<float>(start) * static_cast<float>(last);
      if (w == 1) return {0, 0, 1, 1, span * static_cast<float>(last) / 2.0f + base};
      return {0, span, last, w1, base};
    }
  }
  return {};
}

double coord(const CoordMap& c, int64_t o) {
  if (c.mul1 == 0) return c.offset;
  double x = static_cast<double>(o) + c.add;
  x *= c.mul1;
  x *= c.mul2;
  x /= c.div;
  if (c.pre != 0) x = c.pre + x;
  return x + c.offset;
}

/// The same map in the loop body (float64), skipping the steps that change nothing.
ValueId coord(LoopBody& body, const CoordMap& c, const Expr& o) {
  if (c.mul1 == 0) return body.constant(c.offset, kF64);
  ValueId x = body.cast(body.index_expr(o), kF64);
  auto step = [&](OpCode code, double v, double neutral) {
    if (v != neutral) x = body.binary(code, x, body.constant(v, kF64));
  };
  step(OpCode::kAdd, c.add, 0);
  step(OpCode::kMul, c.mul1, 1);
  step(OpCode::kMul, c.mul2, 1);
  step(OpCode::kDiv, c.div, 1);
  step(OpCode::kAdd, c.pre, 0);
  step(OpCode::kAdd, c.offset, 0);
  return x;
}

/// nearest_mode as the reference's nearest_coeffs picks between floor(x) and floor(x) + 1.
int64_t round_coord(double x, Rounding r) {
  const double f = std::floor(x), frac = x - f;
  switch (r) {
    case Rounding::kRoundPreferFloor:
      return static_cast<int64_t>(frac > 0.5 ? f + 1 : f);
    case Rounding::kRoundPreferCeil:
      return static_cast<int64_t>(frac >= 0.5 ? f + 1 : f);
    case Rounding::kFloor:
      return static_cast<int64_t>(f);
    case Rounding::kCeil:
    case Rounding::kSimple:
      break;
  }
  return static_cast<int64_t>(std::ceil(x));
}

ValueId round_coord(LoopBody& body, ValueId x, Rounding r) {
  ValueId f = body.unary(OpCode::kFloor, x);
  ValueId rounded = f;
  if (r == Rounding::kCeil) {
    rounded = body.unary(OpCode::kCeil, x);
  } else if (r != Rounding::kFloor) {
    OpCode up = r == Rounding::kRoundPreferFloor ? OpCode::kGt : OpCode::kGe;
    ValueId frac = body.binary(OpCode::kSub, x, f);
    ValueId half = body.binary(up, frac, body.constant(0.5, kF64));
    rounded = body.where(half, body.binary(OpCode::kAdd, f, body.constant(1, kF64)), f);
  }
  return body.cast(rounded, DType::kInt64);
}

ValueId index_value(LoopBody& body, const Expr& e) {
  if (auto c = e.as_integer()) return body.constant(static_cast<double>(*c), DType::kInt64);
  return body.index_expr(e);
}

/// The index symbol of an int64 source index clamped into [0, size) (edge padding).
Expr source_index(LoopBody& body, ValueId i, const Expr& size) {
  ValueId low = body.binary(OpCode::kMaximum, i, body.constant(0, DType::kInt64));
  ValueId clamped = body.binary(OpCode::kMinimum, low, index_value(body, size - 1));
  return body.op(body.indirect(clamped, size)).symbol;
}

/// tf_crop_and_resize: whether output index o of this dim reads inside the input.
ValueId crop_mask(LoopBody& body, const Axis& a, const Expr& o) {
  if (!a.valid) return ir::kNoValue;
  return in_range(body, o, Expr(a.valid->first), Expr(a.valid->second));
}

// --- Axes ----------------------------------------------------------------------------------------

std::optional<std::pair<int64_t, int64_t>> valid_outputs(const CoordMap& map, int64_t n,
                                                         int64_t m) {
  int64_t first = m, end = 0;
  for (int64_t o = 0; o < m; ++o) {
    double x = coord(map, o);
    if (x >= 0 && x <= static_cast<double>(n - 1)) {
      first = std::min(first, o);
      end = o + 1;
    }
  }
  if (first == 0 && end == m) return std::nullopt;
  return std::make_pair(first, end);  // the coordinate is monotonic: one range
}

Axis make_axis(const LoweringContext& ctx, const Settings& s, const Target& t, size_t d,
               const Expr& in) {
  Axis a;
  a.in = in;
  a.out = t.out[d];
  const double scale = t.scale[d];
  const bool crop = s.transform == Transform::kTfCropAndResize;
  const double start = crop ? t.roi[d] : 0, end = crop ? t.roi[t.out.size() + d] : 1;
  a.identity = scale == 1.0 && a.out == a.in && s.transform != Transform::kTfHalfPixelForNn &&
               start == 0 && end == 1;
  if (a.identity) return a;
  a.rounding = s.rounding != Rounding::kSimple ? s.rounding
               : scale < 1                     ? Rounding::kCeil
                                               : Rounding::kFloor;
  auto n = in.as_integer();
  auto m = a.out.as_integer();
  bool size_free = s.transform == Transform::kHalfPixel || s.transform == Transform::kAsymmetric ||
                   s.transform == Transform::kTfHalfPixelForNn;
  if (s.antialias && s.mode != Mode::kNearest && scale < 1) a.antialias = scale;
  if ((!n || !m) && !size_free) {
    ctx.fail(
        fmt::format("dim {} of symbolic size {} cannot be resized with this "
                    "coordinate_transformation_mode (it needs static sizes)",
                    d, in.str()));
  }
  a.map = coord_map(s.transform, scale, n.value_or(0), m.value_or(0), t.from_scales, start, end);
  if (crop) a.valid = valid_outputs(a.map, *n, *m);
  return a;
}

// --- Nearest -------------------------------------------------------------------------------------

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

/// The nearest source indices of a static dim as floor((o * n' + c) / m') (n'/m' the ratio of
/// the sizes in lowest terms), when some c gives exactly the reference's table.
std::optional<IndexForm> nearest_form(const Axis& a) {
  if (a.identity) return IndexForm{};
  auto n = a.in.as_integer(), m = a.out.as_integer();
  if (!n || !m || *n <= 0 || *n > kMaxTable || *m > kMaxTable) return std::nullopt;
  if (*m == 0) return IndexForm{};
  const int64_t g = std::gcd(*n, *m);
  IndexForm f{*n / g, 0, *m / g};
  int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  for (int64_t o = 0; o < *m; ++o) {
    int64_t v = std::clamp<int64_t>(round_coord(coord(a.map, o), a.rounding), 0, *n - 1);
    // v == 0 and v == n - 1 may come from the clamp: only one bound holds there.
    if (v > 0) lo = std::max(lo, v * f.div - o * f.mul);
    if (v < *n - 1) hi = std::min(hi, (v + 1) * f.div - 1 - o * f.mul);
  }
  if (lo > hi) return std::nullopt;
  f.add = lo != std::numeric_limits<int64_t>::min()   ? lo
          : hi != std::numeric_limits<int64_t>::max() ? hi
                                                      : 0;
  f.clamp_low = floor_div(f.add, f.div) < 0;
  f.clamp_high = floor_div((*m - 1) * f.mul + f.add, f.div) > *n - 1;
  return f;
}

Expr form_index(const IndexForm& f, const Expr& o, const Expr& in) {
  Expr e = o * f.mul + f.add;
  if (f.div != 1) e = sym::floor_div(e, Expr(f.div));
  if (f.clamp_low) e = sym::max(e, Expr(0));
  if (f.clamp_high) e = sym::min(e, in - 1);
  return e;
}

TensorValue resize_nearest(LoweringContext& ctx, const TensorValue& x, const Settings& s,
                           const std::vector<Axis>& axes) {
  const size_t rank = x.rank();
  std::vector<Expr> shape;
  std::vector<std::optional<IndexForm>> forms;
  bool view = true;
  for (const Axis& a : axes) {
    shape.push_back(a.out);
    forms.push_back(nearest_form(a));
    view = view && forms.back() && !a.valid;
  }
  if (view) {
    return make_view(ctx, x, shape, [&](const std::vector<Expr>& o) {
      std::vector<Expr> at(rank);
      for (size_t d = 0; d < rank; ++d) at[d] = form_index(*forms[d], o[d], axes[d].in);
      return at;
    });
  }
  return ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    std::vector<Expr> at(rank);
    ValueId mask = ir::kNoValue;
    for (size_t d = 0; d < rank; ++d) {
      const Axis& a = axes[d];
      at[d] = forms[d] ? form_index(*forms[d], o[d], a.in)
                       : source_index(body, round_coord(body, coord(body, a.map, o[d]), a.rounding),
                                      a.in);
      mask = and_mask(body, mask, crop_mask(body, a, o[d]));
    }
    ValueId v = ctx.load_at(body, x, at);
    if (mask == ir::kNoValue) return v;
    return body.where(mask, v, body.constant(s.extrapolation, body.dtype(v)));
  });
}

// --- Linear and cubic ----------------------------------------------------------------------------

/// The neighbours one output index reads along a dim and their weights.
struct Taps {
  std::vector<Expr> index;
  std::vector<ValueId> weight;
};

/// The reference's cubic_coeffs for the fraction r: W(r + 1), W(r), W(1 - r), W(2 - r).
std::vector<ValueId> cubic_weights(LoopBody& body, ValueId r, double a, DType cd) {
  auto c = [&](double v) { return body.constant(v, cd); };
  auto add = [&](ValueId p, ValueId q) { return body.binary(OpCode::kAdd, p, q); };
  auto sub = [&](ValueId p, ValueId q) { return body.binary(OpCode::kSub, p, q); };
  auto mul = [&](ValueId p, ValueId q) { return body.binary(OpCode::kMul, p, q); };
  // 1 <= |t| <= 2: ((A t - 5A) t + 8A) t - 4A; |t| <= 1: ((A + 2) t - (A + 3)) t t + 1.
  auto far = [&](ValueId t) {
    return sub(mul(add(mul(sub(mul(c(a), t), c(5 * a)), t), c(8 * a)), t), c(4 * a));
  };
  auto near = [&](ValueId t) { return add(mul(mul(sub(mul(c(a + 2), t), c(a + 3)), t), t), c(1)); };
  ValueId rest = sub(c(1), r);
  return {far(add(r, c(1))), near(r), near(rest), far(add(rest, c(1)))};
}

/// The number of taps of an axis and the offset of the first from the coordinate's floor (for
/// antialiased ones: from ceil(x) - 1, the reference's base).
std::pair<int64_t, int64_t> tap_span(const Axis& a, const Settings& s) {
  const bool cubic = s.mode == Mode::kCubic;
  using Span = std::pair<int64_t, int64_t>;
  if (a.antialias == 0) return cubic ? Span{4, -1} : Span{2, 0};
  // The filter's support (2 for cubic, 1 for linear) widened by 1 / scale, taps on both sides.
  const double support = cubic ? 2 : 1;
  const int64_t first = static_cast<int64_t>(std::floor(-support / a.antialias)) + 1;
  return {2 - 2 * first, first};
}

/// Antialiased taps (a.antialias = s < 1): the source indices base + i for i in [first,
/// first + count) where base = ceil(x) - 1 and t = x - base lies in (0, 1]; tap i weighs
/// filter(s * (i - t)) (the triangle 1 - |d| clipped at 0, or the cubic kernel of support 2),
/// and the weights are normalized to sum 1 (over the taps inside the input with
/// exclude_outside).
Taps antialias_taps(LoopBody& body, const Axis& a, const Settings& s, const Expr& o, DType cd) {
  auto [count, first] = tap_span(a, s);
  FloatMath m{body, kF64};
  ValueId x = coord(body, a.map, o);
  ValueId base = m.sub(body.unary(OpCode::kCeil, x), m.c(1));
  ValueId t = m.sub(x, base);
  ValueId base_index = body.cast(base, DType::kInt64);
  const double A = s.cubic_a;
  Taps taps;
  ValueId total = ir::kNoValue;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = first + k;
    ValueId d =
        body.unary(OpCode::kAbs, m.scale(a.antialias, m.sub(m.c(static_cast<double>(i)), t)));
    ValueId w;
    if (s.mode == Mode::kCubic) {
      ValueId d2 = m.mul(d, d), d3 = m.mul(d2, d);
      ValueId near = m.add(m.sub(m.scale(A + 2, d3), m.scale(A + 3, d2)), m.c(1));
      ValueId far =
          m.sub(m.add(m.sub(m.scale(A, d3), m.scale(5 * A, d2)), m.scale(8 * A, d)), m.c(4 * A));
      w = body.where(body.binary(OpCode::kLe, d, m.c(1)), near,
                     body.where(body.binary(OpCode::kLt, d, m.c(2)), far, m.c(0)));
    } else {
      w = body.binary(OpCode::kMaximum, m.sub(m.c(1), d), m.c(0));
    }
    ValueId index =
        body.binary(OpCode::kAdd, base_index, body.constant(static_cast<double>(i), DType::kInt64));
    if (s.exclude_outside) {
      ValueId inside = body.binary(OpCode::kAnd,
                                   body.binary(OpCode::kGe, index, body.constant(0, DType::kInt64)),
                                   body.binary(OpCode::kLt, index, index_value(body, a.in)));
      w = body.where(inside, w, m.c(0));
    }
    taps.index.push_back(source_index(body, index, a.in));
    taps.weight.push_back(w);
    total = k == 0 ? w : m.add(total, w);
  }
  for (ValueId& w : taps.weight) w = body.cast(m.div(w, total), cd);
  return taps;
}

Taps axis_taps(LoopBody& body, const Axis& a, const Settings& s, const Expr& o, DType cd) {
  if (a.antialias != 0) return antialias_taps(body, a, s, o, cd);
  const bool cubic = s.mode == Mode::kCubic;
  ValueId x = coord(body, a.map, o);
  ValueId f = body.unary(OpCode::kFloor, x);
  ValueId r = body.cast(body.binary(OpCode::kSub, x, f), cd);
  ValueId base = body.cast(f, DType::kInt64);
  Taps taps;
  taps.weight = cubic ? cubic_weights(body, r, s.cubic_a, cd)
                      : std::vector<ValueId>{body.binary(OpCode::kSub, body.constant(1, cd), r), r};
  ValueId total = ir::kNoValue;
  for (size_t k = 0; k < taps.weight.size(); ++k) {
    int64_t offset = static_cast<int64_t>(k) - (cubic ? 1 : 0);
    ValueId i = offset == 0
                    ? base
                    : body.binary(OpCode::kAdd, base,
                                  body.constant(static_cast<double>(offset), DType::kInt64));
    taps.index.push_back(source_index(body, i, a.in));
    if (!s.exclude_outside) continue;
    ValueId inside =
        body.binary(OpCode::kAnd, body.binary(OpCode::kGe, i, body.constant(0, DType::kInt64)),
                    body.binary(OpCode::kLt, i, index_value(body, a.in)));
    taps.weight[k] = body.where(inside, taps.weight[k], body.constant(0, cd));
    total = k == 0 ? taps.weight[k] : body.binary(OpCode::kAdd, total, taps.weight[k]);
  }
  if (s.exclude_outside) {
    for (ValueId& w : taps.weight) w = body.binary(OpCode::kDiv, w, total);
  }
  return taps;
}

/// A linear dim's two source indices and weights per output index, computed at compile time
/// as axis_taps computes them in the loop body (the same float64 coordinate, its floor, the
/// fraction rounded to the compute type, the indices clamped into the input): tables [out, 2]
/// of the indices (float32, exact below 2^24) and of the weights (the compute type). A kernel
/// then loads them by output index instead of computing each element's coordinates in float64:
/// upsampling 21 channels from 28 x 28 to 224 x 224 (a segmentation head) took 3.2 ms so on an
/// AMD EPYC, 2 threads, and the kernel alone about 3x less with the tables.
struct LinearTable {
  TensorValue index, weight;
};

std::optional<LinearTable> linear_table(LoweringContext& ctx, const Axis& a, const Settings& s,
                                        DType cd) {
  const auto n = a.in.as_integer(), m = a.out.as_integer();
  if (s.mode != Mode::kLinear || a.identity || a.antialias != 0 || s.exclude_outside || !n || !m ||
      *n <= 0 || *n >= (int64_t{1} << 24) || *m <= 0 || *m > kMaxTable ||
      (cd != DType::kFloat32 && cd != DType::kFloat64)) {
    return std::nullopt;
  }
  auto index = std::make_shared<graph::Tensor>(DType::kFloat32, std::vector<int64_t>{*m, 2});
  auto weight = std::make_shared<graph::Tensor>(cd, std::vector<int64_t>{*m, 2});
  auto* ix = static_cast<float*>(index->mutable_data());
  auto fill = [&](auto* w) {
    using T = std::remove_pointer_t<decltype(w)>;
    for (int64_t o = 0; o < *m; ++o) {
      const double x = coord(a.map, o), f = std::floor(x);
      const T r = static_cast<T>(x - f);
      const int64_t base = static_cast<int64_t>(f);
      w[2 * o] = T(1) - r;
      w[2 * o + 1] = r;
      ix[2 * o] = static_cast<float>(std::clamp<int64_t>(base, 0, *n - 1));
      ix[2 * o + 1] = static_cast<float>(std::clamp<int64_t>(base + 1, 0, *n - 1));
    }
  };
  if (cd == DType::kFloat32) {
    fill(static_cast<float*>(weight->mutable_data()));
  } else {
    fill(static_cast<double*>(weight->mutable_data()));
  }
  return LinearTable{ctx.from_constant(index), ctx.from_constant(weight)};
}

/// The taps of output index `o` from its dim's tables.
Taps table_taps(LoweringContext& ctx, LoopBody& body, const LinearTable& t, const Axis& a,
                const Expr& o) {
  Taps taps;
  for (int64_t k = 0; k < 2; ++k) {
    ValueId i = body.cast(ctx.load_at(body, t.index, {o, Expr(k)}), DType::kInt64);
    taps.index.push_back(body.op(body.indirect(i, a.in)).symbol);
    taps.weight.push_back(ctx.load_at(body, t.weight, {o, Expr(k)}));
  }
  return taps;
}

/// One pass interpolating the dims `dims` of `input` (the others read their own index).
TensorValue interpolate(LoweringContext& ctx, const TensorValue& input, const Settings& s,
                        const std::vector<Axis>& axes, const std::vector<size_t>& dims) {
  const DType cd = compute_dtype(input.dtype);
  size_t combos = 1;
  for (size_t d : dims) combos *= static_cast<size_t>(tap_span(axes[d], s).first);
  TensorValue x = input;
  if (static_cast<size_t>(x.body->compute_op_count()) * combos >
      static_cast<size_t>(ctx.options().max_inline_ops)) {
    x = ctx.realize(x, fmt::format("read by {} resize taps", combos));
  }
  std::vector<Expr> shape = x.shape;
  for (size_t d : dims) shape[d] = axes[d].out;
  std::vector<std::optional<LinearTable>> tables;
  for (size_t d : dims) tables.push_back(linear_table(ctx, axes[d], s, cd));
  return ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& o) {
    std::vector<Taps> taps;
    ValueId mask = ir::kNoValue;
    for (size_t j = 0; j < dims.size(); ++j) {
      const size_t d = dims[j];
      taps.push_back(tables[j] ? table_taps(ctx, body, *tables[j], axes[d], o[d])
                               : axis_taps(body, axes[d], s, o[d], cd));
      mask = and_mask(body, mask, crop_mask(body, axes[d], o[d]));
    }
    ValueId sum = ir::kNoValue;
    for (size_t c = 0; c < combos; ++c) {
      std::vector<Expr> at = o;
      ValueId w = ir::kNoValue;
      for (size_t j = dims.size(), rest = c; j-- > 0;) {
        const size_t per = taps[j].index.size();
        at[dims[j]] = taps[j].index[rest % per];
        ValueId wj = taps[j].weight[rest % per];
        rest /= per;
        w = w == ir::kNoValue ? wj : body.binary(OpCode::kMul, w, wj);
      }
      ValueId term = body.binary(OpCode::kMul, w, body.cast(ctx.load_at(body, x, at), cd));
      sum = sum == ir::kNoValue ? term : body.binary(OpCode::kAdd, sum, term);
    }
    if (mask == ir::kNoValue) return sum;
    return body.where(mask, sum, body.constant(s.extrapolation, cd));
  });
}

/// Interpolates every resized dim, at most 64 taps per pass (a pass reads the previous one,
/// realized when it is not cheap; a dim with more taps than that has a pass of its own).
TensorValue resize_interpolated(LoweringContext& ctx, const TensorValue& x, const Settings& s,
                                const std::vector<Axis>& axes) {
  constexpr int64_t kMaxTaps = 64;
  TensorValue value = x;
  std::vector<size_t> part;
  int64_t combos = 1;
  for (size_t d = 0; d < axes.size(); ++d) {
    if (axes[d].identity) continue;
    const int64_t n = tap_span(axes[d], s).first;
    if (!part.empty() && combos * n > kMaxTaps) {
      value = interpolate(ctx, value, s, axes, part);
      part.clear();
      combos = 1;
    }
    part.push_back(d);
    combos *= n;
  }
  if (!part.empty()) value = interpolate(ctx, value, s, axes, part);
  return value;
}

TensorValue resize(LoweringContext& ctx, const TensorValue& x, const Settings& s, const Target& t) {
  require_dtype(ctx, x.dtype, s.mode == Mode::kNearest ? kAllTypes : kFloats, "input 'X'");
  std::vector<Axis> axes;
  for (size_t d = 0; d < x.rank(); ++d) axes.push_back(make_axis(ctx, s, t, d, x.shape[d]));
  if (s.mode == Mode::kNearest) return resize_nearest(ctx, x, s, axes);
  return resize_interpolated(ctx, x, s, axes);
}

// --- Ops -----------------------------------------------------------------------------------------

std::vector<TensorValue> lower_resize(LoweringContext& ctx, const graph::Node& node,
                                      const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const size_t rank = x.rank();
  if (node.opset() < 11) {
    const TensorValue& scales = required_input(ctx, inputs, 1, "scales");
    return {resize(ctx, x, legacy_settings(ctx, node),
                   target_from_scales(ctx, x, known_floats(ctx, scales, "scales", rank)))};
  }
  Settings s = resize_settings(ctx, node);
  const TensorValue* scales = present(optional_input(inputs, 2));
  const TensorValue* sizes = present(optional_input(inputs, 3));
  if ((scales == nullptr) == (sizes == nullptr)) {
    ctx.fail(fmt::format("expected one of the inputs 'scales' and 'sizes', found {}",
                         scales != nullptr ? "both" : "neither"));
  }
  // Opset 18: the scales, sizes and roi may name only the dims in `axes`.
  std::vector<size_t> axes;
  if (node.has_attribute("axes")) {
    if (node.opset() < 18) ctx.fail("attribute 'axes' needs opset 18");
    std::vector<bool> seen(rank, false);
    for (int64_t a : node.attr_ints("axes", {})) {
      const size_t d = static_cast<size_t>(ctx.normalize_axis(a, static_cast<int64_t>(rank)));
      if (seen[d]) ctx.fail(fmt::format("attribute 'axes' names dim {} twice", d));
      seen[d] = true;
      axes.push_back(d);
    }
  } else {
    for (size_t d = 0; d < rank; ++d) axes.push_back(d);
  }
  const std::string policy = node.attr_string("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller") {
    ctx.fail(fmt::format(
        "attribute 'keep_aspect_ratio_policy' must be stretch, not_larger or not_smaller, found "
        "'{}'",
        policy));
  }
  Target t;
  if (sizes != nullptr) {
    const std::vector<Expr>& given = require_known(ctx, *sizes, "input 'sizes'");
    if (given.size() != axes.size()) {
      ctx.fail(fmt::format("expected {} sizes (one per resized dim), found {}", axes.size(),
                           given.size()));
    }
    std::vector<Expr> full = x.shape;
    for (size_t k = 0; k < axes.size(); ++k) full[axes[k]] = given[k];
    if (policy == "stretch") {
      t = target_from_sizes(ctx, x, full);
    } else {
      // One scale for every resized dim, the smallest (not_larger) or the largest of theirs;
      // sizes from it, rounded half up.
      std::optional<double> scale;
      for (size_t d : axes) {
        auto n = x.shape[d].as_integer(), m = full[d].as_integer();
        if (!n || !m || *n <= 0) {
          ctx.fail(
              fmt::format("keep_aspect_ratio_policy {} needs static, non-empty sizes; dim "
                          "{} is {} -> {}",
                          policy, d, x.shape[d].str(), full[d].str()));
        }
        const double r = static_cast<double>(*m) / static_cast<double>(*n);
        if (!scale || (policy == "not_larger" ? r < *scale : r > *scale)) scale = r;
      }
      t.from_scales = false;
      t.out = x.shape;
      t.scale.assign(rank, 1.0);
      for (size_t d : axes) {
        t.scale[d] = *scale;
        t.out[d] = Expr(
            static_cast<int64_t>(*scale * static_cast<double>(*x.shape[d].as_integer()) + 0.5));
      }
    }
  } else {
    std::vector<double> given = known_floats(ctx, *scales, "scales", axes.size());
    std::vector<double> full(rank, 1.0);
    for (size_t k = 0; k < axes.size(); ++k) full[axes[k]] = given[k];
    t = target_from_scales(ctx, x, full);
  }
  if (s.transform == Transform::kTfCropAndResize) {
    const TensorValue* roi = present(optional_input(inputs, 1));
    if (roi == nullptr) ctx.fail("coordinate_transformation_mode tf_crop_and_resize needs 'roi'");
    std::vector<double> given = known_floats(ctx, *roi, "roi", 2 * axes.size());
    t.roi.assign(rank, 0.0);
    t.roi.resize(2 * rank, 1.0);
    for (size_t k = 0; k < axes.size(); ++k) {
      t.roi[axes[k]] = given[k];
      t.roi[rank + axes[k]] = given[axes.size() + k];
    }
  }
  return {resize(ctx, x, s, t)};
}

std::vector<TensorValue> lower_upsample(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  std::vector<double> scales;
  if (node.opset() >= 9) {
    scales = known_floats(ctx, required_input(ctx, inputs, 1, "scales"), "scales", x.rank());
  } else {
    for (float f : node.attr_floats("scales", {})) scales.push_back(f);
  }
  return {resize(ctx, x, legacy_settings(ctx, node), target_from_scales(ctx, x, scales))};
}

}  // namespace

void register_resize_ops(Registry& registry) {
  registry.add("", "Resize", {lower_resize, 10, 19});
  registry.add("", "Upsample", {lower_upsample, 7, 9});
}

}  // namespace kiln::lower
