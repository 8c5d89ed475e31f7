#pragma once
/// Constant folding during lowering: values and buffers that depend only on constants
/// (initializers, Constant nodes and what is computed from them alone) are evaluated at compile
/// time with the reference interpreter (ir/interpreter.h) and become constant buffers, so the
/// generated code never recomputes them.
///
/// Accepts a lazy TensorValue (fold_constant, called by lower_graph's settle() for every node
/// output) or the whole Program after lowering (finish_constant_folding, for buffers that op
/// lowerings materialized on their own, e.g. a contiguous copy of a transposed weight for a
/// library call). A value or buffer is foldable when its shape is static, no index uses a size
/// symbol, and every buffer it reads is a constant, or a computed or extern ("matmul", "conv")
/// buffer that is itself foldable. Evaluation copies the buffers it needs (constants share their
/// tensors) into a small Program and interprets it; work above kMaxFoldWork element-ops is left
/// to run time (logged under KILN_LOG=schedule).
///
/// Tests: tests/unit/lower/constant_fold_test.cpp.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "ir/buffer.h"
#include "lower/lowering.h"

namespace kiln::lower {

/// The most element-ops (elements times body ops, summed over the buffers evaluated) a fold may
/// cost; the interpreter walks ops per element, so this bounds compile time to about a second.
inline constexpr int64_t kMaxFoldWork = 50'000'000;

/// The most bytes of constant a transposing view of it is folded for (a copy when compiling).
inline constexpr size_t kMaxTransposedViewBytes = 256 << 10;

/// Whether `body` is a view of constants of at most kMaxTransposedViewBytes each that reads one
/// with a stride other than 0 or 1 along its last dim: its readers would load it so along their
/// vector loop and stay scalar, so fold_constant folds it into a constant of its own layout,
/// though it computes nothing. Swin's relative position bias, a [49 * 49, heads] table read as
/// [heads, 49, 49] in the Add before each window attention's Softmax: those Softmaxes ran scalar.
bool is_small_transposing_view(const ir::Program& program, const ir::LoopBody& body);

/// The value evaluated at compile time as a constant (ctx.from_constant: small tensors also get
/// known contents), or nullopt when `value` is not foldable, not worth folding (already a load
/// of a constant buffer, only a view of constants other than a small transposing one: free at
/// run time and folding would copy the weight, or a generator reading no buffer at all), over
/// budget, or its evaluation fails (e.g. an out-of-range constant index: that error is left to
/// the run-time check).
std::optional<TensorValue> fold_constant(LoweringContext& ctx, const TensorValue& value);

/// The clean-up after lowering: prune_unreachable_buffers, fold_constant_buffers, and
/// prune_unreachable_buffers again.
void finish_constant_folding(ir::Program& program);

/// Turns every foldable computed or extern buffer that is not a graph output into a constant
/// buffer of the same name, in program order.
void fold_constant_buffers(ir::Program& program);

/// Drops computed and extern buffers that no output reads, directly or through other buffers
/// (e.g. a reduction of a weight whose only user was folded), and index checks on dropped
/// buffers. Constant buffers are left to prune_unused_constants, which should run afterwards.
void prune_unreachable_buffers(ir::Program& program);

}  // namespace kiln::lower
