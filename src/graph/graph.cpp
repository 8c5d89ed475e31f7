// Graph construction, typed attribute access, text forms of types, the structural verifier and
// the text dump.
#include "graph/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::graph {

IoValue IoValue::tensor(Tensor t) {
  IoValue v;
  v.tensors.push_back(std::move(t));
  return v;
}

std::string IoValue::str() const {
  std::string content;
  if (!present) {
    content = "empty";
  } else if (kind == ValueKind::kSequence) {
    content = "seq(" + std::to_string(tensors.size()) + " tensors)";
  } else {
    content = std::string(dtype_name(tensors.at(0).dtype()));
  }
  return optional ? "optional(" + content + ")" : content;
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) out += ", ";
    out += shape[i].str();
  }
  return out + "]";
}

Type Type::tensor(DType dtype, std::optional<Shape> shape) {
  Type type;
  type.kind = ValueKind::kTensor;
  type.dtype = dtype;
  type.shape = std::move(shape);
  return type;
}

std::string Type::str() const {
  switch (kind) {
    case ValueKind::kTensor: {
      // An unknown dtype prints as "?"; an unknown rank as "[?]" (unknown dims of a known rank
      // are always size symbols, so "[?]" cannot be mistaken for one).
      std::string dtype_text = dtype == DType::kUndefined ? "?" : std::string(dtype_name(dtype));
      return dtype_text + (shape ? shape_str(*shape) : "[?]");
    }
    case ValueKind::kSequence:
      return "seq(" + (element ? element->str() : std::string("?")) + ")";
    case ValueKind::kOptional:
      return "optional(" + (element ? element->str() : std::string("?")) + ")";
  }
  return "?";
}

Value* Graph::add_value(const std::string& name, Type type) {
  KILN_CHECK(by_name_.count(name) == 0, "value '{}' already exists in graph '{}'", name, name_);
  values_.push_back(std::make_unique<Value>(name, std::move(type)));
  Value* value = values_.back().get();
  by_name_.emplace(name, value);
  return value;
}

Value* Graph::find_value(const std::string& name) const {
  for (const Graph* graph = this; graph != nullptr; graph = graph->parent_) {
    auto it = graph->by_name_.find(name);
    if (it != graph->by_name_.end()) return it->second;
  }
  return nullptr;
}

