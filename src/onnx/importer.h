#pragma once
/// The ONNX importer: reads a ModelProto, runs the ONNX checker and shape inference, and builds a
/// graph::Model: values typed with symbolic shapes (each dim_param becomes a size symbol of that
/// name; unknown dims become fresh symbols "unk__0", "unk__1", ... in order of appearance),
/// initializers loaded as constants (external data relative to the model's directory), opsets
/// per domain recorded on every node, and If/Loop/Scan bodies imported as nested graphs. The
/// result has passed graph::verify(). Model-local functions are inlined first
/// (onnx/function_inliner.h).
///
/// Opsets up to graph::kMaxOpset (28) and IR versions up to graph::kMaxIrVersion (14) import;
/// ONNX 1.12's checker and shape inference know opset 17 and IR version 8, so for a newer model
/// each node is checked by ONNX 1.12 only where its schema still describes the node's version
/// (graph/op_versions.h), and inferred only where its inference still holds; other nodes have
/// their attributes checked against the versions Kiln knows, and lowering infers their shapes.
/// Fields of newer IR versions that only annotate (metadata_props, doc strings) are ignored; one
/// that changes meaning (a node's function overload, multi-device configurations) is refused
/// naming it. Every problem with the file or the model is a UserError
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

/// The newest ai.onnx opset Kiln accepts (graph::kMaxOpset).
int64_t max_supported_opset();

/// What import_model did with the file's bytes (for tests and `kiln info`).
struct ImportStats {
  /// The model file's bytes, read through a read-only memory mapping (never copied whole).
  uint64_t model_bytes_mapped = 0;
};

/// Imports the model at `path`, reading the file memory-mapped. External data is mapped too
/// (each initializer borrows its bytes from a mapping of its file: graph::Tensor::is_mapped), at
/// any offset and length the file holds, past 2^32 included.
graph::Model import_model(const std::filesystem::path& path, ImportStats* stats = nullptr);

/// Imports a serialized ModelProto held in memory. `source_name` names it in messages;
/// `model_dir` is where relative external-data locations are resolved.
graph::Model import_model_from_bytes(std::string_view bytes, const std::string& source_name,
                                     const std::filesystem::path& model_dir);

}  // namespace kiln::onnx
