#pragma once
/// The op table of the C++ backend: for each arithmetic op of ops.def, its scalar C++ expression
/// and its kiln::vec expression (kiln_vec.h), as fmt templates over the operands ({0}, {1}, {2}).
/// Also C++ type names and literals. Memory and structural ops (load, store, constant,
/// index_expr, indirect, cast, where, reduction) have no entry: the body emitter handles them.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/dtype.h"
#include "ir/loop_body.h"

namespace kiln::codegen {

struct CppOpTemplates {
  const char* scalar = nullptr;  // nullptr: not a table op
  const char* vector = nullptr;  // nullptr: no vector form (the loop stays scalar)
  /// The vector form works on masks (bool operands) rather than VecF32.
  bool vector_on_masks = false;
};

/// The table entry of `code` (a switch over every OpCode, so new ops fail to compile).
const CppOpTemplates& cpp_op_templates(ir::OpCode code);

/// For a float32 exp, log, tanh, erf or sigmoid, the scalar form through kiln_simd_math.h's
/// functions, which a loop the C++ compiler vectorizes runs a vector at a time (libm's, in the
/// table's scalar form, keep the loop scalar): Sleef's vector exp and log, inline polynomials for
/// erf and tanh (GELU's, 3-4x faster than Sleef's); nullptr for every other op. Template
/// epilogues and the loops across a reduction's outputs use it.
const char* cpp_simd_math_form(const ir::Op& op);

/// The forms of one op: the scalar C++ expression, kiln::vec's, and the kv_ helpers of template
/// epilogues (render_vector_epilogue_helpers).
enum class OpForm { kScalar, kVec, kKv };

/// A floating Maximum or Minimum one of whose operands is a Constant other than NaN (Clip's
/// bounds, Relu6's), applied to its operands' text `args` in `form`, with the bound as the second
/// operand of kiln::maximum_num, kiln::vec::maximum_num or kv_max_num (minimum alike); nullopt
/// for every other op. `ops` is the op's loop body. With one operand a number, the NaN-propagating
/// maximum and minimum take one x86 max or min (which returns its second operand when either is
/// NaN: with the bound first, a NaN input stays) instead of a max, a compare and a blend: at
/// MobileNetV2's 16 -> 96 expansion with its Clip, the GEMM ran 0.25 ms against 0.33.
std::optional<std::string> format_number_bound(const ir::Op& op, const std::vector<ir::Op>& ops,
                                               const std::vector<std::string>& args, OpForm form);

/// The C++ type of a compute dtype (float16/bfloat16 compute as float).
std::string_view cpp_compute_type(graph::DType dtype);

/// A table template (CppOpTemplates::scalar or ::vector) applied to its operands' C++ text.
std::string format_op(const char* tmpl, const std::vector<std::string>& args);

/// A literal of `dtype` (compute type) for a Constant op's value.
std::string cpp_literal(const ir::Op& op);

/// The identity of a reduction for `dtype` as a C++ expression (sum: 0, max: -inf or lowest ...).
std::string cpp_reduction_init(ir::ReductionType type, graph::DType dtype);

}  // namespace kiln::codegen
