/// Lowerings of training-time ops that have an inference meaning: NegativeLogLikelihoodLoss and
/// SoftmaxCrossEntropyLoss (LogSoftmax over the class axis, then the same NLL), which gather the
/// class picked by the target at every position, weight it, and reduce (none, sum, or mean
/// weighted by the picked classes' weights), all in the loop IR so the gather fuses into the
/// reduction; Dropout, the identity at inference (a random mask in training mode is refused); and
/// the optimizer updates of ai.onnx.preview.training (Adagrad, Momentum incl. Nesterov, Adam),
/// which are elementwise formulas over each optimized tensor and its state.
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <cstdint>
#include <functional>
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

enum class LossReduction { kNone, kSum, kMean };

LossReduction loss_reduction(const LoweringContext& ctx, const graph::Node& node) {
  std::string r = node.attr_string("reduction", "mean");
  if (r == "none") return LossReduction::kNone;
  if (r == "sum") return LossReduction::kSum;
  if (r == "mean") return LossReduction::kMean;
  ctx.fail(fmt::format("attribute 'reduction' must be none, sum or mean, found '{}'", r));
}

/// The NLL of `log_prob` [N, C, d...] (already log-probabilities) at `target` [N, d...]:
/// loss[n, d] = -log_prob[n, target[n, d], d] * weight[target[n, d]], 0 where the target is
/// `ignored`; then reduced.
TensorValue nll(LoweringContext& ctx, const TensorValue& log_prob, const TensorValue& raw_target,
                const TensorValue* weight, LossReduction reduction,
                std::optional<int64_t> ignored) {
  if (log_prob.rank() < 2) {
    ctx.fail(fmt::format("expected an input of rank >= 2 ([N, C, ...]), found rank {}",
                         log_prob.rank()));
  }
  if (raw_target.rank() != log_prob.rank() - 1) {
    ctx.fail(fmt::format("expected a target of rank {} ([N, ...]), found rank {}",
                         log_prob.rank() - 1, raw_target.rank()));
  }
  if (weight != nullptr && weight->rank() != 1) {
    ctx.fail(fmt::format("expected a weight of rank 1 ([C]), found rank {}", weight->rank()));
  }
  const Expr classes = log_prob.shape[1];
  TensorValue target = checked_indices(ctx, raw_target, classes, ignored);
  const DType dtype = log_prob.dtype;
  const DType acc = compute_dtype(dtype);

  // The picked class's weight (1 without weights), 0 where the target is ignored.
  auto picked_weight = [&](LoopBody& body, const std::vector<Expr>& index, ValueId* row) {
    ValueId t = body.cast(ctx.load_at(body, target, index), DType::kInt64);
    ValueId skip = ir::kNoValue;
    if (ignored) {
      skip =
          body.binary(OpCode::kEq, t, body.constant(static_cast<double>(*ignored), DType::kInt64));
      t = body.where(skip, body.constant(0, DType::kInt64), t);
    }
    *row = body.indirect(t, classes);
    ValueId w = weight != nullptr
                    ? body.cast(ctx.load_at(body, *weight, {body.op(*row).symbol}), acc)
                    : body.constant(1, acc);
    if (skip != ir::kNoValue) w = body.where(skip, body.constant(0, acc), w);
    return w;
  };
  auto element_loss = [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId row = ir::kNoValue;
    ValueId w = picked_weight(body, index, &row);
    std::vector<Expr> at = {index[0], body.op(row).symbol};
    at.insert(at.end(), index.begin() + 1, index.end());
    ValueId x = body.cast(ctx.load_at(body, log_prob, at), acc);
    return body.binary(OpCode::kMul, body.unary(OpCode::kNeg, x), w);
  };

  if (reduction == LossReduction::kNone) {
    return ctx.pointwise(dtype, target.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
      return body.cast(element_loss(body, i), dtype);
    });
  }
  TensorValue sum =
      ctx.reduction(acc, {}, target.shape, ReductionType::kSum,
                    [&](LoopBody& body, const std::vector<Expr>&, const std::vector<Expr>& r) {
                      return element_loss(body, r);
                    });
  if (reduction == LossReduction::kSum) {
    return ctx.pointwise(dtype, {}, [&](LoopBody& body, const std::vector<Expr>&) {
      return body.cast(ctx.load_at(body, sum, {}), dtype);
    });
  }
  TensorValue total_weight =
      ctx.reduction(acc, {}, target.shape, ReductionType::kSum,
                    [&](LoopBody& body, const std::vector<Expr>&, const std::vector<Expr>& r) {
                      ValueId row = ir::kNoValue;
                      return picked_weight(body, r, &row);
                    });
  return ctx.pointwise(dtype, {}, [&](LoopBody& body, const std::vector<Expr>&) {
    ValueId s = ctx.load_at(body, sum, {});
    return body.cast(body.binary(OpCode::kDiv, s, ctx.load_at(body, total_weight, {})), dtype);
  });
}

