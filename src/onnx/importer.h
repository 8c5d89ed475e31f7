#pragma once
/// The ONNX importer: reads a ModelProto, runs the ONNX checker and shape inference, and builds a
/// graph::Model: values typed with symbolic shapes (each dim_param becomes a size symbol of that
/// name; unknown dims become fresh symbols "unk__0", "unk__1", ... in order of appearance),
/// initializers loaded as constants (external data relative to the model's directory), opsets
/// per domain recorded on every node, and If/Loop/Scan bodies imported as nested graphs. The
/// result has passed graph::verify(). Every problem with the file or the model is a UserError
/// naming the file (and the node where one is to blame).
///
/// Tests: tests/unit/onnx/importer_test.cpp, tests/unit/onnx/suite_import_test.cpp,
/// tests/errors/.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "graph/graph.h"

namespace kiln::onnx {

/// The newest ai.onnx opset Kiln accepts (what the ONNX library it is built with knows).
int64_t max_supported_opset();

/// Imports the model at `path`.
graph::Model import_model(const std::filesystem::path& path);

/// Imports a serialized ModelProto held in memory. `source_name` names it in messages;
/// `model_dir` is where relative external-data locations are resolved.
graph::Model import_model_from_bytes(std::string_view bytes, const std::string& source_name,
                                     const std::filesystem::path& model_dir);

}  // namespace kiln::onnx
