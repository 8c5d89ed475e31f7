#pragma once
/// Checks of what ONNX 1.12's checker cannot judge in a model newer than it (opset above 17, IR
/// version above 8, ai.onnx.ml above 3):
/// - check_newer_fields: fields of IR versions 9-13 unknown to ONNX 1.12's protobuf (kept by the
///   parser as unknown fields). Annotations (metadata_props on every proto, value_info of
///   functions) are ignored; NodeProto.overload (a call of one overload of a function) and
///   device configurations (ModelProto.configuration, NodeProto.device_configurations) are
///   refused naming the node or field.
/// - check_newer_model: each node whose op has not changed since opset 17
///   (graph/op_versions.h) goes through ONNX 1.12's node checker, with its opset seen as 17; any
///   other node has its attributes checked against those of the versions Kiln knows (its
///   inputs, types and shapes are checked when lowering). Undefined values and cycles are left
///   to graph::verify.
/// Tests: tests/unit/onnx/importer_test.cpp (NewerOpset*).

#include <onnx/onnx_pb.h>

#include <string>

#include "graph/graph.h"

namespace kiln::onnx {

/// Throws UserError naming `source` and the node for a field that changes meaning.
void check_newer_fields(const ::onnx::ModelProto& model, const std::string& source);

/// Throws UserError naming `source` and the node for a node that fails the checks above.
void check_newer_model(const ::onnx::ModelProto& model, const graph::OpsetImports& opsets,
                       const std::string& source);

}  // namespace kiln::onnx
