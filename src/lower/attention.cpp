/// The attention family of opset 23 and later, through the loop IR: Attention (23, 24),
/// RotaryEmbedding (23), LinearAttention (27, its recurrence unrolled over the time steps) and
/// ai.onnx.preview's FlexAttention (its score, mask and probability graphs inlined).
///
/// Attention is scaled dot-product attention, written as the reductions it is made of so that
/// the mask, softcap, softmax and the head mapping of grouped-query attention fuse into them:
///   scores[b, h, i, j] = sum_d Q[b, h, i, d] * K[b, h / g, j, d] * scale    (g: heads per KV head)
///   logits = softcap(scores) + bias        bias: the attention mask, causal and padding masks
///   Y[b, h, i, e] = sum_j softmax_j(logits)[b, h, i, j] * V[b, h / g, j, e]
/// The softmax is the usual max / sum of exp(x - max) pair of reductions, computed in float32
/// (float64 for float64 inputs, or when softmax_precision asks for it). A query whose keys are
/// all masked attends to nothing: its probabilities and output are 0, as the suite expects
/// (the definition's reference implementation gives 0 there, not the NaN of a plain softmax).
///
/// RotaryEmbedding rotates pairs of elements of each head (the two halves of the rotated part,
/// or neighbouring elements when interleaved) by the angles whose cosines and sines the caches
/// hold, per position: a pointwise value.
///
/// Tests: the ONNX 1.23 node suite (tests/onnx/new_ops_cases.txt).

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lower/elementwise.h"
#include "lower/graph_lowering.h"
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

/// A [batch, heads, sequence, head_size] view of an Attention input: 4-D inputs as they are,
/// 3-D ones [batch, sequence, heads * head_size] split into heads.
TensorValue heads_view(LoweringContext& ctx, const TensorValue& x, int64_t heads,
                       const std::string& what) {
  if (x.rank() == 4) return x;
  int64_t hidden = require_static_dim(ctx, x.shape[2], fmt::format("the hidden size of {}", what));
  if (heads <= 0 || hidden % heads != 0) {
    ctx.fail(
        fmt::format("{} has hidden size {}, not a multiple of the {} heads", what, hidden, heads));
  }
  const int64_t size = hidden / heads;
  return make_view(ctx, x, {x.shape[0], Expr(heads), x.shape[1], Expr(size)},
                   [size](const std::vector<Expr>& i) {
                     return std::vector<Expr>{i[0], i[2], i[1] * size + i[3]};
                   });
}

/// The float dtype of Attention's softmax_precision attribute (an ONNX element type code).
DType softmax_dtype(LoweringContext& ctx, const graph::Node& node, DType input) {
  DType acc = compute_dtype(input);
  if (!node.has_attribute("softmax_precision")) return acc;
  int64_t code = node.attr_int("softmax_precision", 1);
  std::optional<DType> dtype = graph::dtype_from_onnx(static_cast<int32_t>(code));
  if (!dtype || !dtype_in(*dtype, kFloats)) {
    ctx.fail(fmt::format(
        "attribute 'softmax_precision' is {}; expected a float type (1, 10, 11 or 16)", code));
  }
  // Half-precision requests compute in float32, which is at least as precise.
  return *dtype == DType::kFloat64 ? DType::kFloat64 : acc;
}

