#include "onnx/function_inliner.h"

#include <fmt/format.h>

#include <google/protobuf/unknown_field_set.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "support/error.h"

namespace kiln::onnx {

namespace {

/// Calls nest at most this deep; deeper means a function calls itself.
constexpr int kMaxDepth = 64;
/// A model expands at most this many calls (a function that calls itself from a subgraph of its
/// own body expands without nesting deeper).
constexpr int kMaxExpansions = 1000000;

std::string normalize_domain(const std::string& domain) {
  return domain == "ai.onnx" ? std::string() : domain;
}

void collect_names(const ::onnx::GraphProto& graph, std::unordered_set<std::string>& names);

void collect_node_names(const ::onnx::NodeProto& node, std::unordered_set<std::string>& names) {
  names.insert(node.name());
  for (const auto& name : node.input()) names.insert(name);
  for (const auto& name : node.output()) names.insert(name);
  for (const auto& attr : node.attribute()) {
    if (attr.has_g()) collect_names(attr.g(), names);
    for (const auto& g : attr.graphs()) collect_names(g, names);
  }
}

void collect_names(const ::onnx::GraphProto& graph, std::unordered_set<std::string>& names) {
  for (const auto* list : {&graph.input(), &graph.output(), &graph.value_info()}) {
    for (const auto& info : *list) names.insert(info.name());
  }
  for (const auto& tensor : graph.initializer()) names.insert(tensor.name());
  for (const auto& node : graph.node()) collect_node_names(node, names);
}

/// Renames every value name in a graph nested in a function body (the subgraph of an If or
/// Loop there): names bound by the call keep their binding, all others are internal.
class Renamer {
 public:
  Renamer(std::unordered_map<std::string, std::string> bound, std::string prefix,
          std::unordered_set<std::string>& taken)
      : map_(std::move(bound)), prefix_(std::move(prefix)), taken_(taken) {}

  std::string operator()(const std::string& name) {
    if (name.empty()) return name;
    auto it = map_.find(name);
    if (it != map_.end()) return it->second;
    std::string fresh = prefix_ + name;
    while (!taken_.insert(fresh).second) fresh += "'";
    return map_[name] = fresh;
  }

  void rename_graph(::onnx::GraphProto& graph) {
    for (auto* list : {graph.mutable_input(), graph.mutable_output(), graph.mutable_value_info()}) {
      for (auto& info : *list) info.set_name((*this)(info.name()));
    }
    for (auto& tensor : *graph.mutable_initializer()) tensor.set_name((*this)(tensor.name()));
    for (auto& node : *graph.mutable_node()) rename_node(node);
  }

  void rename_node(::onnx::NodeProto& node) {
    if (!node.name().empty()) node.set_name(prefix_ + node.name());
    for (auto& name : *node.mutable_input()) name = (*this)(name);
    for (auto& name : *node.mutable_output()) name = (*this)(name);
    for (auto& attr : *node.mutable_attribute()) {
      if (attr.has_g()) rename_graph(*attr.mutable_g());
      for (auto& g : *attr.mutable_graphs()) rename_graph(g);
    }
  }

 private:
  std::unordered_map<std::string, std::string> map_;
  std::string prefix_;
  std::unordered_set<std::string>& taken_;
};

class Inliner {
 public:
  Inliner(::onnx::ModelProto& model, const std::string& source) : model_(model), source_(source) {
    for (const auto& function : model.functions()) {
      // A function with an overload (IR version 10) is called only by nodes naming it, and
      // Kiln refuses such nodes at import.
      if (has_overload(function)) continue;
      auto key = std::make_pair(normalize_domain(function.domain()), function.name());
      if (!functions_.emplace(key, &function).second) {
        user_error("{}: model-local function '{}' of domain '{}' is defined twice", source,
                   function.name(), function.domain());
      }
    }
    collect_names(model.graph(), taken_);
    for (const auto& function : model.functions()) {
      for (const auto& node : function.node()) collect_node_names(node, taken_);
    }
  }

  void run() {
    inline_graph(*model_.mutable_graph(), 0);
    model_.clear_functions();
  }

 private:
  /// FunctionProto.overload (field 13, IR version 10) is unknown to ONNX 1.12's protobuf.
  static bool has_overload(const ::onnx::FunctionProto& function) {
    const auto& unknown = function.GetReflection()->GetUnknownFields(function);
    for (int i = 0; i < unknown.field_count(); ++i) {
      const auto& field = unknown.field(i);
      if (field.number() == 13 &&
          field.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
          !field.length_delimited().empty()) {
        return true;
      }
    }
    return false;
  }

  /// The attributes with defaults, FunctionProto.attribute_proto (field 11, IR version 9),
  /// which ONNX 1.12's protobuf keeps as unknown fields.
  static std::vector<::onnx::AttributeProto> attribute_defaults(
      const ::onnx::FunctionProto& function, const std::string& label) {
    std::vector<::onnx::AttributeProto> defaults;
    const auto& unknown = function.GetReflection()->GetUnknownFields(function);
    for (int i = 0; i < unknown.field_count(); ++i) {
      const auto& field = unknown.field(i);
      if (field.number() != 11) continue;
      ::onnx::AttributeProto attr;
      if (field.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED ||
          !attr.ParseFromString(field.length_delimited())) {
        user_error("{}: function '{}' has an attribute default that cannot be parsed", label,
                   function.name());
      }
      defaults.push_back(std::move(attr));
    }
    return defaults;
  }

  const ::onnx::FunctionProto* callee(const ::onnx::NodeProto& node) const {
    auto it = functions_.find({normalize_domain(node.domain()), node.op_type()});
    return it == functions_.end() ? nullptr : it->second;
  }

