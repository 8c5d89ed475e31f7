#pragma once
/// A reference interpreter of the loop IR: evaluates an ir::Program directly, element by element,
/// in double / int64 arithmetic with the dtype semantics of the generated code (float32 results
/// rounded to float, integer results wrapped to their width, casts as C++ static_cast with
/// float-to-int truncating toward zero). It is the test oracle of lowering and the scheduler,
/// and a debugging tool: slow, and written to be obviously correct rather than fast.
///
/// Size symbols are bound from the inputs' shapes; buffers are evaluated in program order:
/// inputs and constants are copied in, computed buffers by looping over every index (and every
/// reduction index), extern buffers ("matmul", "conv") by naive reference implementations.
/// Loads of elements never written, out-of-bounds accesses and unbound symbols are
/// InternalErrors (bugs in the Program); bad inputs and out-of-range data-dependent indices are
/// UserErrors.
///
/// Tests: tests/unit/ir/interpreter_test.cpp, tests/unit/lower/suite_ops_test.cpp.

#include <map>
#include <string>

#include "graph/tensor.h"
#include "ir/buffer.h"

namespace kiln::ir {

/// Runs `program` on `inputs_by_onnx_name` (one tensor per InputSpec) and returns every output
/// (OutputSpec) as a contiguous tensor keyed by its ONNX name.
std::map<std::string, graph::Tensor> interpret(
    const Program& program, const std::map<std::string, graph::Tensor>& inputs_by_onnx_name);

}  // namespace kiln::ir
