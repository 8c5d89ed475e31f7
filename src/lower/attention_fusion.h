#pragma once
/// Attention as one fused kernel (ir::AttentionCall, runtime/kiln_rt_attention.h): recognizes, at
/// the MatMul that ends it, the attention that exporters write as separate nodes,
///
///   P = Softmax(S, last axis);  out = MatMul(P, V)
///   S = T | Where(mask, T, fill) | Where(mask, fill, T) | Add(T, mask) | Add(mask, T)
///   T = M | Mul(M, c) | Mul(c, M) | Div(M, c);  M = MatMul(Q, K^T)
///
/// on the CPU and, when LoweringOptions::cuda_fused_attention asks for it, on CUDA (there with D
/// and Dv known and at most 128, and at most 6 batch dims:
/// codegen/cuda/cuda_attention.h), in float32, when: M, T, S and P are each read by that one next
/// node only (and are no graph output); c and fill are known scalars; the mask is bool (Where) or
/// float32 (Add) and broadcasts to the scores' shape without changing it; Q, K^T and V have rank at
/// least 2 and their batch dims broadcast to the scores' and the output's, which agree; Q, K^T and
/// V are not all constants (then the node-by-node path folds the whole attention when compiling).
/// Anything else lowers node by node as before. The nodes before the final MatMul have been lowered
/// by then; their buffers, read by nothing, are removed by the scheduler's dead-node elimination.
///
/// Tests: tests/models (attention blocks against numpy, fused and not), aot variants.

#include <functional>
#include <optional>

#include "graph/graph.h"
#include "lower/lowering.h"

namespace kiln::lower {

/// The lowered value of a graph value, and how many times the graph reads it (node inputs and
/// graph outputs).
using ValueLookup = std::function<const TensorValue&(const graph::Value&)>;
using UseCount = std::function<int(const graph::Value&)>;

/// The fused attention's output for `matmul` (a MatMul node), or nullopt when it does not end
/// the pattern above.
std::optional<TensorValue> fuse_attention(LoweringContext& ctx, const graph::Node& matmul,
                                          const ValueLookup& lookup, const UseCount& uses);

}  // namespace kiln::lower
