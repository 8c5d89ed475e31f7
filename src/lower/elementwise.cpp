/// Elementwise lowerings: arithmetic (Add, Sub, Mul, Div, Pow, Mod, Sum, Mean, Min, Max),
/// comparisons, logic, BitShift, Where, Cast and Identity, with numpy broadcasting (and the
/// `broadcast`/`axis` attributes of opsets before 7). Integer contents known at compile time
/// are folded through them (shape arithmetic of exported models), symbolically where the result
/// is expressible. Unary math and activations live in activation.cpp.
///
/// Tests: tests/unit/lower/suite_ops_test.cpp (ONNX node suite through the interpreter).

#include "lower/elementwise.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ir/interpreter_scalar.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using ir::LoopBody;
using ir::OpCode;
using ir::ValueId;
using sym::Expr;

namespace {

/// Float contents are folded only for this many elements: small values whose literals are worth
/// carrying (integers up to kMaxKnownElements).
constexpr int64_t kMaxKnownFloats = 8;

using Scalars = std::vector<ir::interp::Scalar>;

/// The contents of `v` as Scalars of its compute dtype when every element is a literal.
std::optional<Scalars> literal_contents(const TensorValue& v) {
  Scalars out;
  if (graph::is_floating(v.dtype)) {
    if (!v.known_float) return std::nullopt;
    for (double d : *v.known_float) out.push_back({d, 0});
    return out;
  }
  if (!v.known) return std::nullopt;
  for (const Expr& e : *v.known) {
    auto c = e.as_integer();
    if (!c) return std::nullopt;
    out.push_back({0, ir::interp::wrap_int(*c, v.dtype)});
  }
  return out;
}

/// For each element of the output (static shape), the flat position read in each input under
/// broadcasting; nullopt when a shape is symbolic or the output too large.
std::optional<std::vector<std::vector<size_t>>> broadcast_positions(
    const std::vector<const TensorValue*>& inputs, const std::vector<Expr>& shape, int64_t limit) {
  auto out_dims = static_shape(shape);
  if (!out_dims) return std::nullopt;
  int64_t count = 1;
  for (int64_t d : *out_dims) count *= d;
  if (count > limit) return std::nullopt;
  std::vector<std::vector<size_t>> positions(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    auto in_dims = static_shape(inputs[k]->shape);
    if (!in_dims) return std::nullopt;
    size_t skip = out_dims->size() - in_dims->size();
    for (int64_t flat = 0; flat < count; ++flat) {
      int64_t rest = flat, pos = 0, stride = 1;
      for (size_t d = out_dims->size(); d-- > skip;) {
        int64_t i = rest % (*out_dims)[d];
        rest /= (*out_dims)[d];
        int64_t in_size = (*in_dims)[d - skip];
        pos += (in_size == 1 ? 0 : i) * stride;
        stride *= in_size;
      }
      positions[k].push_back(static_cast<size_t>(pos));
    }
  }
  return positions;
}

ir::interp::Scalar fold_element(OpCode code, const Scalars& args, const std::vector<DType>& types,
                                DType out) {
  using namespace ir::interp;
  DType compute = compute_dtype(out);
  switch (code) {
    case OpCode::kCast:
      return cast(args[0], types[0], out);
    case OpCode::kWhere:
      return args[0].i != 0 ? args[1] : args[2];
    default:
      break;
  }
  if (ir::op_arity(code) == 1)
    return cast(apply_unary(code, args[0], types[0], compute), compute, out);
  // Variadic ops (Sum, Max, Min) fold left to right.
  Scalar acc = args[0];
  DType acc_type = types[0];
  for (size_t k = 1; k < args.size(); ++k) {
    DType result = ir::is_comparison(code) ? DType::kBool : compute_dtype(acc_type);
    acc = apply_binary(code, acc, acc_type, args[k], types[k], result);
    acc_type = result;
  }
  return cast(acc, acc_type, out);
}

/// Folds literal contents; false when some input is not made of literals.
bool fold_literals(TensorValue& value, const std::vector<const TensorValue*>& inputs, OpCode code) {
  bool float_out = graph::is_floating(value.dtype);
  std::vector<Scalars> contents;
  std::vector<DType> types;
  for (const TensorValue* in : inputs) {
    auto c = literal_contents(*in);
    if (!c) return false;
    contents.push_back(std::move(*c));
    types.push_back(compute_dtype(in->dtype));
  }
  auto positions =
      broadcast_positions(inputs, value.shape, float_out ? kMaxKnownFloats : kMaxKnownElements);
  if (!positions) return false;
  size_t count = positions->empty() ? 0 : (*positions)[0].size();
  std::vector<Expr> ints;
  std::vector<double> floats;
  for (size_t e = 0; e < count; ++e) {
    Scalars args;
    for (size_t k = 0; k < inputs.size(); ++k) args.push_back(contents[k][(*positions)[k][e]]);
    ir::interp::Scalar s = fold_element(code, args, types, value.dtype);
    if (float_out) {
      floats.push_back(s.f);
    } else {
      ints.emplace_back(s.i);
    }
  }
  if (float_out) {
    value.known_float = std::move(floats);
  } else {
    value.known = std::move(ints);
  }
  return true;
}

}  // namespace

