#pragma once
/// Helpers shared by the elementwise, activation, reduction and normalization lowerings
/// (elementwise.cpp, activation.cpp, reduce.cpp, norm.cpp): dtype checks whose errors name the
/// node, broadcasting maps of inputs to a pointwise output, and folding of compile-time contents
/// (`known` / `known_float`) through elementwise ops.
///
/// Tests: tests/unit/lower/suite_ops_test.cpp (ONNX node suite through the interpreter).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ir/loop_body.h"
#include "lower/lowering.h"
#include "sym/expr.h"

namespace kiln::lower {

/// Sets of dtypes an op accepts (bit flags).
enum DTypeSet : unsigned {
  kFloats = 1u,        // float16, bfloat16, float32, float64
  kSignedInts = 2u,    // int8..int64
  kUnsignedInts = 4u,  // uint8..uint64
  kBools = 8u,         // bool
  kSmallTypes = 16u,   // float8, float4e2m1, int4, uint4, int2, uint2 (ops that move data)
  kInts = kSignedInts | kUnsignedInts,
  kSignedNumbers = kFloats | kSignedInts,
  kNumbers = kFloats | kInts,
  kAllTypes = kNumbers | kBools | kSmallTypes,
};

/// True when `dtype` belongs to `allowed`.
bool dtype_in(graph::DType dtype, unsigned allowed);
/// Fails naming the node when `dtype` is a string or not in `allowed`; `what` names the input.
void require_dtype(const LoweringContext& ctx, graph::DType dtype, unsigned allowed,
                   const std::string& what);
/// Fails naming the node unless every present input has the same dtype; returns it.
graph::DType common_dtype(const LoweringContext& ctx,
                          const std::vector<const TensorValue*>& inputs);

/// The dtype ops compute in (graph/dtype.h).
using graph::compute_dtype;

/// Builds the output element from the inputs' elements (loaded at the broadcast index).
using ElementFn =
    std::function<ir::ValueId(ir::LoopBody& body, const std::vector<ir::ValueId>& elements)>;

/// A pointwise value over the numpy broadcast of the inputs' shapes, of dtype `out`. Does not
/// fold known contents (see fold_known).
TensorValue broadcast_map(LoweringContext& ctx, const std::vector<const TensorValue*>& inputs,
                          graph::DType out, const ElementFn& fn);

/// Per-element symbolic rule for known integer contents: nullopt when the result is not
/// expressible (the whole value then stays unknown).
using KnownFn = std::function<std::optional<sym::Expr>(const std::vector<sym::Expr>& args)>;

/// Folds compile-time contents through an elementwise op into `value` (whose shape is the
/// broadcast of the inputs'): when every input is made of literals, each element is computed
/// with the exact dtype semantics of `code` (an ir op; kCast for casts, kNoOp-like identity via
/// kCast to the same dtype) and stored in `known` (integer and bool results) or `known_float`;
/// otherwise, for integer results, `symbolic` (when given) builds each element from the inputs'
/// `known` expressions.
void fold_known(LoweringContext& ctx, TensorValue& value,
                const std::vector<const TensorValue*>& inputs, ir::OpCode code,
                const KnownFn& symbolic = {});

/// Cast of `x` to `to` with Cast's attributes on `node` (saturate, round_mode): shared by Cast
/// and CastLike. Casts to the 8-, 4- and 2-bit types are materialized, since the loop IR rounds
/// them only where they are stored.
TensorValue cast_value(LoweringContext& ctx, const graph::Node& node, const TensorValue& x,
                       graph::DType to);

/// Registration of the activation and unary math lowerings (activation.cpp).
void register_activation_ops(Registry& registry);

}  // namespace kiln::lower
