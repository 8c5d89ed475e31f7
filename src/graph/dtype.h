#pragma once
/// Element types of tensors, as ONNX defines them (the enum values are ONNX's TensorProto codes).

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::graph {

enum class DType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kBFloat16 = 16,
  // ONNX 1.14-1.23's small types; each element takes one byte in memory (see
  // runtime/kiln_small_types.h), while TensorProtos pack the 4- and 2-bit ones.
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
  kUInt4 = 21,
  kInt4 = 22,
  kFloat4E2M1 = 23,
  kFloat8E8M0 = 24,
  kUInt2 = 25,
  kInt2 = 26,
};

/// The ONNX name: "float32", "int64", "bool", ... ("string" for kString).
std::string_view dtype_name(DType dtype);
/// Bytes per element in memory; 0 for string and undefined. The 4- and 2-bit types take a byte.
int64_t dtype_size(DType dtype);
/// Bits per element as ONNX stores it (raw_data, external data, int32_data): 4 for int4, uint4
/// and float4e2m1, 2 for int2 and uint2, 8 * dtype_size otherwise.
int64_t dtype_packed_bits(DType dtype);
/// Bytes that `numel` elements take packed as ONNX stores them (rounded up to whole bytes).
int64_t dtype_packed_bytes(DType dtype, int64_t numel);
/// The DType for an ONNX TensorProto data type code, nullopt if Kiln does not represent it
/// (the complex types).
std::optional<DType> dtype_from_onnx(int32_t onnx_code);
/// The ONNX spelling of a TensorProto data type code ("FLOAT", "FLOAT8E4M3FN", "INT4", ...),
/// including the codes of ONNX 1.13 and later that Kiln does not represent; "unknown" otherwise.
std::string_view onnx_type_name(int32_t onnx_code);
/// The C++ type used to store it in generated code ("float", "int64_t", "uint16_t" for
/// float16/bfloat16 bit patterns, "uint8_t" for float8 and float4 codes, "int8_t" for int4 and
/// int2, "bool"); empty for string.
std::string_view dtype_cpp_storage(DType dtype);
bool is_floating(DType dtype);  // float16, bfloat16, float32, float64
/// The float8 and float4 types (stored as codes, computed in float32).
bool is_small_float(DType dtype);
/// int4, uint4, int2, uint2 (stored a byte each, computed in int32).
bool is_small_integer(DType dtype);
/// The largest finite value of a float8 or float4 type, the bound of saturating casts.
double small_float_max(DType dtype);
/// The dtype arithmetic on `storage` values computes in: float16, bfloat16, float8 and float4
/// compute in float32, the 4- and 2-bit integers in int32, every other dtype in itself.
DType compute_dtype(DType storage);
bool is_integer(DType dtype);  // signed and unsigned integers of 8 bits or more (not bool)
bool is_signed(DType dtype);

}  // namespace kiln::graph