Value* Graph::find_local_value(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void Graph::add_input(Value* value) {
  KILN_CHECK(value != nullptr, "null graph input in graph '{}'", name_);
  inputs_.push_back(value);
}

void Graph::add_output(Value* value) {
  KILN_CHECK(value != nullptr, "null graph output in graph '{}'", name_);
  outputs_.push_back(value);
}

void Graph::set_initializer(Value* value, std::shared_ptr<const Tensor> data) {
  KILN_CHECK(value != nullptr && data != nullptr, "null initializer in graph '{}'", name_);
  if (value->initializer_ == nullptr) initializers_.push_back(value);
  value->initializer_ = std::move(data);
}

Node* Graph::add_node(std::string name, std::string op_type, std::string domain, int64_t opset,
                      std::vector<Value*> inputs, std::vector<Value*> outputs,
                      std::map<std::string, AttributeValue> attributes) {
  auto node = std::make_unique<Node>();
  node->name_ = std::move(name);
  node->op_type_ = std::move(op_type);
  node->domain_ = std::move(domain);
  node->opset_ = opset;
  node->inputs_ = std::move(inputs);
  node->outputs_ = std::move(outputs);
  node->attributes_ = std::move(attributes);
  Node* raw = node.get();
  for (Value* input : raw->inputs_) {
    if (input != nullptr) input->users_.push_back(raw);
  }
  // A value written twice keeps its first producer; verify() reports the second one.
  for (Value* output : raw->outputs_) {
    if (output != nullptr && output->producer_ == nullptr) output->producer_ = raw;
  }
  nodes_.push_back(std::move(node));
  return raw;
}

namespace {

/// The ONNX-style name of the type an attribute value holds, for error messages.
std::string_view attribute_type_name(const AttributeValue& value) {
  static constexpr std::string_view kNames[] = {"int",  "float",  "string",  "tensor",  "graph",
                                                "ints", "floats", "strings", "tensors", "graphs"};
  static_assert(std::size(kNames) == std::variant_size_v<AttributeValue>);
  return kNames[value.index()];
}

template <typename T>
std::string_view type_name_of() {
  return attribute_type_name(AttributeValue(T{}));
}

/// The attribute as T, nullptr when absent; a UserError naming the node when it has another type.
template <typename T>
const T* typed_attribute(const Node& node, const std::string& name) {
  auto it = node.attributes().find(name);
  if (it == node.attributes().end()) return nullptr;
  if (const T* value = std::get_if<T>(&it->second)) return value;
  user_error("{}: attribute '{}' should be of type {}, found {}", node.describe(), name,
             type_name_of<T>(), attribute_type_name(it->second));
}

}  // namespace

int64_t Node::attr_int(const std::string& name, int64_t fallback) const {
  const auto* value = typed_attribute<int64_t>(*this, name);
  return value ? *value : fallback;
}

float Node::attr_float(const std::string& name, float fallback) const {
  const auto* value = typed_attribute<float>(*this, name);
  return value ? *value : fallback;
}

std::string Node::attr_string(const std::string& name, const std::string& fallback) const {
  const auto* value = typed_attribute<std::string>(*this, name);
  return value ? *value : fallback;
}

std::vector<int64_t> Node::attr_ints(const std::string& name, std::vector<int64_t> fallback) const {
  const auto* value = typed_attribute<std::vector<int64_t>>(*this, name);
  return value ? *value : fallback;
}

std::vector<float> Node::attr_floats(const std::string& name, std::vector<float> fallback) const {
  const auto* value = typed_attribute<std::vector<float>>(*this, name);
  return value ? *value : fallback;
}

std::vector<std::string> Node::attr_strings(const std::string& name,
                                            std::vector<std::string> fallback) const {
  const auto* value = typed_attribute<std::vector<std::string>>(*this, name);
  return value ? *value : fallback;
}

const Tensor* Node::attr_tensor(const std::string& name) const {
  return typed_attribute<Tensor>(*this, name);
}

std::shared_ptr<Graph> Node::attr_graph(const std::string& name) const {
  const auto* value = typed_attribute<std::shared_ptr<Graph>>(*this, name);
  return value ? *value : nullptr;
}

std::vector<std::shared_ptr<Graph>> Node::subgraphs() const {
  std::vector<std::shared_ptr<Graph>> graphs;
  for (const auto& [name, value] : attributes_) {
    if (const auto* graph = std::get_if<std::shared_ptr<Graph>>(&value)) {
      graphs.push_back(*graph);
    } else if (const auto* list = std::get_if<std::vector<std::shared_ptr<Graph>>>(&value)) {
      graphs.insert(graphs.end(), list->begin(), list->end());
    }
  }
  return graphs;
}

std::string Node::describe() const {
  if (domain_.empty() || domain_ == "ai.onnx")
    return fmt::format("node '{}' ({})", name_, op_type_);
  return fmt::format("node '{}' ({}:{})", name_, domain_, op_type_);
}

void collect_reads(const Node& node, std::vector<const Value*>& reads) {
  for (const Value* input : node.inputs()) {
    if (input != nullptr) reads.push_back(input);
  }
  for (const auto& subgraph : node.subgraphs()) {
    if (subgraph == nullptr) continue;
    for (const auto& inner : subgraph->nodes()) collect_reads(*inner, reads);
    for (const Value* output : subgraph->outputs()) reads.push_back(output);
  }
}

// ---------------------------------------------------------------------------------------------
// verify()

namespace {

/// The values defined so far in one graph, chained to the enclosing graph's scope as it stood
/// at the node that owns the subgraph.
struct Scope {
  const Scope* parent = nullptr;
  std::unordered_set<const Value*> defined;

  bool has(const Value* value) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      if (s->defined.count(value) != 0) return true;
    }
    return false;
  }
};

class Verifier {
 public:
  explicit Verifier(const std::string& source_name) : source_(source_name) {}

  void verify_graph(const Graph& graph, const Scope* outer) {
    std::unordered_map<const Node*, size_t> position;
    for (size_t i = 0; i < graph.nodes().size(); ++i) position[graph.nodes()[i].get()] = i;
    Scope scope{outer, {}};
    for (const Value* input : graph.inputs()) scope.defined.insert(input);
    for (const Value* value : graph.initializers()) scope.defined.insert(value);
    const std::unordered_set<const Value*> predefined = scope.defined;
    check_acyclic(graph, position, predefined);

    for (const auto& node : graph.nodes()) {
      check_node_inputs(graph, *node, scope, position);
      for (const auto& subgraph : node->subgraphs()) {
        if (subgraph != nullptr) verify_graph(*subgraph, &scope);
      }
      check_node_outputs(graph, *node, scope, predefined);
    }
    for (const Value* output : graph.outputs()) {
      if (!scope.has(output)) {
        fail("{}: output '{}' is not defined", graph_label(graph), output->name());
      }
    }
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
    throw UserError(source_ + ": " + fmt::format(format, std::forward<Args>(args)...));
  }

