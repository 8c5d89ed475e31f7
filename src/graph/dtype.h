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
};

/// The ONNX name: "float32", "int64", "bool", ... ("string" for kString).
std::string_view dtype_name(DType dtype);
/// Bytes per element; 0 for string and undefined.
int64_t dtype_size(DType dtype);
/// The DType for an ONNX TensorProto data type code, nullopt if Kiln does not represent it
/// (complex types, float8).
std::optional<DType> dtype_from_onnx(int32_t onnx_code);
/// The ONNX spelling of a TensorProto data type code ("FLOAT", "FLOAT8E4M3FN", "INT4", ...),
/// including the codes of ONNX 1.13 and later that Kiln does not represent; "unknown" otherwise.
std::string_view onnx_type_name(int32_t onnx_code);
/// The C++ type used to store it in generated code ("float", "int64_t", "uint16_t" for
/// float16/bfloat16 bit patterns, "bool"); empty for string.
std::string_view dtype_cpp_storage(DType dtype);
bool is_floating(DType dtype);  // float16, bfloat16, float32, float64
/// The dtype arithmetic on `storage` values computes in: float16 and bfloat16 compute in
/// float32, every other dtype in itself.
DType compute_dtype(DType storage);
bool is_integer(DType dtype);  // signed and unsigned integers (not bool)
bool is_signed(DType dtype);

}  // namespace kiln::graph