std::optional<int64_t> ignore_index(const graph::Node& node) {
  if (!node.has_attribute("ignore_index")) return std::nullopt;
  return node.attr_int("ignore_index", 0);
}

std::vector<TensorValue> lower_nll(LoweringContext& ctx, const graph::Node& node,
                                   const LowerInputs& inputs) {
  const TensorValue& input = required_input(ctx, inputs, 0, "input");
  const TensorValue& target = required_input(ctx, inputs, 1, "target");
  require_dtype(ctx, input.dtype, kFloats, "input 'input'");
  return {nll(ctx, input, target, optional_input(inputs, 2), loss_reduction(ctx, node),
              ignore_index(node))};
}

std::vector<TensorValue> lower_softmax_cross_entropy(LoweringContext& ctx, const graph::Node& node,
                                                     const LowerInputs& inputs) {
  const TensorValue& scores = required_input(ctx, inputs, 0, "scores");
  const TensorValue& labels = required_input(ctx, inputs, 1, "labels");
  require_dtype(ctx, scores.dtype, kFloats, "input 'scores'");
  if (scores.rank() < 2) {
    ctx.fail(
        fmt::format("expected scores of rank >= 2 ([N, C, ...]), found rank {}", scores.rank()));
  }
  // log_softmax over the class axis (1): x - max - log(sum(exp(x - max))).
  const DType acc = compute_dtype(scores.dtype);
  std::vector<Expr> keep_shape = scores.shape;
  keep_shape[1] = Expr(1);
  auto with_class = [](const std::vector<Expr>& index, const Expr& c) {
    std::vector<Expr> at = index;
    at[1] = c;
    return at;
  };
  TensorValue max = ctx.reduction(
      acc, keep_shape, {scores.shape[1]}, ReductionType::kMax,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        return body.cast(ctx.load_at(body, scores, with_class(index, r[0])), acc);
      });
  auto shifted = [&](LoopBody& body, const std::vector<Expr>& index) {
    ValueId x = body.cast(ctx.load_at(body, scores, index), acc);
    return body.binary(OpCode::kSub, x, ctx.load_at(body, max, with_class(index, Expr(0))));
  };
  TensorValue sum = ctx.reduction(
      acc, keep_shape, {scores.shape[1]}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        return body.unary(OpCode::kExp, shifted(body, with_class(index, r[0])));
      });
  TensorValue log_prob =
      ctx.pointwise(scores.dtype, scores.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
        ValueId s = ctx.load_at(body, sum, with_class(i, Expr(0)));
        return body.cast(body.binary(OpCode::kSub, shifted(body, i), body.unary(OpCode::kLog, s)),
                         scores.dtype);
      });
  bool wants_log_prob = node.outputs().size() > 1 && node.output(1) != nullptr;
  // Both outputs read the log-probabilities: materialize them once.
  if (wants_log_prob) log_prob = ctx.realize(log_prob, "loss and log_prob outputs");
  TensorValue loss = nll(ctx, log_prob, labels, optional_input(inputs, 2),
                         loss_reduction(ctx, node), ignore_index(node));
  if (!wants_log_prob) return {loss};
  return {loss, log_prob};
}

