#pragma once
/// Element semantics of the reference interpreter (interpreter.h): one value of any dtype, casts
/// and the arithmetic of every LoopBody op, in the dtype semantics of the generated C++ code.
/// Internal to the interpreter; tests: tests/unit/ir/interpreter_test.cpp.

#include <cstdint>

#include "graph/dtype.h"
#include "graph/tensor.h"
#include "ir/loop_body.h"

namespace kiln::ir::interp {

/// One element. Floating dtypes use `f` (already rounded to the dtype); integers and bool use
/// `i`, wrapped to the dtype's width (uint64 keeps its bit pattern).
struct Scalar {
  double f = 0;
  int64_t i = 0;
};

/// True for the dtypes whose elements live in Scalar::f.
bool is_float_dtype(graph::DType dtype);

/// Wraps an integer to the width of `dtype` like static_cast (bool: != 0).
int64_t wrap_int(int64_t value, graph::DType dtype);
/// Rounds a double to the precision of a floating `dtype` (float64: unchanged).
double round_float(double value, graph::DType dtype);

/// A scalar of `dtype` from a double (floats rounded, integers truncated toward zero).
Scalar from_double(double value, graph::DType dtype);
/// The value as a double / an int64 (uint64 above the int64 range converts exactly to double).
double to_double(Scalar s, graph::DType dtype);

/// C++ static_cast semantics between any two numeric/bool dtypes; to bool is != 0; float to
/// integer truncates toward zero (NaN and out-of-range values give INT64_MIN, then wrap, as x86
/// and numpy do).
Scalar cast(Scalar s, graph::DType from, graph::DType to);

/// `s` (of dtype `from`) as a storage of `storage` holds it: cast to `storage`, or for the float8,
/// float4 and sub-byte integer types rounded or wrapped to the type and kept in its compute dtype.
Scalar to_storage(Scalar s, graph::DType from, graph::DType storage);

/// ONNX BitCast: `s` (of compute_dtype(from)) stored as `from`, its bits read as `to` (equal bit
/// widths), as a scalar of compute_dtype(to).
Scalar bitcast(Scalar s, graph::DType from, graph::DType to);

/// Unary op `code` on `a` of dtype `in`, producing dtype `out`.
Scalar apply_unary(OpCode code, Scalar a, graph::DType in, graph::DType out);
/// Binary op `code`; `bt` may differ from `at` only for Pow, Shl, Shr. Integer division or
/// remainder by zero throws UserError.
Scalar apply_binary(OpCode code, Scalar a, graph::DType at, Scalar b, graph::DType bt,
                    graph::DType out);

/// Element k of a tensor (row-major) as a Scalar of the tensor's compute dtype.
Scalar read_element(const graph::Tensor& tensor, int64_t k);
/// Writes a Scalar of compute dtype `from` into element k of `tensor` (converting to its dtype).
void write_element(graph::Tensor& tensor, int64_t k, Scalar s, graph::DType from);

}  // namespace kiln::ir::interp
