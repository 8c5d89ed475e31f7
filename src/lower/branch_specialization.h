#pragma once
/// Branch specialization: lowering a graph that holds Ifs whose branches give an output of
/// different ranks or dtypes. Where nodes read such an output, they cannot be lowered once for
/// both; If's lowering throws BranchMismatch, and BranchSpecializer moves the nodes that depend
/// on that If into both its branches (graph/sink_into_branches.h), lowering again until the If's
/// outputs agree or reach the graph's outputs, whose rank or dtype is then known after a run.
/// Nothing is compiled at run time: each branch outcome has its own code.
///
/// The graph downstream of k such Ifs in a chain is copied for each of the 2^k outcomes, so at
/// most kMaxSpecializedIfs distinct Ifs of the model are specialized; one more is a user error
/// naming them.
///
/// Tests: tests/if_types.

#include <exception>
#include <map>
#include <memory>
#include <vector>

#include "graph/graph.h"

namespace kiln::lower {

/// At most this many Ifs of a model have the nodes after them specialized per branch (a chain of
/// them gives 2^4 = 16 variants of what follows).
constexpr size_t kMaxSpecializedIfs = 4;

/// Thrown by If's lowering: `node`'s branches give an output of different ranks or dtypes that
/// nodes of its graph read. Caught by lower_graph(), never seen by users.
class BranchMismatch : public std::exception {
 public:
  explicit BranchMismatch(const graph::Node& node) : node_(&node) {}
  const graph::Node& node() const { return *node_; }
  const char* what() const noexcept override { return "an If's branches give different types"; }

 private:
  const graph::Node* node_;
};

/// The model graph with the nodes after mismatched Ifs moved into their branches, one If at a
/// time.
class BranchSpecializer {
 public:
  explicit BranchSpecializer(const graph::Graph& model) : current_(&model) {}

  /// The graph to lower now.
  const graph::Graph& graph() const { return *current_; }

  /// Moves the nodes that depend on `mismatch.node()` (a node of graph()) into its branches:
  /// those one step after it the first time, twice as many steps as before the next times.
  /// Throws UserError when that makes more than kMaxSpecializedIfs Ifs of the model specialized.
  void specialize(const BranchMismatch& mismatch);

 private:
  /// The model's node that `node` (of graph()) copies.
  const graph::Node* original(const graph::Node* node) const;

  const graph::Graph* current_;
  std::unique_ptr<graph::Graph> rewritten_;                  // current_ once rewritten
  std::map<const graph::Node*, const graph::Node*> origin_;  // node of graph() -> model's node
  std::map<const graph::Node*, int> depth_;      // a merged If of graph() -> the steps it took in
  std::vector<const graph::Node*> specialized_;  // the model's Ifs, in the order found
  int rewrites_ = 0;
};

}  // namespace kiln::lower