std::vector<TensorValue> lower_attention(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  const TensorValue& q_in = required_input(ctx, inputs, 0, "Q");
  const TensorValue& k_in = required_input(ctx, inputs, 1, "K");
  const TensorValue& v_in = required_input(ctx, inputs, 2, "V");
  const TensorValue* mask = optional_input(inputs, 3);
  const TensorValue* past_key = optional_input(inputs, 4);
  const TensorValue* past_value = optional_input(inputs, 5);
  const TensorValue* nonpad = optional_input(inputs, 6);
  require_dtype(ctx, q_in.dtype, kFloats, "input Q");
  const DType dtype = q_in.dtype;
  if (k_in.dtype != dtype || v_in.dtype != dtype) {
    ctx.fail(fmt::format("Q, K and V must have one dtype, found {}, {} and {}",
                         graph::dtype_name(dtype), graph::dtype_name(k_in.dtype),
                         graph::dtype_name(v_in.dtype)));
  }
  const size_t rank = q_in.rank();
  if ((rank != 3 && rank != 4) || k_in.rank() != rank || v_in.rank() != rank) {
    ctx.fail(fmt::format("Q, K and V must all be 3-D or all 4-D, found ranks {}, {} and {}", rank,
                         k_in.rank(), v_in.rank()));
  }
  if ((past_key == nullptr) != (past_value == nullptr)) {
    ctx.fail("inputs past_key and past_value must be given together");
  }
  const int64_t mode = node.attr_int("qk_matmul_output_mode", 0);
  if (mode < 0 || mode > 3) {
    ctx.fail(fmt::format("attribute 'qk_matmul_output_mode' is {}; expected 0 to 3", mode));
  }
  const bool causal = node.attr_int("is_causal", 0) != 0;
  const double softcap = node.attr_float("softcap", 0.0f);
  if (softcap < 0) ctx.fail(fmt::format("attribute 'softcap' is {}; expected >= 0", softcap));

  int64_t q_heads = node.attr_int("q_num_heads", 0), kv_heads = node.attr_int("kv_num_heads", 0);
  if (rank == 3 && (q_heads <= 0 || kv_heads <= 0)) {
    ctx.fail("3-D Q, K and V need the attributes 'q_num_heads' and 'kv_num_heads'");
  }
  const TensorValue q = heads_view(ctx, q_in, q_heads, "Q");
  TensorValue k = heads_view(ctx, k_in, kv_heads, "K");
  TensorValue v = heads_view(ctx, v_in, kv_heads, "V");
  if (past_key != nullptr) {
    if (past_key->rank() != 4 || past_value->rank() != 4) {
      ctx.fail("past_key and past_value must be 4-D [batch, kv_heads, past_length, head_size]");
    }
    k = concat_values(ctx, {past_key, &k}, 2);
    v = concat_values(ctx, {past_value, &v}, 2);
  }
  const int64_t heads = require_static_dim(ctx, q.shape[1], "the number of heads of Q");
  const int64_t kv = require_static_dim(ctx, k.shape[1], "the number of heads of K");
  if (v.shape[1] != Expr(kv)) {
    ctx.fail(fmt::format("K has {} heads, V {}", kv, v.shape[1].str()));
  }
  if (kv <= 0 || heads % kv != 0) {
    ctx.fail(fmt::format("Q's {} heads are not a multiple of K's and V's {}", heads, kv));
  }
  const int64_t group = heads / kv;  // query heads sharing one key / value head
  const int64_t head_size = require_static_dim(ctx, q.shape[3], "the head size of Q");
  if (k.shape[3] != Expr(head_size)) {
    ctx.fail(fmt::format("Q's head size is {}, K's {}", head_size, k.shape[3].str()));
  }
  const Expr batch = q.shape[0], q_len = q.shape[2], total = k.shape[2], v_size = v.shape[3];
  double scale = node.attr_float("scale", 0.0f);
  if (!node.has_attribute("scale")) scale = 1.0 / std::sqrt(static_cast<double>(head_size));

  const DType acc = compute_dtype(dtype);
  const DType soft = softmax_dtype(ctx, node, dtype);
  const double inf = std::numeric_limits<double>::infinity();
  // Q and K are each scaled by sqrt(scale), as the definition does (it keeps the products in
  // range for float16).
  const double root = std::sqrt(scale);
  TensorValue scores = ctx.reduction(
      acc, {batch, Expr(heads), q_len, total}, {Expr(head_size)}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        ValueId a = body.cast(ctx.load_at(body, q, {i[0], i[1], i[2], r[0]}), acc);
        ValueId b =
            body.cast(ctx.load_at(body, k, {i[0], floor_div(i[1], Expr(group)), i[3], r[0]}), acc);
        ValueId s = body.constant(root, acc);
        return body.binary(OpCode::kMul, body.binary(OpCode::kMul, a, s),
                           body.binary(OpCode::kMul, b, s));
      });

  // The bias added to the scores: the attention mask (bool: false masks the key; float: added;
  // a mask shorter than the keys masks the rest), the causal mask and the padding mask of
  // nonpad_kv_seqlen, each 0 or -inf.
  if (mask != nullptr) {
    if (mask->rank() < 2 || mask->rank() > 4) {
      ctx.fail(fmt::format("attn_mask must have rank 2 to 4, found {}", mask->rank()));
    }
    if (mask->dtype != DType::kBool && mask->dtype != dtype) {
      ctx.fail(fmt::format("attn_mask must be bool or {} (Q's dtype), found {}",
                           graph::dtype_name(dtype), graph::dtype_name(mask->dtype)));
    }
  }
  if (nonpad != nullptr) {
    if (node.opset() < 24) ctx.fail("input nonpad_kv_seqlen needs opset 24");
    if (nonpad->dtype != DType::kInt64 || nonpad->rank() != 1) {
      ctx.fail("nonpad_kv_seqlen must be a 1-D int64 tensor [batch]");
    }
  }
  const Expr past = past_key != nullptr ? past_key->shape[2] : Expr(0);
  auto bias = [&](LoopBody& body, const std::vector<Expr>& i, DType t) {
    ValueId b = body.constant(0, t);
    ValueId minus_inf = body.constant(-inf, t);
    const ValueId j = body.index_expr(i[3]);
    if (mask != nullptr) {
      std::vector<Expr> shape = mask->shape;
      const Expr width = shape.back();
      shape.back() = total;
      std::vector<Expr> at = LoweringContext::broadcast_index(i, shape);
      ValueId inside = body.binary(OpCode::kLt, j, body.index_expr(width));
      ValueId m = mask->dtype == DType::kBool
                      ? load_masked(ctx, body, *mask, at, inside, 0)
                      : body.cast(load_masked(ctx, body, *mask, at, inside, -inf), t);
      if (mask->dtype == DType::kBool) m = body.where(m, b, minus_inf);
      b = body.binary(OpCode::kAdd, b, m);
    }
    if (causal) {
      // Keys up to the query's own position, counted from the end of the keys that precede the
      // query block: the past keys, or (with nonpad_kv_seqlen and no past) the valid keys of the
      // batch less the queries.
      ValueId offset = body.index_expr(past);
      if (past_key == nullptr && nonpad != nullptr) {
        offset =
            body.binary(OpCode::kSub, ctx.load_at(body, *nonpad, {i[0]}), body.index_expr(q_len));
      }
      ValueId last = body.binary(OpCode::kAdd, body.index_expr(i[2]), offset);
      b = body.where(body.binary(OpCode::kLe, j, last), b, minus_inf);
    }
    if (nonpad != nullptr) {
      ValueId valid = body.binary(OpCode::kLt, j, ctx.load_at(body, *nonpad, {i[0]}));
      b = body.where(valid, b, minus_inf);
    }
    return b;
  };
  auto capped = [&](LoopBody& body, const std::vector<Expr>& i) {
    ValueId s = ctx.load_at(body, scores, i);
    if (softcap <= 0) return s;
    ValueId c = body.constant(softcap, acc);
    return body.binary(OpCode::kMul, body.unary(OpCode::kTanh, body.binary(OpCode::kDiv, s, c)), c);
  };
  TensorValue logits = ctx.pointwise(soft, scores.shape, [&](LoopBody& body, const auto& i) {
    return body.cast(body.binary(OpCode::kAdd, capped(body, i), bias(body, i, acc)), soft);
  });
  logits = ctx.realize(logits, "read by the softmax's reductions");
  const std::vector<Expr> row_shape = {batch, Expr(heads), q_len, Expr(1)};
  auto row = [](const std::vector<Expr>& i) {
    return std::vector<Expr>{i[0], i[1], i[2], Expr(0)};
  };
  auto element = [&](const std::vector<Expr>& i, const std::vector<Expr>& r) {
    return std::vector<Expr>{i[0], i[1], i[2], r[0]};
  };
  TensorValue max = ctx.reduction(soft, row_shape, {total}, ReductionType::kMax,
                                  [&](LoopBody& body, const auto& i, const auto& r) {
                                    return ctx.load_at(body, logits, element(i, r));
                                  });
  // A row whose keys are all masked has max -inf; it is shifted by 0 instead, so that its
  // exponentials are 0 (not NaN) and its probabilities come out 0 below.
  auto shifted_exp = [&](LoopBody& body, const std::vector<Expr>& at) {
    ValueId x = ctx.load_at(body, logits, at);
    ValueId m = ctx.load_at(body, max, row(at));
    m = body.where(body.unary(OpCode::kIsNegInf, m), body.constant(0, soft), m);
    return body.unary(OpCode::kExp, body.binary(OpCode::kSub, x, m));
  };
  TensorValue sum = ctx.reduction(soft, row_shape, {total}, ReductionType::kSum,
                                  [&](LoopBody& body, const auto& i, const auto& r) {
                                    return shifted_exp(body, element(i, r));
                                  });
  auto probability = [&](LoopBody& body, const std::vector<Expr>& at) {
    ValueId s = ctx.load_at(body, sum, row(at));
    ValueId p = body.binary(OpCode::kDiv, shifted_exp(body, at), s);
    return body.where(body.binary(OpCode::kEq, s, body.constant(0, soft)), body.constant(0, soft),
                      p);
  };
  TensorValue y4 = ctx.reduction(
      dtype, {batch, Expr(heads), q_len, v_size}, {total}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        ValueId p = body.cast(probability(body, {i[0], i[1], i[2], r[0]}), acc);
        ValueId x =
            body.cast(ctx.load_at(body, v, {i[0], floor_div(i[1], Expr(group)), r[0], i[3]}), acc);
        return body.binary(OpCode::kMul, p, x);
      });
  TensorValue y = y4;
  if (rank == 3) {
    const int64_t size = require_static_dim(ctx, v_size, "the head size of V");
    y = make_view(ctx, y4, {batch, q_len, Expr(heads * size)}, [size](const std::vector<Expr>& i) {
      return std::vector<Expr>{i[0], floor_div(i[2], Expr(size)), i[1], mod(i[2], Expr(size))};
    });
  }
  std::vector<TensorValue> outputs = {y, k, v};
  if (node.outputs().size() > 3 && node.output(3) != nullptr) {
    // The scores at the stage qk_matmul_output_mode names: after the (soft-capped) product, with
    // the bias added, or after the softmax.
    outputs.push_back(ctx.pointwise(dtype, scores.shape, [&](LoopBody& body, const auto& i) {
      if (mode == 3) return body.cast(probability(body, i), dtype);
      if (mode == 0 || mode == 1) return body.cast(capped(body, i), dtype);
      return body.cast(ctx.load_at(body, logits, i), dtype);
    }));
  }
  return outputs;
}