bool dtype_in(DType dtype, unsigned allowed) {
  if (graph::is_floating(dtype)) return (allowed & kFloats) != 0;
  if (dtype == DType::kBool) return (allowed & kBools) != 0;
  if (graph::is_small_float(dtype) || graph::is_small_integer(dtype)) {
    return (allowed & kSmallTypes) != 0;
  }
  if (graph::is_integer(dtype)) {
    return (allowed & (graph::is_signed(dtype) ? kSignedInts : kUnsignedInts)) != 0;
  }
  return false;
}

void require_dtype(const LoweringContext& ctx, DType dtype, unsigned allowed,
                   const std::string& what) {
  if (dtype == DType::kString)
    ctx.fail(fmt::format("{} is a string tensor, which is not supported", what));
  if (!dtype_in(dtype, allowed)) {
    ctx.fail(fmt::format("{} has dtype {}, which this op does not accept", what,
                         graph::dtype_name(dtype)));
  }
}

DType common_dtype(const LoweringContext& ctx, const std::vector<const TensorValue*>& inputs) {
  DType dtype = inputs.at(0)->dtype;
  for (const TensorValue* in : inputs) {
    if (in->dtype != dtype) {
      ctx.fail(fmt::format("inputs must have one dtype, found {} and {}", graph::dtype_name(dtype),
                           graph::dtype_name(in->dtype)));
    }
  }
  return dtype;
}

namespace {

/// Whether `body` computes a transcendental function (exp, log, tanh, erf, sigmoid, pow, ...):
/// tens of operations per element, not one.
bool has_transcendental(const ir::LoopBody& body) {
  for (const ir::Op& op : body.ops()) {
    switch (op.code) {
      case OpCode::kExp:
      case OpCode::kLog:
      case OpCode::kTanh:
      case OpCode::kSigmoid:
      case OpCode::kErf:
      case OpCode::kPow:
      case OpCode::kSin:
      case OpCode::kCos:
      case OpCode::kTan:
      case OpCode::kAsin:
      case OpCode::kAcos:
      case OpCode::kAtan:
      case OpCode::kSinh:
      case OpCode::kCosh:
      case OpCode::kAsinh:
      case OpCode::kAcosh:
      case OpCode::kAtanh:
      case OpCode::kLog1p:
      case OpCode::kExpm1:
      case OpCode::kSoftplus:
        return true;
      default:
        break;
    }
  }
  return false;
}

}  // namespace

