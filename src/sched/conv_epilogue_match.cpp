#include "sched/conv_epilogue_match.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sched/template_epilogue.h"

namespace kiln::sched {

using ir::OpCode;
using ir::ValueId;

namespace {

/// An activation fused into a convolution (ir::ConvCall::activation, alpha, beta).
struct Activation {
  ir::ConvActivation kind = ir::ConvActivation::kNone;
  double alpha = 0, beta = 0;
};

/// `v`'s tree as text: "x" for the activation's input (any of the values `x`: the product may be
/// loaded once per use, as x * Sigmoid(x) does), "c" for a constant (its value appended to
/// `constants`, in the order the text names them), op(operands) for the ops an activation is
/// made of. Empty when it reads anything else.
std::string tree_text(const ir::LoopBody& body, ValueId v, const std::set<ValueId>& x,
                      std::vector<double>& constants, int depth = 0) {
  if (x.count(v)) return "x";
  if (v == ir::kNoValue || depth > 12) return "";
  const ir::Op& op = body.op(v);
  // Float32 values, but for the comparison (bool) a Where's condition is.
  if (op.dtype != (op.code == OpCode::kLt ? graph::DType::kBool : graph::DType::kFloat32))
    return "";
  if (op.code == OpCode::kConstant) {
    if (!std::isfinite(op.float_value)) return "";
    constants.push_back(op.float_value);
    return "c";
  }
  switch (op.code) {
    case OpCode::kRelu:
    case OpCode::kSigmoid:
    case OpCode::kTanh:
    case OpCode::kErf:
    case OpCode::kExpm1:
    case OpCode::kAdd:
    case OpCode::kMul:
    case OpCode::kMinimum:
    case OpCode::kMaximum:
    case OpCode::kWhere:
    case OpCode::kLt:
      break;
    default:
      return "";
  }
  std::string text(ir::op_name(op.code));
  text += "(";
  for (int k = 0; k < ir::op_arity(op.code); ++k) {
    const ValueId operand = op.operands[static_cast<size_t>(k)];
    if (op.code == OpCode::kWhere && k == 0) {  // the condition: x < c
      const ir::Op& cond = body.op(operand);
      if (cond.code != OpCode::kLt) return "";
    }
    const std::string sub = tree_text(body, operand, x, constants, depth + 1);
    if (sub.empty()) return "";
    text += (k > 0 ? "," : "") + sub;
  }
  return text + ")";
}

/// Whether float32 constants `a` and `b` agree (the lowering rounds double constants to float).
bool same_constant(double a, double b) {
  return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b));
}

/// The activation the value `stored` of `body` is of the value `x` (any of them), recognized by its
/// tree of ops over `x` and float32 constants in the forms lower/activation.cpp builds (Relu,
/// Sigmoid, Tanh, Clip, LeakyRelu, Elu, Gelu in both forms; Swish and SiLU as x * Sigmoid(alpha
/// x)); nullopt for any other tree. HardSigmoid and HardSwish have no pointwise mode in cuDNN and
/// stay kernels of their own.
std::optional<Activation> match_activation(const ir::LoopBody& body, ValueId stored,
                                           const std::set<ValueId>& x) {
  using ir::ConvActivation;
  std::vector<double> c;
  const std::string t = tree_text(body, stored, x, c);
  if (t.empty()) return std::nullopt;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // Relu(Relu(z)) is Relu(z).
  if (t == "relu(x)" || t == "relu(relu(x))") return Activation{ConvActivation::kRelu};
  if (t == "sigmoid(x)") return Activation{ConvActivation::kSigmoid};
  if (t == "tanh(x)") return Activation{ConvActivation::kTanh};
  // Clip before opset 11 (maximum then minimum), with bounds from inputs (either alone), and
  // HardSigmoid-style clamps (minimum then maximum): the same where lo <= hi.
  std::optional<std::pair<double, double>> clip;
  if (t == "minimum(maximum(x,c),c)") clip = {c[0], c[1]};
  if (t == "maximum(minimum(x,c),c)") clip = {c[1], c[0]};
  if (t == "maximum(x,c)") clip = {c[0], kInf};
  if (t == "minimum(x,c)") clip = {-kInf, c[0]};
  if (clip) {
    if (clip->first > clip->second) return std::nullopt;
    // The libraries take finite bounds: float32's range stands for an open side.
    const double big = std::numeric_limits<float>::max();
    return Activation{ConvActivation::kClip, std::max(clip->first, -big),
                      std::min(clip->second, big)};
  }
  if (t == "where(lt(x,c),mul(x,c),x)" && c[0] == 0)
    return Activation{ConvActivation::kLeakyRelu, c[1]};
  if (t == "where(lt(x,c),mul(expm1(x),c),x)" && c[0] == 0)
    return Activation{ConvActivation::kElu, c[1]};
  if (t == "mul(mul(x,c),add(c,erf(mul(x,c))))" && same_constant(c[0], 0.5) &&
      same_constant(c[1], 1) && same_constant(c[2], M_SQRT1_2)) {
    return Activation{ConvActivation::kGelu};
  }
  if (t == "mul(mul(x,c),add(c,tanh(mul(add(x,mul(mul(mul(x,x),x),c)),c))))" &&
      same_constant(c[0], 0.5) && same_constant(c[1], 1) && same_constant(c[2], 0.044715) &&
      same_constant(c[3], std::sqrt(2.0 / M_PI))) {
    return Activation{ConvActivation::kGeluTanh};
  }
  if (t == "mul(x,sigmoid(x))") return Activation{ConvActivation::kSwish, 1.0};
  if (t == "mul(x,sigmoid(mul(x,c)))") return Activation{ConvActivation::kSwish, c[0]};
  return std::nullopt;
}

}  // namespace