std::vector<TensorValue> lower_dropout(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const TensorValue& data = required_input(ctx, inputs, 0, "data");
  // Before opset 12 ratio is an attribute and there is no training mode (opset < 7: is_test).
  bool training = node.opset() < 7 && node.attr_int("is_test", 0) == 0;
  std::optional<double> ratio = node.attr_float("ratio", 0.5f);
  if (node.opset() >= 12) {
    const TensorValue* r = optional_input(inputs, 1);
    ratio = r != nullptr ? known_scalar(*r) : 0.5;
    const TensorValue* mode = optional_input(inputs, 2);
    training = false;
    if (mode != nullptr) {
      std::optional<double> m = known_scalar(*mode);
      if (!m) ctx.fail("input 'training_mode' must be known when compiling");
      training = *m != 0;
    }
  }
  if (training && ratio != 0.0) {
    ctx.fail(
        "training mode with a non-zero ratio draws a random mask; compile the model for "
        "inference (training_mode = 0)");
  }
  std::vector<TensorValue> outputs = {data};
  if (node.outputs().size() > 1 && node.output(1) != nullptr) {
    DType mask_dtype = node.opset() >= 10 ? DType::kBool : data.dtype;
    outputs.push_back(ctx.pointwise(
        mask_dtype, data.shape,
        [&](LoopBody& body, const std::vector<Expr>&) { return body.constant(1, mask_dtype); }));
  }
  return outputs;
}

// --- Optimizer updates (ai.onnx.preview.training) ---------------------------------------------

/// The inputs of an optimizer: R (learning rate), T (update count), then `groups` lists of n
/// tensors each (X..., G..., state...). Returns n.
size_t optimized_count(const LoweringContext& ctx, const LowerInputs& inputs, size_t groups) {
  if (inputs.size() < 2 || (inputs.size() - 2) % groups != 0 || inputs.size() == 2) {
    ctx.fail(fmt::format("expected R, T and {} lists of tensors of one length, found {} inputs",
                         groups, inputs.size()));
  }
  return (inputs.size() - 2) / groups;
}

/// One elementwise update: `fn` gets the loaded scalars R and T (as floats) and the elements of
/// the tensors at `refs` (X, G, states...) and returns the value of output `which`.
using UpdateFn = std::function<ValueId(LoopBody& body, ValueId r, ValueId t,
                                       const std::vector<ValueId>& e, size_t which)>;

std::vector<TensorValue> optimizer(LoweringContext& ctx, const LowerInputs& inputs, size_t groups,
                                   size_t outputs_per_tensor, const UpdateFn& fn) {
  const size_t n = optimized_count(ctx, inputs, groups);
  const TensorValue& r = required_input(ctx, inputs, 0, "R");
  const TensorValue& t = required_input(ctx, inputs, 1, "T");
  std::vector<TensorValue> results(n * outputs_per_tensor);
  for (size_t k = 0; k < n; ++k) {
    std::vector<const TensorValue*> refs;
    for (size_t g = 0; g < groups; ++g) {
      refs.push_back(
          &required_input(ctx, inputs, 2 + g * n + k, fmt::format("input {}", 2 + g * n + k)));
      if (refs.back()->shape != refs[0]->shape)
        ctx.fail("each tensor and its state must have one shape");
    }
    const TensorValue& x = *refs[0];
    require_dtype(ctx, x.dtype, kFloats, "the optimized tensors");
    const DType f = compute_dtype(x.dtype);
    for (size_t which = 0; which < outputs_per_tensor; ++which) {
      results[which * n + k] =
          ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
            ValueId rv = body.cast(ctx.load_at(body, r, std::vector<Expr>(r.rank(), Expr(0))), f);
            ValueId tv = body.cast(ctx.load_at(body, t, std::vector<Expr>(t.rank(), Expr(0))), f);
            std::vector<ValueId> e;
            for (const TensorValue* ref : refs)
              e.push_back(body.cast(ctx.load_at(body, *ref, i), f));
            return body.cast(fn(body, rv, tv, e, which), x.dtype);
          });
    }
  }
  return results;
}

std::vector<TensorValue> lower_adagrad(LoweringContext& ctx, const graph::Node& node,
                                       const LowerInputs& inputs) {
  const double decay = node.attr_float("decay_factor", 0), eps = node.attr_float("epsilon", 0),
               norm = node.attr_float("norm_coefficient", 0);
  // X, G, H -> X_new, H_new.
  return optimizer(
      ctx, inputs, 3, 2,
      [=](LoopBody& body, ValueId r, ValueId t, const std::vector<ValueId>& e, size_t which) {
        FloatMath a{body, body.dtype(r)};
        ValueId g = a.add(a.scale(norm, e[0]), e[1]);
        ValueId h = a.add(e[2], a.mul(g, g));
        if (which == 1) return h;
        ValueId rate = a.div(r, a.add(a.c(1), a.scale(decay, t)));
        ValueId adaptive = a.add(a.sqrt(h), a.c(eps));
        return a.sub(e[0], a.div(a.mul(rate, g), adaptive));
      });
}