// --- RotaryEmbedding -----------------------------------------------------------------------------

std::vector<TensorValue> lower_rotary_embedding(LoweringContext& ctx, const graph::Node& node,
                                                const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& cos_cache = required_input(ctx, inputs, 1, "cos_cache");
  const TensorValue& sin_cache = required_input(ctx, inputs, 2, "sin_cache");
  const TensorValue* position_ids = optional_input(inputs, 3);
  require_dtype(ctx, x.dtype, kFloats, "input X");
  if (cos_cache.dtype != x.dtype || sin_cache.dtype != x.dtype) {
    ctx.fail("cos_cache and sin_cache must have X's dtype");
  }
  if (x.rank() != 3 && x.rank() != 4) {
    ctx.fail(
        fmt::format("X must be 3-D [batch, sequence, hidden] or 4-D [batch, heads, "
                    "sequence, head_size], found rank {}",
                    x.rank()));
  }
  const bool interleaved = node.attr_int("interleaved", 0) != 0;
  int64_t head_size;
  if (x.rank() == 4) {
    head_size = require_static_dim(ctx, x.shape[3], "the head size of X");
  } else {
    const int64_t heads = node.attr_int("num_heads", 0);
    const int64_t hidden = require_static_dim(ctx, x.shape[2], "the hidden size of X");
    if (heads <= 0 || hidden % heads != 0) {
      ctx.fail(fmt::format("3-D X of hidden size {} needs the attribute 'num_heads' dividing it",
                           hidden));
    }
    head_size = hidden / heads;
  }
  int64_t rotary = node.attr_int("rotary_embedding_dim", 0);
  if (rotary == 0) rotary = head_size;
  if (rotary < 0 || rotary > head_size || rotary % 2 != 0) {
    ctx.fail(
        fmt::format("attribute 'rotary_embedding_dim' is {}; expected an even size up to "
                    "the head size {}",
                    rotary, head_size));
  }
  const int64_t half = rotary / 2;
  const size_t cache_rank = position_ids != nullptr ? 2 : 3;
  if (cos_cache.rank() != cache_rank || sin_cache.rank() != cache_rank) {
    ctx.fail(fmt::format("cos_cache and sin_cache must be {}-D {}", cache_rank,
                         position_ids != nullptr ? "[max_position, rotary_dim / 2]"
                                                 : "[batch, sequence, rotary_dim / 2]"));
  }
  std::optional<TensorValue> positions;
  if (position_ids != nullptr) {
    if (position_ids->rank() != 2) ctx.fail("position_ids must be 2-D [batch, sequence]");
    positions = checked_indices(ctx, *position_ids, cos_cache.shape[0]);
  }
  const DType acc = compute_dtype(x.dtype);
  return {ctx.pointwise(x.dtype, x.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    // (batch, sequence, element within the head) of this output element.
    Expr b = index[0], s, d, head_base;
    if (x.rank() == 4) {
      s = index[2];
      d = index[3];
      head_base = Expr(0);
    } else {
      s = index[1];
      d = mod(index[2], Expr(head_size));
      head_base = index[2] - d;
    }
    auto element = [&](const Expr& e) {
      std::vector<Expr> at = index;
      at.back() = head_base + e;
      return body.cast(ctx.load_at(body, x, at), acc);
    };
    // The pair this element belongs to, k in [0, half), and whether it is the pair's second
    // (imaginary) part. Elements past the rotated part read as they are, via a clamp.
    Expr rotated_d = sym::min(d, Expr(rotary - 1));
    Expr k = interleaved ? floor_div(rotated_d, Expr(2)) : mod(rotated_d, Expr(half));
    Expr first = interleaved ? k * 2 : k;
    Expr second = interleaved ? k * 2 + 1 : k + half;
    auto cache = [&](const TensorValue& c) {
      if (!positions) return body.cast(ctx.load_at(body, c, {b, s, k}), acc);
      ValueId p = body.indirect(ctx.load_at(body, *positions, {b, s}), c.shape[0]);
      return body.cast(ctx.load_at(body, c, {body.op(p).symbol, k}), acc);
    };
    ValueId cos = cache(cos_cache), sin = cache(sin_cache);
    ValueId x1 = element(first), x2 = element(second);
    ValueId real = body.binary(OpCode::kSub, body.binary(OpCode::kMul, cos, x1),
                               body.binary(OpCode::kMul, sin, x2));
    ValueId imag = body.binary(OpCode::kAdd, body.binary(OpCode::kMul, sin, x1),
                               body.binary(OpCode::kMul, cos, x2));
    ValueId di = body.index_expr(d);
    ValueId is_second = interleaved
                            ? body.binary(OpCode::kEq, body.index_expr(mod(d, Expr(2))),
                                          body.constant(1, DType::kInt64))
                            : body.binary(OpCode::kGe, di, body.constant(half, DType::kInt64));
    ValueId rotated = body.where(is_second, imag, real);
    ValueId in_rotary = body.binary(OpCode::kLt, di, body.constant(rotary, DType::kInt64));
    return body.cast(body.where(in_rotary, rotated, element(d)), x.dtype);
  })};
}

