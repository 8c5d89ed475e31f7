#include "lower/branch_specialization.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/sink_into_branches.h"
#include "support/error.h"

namespace kiln::lower {

namespace {

/// A bound on rewrites, against a bug that would rewrite forever: each specialized If takes
/// about log2(depth) rewrites per copy, and there are at most 2^kMaxSpecializedIfs copies.
constexpr int kMaxRewrites = 4096;

}  // namespace

const graph::Node* BranchSpecializer::original(const graph::Node* node) const {
  auto it = origin_.find(node);
  return it == origin_.end() ? node : it->second;
}

void BranchSpecializer::specialize(const BranchMismatch& mismatch) {
  const graph::Node& node = mismatch.node();
  const graph::Node* model_node = original(&node);
  if (std::find(specialized_.begin(), specialized_.end(), model_node) == specialized_.end()) {
    specialized_.push_back(model_node);
    if (specialized_.size() > kMaxSpecializedIfs) {
      std::vector<std::string> names;
      for (const graph::Node* n : specialized_) names.push_back(n->describe());
      user_error(
          "{} Ifs give outputs of different ranks or dtypes in their two branches and nodes read "
          "them: {}; Kiln compiles the nodes after such an If once per branch, so a chain of k "
          "of them gives 2^k variants, and it specializes at most {} Ifs (make the branches "
          "give the same rank and dtype, or cast or reshape the outputs inside them)",
          specialized_.size(), fmt::join(names, ", "), kMaxSpecializedIfs);
    }
  }
  KILN_CHECK(++rewrites_ <= kMaxRewrites, "branch specialization did not converge at {}",
             node.describe());
  auto found = depth_.find(&node);
  const int depth = found == depth_.end() ? 1 : 2 * found->second;
  graph::SunkGraph sunk = graph::sink_into_branches(*current_, node, depth);
  std::map<const graph::Node*, const graph::Node*> origin;
  std::map<const graph::Node*, int> depths;
  for (const auto& [copy, source] : sunk.copied_from) {
    origin[copy] = original(source);
    auto d = depth_.find(source);
    if (d != depth_.end()) depths[copy] = d->second;
  }
  depths[sunk.merged] = depth;
  origin_ = std::move(origin);
  depth_ = std::move(depths);
  rewritten_ = std::move(sunk.graph);  // after the maps: they no longer point into the old one
  current_ = rewritten_.get();
}

}  // namespace kiln::lower