  static std::string graph_label(const Graph& graph) {
    return fmt::format("graph '{}'", graph.name());
  }

  static std::string node_label(const Graph& graph, const Node& node) {
    if (graph.parent() == nullptr) return node.describe();
    return fmt::format("{} in subgraph '{}'", node.describe(), graph.name());
  }

  void check_node_inputs(const Graph& graph, const Node& node, const Scope& scope,
                         const std::unordered_map<const Node*, size_t>& position) {
    for (const Value* input : node.inputs()) {
      if (input == nullptr || scope.has(input)) continue;
      const Node* producer = input->producer();
      if (producer != nullptr && position.count(producer) != 0) {
        fail("{}: input '{}' is produced by a later {}; expected nodes in topological order",
             node_label(graph, node), input->name(), producer->describe());
      }
      fail("{}: input '{}' is not defined", node_label(graph, node), input->name());
    }
  }

  void check_node_outputs(const Graph& graph, const Node& node, Scope& scope,
                          const std::unordered_set<const Value*>& predefined) {
    for (const Value* output : node.outputs()) {
      if (output == nullptr) continue;
      if (!scope.has(output)) {
        scope.defined.insert(output);
        continue;
      }
      std::string label = node_label(graph, node);
      if (predefined.count(output) != 0) {
        fail("{}: output '{}' is already defined as a graph input or initializer", label,
             output->name());
      }
      if (scope.defined.count(output) == 0) {
        fail("{}: output '{}' is already defined in an enclosing graph", label, output->name());
      }
      const Node* first = output->producer();
      if (first != nullptr && first != &node) {
        fail("{}: output '{}' is already produced by {}; expected one producer per value", label,
             output->name(), first->describe());
      }
      fail("{}: output '{}' is listed twice", label, output->name());
    }
  }

  /// Depth-first search over "reads from" edges between the graph's nodes; reports one cycle.
  void check_acyclic(const Graph& graph, const std::unordered_map<const Node*, size_t>& position,
                     const std::unordered_set<const Value*>& predefined) {
    const size_t n = graph.nodes().size();
    std::vector<std::vector<size_t>> deps(n);
    for (size_t i = 0; i < n; ++i) {
      std::vector<const Value*> reads;
      collect_reads(*graph.nodes()[i], reads);
      for (const Value* value : reads) {
        if (predefined.count(value) != 0) continue;  // a node overwriting it is reported later
        auto it = position.find(value->producer());
        if (it != position.end()) deps[i].push_back(it->second);
      }
    }
    enum Color : uint8_t { kWhite, kGrey, kBlack };
    std::vector<Color> color(n, kWhite);
    std::vector<size_t> stack;
    std::vector<size_t> next_edge(n, 0);
    for (size_t root = 0; root < n; ++root) {
      if (color[root] != kWhite) continue;
      stack.push_back(root);
      color[root] = kGrey;
      while (!stack.empty()) {
        size_t top = stack.back();
        if (next_edge[top] == deps[top].size()) {
          color[top] = kBlack;
          stack.pop_back();
          continue;
        }
        size_t dep = deps[top][next_edge[top]++];
        if (color[dep] == kGrey) report_cycle(graph, stack, dep);
        if (color[dep] == kWhite) {
          color[dep] = kGrey;
          stack.push_back(dep);
        }
      }
    }
  }

  [[noreturn]] void report_cycle(const Graph& graph, const std::vector<size_t>& stack,
                                 size_t start) {
    // Each stack entry reads from the next, so data flows from the end of the stack back to
    // `start`: print it that way, starting and ending at `start`.
    size_t first =
        static_cast<size_t>(std::find(stack.begin(), stack.end(), start) - stack.begin());
    std::string path = fmt::format("'{}'", graph.nodes()[start]->name());
    for (size_t i = stack.size() - 1; i > first; --i) {
      path += fmt::format(" -> '{}'", graph.nodes()[stack[i]]->name());
    }
    path += fmt::format(" -> '{}'", graph.nodes()[start]->name());
    fail("{}: the graph has a cycle: {}", node_label(graph, *graph.nodes()[start]), path);
  }

  std::string source_;
};

}  // namespace

void verify(const Graph& graph, const std::string& source_name) {
  Verifier(source_name).verify_graph(graph, nullptr);
}

// ---------------------------------------------------------------------------------------------
// dump()