std::optional<ConvEpilogueMatch> match_conv_epilogue(const ir::Program& program,
                                                     const ir::Buffer& product,
                                                     const ir::Buffer& consumer) {
  const graph::DType dtype = product.dtype;
  if (consumer.kind != ir::BufferKind::kComputed || consumer.is_reduction() ||
      consumer.dtype != dtype || consumer.layout.sizes != product.layout.sizes ||
      !consumer.layout.is_contiguous() || !product.layout.is_contiguous() ||
      consumer.body.sizes() != product.layout.sizes) {
    return std::nullopt;
  }
  const ir::LoopBody& body = consumer.body;
  const sym::Expr identity = elementwise_index(program, product.layout, body);
  const sym::Expr stored_at = elementwise_index(program, consumer.layout, body);
  // The product's loads (one, or one per use without a residual), the residual's load and
  // buffer, the Add of the two, the stored value.
  std::set<ValueId> loads;
  std::optional<ValueId> loaded, residual, added, stored;
  const ir::Buffer* residual_buffer = nullptr;
  for (size_t id = 0; id < body.ops().size(); ++id) {
    const auto v = static_cast<ValueId>(id);
    const ir::Op& op = body.op(v);
    if (stored) return std::nullopt;
    switch (op.code) {
      case OpCode::kLoad: {
        if (op.mask != ir::kNoValue || op.buffer_dtype != dtype ||
            op.dtype != graph::DType::kFloat32) {
          return std::nullopt;
        }
        if (op.buffer == product.name && op.index == identity) {
          if (!loaded) loaded = v;
          loads.insert(v);
          break;
        }
        // Any other buffer of the product's sizes, contiguous, read at the element the
        // iteration computes: the residual.
        const ir::Buffer* r = program.find(op.buffer);
        if (residual || r == nullptr || op.buffer == product.name || r->dtype != dtype ||
            r->layout.sizes != product.layout.sizes || !r->layout.is_contiguous() ||
            op.index != elementwise_index(program, r->layout, body)) {
          return std::nullopt;
        }
        residual = v;
        residual_buffer = r;
        break;
      }
      case OpCode::kStore:
        if (op.index != stored_at) return std::nullopt;
        stored = op.operands[0];
        break;
      default:
        // product + residual, in either order, once: the activation's input.
        if (op.code == OpCode::kAdd && loaded && residual && !added &&
            ((op.operands[0] == *loaded && op.operands[1] == *residual) ||
             (op.operands[1] == *loaded && op.operands[0] == *residual))) {
          added = v;
        }
        // Anything else is checked below as part of the activation's tree (a value the stored
        // one does not use is left out).
        break;
    }
  }
  if (!stored || !loaded || (residual && (!added || loads.size() > 1))) return std::nullopt;
  const ValueId input = added ? *added : *loaded;
  ConvEpilogueMatch match;
  match.residual = added ? residual_buffer : nullptr;
  if (!(added ? *stored == input : loads.count(*stored) > 0)) {
    std::optional<Activation> act =
        match_activation(body, *stored, added ? std::set<ValueId>{input} : loads);
    if (!act) return std::nullopt;
    match.activation = act->kind;
    match.alpha = act->alpha;
    match.beta = act->beta;
  } else if (!added) {
    return std::nullopt;  // the product stored unchanged
  }
  return match;
}

}  // namespace kiln::sched
