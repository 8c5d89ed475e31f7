#pragma once
/// sink_into_branches: a graph pass for an If whose branches give outputs of different ranks or
/// dtypes (a sample-rate flag choosing one of two front ends). The nodes that depend on the If
/// within `depth` steps (by the longest path from it) move into both of its branches, so that
/// each branch computes them for its own output types and the If returns what the rest of the
/// graph reads from them. Both branches are then lowered and compiled ahead of time, as any If's.
/// The lowering (lower/branch_specialization.cpp) calls it again, with a larger depth, while the
/// If's outputs still differ and are read.
///
/// Accepts a verified graph; returns a copy of the whole model graph (values, nodes and
/// subgraphs copied; initializer data shared) in topological order, the input untouched.
///
/// Tests: tests/if_types (models whose If branches differ in rank or dtype, against numpy).

#include <map>
#include <memory>

#include "graph/graph.h"

namespace kiln::graph {

struct SunkGraph {
  std::unique_ptr<Graph> graph;  // the rewritten copy of the model graph
  const Node* merged = nullptr;  // the If that now holds the moved nodes
  /// Each node of `graph` -> the node of the input graph it copies.
  std::map<const Node*, const Node*> copied_from;
};

/// Moves the nodes of `if_node`'s graph at most `depth` (>= 1) steps downstream of `if_node`
/// into both of its branches; `root` is the model graph that holds it (at any nesting depth).
SunkGraph sink_into_branches(const Graph& root, const Node& if_node, int depth);

}  // namespace kiln::graph