// --- FlexAttention -------------------------------------------------------------------------------

/// ai.onnx.preview FlexAttention (1): scores = Q K^T * scale (4-D [B, H, L, d]; a query head h
/// reads KV head h / (H / H_kv)), then the graph attributes score_mod and mask_mod applied to the
/// scores, the softmax over the keys, prob_mod applied to the probabilities, and the product with
/// V. Each graph takes one tensor of Q's type and returns one; they are inlined (so their
/// elementwise ops fuse with the softmax's reductions).
std::vector<TensorValue> lower_flex_attention(LoweringContext& ctx, const graph::Node& node,
                                              const LowerInputs& inputs) {
  const TensorValue& q = required_input(ctx, inputs, 0, "Q");
  const TensorValue& k = required_input(ctx, inputs, 1, "K");
  const TensorValue& v = required_input(ctx, inputs, 2, "V");
  require_dtype(ctx, q.dtype, kFloats, "input Q");
  const DType dtype = q.dtype;
  if (k.dtype != dtype || v.dtype != dtype) ctx.fail("Q, K and V must have one dtype");
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) {
    ctx.fail("Q, K and V must be 4-D [batch, heads, sequence, head_size]");
  }
  const int64_t heads = require_static_dim(ctx, q.shape[1], "the number of heads of Q");
  const int64_t kv = require_static_dim(ctx, k.shape[1], "the number of heads of K");
  if (v.shape[1] != Expr(kv) || kv <= 0 || heads % kv != 0) {
    ctx.fail(fmt::format("Q's {} heads are not a multiple of K's and V's ({} and {})", heads, kv,
                         v.shape[1].str()));
  }
  const int64_t group = heads / kv;
  const int64_t head_size = require_static_dim(ctx, q.shape[3], "the head size of Q");
  if (k.shape[3] != Expr(head_size)) ctx.fail("Q and K have different head sizes");
  double scale = node.attr_float("scale", 0.0f);
  if (!node.has_attribute("scale")) scale = 1.0 / std::sqrt(static_cast<double>(head_size));
  const DType acc = compute_dtype(dtype);
  const Expr batch = q.shape[0], q_len = q.shape[2], total = k.shape[2];
  const std::vector<Expr> scores_shape = {batch, Expr(heads), q_len, total};
  TensorValue product = ctx.reduction(
      acc, scores_shape, {Expr(head_size)}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        ValueId a = body.cast(ctx.load_at(body, q, {i[0], i[1], i[2], r[0]}), acc);
        ValueId b =
            body.cast(ctx.load_at(body, k, {i[0], floor_div(i[1], Expr(group)), i[3], r[0]}), acc);
        return body.binary(OpCode::kMul, a, b);
      });
  TensorValue scores = ctx.pointwise(dtype, scores_shape, [&](LoopBody& body, const auto& i) {
    return body.cast(
        body.binary(OpCode::kMul, ctx.load_at(body, product, i), body.constant(scale, acc)), dtype);
  });
  // Applies a graph attribute (one input, one output, the input's shape and type).
  auto apply = [&](const char* name, const TensorValue& x) {
    std::shared_ptr<graph::Graph> g = node.attr_graph(name);
    if (!g) return x;
    if (g->inputs().size() != 1 || g->outputs().size() != 1) {
      ctx.fail(fmt::format("attribute '{}' must be a graph of one input and one output", name));
    }
    TensorValue out = ctx.graph_lowering().inline_graph(*g, {x}).at(0);
    if (out.dtype != x.dtype || out.shape != x.shape) {
      ctx.fail(fmt::format("attribute '{}' returns {} {}, expected {} {}", name,
                           graph::dtype_name(out.dtype), graph::shape_str(out.shape),
                           graph::dtype_name(x.dtype), graph::shape_str(x.shape)));
    }
    return out;
  };
  scores = ctx.realize(apply("mask_mod", apply("score_mod", scores)), "read by the softmax");
  const std::vector<Expr> row_shape = {batch, Expr(heads), q_len, Expr(1)};
  auto row = [](const std::vector<Expr>& i) {
    return std::vector<Expr>{i[0], i[1], i[2], Expr(0)};
  };
  auto logit = [&](LoopBody& body, const std::vector<Expr>& at) {
    return body.cast(ctx.load_at(body, scores, at), acc);
  };
  TensorValue max = ctx.reduction(acc, row_shape, {total}, ReductionType::kMax,
                                  [&](LoopBody& body, const auto& i, const auto& r) {
                                    return logit(body, {i[0], i[1], i[2], r[0]});
                                  });
  auto shifted_exp = [&](LoopBody& body, const std::vector<Expr>& at) {
    return body.unary(OpCode::kExp,
                      body.binary(OpCode::kSub, logit(body, at), ctx.load_at(body, max, row(at))));
  };
  TensorValue sum = ctx.reduction(acc, row_shape, {total}, ReductionType::kSum,
                                  [&](LoopBody& body, const auto& i, const auto& r) {
                                    return shifted_exp(body, {i[0], i[1], i[2], r[0]});
                                  });
  TensorValue probs = ctx.pointwise(dtype, scores_shape, [&](LoopBody& body, const auto& i) {
    return body.cast(
        body.binary(OpCode::kDiv, shifted_exp(body, i), ctx.load_at(body, sum, row(i))), dtype);
  });
  probs = apply("prob_mod", probs);
  if (node.has_attribute("prob_mod")) probs = ctx.realize(probs, "read by the product with V");
  return {ctx.reduction(
      dtype, {batch, Expr(heads), q_len, v.shape[3]}, {total}, ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
        ValueId p = body.cast(ctx.load_at(body, probs, {i[0], i[1], i[2], r[0]}), acc);
        ValueId x =
            body.cast(ctx.load_at(body, v, {i[0], floor_div(i[1], Expr(group)), r[0], i[3]}), acc);
        return body.binary(OpCode::kMul, p, x);
      })};
}

