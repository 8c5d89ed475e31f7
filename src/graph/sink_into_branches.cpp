#include "graph/sink_into_branches.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "support/error.h"

namespace kiln::graph {

namespace {

/// Copies graphs value by value. One map serves every nesting level: a subgraph's reads of
/// enclosing values find their copies there. Within the graph that holds the If, the nodes it
/// depends on (`moved`) are copied into each branch instead, with the If's outputs standing
/// for that branch's outputs.
class Copier {
 public:
  Copier(const Node& target, int depth) : target_(target), depth_(depth) {}

  std::unique_ptr<Graph> copy_root(const Graph& root) {
    auto copy = std::make_unique<Graph>(root.name());
    copy_body(root, *copy);
    copy_outputs(root, *copy);
    return copy;
  }

  std::map<const Node*, const Node*> copied_from;
  const Node* merged = nullptr;

 private:
  Value* map(const Value* value) const {
    if (value == nullptr) return nullptr;
    auto it = values_.find(value);
    KILN_CHECK(it != values_.end(), "sink_into_branches: value '{}' read before it is copied",
               value->name());
    return it->second;
  }

  /// A value of `dst` like `value`, under its name or, when `dst` already has that name (a
  /// branch's own value), under the first free "name__N".
  static Value* new_value(Graph& dst, const Value& value, Type type) {
    std::string name = value.name();
    for (int n = 1; dst.find_local_value(name) != nullptr; ++n) {
      name = fmt::format("{}__{}", value.name(), n);
    }
    return dst.add_value(name, std::move(type));
  }

  void copy_body(const Graph& src, Graph& dst) {
    for (const Value* input : src.inputs()) {
      values_[input] = new_value(dst, *input, input->type());
      dst.add_input(values_[input]);
    }
    for (const Value* init : src.initializers()) {
      Value* value = new_value(dst, *init, init->type());
      dst.set_initializer(value, init->initializer_data());
      values_[init] = value;
    }
    bool holds_target = std::any_of(src.nodes().begin(), src.nodes().end(),
                                    [&](const auto& node) { return node.get() == &target_; });
    if (holds_target) {
      copy_sinking(src, dst);
      return;
    }
    for (const auto& node : src.nodes()) copy_node(*node, dst, /*moved=*/false);
  }

  void copy_outputs(const Graph& src, Graph& dst) {
    for (const Value* output : src.outputs()) dst.add_output(map(output));
  }

  AttributeValue copy_attribute(const AttributeValue& attribute, Graph& dst) {
    auto copy_graph = [&](const std::shared_ptr<Graph>& g) -> std::shared_ptr<Graph> {
      if (g == nullptr) return nullptr;
      auto copy = std::make_shared<Graph>(g->name(), &dst);
      copy_body(*g, *copy);
      copy_outputs(*g, *copy);
      return copy;
    };
    if (const auto* g = std::get_if<std::shared_ptr<Graph>>(&attribute)) return copy_graph(*g);
    if (const auto* list = std::get_if<std::vector<std::shared_ptr<Graph>>>(&attribute)) {
      std::vector<std::shared_ptr<Graph>> copies;
      for (const auto& g : *list) copies.push_back(copy_graph(g));
      return copies;
    }
    return attribute;
  }

  /// Copies `node` into `dst`. A moved node's tensor outputs lose their declared dtypes and
  /// shapes: the model declared them for one branch's types at most.
  Node* copy_node(const Node& node, Graph& dst, bool moved) {
    std::map<std::string, AttributeValue> attributes;
    for (const auto& [name, value] : node.attributes())
      attributes[name] = copy_attribute(value, dst);
    std::vector<Value*> inputs;
    for (const Value* input : node.inputs()) inputs.push_back(map(input));
    std::vector<Value*> outputs;
    for (const Value* output : node.outputs()) {
      if (output == nullptr) {
        outputs.push_back(nullptr);
        continue;
      }
      Type type = output->type();
      if (moved && type.kind == ValueKind::kTensor) type = Type();
      outputs.push_back(values_[output] = new_value(dst, *output, std::move(type)));
    }
    Node* copy = dst.add_node(node.name(), node.op_type(), node.domain(), node.opset(),
                              std::move(inputs), std::move(outputs), std::move(attributes));
    copied_from[copy] = &node;
    return copy;
  }

  void copy_sinking(const Graph& src, Graph& dst);
  void copy_merged_if(const std::vector<const Node*>& moved,
                      const std::vector<const Value*>& escaping, Graph& dst);