namespace {

constexpr size_t kMaxListed = 16;

template <typename T>
std::string list_str(const std::vector<T>& values, auto&& format_one) {
  std::string out = "[";
  for (size_t i = 0; i < values.size() && i < kMaxListed; ++i) {
    if (i != 0) out += ", ";
    out += format_one(values[i]);
  }
  if (values.size() > kMaxListed) out += fmt::format(", ... ({} in all)", values.size());
  return out + "]";
}

std::string tensor_str(const Tensor& tensor) {
  std::string head =
      fmt::format("tensor<{}{}>", dtype_name(tensor.dtype()),
                  list_str(tensor.dims(), [](int64_t d) { return fmt::format("{}", d); }));
  constexpr int64_t kMaxShown = 4;
  if (tensor.numel() > kMaxShown || tensor.dtype() == DType::kUndefined) return head;
  std::vector<std::string> shown;
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    if (tensor.dtype() == DType::kString) {
      shown.push_back(fmt::format("\"{}\"", tensor.string_values().at(static_cast<size_t>(i))));
    } else if (is_floating(tensor.dtype())) {
      shown.push_back(fmt::format("{}", tensor.element_as_double(i)));
    } else {
      shown.push_back(fmt::format("{}", tensor.element_as_int64(i)));
    }
  }
  return head + "(" + fmt::format("{}", fmt::join(shown, ", ")) + ")";
}

/// The attribute's text, or "" for graph attributes (dumped as nested blocks).
std::string attribute_str(const AttributeValue& value) {
  auto quote = [](const std::string& s) { return fmt::format("\"{}\"", s); };
  auto plain = [](const auto& v) { return fmt::format("{}", v); };
  if (auto* v = std::get_if<int64_t>(&value)) return plain(*v);
  if (auto* v = std::get_if<float>(&value)) return plain(*v);
  if (auto* v = std::get_if<std::string>(&value)) return quote(*v);
  if (auto* v = std::get_if<Tensor>(&value)) return tensor_str(*v);
  if (auto* v = std::get_if<std::vector<int64_t>>(&value)) return list_str(*v, plain);
  if (auto* v = std::get_if<std::vector<float>>(&value)) return list_str(*v, plain);
  if (auto* v = std::get_if<std::vector<std::string>>(&value)) return list_str(*v, quote);
  if (auto* v = std::get_if<std::vector<Tensor>>(&value)) return list_str(*v, tensor_str);
  return "";
}

std::string value_list(const std::vector<Value*>& values) {
  std::vector<std::string> names;
  for (const Value* value : values) names.push_back(value ? "%" + value->name() : "none");
  return fmt::format("{}", fmt::join(names, ", "));
}

void dump_graph(const Graph& graph, IndentedBuffer& out);

void dump_node(const Node& node, IndentedBuffer& out) {
  std::vector<std::string> attrs;
  std::vector<std::pair<std::string, std::vector<std::shared_ptr<Graph>>>> graphs;
  for (const auto& [name, value] : node.attributes()) {
    if (auto* g = std::get_if<std::shared_ptr<Graph>>(&value)) {
      graphs.push_back({name, {*g}});
    } else if (auto* gs = std::get_if<std::vector<std::shared_ptr<Graph>>>(&value)) {
      graphs.push_back({name, *gs});
    } else {
      attrs.push_back(name + "=" + attribute_str(value));
    }
  }
  std::string op = node.domain().empty() ? node.op_type() : node.domain() + ":" + node.op_type();
  std::string text =
      fmt::format("{} = {}({})", value_list(node.outputs()), op, value_list(node.inputs()));
  if (!attrs.empty()) text += fmt::format(" {{{}}}", fmt::join(attrs, ", "));
  text += fmt::format("  # {}", node.name());
  out.line(text);
  auto scope = out.scope();
  for (const auto& [name, list] : graphs) {
    for (const auto& subgraph : list) {
      out.linef("{}:", name);
      auto inner = out.scope();
      if (subgraph != nullptr) dump_graph(*subgraph, out);
    }
  }
}

void dump_graph(const Graph& graph, IndentedBuffer& out) {
  out.linef("graph '{}'", graph.name());
  for (const Value* input : graph.inputs()) {
    out.linef("input %{}: {}", input->name(), input->type().str());
  }
  for (const Value* value : graph.initializers()) {
    const Tensor* data = value->initializer();
    out.linef("initializer %{}: {} ({} bytes)", value->name(), value->type().str(), data->nbytes());
  }
  for (const auto& node : graph.nodes()) dump_node(*node, out);
  for (const Value* output : graph.outputs()) {
    out.linef("output %{}: {}", output->name(), output->type().str());
  }
}

}  // namespace

std::string dump(const Graph& graph) {
  IndentedBuffer out;
  dump_graph(graph, out);
  return out.str();
}

}  // namespace kiln::graph
