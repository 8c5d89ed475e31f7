#include "graph/dtype.h"

#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>

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
    case DType::kFloat8E4M3FN:
      return "float8e4m3fn";
    case DType::kFloat8E4M3FNUZ:
      return "float8e4m3fnuz";
    case DType::kFloat8E5M2:
      return "float8e5m2";
    case DType::kFloat8E5M2FNUZ:
      return "float8e5m2fnuz";
    case DType::kUInt4:
      return "uint4";
    case DType::kInt4:
      return "int4";
    case DType::kFloat4E2M1:
      return "float4e2m1";
    case DType::kFloat8E8M0:
      return "float8e8m0";
    case DType::kUInt2:
      return "uint2";
    case DType::kInt2:
      return "int2";
  }
  return "invalid";
}

int64_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kUInt4:
    case DType::kInt4:
    case DType::kFloat4E2M1:
    case DType::kFloat8E8M0:
    case DType::kUInt2:
    case DType::kInt2:
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

int64_t dtype_packed_bits(DType dtype) {
  switch (dtype) {
    case DType::kUInt4:
    case DType::kInt4:
    case DType::kFloat4E2M1:
      return 4;
    case DType::kUInt2:
    case DType::kInt2:
      return 2;
    default:
      return 8 * dtype_size(dtype);
  }
}

int64_t dtype_packed_bytes(DType dtype, int64_t numel) {
  int64_t bits = dtype_packed_bits(dtype);
  if (bits >= 8) return numel * (bits / 8);
  int64_t per_byte = 8 / bits;
  return numel / per_byte + (numel % per_byte != 0 ? 1 : 0);
}

std::string_view onnx_type_name(int32_t onnx_code) {
  // TensorProto.DataType as of IR version 14.
  static constexpr std::string_view kNames[] = {
      "UNDEFINED",      "FLOAT",      "UINT8",          "INT8",       "UINT16",    "INT16",
      "INT32",          "INT64",      "STRING",         "BOOL",       "FLOAT16",   "DOUBLE",
      "UINT32",         "UINT64",     "COMPLEX64",      "COMPLEX128", "BFLOAT16",  "FLOAT8E4M3FN",
      "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4",      "INT4",      "FLOAT4E2M1",
      "FLOAT8E8M0",     "UINT2",      "INT2",           "FLOAT6E2M3", "FLOAT6E3M2"};
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
      break;
  }
  if (onnx_code >= 17 && onnx_code <= 26) return static_cast<DType>(onnx_code);
  return std::nullopt;  // 14/15 complex, and codes after ONNX 1.23's
}

DType compute_dtype(DType storage) {
  if (storage == DType::kFloat16 || storage == DType::kBFloat16 || is_small_float(storage)) {
    return DType::kFloat32;
  }
  return is_small_integer(storage) ? DType::kInt32 : storage;
}

bool is_small_float(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat4E2M1:
    case DType::kFloat8E8M0:
      return true;
    default:
      return false;
  }
}

bool is_small_integer(DType dtype) {
  return dtype == DType::kInt4 || dtype == DType::kUInt4 || dtype == DType::kInt2 ||
         dtype == DType::kUInt2;
}

double small_float_max(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3FN:
      return 448.0;
    case DType::kFloat8E4M3FNUZ:
      return 240.0;
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
      return 57344.0;
    case DType::kFloat4E2M1:
      return 6.0;
    case DType::kFloat8E8M0:
      return 0x1.0p127;
    default:
      return 0.0;
  }
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
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat4E2M1:
    case DType::kFloat8E8M0:
    case DType::kUInt4:
    case DType::kUInt2:
      return "uint8_t";
    case DType::kInt4:
    case DType::kInt2:
      return "int8_t";
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
  if (is_small_float(dtype)) return dtype != DType::kFloat8E8M0;
  switch (dtype) {
    case DType::kInt4:
    case DType::kInt2:
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
