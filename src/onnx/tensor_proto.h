#pragma once
/// Conversion between onnx::TensorProto and graph::Tensor: every dtype Kiln represents, from
/// raw_data or the typed fields, and external data memory-mapped read-only from files confined to
/// the model's directory. Tests: tests/unit/onnx/tensor_file_test.cpp.

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <string>

#include "graph/tensor.h"

/// Kiln's namespace mirrors the folder; inside it, the protobuf classes are spelled ::onnx::.
namespace kiln::onnx {

/// Builds a tensor from `proto`. External data is looked up relative to `model_dir` and must stay
/// inside it. Throws UserError naming `context` (e.g. "initializer 'W'") on unsupported data
/// types, sizes that do not match the dims, and bad external data.
graph::Tensor tensor_from_proto(const ::onnx::TensorProto& proto,
                                const std::filesystem::path& model_dir, const std::string& context);

/// A TensorProto holding `t`: raw_data (little-endian; the 4- and 2-bit types packed as ONNX
/// packs them) for numeric types, string_data for strings.
::onnx::TensorProto tensor_to_proto(const graph::Tensor& t, const std::string& name);

}  // namespace kiln::onnx
