/// Attention as one fused kernel: the pattern match (see attention_fusion.h for the pattern and
/// its conditions).

#include "lower/attention_fusion.h"

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "lower/op_util.h"

namespace kiln::lower {

using graph::DType;
using sym::Expr;

namespace {

/// The node of domain ai.onnx and type `op` that produces `value`, or nullptr.
const graph::Node* producer_op(const graph::Value* value, const char* op) {
  if (value == nullptr) return nullptr;
  const graph::Node* node = value->producer();
  if (node == nullptr || !node->domain().empty() || node->op_type() != op) return nullptr;
  return node;
}

/// The scores T = MatMul(Q, K^T), optionally times or divided by a known scalar.
struct Scores {
  const graph::Node* qk = nullptr;
  double scale = 1.0;
};

class Matcher {
 public:
  Matcher(const ValueLookup& lookup, const UseCount& uses) : lookup_(lookup), uses_(uses) {}

  /// Whether `value` is read once, by the next node of the pattern.
  bool single(const graph::Value* value) const { return value != nullptr && uses_(*value) == 1; }

  const TensorValue& value(const graph::Value& v) const { return lookup_(v); }

  /// T = M | Mul(M, c) | Mul(c, M) | Div(M, c), M read only here, T of M's shape.
  std::optional<Scores> scores(const graph::Value* t) const {
    if (t == nullptr) return std::nullopt;
    if (const graph::Node* qk = producer_op(t, "MatMul")) return Scores{qk, 1.0};
    auto scaled = [&](const graph::Value* m, const graph::Value* c,
                      bool divide) -> std::optional<Scores> {
      const graph::Node* qk = producer_op(m, "MatMul");
      if (qk == nullptr || !single(m) || c == nullptr) return std::nullopt;
      if (value(*t).shape != value(*m).shape) return std::nullopt;
      std::optional<double> k = known_scalar(value(*c));
      if (!k || (divide && *k == 0.0)) return std::nullopt;
      return Scores{qk, divide ? 1.0 / *k : *k};
    };
    if (const graph::Node* mul = producer_op(t, "Mul")) {
      if (mul->inputs().size() != 2) return std::nullopt;
      if (auto s = scaled(mul->inputs()[0], mul->inputs()[1], false)) return s;
      return scaled(mul->inputs()[1], mul->inputs()[0], false);
    }
    if (const graph::Node* div = producer_op(t, "Div")) {
      if (div->inputs().size() != 2) return std::nullopt;
      return scaled(div->inputs()[0], div->inputs()[1], true);
    }
    return std::nullopt;
  }

 private:
  const ValueLookup& lookup_;
  const UseCount& uses_;
};

/// Whether `shape` broadcasts to `target` (right-aligned) without changing it.
bool broadcasts_to(const std::vector<Expr>& shape, const std::vector<Expr>& target) {
  if (shape.size() > target.size()) return false;
  const size_t skip = target.size() - shape.size();
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] != Expr(1) && shape[k] != target[skip + k]) return false;
  }
  return true;
}

/// Whether every element of `value` comes from constants (its loads read constant buffers only):
/// then the node-by-node path folds the attention into a constant when compiling.
bool reads_only_constants(LoweringContext& ctx, const TensorValue& value) {
  if (!value.body) return value.known || value.known_float;
  for (const ir::Op& op : value.body->ops()) {
    if (op.code != ir::OpCode::kLoad) continue;
    const ir::Buffer* buffer = ctx.program().find(op.buffer);
    if (buffer == nullptr || buffer->kind != ir::BufferKind::kConstant) return false;
  }
  return true;
}

}  // namespace