  void inline_graph(::onnx::GraphProto& graph, int depth) {
    bool any = false;
    for (const auto& node : graph.node()) any = any || callee(node) != nullptr;
    if (any) {
      google::protobuf::RepeatedPtrField<::onnx::NodeProto> nodes;
      nodes.Swap(graph.mutable_node());
      for (auto& node : nodes) expand(node, *graph.mutable_node(), depth);
    }
    for (auto& node : *graph.mutable_node()) {
      for (auto& attr : *node.mutable_attribute()) {
        if (attr.has_g()) inline_graph(*attr.mutable_g(), depth);
        for (auto& g : *attr.mutable_graphs()) inline_graph(g, depth);
      }
    }
  }

  /// Appends `node` to `out`, or the body of the function it calls, itself expanded.
  void expand(const ::onnx::NodeProto& node,
              google::protobuf::RepeatedPtrField<::onnx::NodeProto>& out, int depth) {
    const ::onnx::FunctionProto* function = callee(node);
    if (function == nullptr) {
      *out.Add() = node;
      return;
    }
    std::string label = fmt::format("{}: node '{}' ({}, a model-local function)", source_,
                                    node.name(), node.op_type());
    if (depth >= kMaxDepth || expansions_ >= kMaxExpansions) {
      user_error(
          "{}: calls nest more than {} deep or expand more than {} times; a function "
          "calls itself",
          label, kMaxDepth, kMaxExpansions);
    }
    if (node.input_size() > function->input_size() ||
        node.output_size() > function->output_size()) {
      user_error("{}: has {} inputs and {} outputs; the function takes {} and gives {}", label,
                 node.input_size(), node.output_size(), function->input_size(),
                 function->output_size());
    }
    merge_opsets(*function, label);
    std::unordered_map<std::string, std::string> bound;
    for (int i = 0; i < function->input_size(); ++i) {
      bound[function->input(i)] = i < node.input_size() ? node.input(i) : "";
    }
    for (int i = 0; i < function->output_size(); ++i) {
      bound[function->output(i)] = i < node.output_size() ? node.output(i) : "";
    }
    std::string prefix = fmt::format("{}.{}/", function->name(), expansions_++);
    Renamer rename(std::move(bound), prefix, taken_);
    std::map<std::string, const ::onnx::AttributeProto*> given;
    for (const auto& attr : node.attribute()) given[attr.name()] = &attr;
    std::vector<::onnx::AttributeProto> defaults = attribute_defaults(*function, label);
    for (const auto& attr : defaults) given.emplace(attr.name(), &attr);
    google::protobuf::RepeatedPtrField<::onnx::NodeProto> body;
    for (const auto& inner : function->node()) {
      ::onnx::NodeProto copy = inner;
      rename.rename_node(copy);
      if (copy.name().empty()) copy.set_name(prefix + copy.op_type());
      resolve_attribute_refs(copy, given);
      *body.Add() = std::move(copy);
    }
    for (auto& inner : body) expand(inner, out, depth + 1);
    // Subgraphs of the inlined nodes are expanded by inline_graph, which walks every node
    // after expanding its graph.
  }

  /// Replaces attributes that refer to the caller's (`ref_attr_name`) by the caller's value
  /// under the body's name; one the caller does not give and the function has no default for is
  /// left out. Subgraphs of the node may refer too.
  static void resolve_attribute_refs(
      ::onnx::NodeProto& node, const std::map<std::string, const ::onnx::AttributeProto*>& given) {
    google::protobuf::RepeatedPtrField<::onnx::AttributeProto> resolved;
    for (auto& attr : *node.mutable_attribute()) {
      if (attr.ref_attr_name().empty()) {
        if (attr.has_g()) resolve_graph_refs(*attr.mutable_g(), given);
        for (auto& g : *attr.mutable_graphs()) resolve_graph_refs(g, given);
        *resolved.Add() = attr;
        continue;
      }
      auto it = given.find(attr.ref_attr_name());
      if (it == given.end()) continue;
      ::onnx::AttributeProto value = *it->second;
      value.set_name(attr.name());
      *resolved.Add() = std::move(value);
    }
    node.mutable_attribute()->Swap(&resolved);
  }

  static void resolve_graph_refs(
      ::onnx::GraphProto& graph,
      const std::map<std::string, const ::onnx::AttributeProto*>& given) {
    for (auto& node : *graph.mutable_node()) resolve_attribute_refs(node, given);
  }

  void merge_opsets(const ::onnx::FunctionProto& function, const std::string& label) {
    std::map<std::string, int64_t> model_opsets;
    for (const auto& import : model_.opset_import()) {
      model_opsets[normalize_domain(import.domain())] = import.version();
    }
    for (const auto& import : function.opset_import()) {
      std::string domain = normalize_domain(import.domain());
      auto it = model_opsets.find(domain);
      if (it == model_opsets.end()) {
        auto* added = model_.add_opset_import();
        added->set_domain(import.domain());
        added->set_version(import.version());
        model_opsets[domain] = import.version();
      } else if (it->second != import.version()) {
        user_error(
            "{}: function '{}' imports opset {} of domain '{}' but the model imports {}; Kiln "
            "inlines functions and needs one version per domain",
            label, function.name(), import.version(), domain.empty() ? "ai.onnx" : domain,
            it->second);
      }
    }
  }

  ::onnx::ModelProto& model_;
  const std::string& source_;
  std::map<std::pair<std::string, std::string>, const ::onnx::FunctionProto*> functions_;
  std::unordered_set<std::string> taken_;
  int expansions_ = 0;
};

}  // namespace

void inline_model_functions(::onnx::ModelProto& model, const std::string& source) {
  if (model.functions_size() == 0) return;
  // The functions live in `model`; inlining adds to its graph only, then clears them.
  Inliner(model, source).run();
}

}  // namespace kiln::onnx