TensorValue broadcast_map(LoweringContext& ctx, const std::vector<const TensorValue*>& inputs,
                          DType out, const ElementFn& fn) {
  std::vector<std::vector<Expr>> shapes;
  for (const TensorValue* in : inputs) shapes.push_back(in->shape);
  std::vector<Expr> shape = ctx.broadcast_shapes(shapes);
  // A lazy input with a transcendental op that the output broadcasts over 16 or more times its
  // elements is stored first: inlined, each of its elements would be recomputed for every output
  // element it broadcasts to. A squeeze-and-excitation gate, Sigmoid of [N, C, 1, 1] scaling
  // [N, C, H, W] (EfficientNet's, MobileNetV3's), took a Sleef exp per pixel and channel so.
  std::vector<TensorValue> stored;
  stored.reserve(inputs.size());
  std::vector<const TensorValue*> reads = inputs;
  const std::optional<int64_t> out_numel = sym::product(shape).as_integer();
  for (const TensorValue*& in : reads) {
    const std::optional<int64_t> numel = sym::product(in->shape).as_integer();
    if (!out_numel || !numel || *numel * 16 > *out_numel || in->known || in->known_float ||
        ctx.as_buffer(*in) || !in->body || !has_transcendental(*in->body)) {
      continue;
    }
    stored.push_back(ctx.reads_channels_last(*in) ? ctx.realize_channels_last(*in, "broadcast")
                                                  : ctx.realize(*in, "broadcast"));
    in = &stored.back();
  }
  return ctx.pointwise(out, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    std::vector<ValueId> elements;
    for (const TensorValue* in : reads) {
      elements.push_back(
          ctx.load_at(body, *in, LoweringContext::broadcast_index(index, in->shape)));
    }
    return fn(body, elements);
  });
}

void fold_known(LoweringContext&, TensorValue& value, const std::vector<const TensorValue*>& inputs,
                OpCode code, const KnownFn& symbolic) {
  if (fold_literals(value, inputs, code)) return;
  if (!symbolic || graph::is_floating(value.dtype)) return;
  for (const TensorValue* in : inputs) {
    if (!in->known) return;
  }
  auto positions = broadcast_positions(inputs, value.shape, kMaxKnownElements);
  if (!positions) return;
  size_t count = positions->empty() ? 0 : (*positions)[0].size();
  std::vector<Expr> known;
  for (size_t e = 0; e < count; ++e) {
    std::vector<Expr> args;
    for (size_t k = 0; k < inputs.size(); ++k)
      args.push_back((*inputs[k]->known)[(*positions)[k][e]]);
    std::optional<Expr> r = symbolic(args);
    if (!r) return;
    known.push_back(*r);
  }
  value.known = std::move(known);
}