std::optional<TensorValue> fuse_attention(LoweringContext& ctx, const graph::Node& matmul,
                                          const ValueLookup& lookup, const UseCount& uses) {
  const bool cuda = ctx.options().device == ir::Device::kCuda;
  if ((ctx.options().device != ir::Device::kCpu && !cuda) || !ctx.options().fuse_attention ||
      (cuda && !ctx.options().cuda_fused_attention)) {
    return std::nullopt;
  }
  if (matmul.inputs().size() != 2 || matmul.outputs().size() != 1) return std::nullopt;
  Matcher match(lookup, uses);
  const graph::Value* p = matmul.inputs()[0];
  const graph::Value* v = matmul.inputs()[1];
  const graph::Node* softmax = producer_op(p, "Softmax");
  if (softmax == nullptr || !match.single(p) || v == nullptr) return std::nullopt;
  const graph::Value* s = softmax->inputs().empty() ? nullptr : softmax->inputs()[0];
  if (!match.single(s)) return std::nullopt;
  const TensorValue& sv = match.value(*s);
  const int64_t rank = static_cast<int64_t>(sv.rank());
  if (rank < 2) return std::nullopt;
  // Softmax over the last axis only (before opset 13 the axis and every later dim: the same
  // when the axis is the last).
  int64_t axis = softmax->attr_int("axis", softmax->opset() < 13 ? 1 : -1);
  if (axis < 0) axis += rank;
  if (axis != rank - 1) return std::nullopt;

  ir::AttentionCall call;
  const graph::Value* mask = nullptr;
  std::optional<Scores> scores;
  if (const graph::Node* where = producer_op(s, "Where")) {
    if (where->inputs().size() != 3) return std::nullopt;
    const graph::Value* cond = where->inputs()[0];
    for (bool keep_where_true : {true, false}) {
      const graph::Value* t = where->inputs()[keep_where_true ? 1 : 2];
      const graph::Value* f = where->inputs()[keep_where_true ? 2 : 1];
      if (!match.single(t) || f == nullptr || cond == nullptr) continue;
      std::optional<double> fill = known_scalar(match.value(*f));
      if (!fill || match.value(*t).shape != sv.shape) continue;
      scores = match.scores(t);
      if (!scores) continue;
      mask = cond;
      call.mask =
          keep_where_true ? ir::AttentionMask::kKeepWhereTrue : ir::AttentionMask::kKeepWhereFalse;
      call.fill = *fill;
      break;
    }
    if (mask != nullptr && match.value(*mask).dtype != DType::kBool) return std::nullopt;
  } else if (const graph::Node* add = producer_op(s, "Add")) {
    if (add->inputs().size() != 2) return std::nullopt;
    for (size_t k = 0; k < 2 && !scores; ++k) {
      const graph::Value* t = add->inputs()[k];
      const graph::Value* m = add->inputs()[1 - k];
      if (!match.single(t) || m == nullptr || match.value(*t).shape != sv.shape) continue;
      if (match.value(*m).dtype != DType::kFloat32) continue;
      scores = match.scores(t);
      if (scores) {
        mask = m;
        call.mask = ir::AttentionMask::kAdd;
      }
    }
  } else {
    scores = match.scores(s);
  }
  if (!scores || scores->qk->inputs().size() != 2) return std::nullopt;
  const graph::Value* qk_out = scores->qk->outputs().empty() ? nullptr : scores->qk->outputs()[0];
  if (!match.single(qk_out) || scores->qk->inputs()[0] == nullptr ||
      scores->qk->inputs()[1] == nullptr) {
    return std::nullopt;
  }
  call.scale = scores->scale;

  const TensorValue& m = match.value(*qk_out);
  const TensorValue& q = match.value(*scores->qk->inputs()[0]);
  const TensorValue& kt = match.value(*scores->qk->inputs()[1]);
  const TensorValue& vv = match.value(*v);
  for (const TensorValue* t : {&m, &sv, &q, &kt, &vv}) {
    if (t->dtype != DType::kFloat32 || t->rank() < 2 || t->rank() > m.rank()) return std::nullopt;
  }
  if (m.shape != sv.shape) return std::nullopt;
  if (reads_only_constants(ctx, q) && reads_only_constants(ctx, kt) &&
      reads_only_constants(ctx, vv)) {
    return std::nullopt;
  }
  const size_t r = m.rank();
  const Expr& lq = m.shape[r - 2];
  const Expr& lk = m.shape[r - 1];
  std::vector<Expr> batch(m.shape.begin(), m.shape.end() - 2);
  // V [.., Lk, Dv] with batch dims that broadcast to the scores' without changing them.
  if (vv.shape[vv.rank() - 2] != lk) return std::nullopt;
  if (!broadcasts_to(std::vector<Expr>(vv.shape.begin(), vv.shape.end() - 2), batch)) {
    return std::nullopt;
  }
  std::optional<TensorValue> mask_value;
  if (mask != nullptr) {
    mask_value = match.value(*mask);
    if (!broadcasts_to(mask_value->shape, m.shape)) return std::nullopt;
  }

  auto operand = [&](const TensorValue& t, const Expr& rows, const Expr& cols) {
    ir::View view = ctx.as_view(t);
    std::vector<Expr> sizes = batch;
    sizes.push_back(rows);
    sizes.push_back(cols);
    view.layout = broadcast_layout(view.layout, sizes);
    return view;
  };
  const Expr& d = q.shape.back();
  const Expr& dv = vv.shape.back();
  if (cuda) {
    // The GPU kernel (codegen/cuda/cuda_attention.h) keeps heads of up to 128 in shared memory
    // and registers, and up to 6 batch dims.
    const std::optional<int64_t> dn = d.as_integer(), dvn = dv.as_integer();
    if (!dn || !dvn || *dn < 1 || *dvn < 1 || *dn > 128 || *dvn > 128 || batch.size() > 6)
      return std::nullopt;
  }
  std::vector<std::optional<ir::View>> inputs = {operand(q, lq, d), operand(kt, d, lk),
                                                 operand(vv, lk, dv)};
  if (mask_value) inputs.push_back(operand(*mask_value, lq, lk));
  std::vector<Expr> shape = batch;
  shape.push_back(lq);
  shape.push_back(dv);
  return ctx.extern_call(call, DType::kFloat32, std::move(shape), std::move(inputs));
}

}  // namespace kiln::lower
