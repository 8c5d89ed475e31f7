#pragma once
/// Split reductions for the CUDA backend: a reduction with few output rows and long rows would
/// run on a few blocks of the GPU (a block per row), so it becomes two ordinary reductions
/// (Inductor's split reduction): a first buffer of partial results, [rows, S], each the reduction
/// of one of S consecutive chunks of the row, and the original buffer, which reduces the S
/// partials of its row in order and applies what followed the reduction (a mean's division, a
/// norm's root). The chunks and the order of combination are fixed when compiling, so results
/// are reproducible run to run (no atomics); the partial buffer is an ordinary buffer, placed in
/// the device arena by the memory plan.

#include <cstdint>

#include "ir/buffer.h"

namespace kiln::codegen {

/// Rows of at least this many elements (static) may be split.
inline constexpr int64_t kSplitMinRow = 8192;

/// Splits every CUDA reduction buffer of `program` whose static rows are long (kSplitMinRow)
/// and few (fewer than a block for each of the GPU's multiprocessors, twice over), of a
/// reduction that combines partial results with itself (Sum, Prod, Max, Min, Any, All). Returns
/// how many it split.
int split_long_reductions(ir::Program& program);

}  // namespace kiln::codegen
