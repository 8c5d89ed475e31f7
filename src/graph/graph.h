#pragma once
/// The tensor-level graph imported from ONNX: Values with a kind (tensor, sequence, optional), an
/// element dtype and a symbolic shape; Nodes with typed attributes and nested subgraphs; Graphs
/// with inputs, outputs and initializers. Nodes and Values are owned by their Graph and referred
/// to by pointer; names are unique within a graph scope.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "graph/dtype.h"
#include "graph/tensor.h"
#include "sym/expr.h"

namespace kiln::graph {

class Graph;
class Node;

/// A shape whose dims are symbolic integers (integers for static dims).
using Shape = std::vector<sym::Expr>;
std::string shape_str(const Shape& shape);  // "[batch, 3, 224, 224]"

enum class ValueKind : uint8_t { kTensor, kSequence, kOptional };

/// The type of a value: for kTensor, dtype and shape (nullopt when rank is unknown); for
/// kSequence and kOptional, the element type.
struct Type {
  ValueKind kind = ValueKind::kTensor;
  DType dtype = DType::kUndefined;
  std::optional<Shape> shape;
  std::shared_ptr<const Type> element;  // kSequence / kOptional

  static Type tensor(DType dtype, std::optional<Shape> shape);
  std::string str() const;  // "float32[batch, 3]", "seq(float32[?])", "optional(int64[])"
};

/// A model input or output value as the user holds it: a tensor, a sequence of tensors, or an
/// optional (empty, or holding a tensor or a sequence). `kind` is the content's kind.
struct IoValue {
  ValueKind kind = ValueKind::kTensor;
  bool optional = false;
  bool present = true;          // false: an empty optional
  std::vector<Tensor> tensors;  // the tensor, or the sequence's elements; none when empty

  static IoValue tensor(Tensor t);
  std::string str() const;  // "float32[3]", "seq(2 x float32)", "optional(empty)"
};

class Value {
 public:
  Value(std::string name, Type type) : name_(std::move(name)), type_(std::move(type)) {}
  const std::string& name() const { return name_; }
  const Type& type() const { return type_; }
  void set_type(Type type) { type_ = std::move(type); }
  /// The node producing this value; null for graph inputs, initializers and outer-scope values.
  Node* producer() const { return producer_; }
  /// Nodes reading this value, in node order (a node appears once per use).
  const std::vector<Node*>& users() const { return users_; }
  /// The initializer data when this value is a constant of the graph.
  const Tensor* initializer() const { return initializer_.get(); }
  /// The initializer data, shared (outlives the graph when kept).
  std::shared_ptr<const Tensor> initializer_data() const { return initializer_; }

 private:
  friend class Graph;
  std::string name_;
  Type type_;
  Node* producer_ = nullptr;
  std::vector<Node*> users_;
  std::shared_ptr<const Tensor> initializer_;
};

/// A typed attribute value. Graph attributes hold subgraphs (If/Loop/Scan bodies).
using AttributeValue =
    std::variant<int64_t, float, std::string, Tensor, std::shared_ptr<Graph>, std::vector<int64_t>,
                 std::vector<float>, std::vector<std::string>, std::vector<Tensor>,
                 std::vector<std::shared_ptr<Graph>>>;

class Node {
 public:
  const std::string& name() const { return name_; }
  const std::string& op_type() const { return op_type_; }
  /// "" for the default ai.onnx domain.
  const std::string& domain() const { return domain_; }
  /// The opset version of this node's domain in the model.
  int64_t opset() const { return opset_; }
  /// Inputs; an omitted optional input is nullptr.
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }
  const std::map<std::string, AttributeValue>& attributes() const { return attributes_; }
  bool has_attribute(const std::string& name) const { return attributes_.count(name) != 0; }
  /// Typed attribute access with a default; throws UserError naming the node when the attribute
  /// exists with another type.
  int64_t attr_int(const std::string& name, int64_t fallback) const;
  float attr_float(const std::string& name, float fallback) const;
  std::string attr_string(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const std::string& name, std::vector<int64_t> fallback) const;
  std::vector<float> attr_floats(const std::string& name, std::vector<float> fallback) const;
  std::vector<std::string> attr_strings(const std::string& name,
                                        std::vector<std::string> fallback) const;
  const Tensor* attr_tensor(const std::string& name) const;
  std::shared_ptr<Graph> attr_graph(const std::string& name) const;
  /// Subgraphs of this node's graph attributes, by attribute name order.
  std::vector<std::shared_ptr<Graph>> subgraphs() const;
  /// "node 'conv1' (Conv)" for error messages.
  std::string describe() const;

 private:
  friend class Graph;
  std::string name_;
  std::string op_type_;
  std::string domain_;
  int64_t opset_ = 0;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::map<std::string, AttributeValue> attributes_;
};

/// Opset imports of the model: domain ("" = ai.onnx) -> version.
using OpsetImports = std::map<std::string, int64_t>;

class Graph {
 public:
  explicit Graph(std::string name, Graph* parent = nullptr)
      : name_(std::move(name)), parent_(parent) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  const std::string& name() const { return name_; }
  /// The enclosing graph for subgraphs (their nodes may read outer values); null at top level.
  Graph* parent() const { return parent_; }

  /// Creates a value owned by this graph; the name must be new in this graph.
  Value* add_value(const std::string& name, Type type);
  /// Finds a value by name in this graph, then in enclosing graphs.
  Value* find_value(const std::string& name) const;
  /// Finds a value by name in this graph only (null when it has none).
  Value* find_local_value(const std::string& name) const;
  /// Marks an existing value as a graph input / output / initializer.
  void add_input(Value* value);
  void add_output(Value* value);
  void set_initializer(Value* value, std::shared_ptr<const Tensor> data);
  /// Appends a node; wires producer/users of its values.
  Node* add_node(std::string name, std::string op_type, std::string domain, int64_t opset,
                 std::vector<Value*> inputs, std::vector<Value*> outputs,
                 std::map<std::string, AttributeValue> attributes);

  /// The model's real inputs: graph inputs without an initializer.
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  /// Values with initializer data, in model order.
  const std::vector<Value*>& initializers() const { return initializers_; }
  /// Nodes in model order (verify() checks that this order is topological).
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  /// All values owned by this graph, in creation order.
  const std::vector<std::unique_ptr<Value>>& values() const { return values_; }

 private:
  std::string name_;
  Graph* parent_;
  std::vector<std::unique_ptr<Value>> values_;
  std::map<std::string, Value*, std::less<>> by_name_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::vector<Value*> initializers_;
};

/// A whole model: the main graph plus model-level metadata.
struct Model {
  std::string path;  // where it was loaded from ("" if built in memory)
  int64_t ir_version = 0;
  std::string producer_name;
  OpsetImports opsets;
  std::unique_ptr<Graph> graph;
};

/// Checks structural invariants: every node input is defined before use (in this graph or an
/// enclosing one), no value has two producers, the graph is acyclic, outputs are defined. Throws
/// UserError naming the node, op and problem.
void verify(const Graph& graph, const std::string& source_name);

/// Appends every value `node` reads: its inputs and, through its subgraphs, the values of
/// enclosing graphs those read (with the subgraphs' own values, which no outer node produces).
void collect_reads(const Node& node, std::vector<const Value*>& reads);

/// A readable text dump of the graph (and subgraphs, indented).
std::string dump(const Graph& graph);

}  // namespace kiln::graph