namespace {

// --- Legacy broadcasting (opsets 1-6) ------------------------------------------------------------

/// Before opset 7, binary ops broadcast B only when `broadcast` = 1, aligning B's dims with A's
/// starting at `axis` (default: right-aligned). Returns B reshaped so numpy rules apply.
TensorValue legacy_broadcast(LoweringContext& ctx, const graph::Node& node, const TensorValue& a,
                             const TensorValue& b) {
  if (node.opset() >= 7 || node.attr_int("broadcast", 0) == 0 || !node.has_attribute("axis")) {
    return b;
  }
  int64_t rank = static_cast<int64_t>(a.rank());
  int64_t axis = ctx.normalize_axis(node.attr_int("axis", 0), rank);
  int64_t b_rank = static_cast<int64_t>(b.rank());
  if (axis + b_rank > rank) ctx.fail("input B does not fit into A at the given axis");
  std::vector<Expr> shape(static_cast<size_t>(axis), Expr(1));
  shape.insert(shape.end(), b.shape.begin(), b.shape.end());
  shape.resize(static_cast<size_t>(rank), Expr(1));
  return reshape_view(ctx, b, shape);
}

// --- Symbolic rules for known integers -------------------------------------------------------

bool provably_nonnegative(LoweringContext& ctx, const Expr& e) {
  return ctx.analyzer().statically_known_nonnegative(e);
}

bool provably_positive(LoweringContext& ctx, const Expr& e) {
  return ctx.analyzer().statically_known_leq(Expr(1), e);
}

/// Comparisons of known integers: decided when the analyzer can prove the answer.
KnownFn comparison_rule(LoweringContext& ctx, OpCode code) {
  auto lt = [&ctx](const Expr& x, const Expr& y) {
    return ctx.analyzer().statically_known_lt(x, y);
  };
  auto le = [&ctx](const Expr& x, const Expr& y) {
    return ctx.analyzer().statically_known_leq(x, y);
  };
  auto decide = [](bool yes, bool no) -> std::optional<Expr> {
    if (yes) return Expr(1);
    if (no) return Expr(0);
    return std::nullopt;
  };
  switch (code) {
    case OpCode::kEq:
      return [=](const std::vector<Expr>& a) {
        return decide(a[0] == a[1], lt(a[0], a[1]) || lt(a[1], a[0]));
      };
    case OpCode::kLt:
      return [=](const std::vector<Expr>& a) { return decide(lt(a[0], a[1]), le(a[1], a[0])); };
    case OpCode::kLe:
      return [=](const std::vector<Expr>& a) { return decide(le(a[0], a[1]), lt(a[1], a[0])); };
    case OpCode::kGt:
      return [=](const std::vector<Expr>& a) { return decide(lt(a[1], a[0]), le(a[0], a[1])); };
    case OpCode::kGe:
      return [=](const std::vector<Expr>& a) { return decide(le(a[1], a[0]), lt(a[0], a[1])); };
    default:
      return {};
  }
}

KnownFn known_rule(LoweringContext& ctx, OpCode code) {
  switch (code) {
    case OpCode::kAdd:
      return [](const std::vector<Expr>& a) { return a[0] + a[1]; };
    case OpCode::kSub:
      return [](const std::vector<Expr>& a) { return a[0] - a[1]; };
    case OpCode::kMul:
      return [](const std::vector<Expr>& a) { return a[0] * a[1]; };
    case OpCode::kMinimum:
      return [](const std::vector<Expr>& a) { return sym::min(a[0], a[1]); };
    case OpCode::kMaximum:
      return [](const std::vector<Expr>& a) { return sym::max(a[0], a[1]); };
    case OpCode::kDiv:
      // Truncating division equals floor division only for nonnegative operands.
      return [&ctx](const std::vector<Expr>& a) -> std::optional<Expr> {
        if (!provably_nonnegative(ctx, a[0]) || !provably_positive(ctx, a[1])) return std::nullopt;
        return sym::floor_div(a[0], a[1]);
      };
    case OpCode::kFloorMod:
      return [&ctx](const std::vector<Expr>& a) -> std::optional<Expr> {
        if (!provably_positive(ctx, a[1])) return std::nullopt;
        return sym::mod(a[0], a[1]);
      };
    case OpCode::kFmod:
      return [&ctx](const std::vector<Expr>& a) -> std::optional<Expr> {
        if (!provably_nonnegative(ctx, a[0]) || !provably_positive(ctx, a[1])) return std::nullopt;
        return sym::mod(a[0], a[1]);
      };
    default:
      return comparison_rule(ctx, code);
  }
}

// --- Binary and variadic ops -------------------------------------------------------------------

/// A binary op with numpy broadcasting: both inputs of one dtype from `allowed`.
LowerFn binary_op(OpCode code, unsigned allowed) {
  return [code, allowed](LoweringContext& ctx, const graph::Node& node,
                         const LowerInputs& inputs) -> std::vector<TensorValue> {
    const TensorValue& a = required_input(ctx, inputs, 0, "A");
    TensorValue b = legacy_broadcast(ctx, node, a, required_input(ctx, inputs, 1, "B"));
    DType dtype = common_dtype(ctx, {&a, &b});
    require_dtype(ctx, dtype, allowed, "input A");
    DType out = ir::is_comparison(code) ? DType::kBool : dtype;
    TensorValue value =
        broadcast_map(ctx, {&a, &b}, out, [code](LoopBody& body, const std::vector<ValueId>& e) {
          return body.binary(code, e[0], e[1]);
        });
    fold_known(ctx, value, {&a, &b}, code, known_rule(ctx, code));
    return {value};
  };
}

std::vector<TensorValue> lower_pow(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  TensorValue y = legacy_broadcast(ctx, node, x, required_input(ctx, inputs, 1, "Y"));
  require_dtype(ctx, x.dtype, kNumbers, "input X");
  require_dtype(ctx, y.dtype, kNumbers, "input Y");
  if (node.opset() < 12 && x.dtype != y.dtype) common_dtype(ctx, {&x, &y});
  // The result has the base's type whatever the exponent's (ONNX Pow-12 and later).
  TensorValue value =
      broadcast_map(ctx, {&x, &y}, x.dtype, [](LoopBody& body, const std::vector<ValueId>& e) {
        return body.binary(OpCode::kPow, e[0], e[1]);
      });
  fold_known(ctx, value, {&x, &y}, OpCode::kPow);
  return {value};
}

std::vector<TensorValue> lower_mod(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  bool fmod = node.attr_int("fmod", 0) != 0;
  const TensorValue& a = required_input(ctx, inputs, 0, "A");
  if (graph::is_floating(a.dtype) && !fmod) {
    ctx.fail("fmod must be 1 for floating-point inputs (ONNX Mod)");
  }
  return binary_op(fmod ? OpCode::kFmod : OpCode::kFloorMod, kNumbers)(ctx, node, inputs);
}

std::vector<TensorValue> lower_bit_shift(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  std::string direction = node.attr_string("direction", "");
  if (direction != "LEFT" && direction != "RIGHT") {
    ctx.fail(fmt::format("attribute 'direction' must be LEFT or RIGHT, found '{}'", direction));
  }
  return binary_op(direction == "LEFT" ? OpCode::kShl : OpCode::kShr, kUnsignedInts)(ctx, node,
                                                                                     inputs);
}

/// Present inputs of a variadic op; fails when there are none.
std::vector<const TensorValue*> variadic_inputs(const LoweringContext& ctx,
                                                const LowerInputs& inputs) {
  std::vector<const TensorValue*> present;
  for (const auto& in : inputs) {
    if (in) present.push_back(&*in);
  }
  if (present.empty()) ctx.fail("expected at least one input, found none");
  return present;
}

/// Sum, Max, Min: a left fold of `code` over all inputs, broadcast together.
LowerFn variadic_op(OpCode code, unsigned allowed) {
  return [code, allowed](LoweringContext& ctx, const graph::Node&,
                         const LowerInputs& inputs) -> std::vector<TensorValue> {
    std::vector<const TensorValue*> present = variadic_inputs(ctx, inputs);
    DType dtype = common_dtype(ctx, present);
    require_dtype(ctx, dtype, allowed, "input 0");
    TensorValue value =
        broadcast_map(ctx, present, dtype, [code](LoopBody& body, const std::vector<ValueId>& e) {
          ValueId acc = e[0];
          for (size_t k = 1; k < e.size(); ++k) acc = body.binary(code, acc, e[k]);
          return acc;
        });
    fold_known(ctx, value, present, code, present.size() == 2 ? known_rule(ctx, code) : KnownFn{});
    return {value};
  };
}

std::vector<TensorValue> lower_mean(LoweringContext& ctx, const graph::Node&,
                                    const LowerInputs& inputs) {
  std::vector<const TensorValue*> present = variadic_inputs(ctx, inputs);
  DType dtype = common_dtype(ctx, present);
  require_dtype(ctx, dtype, kFloats, "input 0");
  double count = static_cast<double>(present.size());
  return {
      broadcast_map(ctx, present, dtype, [count](LoopBody& body, const std::vector<ValueId>& e) {
        ValueId acc = e[0];
        for (size_t k = 1; k < e.size(); ++k) acc = body.binary(OpCode::kAdd, acc, e[k]);
        return body.binary(OpCode::kDiv, acc, body.constant(count, body.dtype(acc)));
      })};
}

// --- Logic, Where, Cast, Identity ----------------------------------------------------------------

std::vector<TensorValue> lower_bitwise_not(LoweringContext& ctx, const graph::Node&,
                                           const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, kInts, "input X");
  return {broadcast_map(ctx, {&x}, x.dtype, [](LoopBody& body, const std::vector<ValueId>& e) {
    return body.unary(OpCode::kBitNot, e[0]);
  })};
}

