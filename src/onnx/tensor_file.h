#pragma once
/// Tensor files: ".pb" (a serialized onnx::TensorProto, as in the ONNX test suite) and ".npy"
/// (numpy's format, versions 1.0 to 3.0). Used for `kiln run` inputs and outputs and by tests.
/// Tests: tests/unit/onnx/tensor_file_test.cpp.

#include <filesystem>
#include <string>
#include <string_view>

#include "graph/graph.h"
#include "graph/tensor.h"

namespace kiln::onnx {

/// Reads a tensor file, chosen by extension (".pb" or ".npy"). Fortran-order .npy arrays are
/// transposed into C order. Throws UserError naming the path when the file cannot be read, is
/// truncated or malformed, or holds a type Kiln does not represent (big-endian, structured, ...).
graph::Tensor read_tensor_file(const std::filesystem::path& path);

/// Writes `t` atomically, chosen by extension: ".npy" (format 1.0, header padded to 64 bytes as
/// numpy does) or ".pb" (a TensorProto named `name`). Throws UserError for combinations numpy
/// cannot hold (bfloat16, string) and for unknown extensions.
void write_tensor_file(const graph::Tensor& t, const std::filesystem::path& path,
                       const std::string& name = "");

/// Reads a model input or output of type `type` from a file: for a tensor, as read_tensor_file;
/// for a sequence or an optional, a ".pb" file holding an onnx SequenceProto or OptionalProto
/// (as in the ONNX test suite). `what` names the value in errors.
graph::IoValue read_value_file(const std::filesystem::path& path, const graph::Type& type);

/// A short human summary, e.g. "float32[2, 3] min=-1 max=4 mean=1.5 values=[-1, 0, 1, ...]".
std::string tensor_summary(const graph::Tensor& t);

/// The bytes of a .npy file holding `t` (what write_tensor_file writes for ".npy").
std::string encode_npy(const graph::Tensor& t, const std::string& what);
/// Parses the bytes of a .npy file; `what` (usually the path) names it in errors.
graph::Tensor decode_npy(std::string_view bytes, const std::string& what);

}  // namespace kiln::onnx
