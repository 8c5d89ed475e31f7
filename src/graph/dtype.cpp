#include "graph/dtype.h"

#include <iterator>

namespace kiln::graph {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kUndefined:
      return "undefined";
    case DType::kFloat32:
      return "float32";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt8:
      return "int8";
    case DType::kUInt16:
      return "uint16";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kString:
      return "string";
    case DType::kBool:
      return "bool";
    case DType::kFloat16:
      return "float16";
    case DType::kFloat64:
      return "float64";
    case DType::kUInt32:
      return "uint32";
    case DType::kUInt64:
      return "uint64";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "invalid";
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool:
      return 1;
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
    case DType::kUInt32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
    case DType::kUInt64:
      return 8;
    case DType::kUndefined:
    case DType::kString:
      return 0;
  }
  return 0;
}

std::string_view onnx_type_name(int32_t onnx_code) {
  // TensorProto.DataType as of ONNX 1.23 (IR version 13).
  static constexpr std::string_view kNames[] = {
      "UNDEFINED",      "FLOAT",    "UINT8",        "INT8",           "UINT16",
      "INT16",          "INT32",    "INT64",        "STRING",         "BOOL",
      "FLOAT16",        "DOUBLE",   "UINT32",       "UINT64",         "COMPLEX64",
      "COMPLEX128",     "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
      "FLOAT8E5M2FNUZ", "UINT4",    "INT4",         "FLOAT4E2M1",     "FLOAT8E8M0",
      "UINT2",          "INT2"};
  if (onnx_code < 0 || onnx_code >= static_cast<int32_t>(std::size(kNames))) return "unknown";
  return kNames[onnx_code];
}

std::optional<DType> dtype_from_onnx(int32_t onnx_code) {
  switch (onnx_code) {
    case 0:
      return DType::kUndefined;
    case 1:
      return DType::kFloat32;
    case 2:
      return DType::kUInt8;
    case 3:
      return DType::kInt8;
    case 4:
      return DType::kUInt16;
    case 5:
      return DType::kInt16;
    case 6:
      return DType::kInt32;
    case 7:
      return DType::kInt64;
    case 8:
      return DType::kString;
    case 9:
      return DType::kBool;
    case 10:
      return DType::kFloat16;
    case 11:
      return DType::kFloat64;
    case 12:
      return DType::kUInt32;
    case 13:
      return DType::kUInt64;
    case 16:
      return DType::kBFloat16;
    default:
      return std::nullopt;  // 14/15 complex, 17+ float8 and later additions
  }
}

DType compute_dtype(DType storage) {
  return storage == DType::kFloat16 || storage == DType::kBFloat16 ? DType::kFloat32 : storage;
}

std::string_view dtype_cpp_storage(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float";
    case DType::kFloat64:
      return "double";
    case DType::kUInt8:
      return "uint8_t";
    case DType::kInt8:
      return "int8_t";
    case DType::kUInt16:
      return "uint16_t";
    case DType::kInt16:
      return "int16_t";
    case DType::kInt32:
      return "int32_t";
    case DType::kInt64:
      return "int64_t";
    case DType::kUInt32:
      return "uint32_t";
    case DType::kUInt64:
      return "uint64_t";
    case DType::kBool:
      return "bool";
    case DType::kFloat16:
    case DType::kBFloat16:
      return "uint16_t";
    case DType::kString:
    case DType::kUndefined:
      return "";
  }
  return "";
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32 ||
         dtype == DType::kFloat64;
}

bool is_integer(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt32:
    case DType::kUInt64:
      return true;
    default:
      return false;
  }
}

bool is_signed(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      return true;
    default:
      return false;
  }
}

}  // namespace kiln::graph