std::vector<TensorValue> lower_not(LoweringContext& ctx, const graph::Node&,
                                   const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, kBools, "input X");
  TensorValue value = broadcast_map(
      ctx, {&x}, DType::kBool,
      [](LoopBody& body, const std::vector<ValueId>& e) { return body.unary(OpCode::kNot, e[0]); });
  fold_known(ctx, value, {&x}, OpCode::kNot);
  return {value};
}

std::vector<TensorValue> lower_where(LoweringContext& ctx, const graph::Node&,
                                     const LowerInputs& inputs) {
  const TensorValue& cond = required_input(ctx, inputs, 0, "condition");
  const TensorValue& x = required_input(ctx, inputs, 1, "X");
  const TensorValue& y = required_input(ctx, inputs, 2, "Y");
  require_dtype(ctx, cond.dtype, kBools, "input condition");
  DType dtype = common_dtype(ctx, {&x, &y});
  require_dtype(ctx, dtype, kAllTypes, "input X");
  TensorValue value = broadcast_map(
      ctx, {&cond, &x, &y}, dtype,
      [](LoopBody& body, const std::vector<ValueId>& e) { return body.where(e[0], e[1], e[2]); });
  fold_known(ctx, value, {&cond, &x, &y}, OpCode::kWhere,
             [](const std::vector<Expr>& a) -> std::optional<Expr> {
               auto c = a[0].as_integer();
               if (!c) return std::nullopt;
               return *c != 0 ? a[1] : a[2];
             });
  return {value};
}