std::vector<TensorValue> lower_momentum(LoweringContext& ctx, const graph::Node& node,
                                        const LowerInputs& inputs) {
  const double alpha = node.attr_float("alpha", 0), beta = node.attr_float("beta", 0),
               norm = node.attr_float("norm_coefficient", 0);
  std::string mode = node.attr_string("mode", "standard");
  if (mode != "standard" && mode != "nesterov") {
    ctx.fail(fmt::format("mode must be standard or nesterov, found '{}'", mode));
  }
  const bool nesterov = mode == "nesterov";
  // X, G, V -> X_new, V_new; the first update (T = 0) does not scale the gradient by beta.
  return optimizer(
      ctx, inputs, 3, 2,
      [=](LoopBody& body, ValueId r, ValueId t, const std::vector<ValueId>& e, size_t which) {
        FloatMath a{body, body.dtype(r)};
        ValueId g = a.add(a.scale(norm, e[0]), e[1]);
        ValueId first = body.binary(OpCode::kLe, t, a.c(0));
        ValueId b = body.where(first, a.c(1), a.c(beta));
        ValueId v = a.add(a.scale(alpha, e[2]), a.mul(b, g));
        if (which == 1) return v;
        ValueId step = nesterov ? a.add(g, a.scale(alpha, v)) : v;
        return a.sub(e[0], a.mul(r, step));
      });
}

std::vector<TensorValue> lower_adam(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& inputs) {
  const double alpha = node.attr_float("alpha", 0.9f), beta = node.attr_float("beta", 0.999f),
               eps = node.attr_float("epsilon", 1e-6f),
               norm = node.attr_float("norm_coefficient", 0),
               norm_post = node.attr_float("norm_coefficient_post", 0);
  // X, G, V, H -> X_new, V_new, H_new; from the second update on the rate is bias-corrected.
  return optimizer(
      ctx, inputs, 4, 3,
      [=](LoopBody& body, ValueId r, ValueId t, const std::vector<ValueId>& e, size_t which) {
        FloatMath a{body, body.dtype(r)};
        ValueId g = a.add(a.scale(norm, e[0]), e[1]);
        ValueId v = a.add(a.scale(alpha, e[2]), a.scale(1 - alpha, g));
        ValueId h = a.add(a.scale(beta, e[3]), a.scale(1 - beta, a.mul(g, g)));
        if (which == 1) return v;
        if (which == 2) return h;
        ValueId h_sqrt = a.add(a.sqrt(h), a.c(eps));
        ValueId pow_b = body.binary(OpCode::kPow, a.c(beta), t);
        ValueId pow_a = body.binary(OpCode::kPow, a.c(alpha), t);
        ValueId corrected = a.div(a.mul(r, a.sqrt(a.sub(a.c(1), pow_b))), a.sub(a.c(1), pow_a));
        ValueId first = body.binary(OpCode::kLe, t, a.c(0));
        ValueId rate = body.where(first, r, corrected);
        ValueId x = a.sub(e[0], a.mul(rate, a.div(v, h_sqrt)));
        return a.scale(1 - norm_post, x);
      });
}

}  // namespace

void register_training_ops(Registry& registry) {
  const std::string training = "ai.onnx.preview.training";
  registry.add(training, "Adagrad", {lower_adagrad, 1, 1});
  registry.add(training, "Momentum", {lower_momentum, 1, 1});
  registry.add(training, "Adam", {lower_adam, 1, 1});
  registry.add("", "Dropout", {lower_dropout, 1, 17});
  registry.add("", "NegativeLogLikelihoodLoss", {lower_nll, 12, 17});
  registry.add("", "SoftmaxCrossEntropyLoss", {lower_softmax_cross_entropy, 12, 17});
}

}  // namespace kiln::lower
