#pragma once
/// Inlining of model-local functions (ModelProto.functions, IR version 8 and later), as ONNX
/// Runtime does at load: every node that calls a function of the model is replaced by the
/// function's nodes, in the main graph and in subgraphs, and calls inside functions are inlined
/// in turn. Attributes the body refers to (`ref_attr_name`) take the caller's value, else the
/// function's default, else are left out. The values and nodes of each expansion are renamed
/// apart ("<function>.<k>/<name>", with k counting expansions, checked against every name of
/// the model), so names stay unique. The function's opset imports are merged into the model's;
/// a domain imported at two different versions is refused. Afterwards the model has no
/// functions, and the ONNX checker and shape inference see plain nodes.
/// Tests: tests/unit/onnx/importer_test.cpp (ModelLocalFunction*).

#include <onnx/onnx_pb.h>

#include <string>

namespace kiln::onnx {

/// Inlines every call of a model-local function in `model` and clears model.functions. Throws
/// UserError naming `source`, the function and the node for recursive calls, missing inputs or
/// conflicting opsets.
void inline_model_functions(::onnx::ModelProto& model, const std::string& source);

}  // namespace kiln::onnx