/// The target dtype of Cast: an int attribute from opset 6, a type name before.
DType cast_target(const LoweringContext& ctx, const graph::Node& node) {
  auto it = node.attributes().find("to");
  if (it == node.attributes().end()) ctx.fail("missing attribute 'to'");
  int64_t code = -1;
  if (const auto* i = std::get_if<int64_t>(&it->second)) code = *i;
  if (const auto* s = std::get_if<std::string>(&it->second)) {
    static const std::map<std::string, int64_t> kNames = {
        {"FLOAT", 1},   {"UINT8", 2},   {"INT8", 3},    {"UINT16", 4},   {"INT16", 5},
        {"INT32", 6},   {"INT64", 7},   {"STRING", 8},  {"BOOL", 9},     {"FLOAT16", 10},
        {"DOUBLE", 11}, {"UINT32", 12}, {"UINT64", 13}, {"BFLOAT16", 16}};
    auto name = kNames.find(*s);
    if (name != kNames.end()) code = name->second;
  }
  std::optional<DType> dtype = graph::dtype_from_onnx(static_cast<int32_t>(code));
  if (!dtype) ctx.fail("attribute 'to' names a type Kiln does not support");
  if (*dtype == DType::kString) ctx.fail("casts to string are not supported");
  return *dtype;
}

std::vector<TensorValue> lower_cast(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  require_dtype(ctx, x.dtype, kAllTypes, "input 'input'");
  return {cast_value(ctx, node, x, cast_target(ctx, node))};
}

/// BitCast-26: the input's bits read as type `to`, of the same bit width (float32 <-> int32,
/// float16 <-> int16, bool <-> uint8, int4 <-> uint4, ...), elementwise through the loop IR.
std::vector<TensorValue> lower_bitcast(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  require_dtype(ctx, x.dtype, kAllTypes, "input 'input'");
  const DType from = x.dtype, to = cast_target(ctx, node);
  if (graph::dtype_packed_bits(from) != graph::dtype_packed_bits(to)) {
    ctx.fail(
        fmt::format("cannot reinterpret {} ({} bits) as {} ({} bits): BitCast needs types "
                    "of the same bit width",
                    graph::dtype_name(from), graph::dtype_packed_bits(from), graph::dtype_name(to),
                    graph::dtype_packed_bits(to)));
  }
  return {broadcast_map(ctx, {&x}, to, [from, to](LoopBody& body, const std::vector<ValueId>& e) {
    return body.bitcast(e[0], from, to);
  })};
}

std::vector<TensorValue> lower_identity(LoweringContext& ctx, const graph::Node&,
                                        const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "input");
  require_dtype(ctx, x.dtype, kAllTypes, "input 'input'");
  return {x};
}

