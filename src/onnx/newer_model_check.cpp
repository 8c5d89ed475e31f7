#include "onnx/newer_model_check.h"

#include <fmt/format.h>
#include <google/protobuf/unknown_field_set.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <regex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "graph/op_versions.h"
#include "support/error.h"

namespace kiln::onnx {

namespace {

namespace checker = ::onnx::checker;

std::string normalize_domain(const std::string& domain) {
  return domain == "ai.onnx" ? std::string() : domain;
}

/// The number of unknown field `number` of `message` (fields of a newer onnx.proto).
bool has_unknown_field(const google::protobuf::Message& message, int number) {
  const auto& unknown = message.GetReflection()->GetUnknownFields(message);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const auto& field = unknown.field(i);
    if (field.number() != number) continue;
    // An empty string is the field's default: no overload.
    if (field.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
        field.length_delimited().empty()) {
      continue;
    }
    return true;
  }
  return false;
}

std::string node_label(const std::string& source, const ::onnx::NodeProto& node) {
  return fmt::format("{}: node '{}' ({})", source, node.name(), node.op_type());
}

void check_graph_fields(const ::onnx::GraphProto& graph, const std::string& source);

void check_node_fields(const ::onnx::NodeProto& node, const std::string& source) {
  // NodeProto fields 8 (overload) and 10 (device_configurations), IR versions 10 and 11.
  if (has_unknown_field(node, 8)) {
    user_error("{}: field 'overload' (a call of one overload of a function) is not supported",
               node_label(source, node));
  }
  if (has_unknown_field(node, 10)) {
    user_error("{}: field 'device_configurations' (sharding over devices) is not supported",
               node_label(source, node));
  }
  for (const auto& attr : node.attribute()) {
    if (attr.has_g()) check_graph_fields(attr.g(), source);
    for (const auto& g : attr.graphs()) check_graph_fields(g, source);
  }
}

void check_graph_fields(const ::onnx::GraphProto& graph, const std::string& source) {
  for (const auto& node : graph.node()) check_node_fields(node, source);
}

/// Whether a node in `graph` (or deeper) is of an ai.onnx op changed after opset 17.
bool has_changed_ops(const ::onnx::GraphProto& graph, int64_t opset) {
  for (const auto& node : graph.node()) {
    if (normalize_domain(node.domain()).empty() &&
        !graph::onnx112_schema_is_current(node.op_type(), opset)) {
      return true;
    }
    for (const auto& attr : node.attribute()) {
      if (attr.has_g() && has_changed_ops(attr.g(), opset)) return true;
      for (const auto& g : attr.graphs()) {
        if (has_changed_ops(g, opset)) return true;
      }
    }
  }
  return false;
}

class NewerModelChecker {
 public:
  NewerModelChecker(const ::onnx::ModelProto& model, const graph::OpsetImports& opsets,
                    const std::string& source)
      : opsets_(opsets), source_(source) {
    ctx_.set_ir_version(
        static_cast<int>(std::min<int64_t>(model.ir_version(), ::onnx::IR_VERSION)));
    std::unordered_map<std::string, int> capped;
    for (const auto& [domain, version] : opsets) {
      int64_t limit = domain.empty() ? graph::kOnnx112Opset : domain == "ai.onnx.ml" ? 3 : version;
      capped[domain] = static_cast<int>(std::min(version, limit));
    }
    if (capped.count("") != 0) capped["ai.onnx"] = capped[""];
    ctx_.set_opset_imports(capped);
  }

  void check_graph(const ::onnx::GraphProto& graph, const checker::LexicalScopeContext& parent) {
    checker::LexicalScopeContext lex(parent);
    for (const auto& input : graph.input()) lex.add(input.name());
    for (const auto& tensor : graph.initializer()) lex.add(tensor.name());
    for (const auto& node : graph.node()) {
      check_node(node, lex);
      for (const auto& output : node.output()) lex.add(output);
    }
  }