// --- LinearAttention -----------------------------------------------------------------------------

/// The most time steps LinearAttention's recurrence is unrolled over.
constexpr int64_t kMaxLinearAttentionSteps = 64;

/// LinearAttention-27: a state S [B, H_kv, d_k, d_v] (past_state, or zeros) updated per time step
/// t by the update rule, S <- S * exp(decay_t) (gated rules), v_t <- beta_t (v_t - S^T (e_t k_t))
/// (delta rules; e_t the erase gate, or 1), S <- S + k_t v_t^T, and read as
/// o_t = scale * q_t S (query head h reads KV head h / group). The steps are unrolled when
/// compiling (at most kMaxLinearAttentionSteps), each state realized once; everything in float32.
std::vector<TensorValue> lower_linear_attention(LoweringContext& ctx, const graph::Node& node,
                                                const LowerInputs& inputs) {
  const TensorValue& query = required_input(ctx, inputs, 0, "query");
  const TensorValue& key = required_input(ctx, inputs, 1, "key");
  const TensorValue& value = required_input(ctx, inputs, 2, "value");
  const TensorValue* past = optional_input(inputs, 3);
  const TensorValue* decay = optional_input(inputs, 4);
  const TensorValue* beta = optional_input(inputs, 5);
  const TensorValue* erase = optional_input(inputs, 6);
  require_dtype(ctx, query.dtype, kFloats, "input query");
  const std::string rule = node.attr_string("update_rule", "gated_delta");
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta") {
    ctx.fail(fmt::format(
        "attribute 'update_rule' must be linear, gated, delta or gated_delta, found '{}'", rule));
  }
  const bool gating = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  if (gating != (decay != nullptr)) {
    ctx.fail(
        fmt::format("update_rule '{}' {} the input decay", rule, gating ? "needs" : "takes no"));
  }
  if (delta != (beta != nullptr)) {
    ctx.fail(fmt::format("update_rule '{}' {} the input beta", rule, delta ? "needs" : "takes no"));
  }
  if (erase != nullptr && !delta) {
    ctx.fail(fmt::format("update_rule '{}' takes no erase_gate", rule));
  }
  const int64_t q_heads = node.attr_int("q_num_heads", 0),
                kv_heads = node.attr_int("kv_num_heads", 0);
  if (q_heads <= 0 || kv_heads <= 0 || q_heads % kv_heads != 0) {
    ctx.fail(
        fmt::format("attributes 'q_num_heads' ({}) and 'kv_num_heads' ({}) must be positive, "
                    "the first a multiple of the second",
                    q_heads, kv_heads));
  }
  for (const TensorValue* v : {&query, &key, &value}) {
    if (v->rank() != 3) ctx.fail("query, key and value must be 3-D [batch, time, heads * size]");
  }
  const int64_t steps = require_static_dim(ctx, query.shape[1], "the number of time steps");
  if (steps > kMaxLinearAttentionSteps) {
    ctx.fail(fmt::format("{} time steps: Kiln unrolls the recurrence over at most {}", steps,
                         kMaxLinearAttentionSteps));
  }
  const TensorValue q = heads_view(ctx, query, q_heads, "query");
  const TensorValue k = heads_view(ctx, key, kv_heads, "key");
  const TensorValue v = heads_view(ctx, value, kv_heads, "value");
  const int64_t dk = require_static_dim(ctx, q.shape[3], "the key size");
  const int64_t dv = require_static_dim(ctx, v.shape[3], "the value size");
  if (k.shape[3] != Expr(dk)) ctx.fail("query and key have different head sizes");
  const int64_t group = q_heads / kv_heads;
  const Expr batch = query.shape[0];
  double scale = node.attr_float("scale", 0.0f);
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(dk));
  const DType f = DType::kFloat32;
  // decay [B, T, H_kv] (per head) or [B, T, H_kv * d_k]; beta [B, T, H_kv or 1]; erase_gate
  // [B, T, H_kv * d_k].
  auto last_dim = [&](const TensorValue* t, const char* what) {
    if (t->rank() != 3) ctx.fail(fmt::format("{} must be 3-D", what));
    return require_static_dim(ctx, t->shape[2], fmt::format("the last dim of {}", what));
  };
  const int64_t decay_last = decay != nullptr ? last_dim(decay, "decay") : 0;
  if (decay != nullptr && decay_last != kv_heads && decay_last != kv_heads * dk) {
    ctx.fail(
        fmt::format("decay's last dim is {}; expected kv_num_heads ({}) or kv_num_heads * "
                    "d_k ({})",
                    decay_last, kv_heads, kv_heads * dk));
  }
  const int64_t beta_last = beta != nullptr ? last_dim(beta, "beta") : 0;
  if (beta != nullptr && beta_last != kv_heads && beta_last != 1) {
    ctx.fail(fmt::format("beta's last dim is {}; expected kv_num_heads or 1", beta_last));
  }
  if (erase != nullptr && last_dim(erase, "erase_gate") != kv_heads * dk) {
    ctx.fail("erase_gate's last dim must be kv_num_heads * d_k");
  }
  const std::vector<Expr> state_shape = {batch, Expr(kv_heads), Expr(dk), Expr(dv)};
  if (past != nullptr && (past->rank() != 4 || past->shape[1] != Expr(kv_heads) ||
                          past->shape[2] != Expr(dk) || past->shape[3] != Expr(dv))) {
    ctx.fail(fmt::format("past_state must be [batch, {}, {}, {}], found {}", kv_heads, dk, dv,
                         graph::shape_str(past->shape)));
  }
  auto load = [&](LoopBody& body, const TensorValue& t, const std::vector<Expr>& at) {
    return body.cast(ctx.load_at(body, t, at), f);
  };
  TensorValue state = ctx.pointwise(f, state_shape, [&](LoopBody& body, const auto& i) {
    return past != nullptr ? load(body, *past, i) : body.constant(0, f);
  });
  std::vector<TensorValue> outputs;  // per step, [B, H_q, 1, d_v]
  for (int64_t t = 0; t < steps; ++t) {
    const Expr step(t);
    if (gating) {
      const TensorValue before = state;
      state = ctx.pointwise(f, state_shape, [&](LoopBody& body, const std::vector<Expr>& i) {
        const Expr column = decay_last == kv_heads ? i[1] : i[1] * dk + i[2];
        ValueId g = body.unary(OpCode::kExp, load(body, *decay, {i[0], step, column}));
        return body.binary(OpCode::kMul, ctx.load_at(body, before, i), g);
      });
      state = ctx.realize(state, "the decayed state");
    }
    // The value written at this step: v_t, or beta_t (v_t - S^T (e_t k_t)).
    TensorValue written = ctx.pointwise(f, {batch, Expr(kv_heads), Expr(dv)},
                                        [&](LoopBody& body, const std::vector<Expr>& i) {
                                          return load(body, v, {i[0], i[1], step, i[2]});
                                        });
    if (delta) {
      TensorValue retrieved = ctx.reduction(
          f, {batch, Expr(kv_heads), Expr(dv)}, {Expr(dk)}, ReductionType::kSum,
          [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
            ValueId kd = load(body, k, {i[0], i[1], step, r[0]});
            if (erase != nullptr) {
              kd =
                  body.binary(OpCode::kMul, kd, load(body, *erase, {i[0], step, i[1] * dk + r[0]}));
            }
            return body.binary(OpCode::kMul, ctx.load_at(body, state, {i[0], i[1], r[0], i[2]}),
                               kd);
          });
      const TensorValue plain = written;
      written = ctx.pointwise(f, plain.shape, [&](LoopBody& body, const std::vector<Expr>& i) {
        ValueId b = load(body, *beta, {i[0], step, beta_last == 1 ? Expr(0) : i[1]});
        return body.binary(OpCode::kMul, b,
                           body.binary(OpCode::kSub, ctx.load_at(body, plain, i),
                                       ctx.load_at(body, retrieved, i)));
      });
    }
    const TensorValue before = state;
    state = ctx.pointwise(f, state_shape, [&](LoopBody& body, const std::vector<Expr>& i) {
      ValueId kd = load(body, k, {i[0], i[1], step, i[2]});
      ValueId outer = body.binary(OpCode::kMul, kd, ctx.load_at(body, written, {i[0], i[1], i[3]}));
      return body.binary(OpCode::kAdd, ctx.load_at(body, before, i), outer);
    });
    state = ctx.realize(state, fmt::format("the state after step {}", t));
    const TensorValue current = state;
    outputs.push_back(ctx.reduction(
        f, {batch, Expr(q_heads), Expr(1), Expr(dv)}, {Expr(dk)}, ReductionType::kSum,
        [&](LoopBody& body, const std::vector<Expr>& i, const std::vector<Expr>& r) {
          ValueId qd = load(body, q, {i[0], i[1], step, r[0]});
          ValueId s =
              ctx.load_at(body, current, {i[0], sym::floor_div(i[1], Expr(group)), r[0], i[3]});
          return body.binary(OpCode::kMul, body.binary(OpCode::kMul, qd, s),
                             body.constant(scale, f));
        }));
  }
  std::vector<const TensorValue*> parts;
  for (const TensorValue& o : outputs) parts.push_back(&o);
  const TensorValue all = concat_values(ctx, parts, 2);  // [B, H_q, T, d_v]
  TensorValue y = ctx.pointwise(
      query.dtype, {batch, query.shape[1], Expr(q_heads * dv)},
      [&](LoopBody& body, const std::vector<Expr>& i) {
        return body.cast(
            ctx.load_at(body, all,
                        {i[0], sym::floor_div(i[2], Expr(dv)), i[1], mod(i[2], Expr(dv))}),
            query.dtype);
      });
  const DType state_dtype = past != nullptr ? past->dtype : query.dtype;
  const TensorValue final_state = state;
  TensorValue present = ctx.pointwise(state_dtype, state_shape, [&](LoopBody& body, const auto& i) {
    return body.cast(ctx.load_at(body, final_state, i), state_dtype);
  });
  return {y, present};
}

}  // namespace

void register_attention_ops(Registry& registry) {
  registry.add("", "Attention", {lower_attention, 23, 24});
  registry.add("", "RotaryEmbedding", {lower_rotary_embedding, 23, 23});
  registry.add("", "LinearAttention", {lower_linear_attention, 27, 27});
  registry.add("ai.onnx.preview", "FlexAttention", {lower_flex_attention, 1, 1});
}

}  // namespace kiln::lower