  const Node& target_;
  const int depth_;
  std::unordered_map<const Value*, Value*> values_;
};

/// The graph holding the If: nodes within depth_ of it (longest path) move into its branches;
/// the merged If takes the If's place, later if a moved node reads a value made after it.
void Copier::copy_sinking(const Graph& src, Graph& dst) {
  const auto& nodes = src.nodes();
  const size_t n = nodes.size();
  std::unordered_map<const Node*, size_t> index;
  for (size_t i = 0; i < n; ++i) index[nodes[i].get()] = i;
  const size_t x = index.at(&target_);
  std::vector<std::vector<const Value*>> reads(n);
  for (size_t i = 0; i < n; ++i) collect_reads(*nodes[i], reads[i]);
  auto producer = [&](const Value* v) -> std::optional<size_t> {
    auto it = index.find(v->producer());
    if (v->producer() == nullptr || it == index.end()) return std::nullopt;
    return it->second;
  };
  // Longest distance from the If: every node on a path between two moved nodes moves too.
  std::vector<int> distance(n, -1);
  distance[x] = 0;
  for (size_t i = x + 1; i < n; ++i) {
    for (const Value* v : reads[i]) {
      std::optional<size_t> p = producer(v);
      if (p && distance[*p] >= 0) distance[i] = std::max(distance[i], distance[*p] + 1);
    }
  }
  std::vector<bool> moves(n, false);
  std::vector<const Node*> moved;
  for (size_t i = 0; i < n; ++i) {
    moves[i] = distance[i] >= 1 && distance[i] <= depth_;
    if (moves[i]) moved.push_back(nodes[i].get());
  }
  // What the merged If returns: values of the If or of moved nodes that the rest reads.
  std::set<const Value*> read_outside(src.outputs().begin(), src.outputs().end());
  for (size_t i = 0; i < n; ++i) {
    if (!moves[i] && i != x) read_outside.insert(reads[i].begin(), reads[i].end());
  }
  std::vector<const Value*> escaping;
  for (size_t i = 0; i < n; ++i) {
    if (i != x && !moves[i]) continue;
    for (const Value* out : nodes[i]->outputs()) {
      if (out != nullptr && read_outside.count(out)) escaping.push_back(out);
    }
  }
  // A stable topological order of the remaining nodes, the merged If standing at x.
  auto unit = [&](size_t i) { return moves[i] ? x : i; };
  std::vector<std::set<size_t>> dependents(n);
  std::vector<size_t> pending(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (const Value* v : reads[i]) {
      std::optional<size_t> p = producer(v);
      if (!p || unit(*p) == unit(i)) continue;
      if (dependents[unit(*p)].insert(unit(i)).second) ++pending[unit(i)];
    }
  }
  std::set<size_t> ready;
  for (size_t i = 0; i < n; ++i) {
    if (!moves[i] && pending[i] == 0) ready.insert(i);
  }
  size_t emitted = 0;
  while (!ready.empty()) {
    const size_t i = *ready.begin();
    ready.erase(ready.begin());
    ++emitted;
    if (i == x) {
      copy_merged_if(moved, escaping, dst);
    } else {
      copy_node(*nodes[i], dst, /*moved=*/false);
    }
    for (size_t d : dependents[i]) {
      if (--pending[d] == 0) ready.insert(d);
    }
  }
  KILN_CHECK(emitted + moved.size() == n, "sink_into_branches: a cycle after merging {}",
             target_.describe());
}

/// The If with the moved nodes in each branch, returning `escaping`.
void Copier::copy_merged_if(const std::vector<const Node*>& moved,
                            const std::vector<const Value*>& escaping, Graph& dst) {
  std::map<std::string, AttributeValue> attributes;
  for (const auto& [name, value] : target_.attributes()) {
    const auto* branch = std::get_if<std::shared_ptr<Graph>>(&value);
    if (branch == nullptr || *branch == nullptr) {
      attributes[name] = copy_attribute(value, dst);
      continue;
    }
    auto copy = std::make_shared<Graph>((*branch)->name(), &dst);
    copy_body(**branch, *copy);
    const auto& branch_outputs = (*branch)->outputs();
    for (size_t k = 0; k < target_.outputs().size() && k < branch_outputs.size(); ++k) {
      if (target_.outputs()[k] != nullptr) values_[target_.outputs()[k]] = map(branch_outputs[k]);
    }
    for (const Node* node : moved) copy_node(*node, *copy, /*moved=*/true);
    for (const Value* v : escaping) copy->add_output(map(v));
    attributes[name] = copy;
  }
  std::vector<Value*> outputs;
  for (const Value* v : escaping) outputs.push_back(values_[v] = new_value(dst, *v, v->type()));
  std::vector<Value*> inputs;
  for (const Value* input : target_.inputs()) inputs.push_back(map(input));
  Node* node = dst.add_node(target_.name(), target_.op_type(), target_.domain(), target_.opset(),
                            std::move(inputs), std::move(outputs), std::move(attributes));
  copied_from[node] = &target_;
  merged = node;
}

}  // namespace

SunkGraph sink_into_branches(const Graph& root, const Node& if_node, int depth) {
  KILN_CHECK(if_node.op_type() == "If" && depth >= 1, "sink_into_branches: {} with depth {}",
             if_node.describe(), depth);
  Copier copier(if_node, depth);
  SunkGraph result;
  result.graph = copier.copy_root(root);
  KILN_CHECK(copier.merged != nullptr, "sink_into_branches: {} is not in the graph",
             if_node.describe());
  result.merged = copier.merged;
  result.copied_from = std::move(copier.copied_from);
  return result;
}

}  // namespace kiln::graph