 private:
  int64_t opset_of(const std::string& domain) const {
    auto it = opsets_.find(domain);
    return it == opsets_.end() ? 0 : it->second;
  }

  void check_node(const ::onnx::NodeProto& node, const checker::LexicalScopeContext& lex) {
    std::string domain = normalize_domain(node.domain());
    int64_t opset = opset_of(domain);
    bool onnx112_checks = domain.empty()
                              ? graph::onnx112_schema_is_current(node.op_type(), opset) &&
                                    !std::any_of(node.attribute().begin(), node.attribute().end(),
                                                 [&](const ::onnx::AttributeProto& attr) {
                                                   return subgraphs_changed(attr, opset);
                                                 })
                              : domain == "ai.onnx.ml" && opset <= 3;
    if (onnx112_checks) {
      try {
        checker::check_node(node, ctx_, lex);
      } catch (const std::exception& e) {
        std::string message = std::regex_replace(
            std::string(e.what()).substr(0, std::string(e.what()).find("==> Context:")),
            std::regex(R"(\s+)"), " ");
        while (!message.empty() && (message.back() == ' ' || message.back() == '.')) {
          message.pop_back();
        }
        user_error("{}: invalid model: {}", node_label(source_, node), message);
      }
      return;
    }
    if (domain.empty()) check_attribute_names(node, opset);
    for (const auto& attr : node.attribute()) {
      if (attr.has_g()) check_graph(attr.g(), lex);
      for (const auto& g : attr.graphs()) check_graph(g, lex);
    }
  }

  static bool subgraphs_changed(const ::onnx::AttributeProto& attr, int64_t opset) {
    if (attr.has_g() && has_changed_ops(attr.g(), opset)) return true;
    return std::any_of(attr.graphs().begin(), attr.graphs().end(),
                       [&](const ::onnx::GraphProto& g) { return has_changed_ops(g, opset); });
  }

  /// An attribute neither ONNX 1.12's version of the op nor a later version up to `opset`
  /// defines is refused: Kiln would not know what it means. Ops ONNX 1.12 does not know and the
  /// version table does not list are left to lowering, which refuses them.
  void check_attribute_names(const ::onnx::NodeProto& node, int64_t opset) const {
    const ::onnx::OpSchema* schema =
        ::onnx::OpSchemaRegistry::Schema(node.op_type(), graph::kOnnx112Opset, "");
    if (schema == nullptr && graph::op_versions_after_17(node.op_type()).empty()) return;
    std::vector<std::string_view> added = graph::attributes_added_after_17(node.op_type(), opset);
    for (const auto& attr : node.attribute()) {
      if (schema != nullptr && schema->attributes().count(attr.name()) != 0) continue;
      if (std::find(added.begin(), added.end(), attr.name()) != added.end()) continue;
      user_error("{}: attribute '{}' is not an attribute of {} at opset {} that Kiln knows",
                 node_label(source_, node), attr.name(), node.op_type(), opset);
    }
  }

  const graph::OpsetImports& opsets_;
  const std::string& source_;
  checker::CheckerContext ctx_;
};

}  // namespace

void check_newer_fields(const ::onnx::ModelProto& model, const std::string& source) {
  // ModelProto field 26: configuration (multi-device execution), IR version 11.
  if (has_unknown_field(model, 26)) {
    user_error("{}: field 'configuration' (multi-device execution) is not supported", source);
  }
  check_graph_fields(model.graph(), source);
  for (const auto& function : model.functions()) {
    for (const auto& node : function.node()) check_node_fields(node, source);
  }
}

void check_newer_model(const ::onnx::ModelProto& model, const graph::OpsetImports& opsets,
                       const std::string& source) {
  NewerModelChecker checker(model, opsets, source);
  checker.check_graph(model.graph(), checker::LexicalScopeContext());
}

}  // namespace kiln::onnx