void register_binary_ops(Registry& r) {
  r.add("", "Add", {binary_op(OpCode::kAdd, kNumbers), 1, 17});
  r.add("", "Sub", {binary_op(OpCode::kSub, kNumbers), 1, 17});
  r.add("", "Mul", {binary_op(OpCode::kMul, kNumbers), 1, 17});
  r.add("", "Div", {binary_op(OpCode::kDiv, kNumbers), 1, 17});
  r.add("", "Pow", {lower_pow, 1, 17});
  r.add("", "Mod", {lower_mod, 10, 17});
  r.add("", "BitShift", {lower_bit_shift, 11, 17});
  r.add("", "Equal", {binary_op(OpCode::kEq, kAllTypes), 1, 17});
  r.add("", "Less", {binary_op(OpCode::kLt, kNumbers), 1, 17});
  r.add("", "Greater", {binary_op(OpCode::kGt, kNumbers), 1, 17});
  r.add("", "LessOrEqual", {binary_op(OpCode::kLe, kNumbers), 12, 17});
  r.add("", "GreaterOrEqual", {binary_op(OpCode::kGe, kNumbers), 12, 17});
  r.add("", "And", {binary_op(OpCode::kAnd, kBools), 1, 17});
  r.add("", "Or", {binary_op(OpCode::kOr, kBools), 1, 17});
  r.add("", "Xor", {binary_op(OpCode::kXor, kBools), 1, 17});
  r.add("", "BitwiseAnd", {binary_op(OpCode::kBitAnd, kInts), 18, 18});
  r.add("", "BitwiseOr", {binary_op(OpCode::kBitOr, kInts), 18, 18});
  r.add("", "BitwiseXor", {binary_op(OpCode::kBitXor, kInts), 18, 18});
}

}  // namespace

namespace {

/// v (float32) clamped to [-max, max] of `to`; NaN passes through (comparisons with it are
/// false) to become the type's NaN.
ValueId clamp_to_small_float(LoopBody& body, ValueId v, DType to) {
  const double max = graph::small_float_max(to);
  ValueId hi = body.constant(max, DType::kFloat32), lo = body.constant(-max, DType::kFloat32);
  v = body.where(body.binary(OpCode::kGt, v, hi), hi, v);
  return body.where(body.binary(OpCode::kLt, v, lo), lo, v);
}

}  // namespace

TensorValue cast_value(LoweringContext& ctx, const graph::Node& node, const TensorValue& x,
                       DType to) {
  if (to == DType::kFloat8E8M0) {
    std::string mode = node.attr_string("round_mode", "up");
    if (mode != "up") {
      ctx.fail(
          fmt::format("round_mode '{}' of casts to float8e8m0 is not supported (expected "
                      "'up', the default)",
                      mode));
    }
  }
  if (!graph::is_small_float(to) && !graph::is_small_integer(to)) {
    TensorValue value = broadcast_map(
        ctx, {&x}, to,
        [to](LoopBody& body, const std::vector<ValueId>& e) { return body.cast(e[0], to); });
    bool int_to_int = graph::is_integer(x.dtype) && graph::is_integer(to);
    fold_known(ctx, value, {&x}, OpCode::kCast,
               int_to_int ? KnownFn([](const std::vector<Expr>& a) { return std::optional(a[0]); })
                          : KnownFn{});
    return value;
  }
  // Cast-19's saturate (default 1) clamps float8 results to the largest finite value, infinities
  // included; float4e2m1 stores always saturate.
  const bool saturate =
      graph::is_small_float(to) && to != DType::kFloat4E2M1 && node.attr_int("saturate", 1) != 0;
  TensorValue value =
      broadcast_map(ctx, {&x}, to, [to, saturate](LoopBody& body, const std::vector<ValueId>& e) {
        ValueId v = body.cast(e[0], to);
        return saturate ? clamp_to_small_float(body, v, to) : v;
      });
  // The loop IR computes these types in float32 / int32 and rounds (or wraps) them only where a
  // buffer stores them: materialize, so that consumers see the stored value.
  return ctx.realize(value, "a cast to an 8-, 4- or 2-bit type rounds where it is stored");
}

void register_elementwise_ops(Registry& registry) {
  register_binary_ops(registry);
  registry.add("", "Sum", {variadic_op(OpCode::kAdd, kFloats), 1, 17});
  registry.add("", "Max", {variadic_op(OpCode::kMaximum, kNumbers), 1, 17});
  registry.add("", "Min", {variadic_op(OpCode::kMinimum, kNumbers), 1, 17});
  registry.add("", "Mean", {lower_mean, 1, 17});
  registry.add("", "Not", {lower_not, 1, 17});
  registry.add("", "BitwiseNot", {lower_bitwise_not, 18, 18});
  registry.add("", "Where", {lower_where, 9, 17});
  registry.add("", "Cast", {lower_cast, 1, 25});
  registry.add("", "BitCast", {lower_bitcast, 26, 26});
  registry.add("", "Identity", {lower_identity, 1, 17});
  register_activation_ops(registry);
}

}  // namespace kiln::lower
