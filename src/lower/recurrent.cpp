/// The recurrent ops RNN, GRU and LSTM as the library kernel "rnn" (kiln_rt_library.h): a
/// sequential loop over time per direction and batch entry, which the loop IR does not express.
/// The kernel writes one buffer [seq + 2, dirs, batch, hidden] holding Y, then Y_h, then Y_c;
/// the op's outputs are views of it (permuted for layout = 1), so they fuse into their users.
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lower/elementwise.h"
#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using sym::Expr;

namespace {

struct Activation {
  const char* name;
  int64_t code;  // kiln_rt::RnnActivation
  bool alpha, beta;
  double default_alpha, default_beta;
};

constexpr Activation kActivations[] = {
    {"Relu", 0, false, false, 0, 0},        {"Tanh", 1, false, false, 0, 0},
    {"Sigmoid", 2, false, false, 0, 0},     {"Affine", 3, true, true, 1, 0},
    {"LeakyRelu", 4, true, false, 0.01, 0}, {"ThresholdedRelu", 5, true, false, 1, 0},
    {"ScaledTanh", 6, true, true, 1, 1},    {"HardSigmoid", 7, true, true, 0.2, 0.5},
    {"Elu", 8, true, false, 1, 0},          {"Softsign", 9, false, false, 0, 0},
    {"Softplus", 10, false, false, 0, 0},
};

std::vector<TensorValue> lower_recurrent(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  const std::string& op = node.op_type();
  const int64_t kind = op == "RNN" ? 0 : op == "GRU" ? 1 : 2;
  const int64_t gates = kind == 0 ? 1 : kind == 1 ? 3 : 4;
  const size_t functions = kind == 0 ? 1 : kind == 1 ? 2 : 3;
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& w = required_input(ctx, inputs, 1, "W");
  const TensorValue& r = required_input(ctx, inputs, 2, "R");
  require_dtype(ctx, x.dtype, kFloats, "input 'X'");
  if (x.dtype != DType::kFloat32 && x.dtype != DType::kFloat64) {
    ctx.fail("expected float32 or float64 inputs");
  }
  if (x.rank() != 3 || w.rank() != 3 || r.rank() != 3) ctx.fail("X, W and R must have rank 3");
  const std::string direction = node.attr_string("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    ctx.fail(
        fmt::format("direction must be forward, reverse or bidirectional, found '{}'", direction));
  }
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  const bool batch_major = node.attr_int("layout", 0) != 0;
  const Expr seq = x.shape[batch_major ? 1 : 0], batch = x.shape[batch_major ? 0 : 1];
  const Expr hidden = r.shape[2];
  if (w.shape[0] != Expr(dirs) || w.shape[1] != hidden * gates) {
    ctx.fail(fmt::format("expected W of shape [{}, {} * hidden, input], found {}", dirs, gates,
                         graph::shape_str(w.shape)));
  }
  // Activations per direction, with their alpha and beta consumed in order.
  std::vector<std::string> names = node.attr_strings("activations", {});
  if (names.empty()) {
    std::vector<std::string> defaults = kind == 0 ? std::vector<std::string>{"Tanh"}
                                        : kind == 1
                                            ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                            : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  }
  if (names.size() != functions * static_cast<size_t>(dirs)) {
    ctx.fail(fmt::format("expected {} activations, found {}", functions * dirs, names.size()));
  }
  std::vector<float> alphas = node.attr_floats("activation_alpha", {});
  std::vector<float> betas = node.attr_floats("activation_beta", {});
  size_t next_alpha = 0, next_beta = 0;
  std::vector<int64_t> codes;
  std::vector<double> alpha, beta;
  for (const std::string& name : names) {
    const Activation* a = nullptr;
    for (const Activation& candidate : kActivations) {
      if (name == candidate.name) a = &candidate;
    }
    if (a == nullptr) ctx.fail(fmt::format("activation '{}' is not supported", name));
    codes.push_back(a->code);
    alpha.push_back(a->alpha && next_alpha < alphas.size() ? alphas[next_alpha++]
                                                           : a->default_alpha);
    beta.push_back(a->beta && next_beta < betas.size() ? betas[next_beta++] : a->default_beta);
  }
  std::vector<std::optional<ir::View>> views = {ctx.as_view(x, true), ctx.as_view(w, true),
                                                ctx.as_view(r, true)};
  for (size_t k = 3; k < (kind == 2 ? 8u : 6u); ++k) {
    const TensorValue* v = optional_input(inputs, k);
    views.push_back(v == nullptr ? std::nullopt : std::optional(ctx.as_view(*v, true)));
  }
  ir::RnnCall call;
  call.kind = kind;
  call.dirs = dirs;
  call.reverse = direction == "reverse";
  call.batch_major = batch_major;
  call.clip = static_cast<double>(node.attr_float("clip", 0));
  call.linear_before_reset = node.attr_int("linear_before_reset", 0) != 0;
  call.input_forget = node.attr_int("input_forget", 0) != 0;
  call.activations = codes;
  call.alpha = alpha;
  call.beta = beta;
  TensorValue all = ctx.extern_call(std::move(call), x.dtype, {seq + 2, Expr(dirs), batch, hidden},
                                    std::move(views));
  // Y [seq, dirs, batch, H] (layout 1: [batch, seq, dirs, H]); Y_h and Y_c [dirs, batch, H]
  // (layout 1: [batch, dirs, H]).
  TensorValue y = batch_major ? make_view(ctx, all, {batch, seq, Expr(dirs), hidden},
                                          [](const std::vector<Expr>& o) {
                                            return std::vector<Expr>{o[1], o[2], o[0], o[3]};
                                          })
                              : make_view(ctx, all, {seq, Expr(dirs), batch, hidden},
                                          [](const std::vector<Expr>& o) { return o; });
  auto state = [&](const Expr& row) {
    if (batch_major) {
      return make_view(ctx, all, {batch, Expr(dirs), hidden}, [&](const std::vector<Expr>& o) {
        return std::vector<Expr>{row, o[1], o[0], o[2]};
      });
    }
    return make_view(ctx, all, {Expr(dirs), batch, hidden}, [&](const std::vector<Expr>& o) {
      return std::vector<Expr>{row, o[0], o[1], o[2]};
    });
  };
  std::vector<TensorValue> outputs = {y, state(seq)};
  if (kind == 2) outputs.push_back(state(seq + 1));
  return outputs;
}

}  // namespace

void register_recurrent_ops(Registry& registry) {
  for (const char* op : {"RNN", "GRU", "LSTM"}) registry.add("", op, {lower_recurrent, 7, 17});
}

}  // namespace kiln::lower
