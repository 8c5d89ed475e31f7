/// Fusion (Inductor's fuse_nodes): legality (why_no_fuse) is kept apart from priority
/// (score_fusion); every refusal is recorded with its reason.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sched/scheduler_impl.h"
#include "support/error.h"
#include "support/log.h"

namespace kiln::sched {
namespace {

bool intersects(const std::set<std::string>& a, const std::set<std::string>& b) {
  for (const std::string& x : a) {
    if (b.count(x)) return true;
  }
  return false;
}

// Group-space store indices of the buffers a node writes.
std::map<std::string, std::optional<sym::Expr>> store_indices(
    const std::vector<KernelMember>& members, const sym::Analyzer& ga) {
  std::map<std::string, std::optional<sym::Expr>> out;
  for (const KernelMember& m : members) out[m.buffer->name] = group_store_index(m, ga);
  return out;
}

}  // namespace

std::optional<std::vector<KernelMember>> map_members(const std::vector<const ir::Buffer*>& buffers,
                                                     const KernelGroup& group,
                                                     const sym::Analyzer& facts,
                                                     std::string* misfit) {
  std::vector<KernelMember> members;
  for (const ir::Buffer* b : buffers) {
    auto m = map_member(*b, group, facts);
    if (!m) {
      if (misfit) *misfit = b->name;
      return std::nullopt;
    }
    members.push_back(std::move(*m));
  }
  return members;
}

std::optional<sym::Expr> group_store_index(const KernelMember& member, const sym::Analyzer& ga) {
  std::optional<sym::Expr> index;
  for (const ir::Op& op : member.buffer->body.ops()) {
    if (op.code != ir::OpCode::kStore || op.buffer != member.buffer->name) continue;
    if (is_indirect_index(member.buffer->body, op.index)) return std::nullopt;
    sym::Expr e = to_group_index(op.index, member, ga);
    if (index && *index != e) return std::nullopt;
    index = e;
  }
  return index;
}

void Scheduler::record(const SchedNode& node1, const SchedNode& node2, bool fused,
                       std::string reason) {
  auto key = std::make_tuple(node1.name(), node2.name(), reason);
  if (!recorded_.insert(key).second) return;
  log::write(log::Category::kFusion, "{} {} with {}{}{}", fused ? "fusing" : "cannot fuse",
             node1.name(), node2.name(), reason.empty() ? "" : ": ", reason);
  decisions_.push_back(FusionDecision{node1.name(), node2.name(), fused, std::move(reason)});
}

std::optional<std::string> Scheduler::why_no_fuse_vertical(const SchedNode& node1,
                                                           const SchedNode& node2,
                                                           const KernelGroup& fused) {
  // The wrapper checks index buffers between kernels, so their readers run after them.
  for (const std::string& name : node2.unmet) {
    if (node1.names.count(name) && checked_indices_.count(name)) {
      return fmt::format("{} holds indices checked before their readers run", name);
    }
  }
  std::string misfit;
  auto members1 = map_members(node1.buffers, fused, program_.analyzer, &misfit);
  auto members2 = map_members(node2.buffers, fused, program_.analyzer, &misfit);
  if (!members1 || !members2)
    return fmt::format("loops of {} do not map onto {}", misfit, fused.str());
  sym::Analyzer ga = fused.analyzer(program_.analyzer);
  auto writes = store_indices(*members1, ga);
  for (size_t k = 0; k < node2.buffers.size(); ++k) {
    for (const Dep& read : node2.rw[k].reads) {
      auto w = writes.find(read.buffer);
      if (w == writes.end()) continue;
      if (read.kind != DepKind::kMemory || !w->second ||
          to_group_index(read.index, (*members2)[k], ga) != *w->second) {
        return std::string("memory deps did not match");
      }
    }
  }
  for (const std::string& name : node2.unmet) {
    if (node1.names.count(name)) continue;
    if (intersects(node1.names, name_to_node_.at(name)->ancestors)) {
      return std::string("intermediate nodes between node1 & node2");
    }
  }
  if (auto veto = backend_.can_fuse_vertical(node1.info(), node2.info(), fused)) return veto;
  return std::nullopt;
}

std::optional<std::string> Scheduler::why_no_fuse(const SchedNode& node1, const SchedNode& node2,
                                                  KernelGroup* fused) {
  if (&node1 == &node2) return std::string("same node");
  if (node1.is_extern || node2.is_extern) return std::string("extern calls do not fuse");
  if (node1.buffers.front()->device != node2.buffers.front()->device)
    return std::string("different devices");
  if (node1.buffers.size() + node2.buffers.size() > static_cast<size_t>(options_.max_fusion_size)) {
    return fmt::format("exceeds max fusion size {}", options_.max_fusion_size);
  }
  if (node1.compute_ops + node2.compute_ops > options_.max_fusion_ops) {
    return fmt::format("exceeds max fusion ops {} ({} + {})", options_.max_fusion_ops,
                       node1.compute_ops, node2.compute_ops);
  }
  std::string reason;
  auto group = merge_groups(node1.group, node2.group, program_.analyzer, &reason);
  if (!group) return fmt::format("size mismatch: {}", reason);
  *fused = *group;
  if (intersects(node2.names, node1.ancestors)) return why_no_fuse_vertical(node2, node1, *group);
  if (intersects(node1.names, node2.ancestors)) return why_no_fuse_vertical(node1, node2, *group);
  int proximity = std::max(std::abs(node1.min_order - node2.max_order),
                           std::abs(node2.min_order - node1.max_order));
  if (proximity > options_.max_proximity) {
    return fmt::format("will increase peak memory (distance {} > {})", proximity,
                       options_.max_proximity);
  }
  std::string misfit;
  if (!map_members(node1.buffers, *group, program_.analyzer, &misfit) ||
      !map_members(node2.buffers, *group, program_.analyzer, &misfit)) {
    return fmt::format("loops of {} do not map onto {}", misfit, group->str());
  }
  if (auto veto = backend_.can_fuse_horizontal(node1.info(), node2.info(), *group)) return veto;
  return std::nullopt;
}

bool Scheduler::will_fusion_create_cycle(const SchedNode& node1, const SchedNode& node2) {
  std::set<std::string> combined_names = node1.names;
  combined_names.insert(node2.names.begin(), node2.names.end());
  std::set<std::string> combined_ancestors;
  for (const auto* n : {&node1, &node2}) {
    for (const std::string& a : n->ancestors) {
      if (!combined_names.count(a)) combined_ancestors.insert(a);
    }
  }
  std::set<const SchedNode*> visited;
  // Only fused nodes add ancestors beyond those of their parts, so only they can close a path.
  std::function<bool(const SchedNode*)> found_path = [&](const SchedNode* n) {
    if (!n->is_fused() || !visited.insert(n).second) return false;
    if (std::includes(combined_ancestors.begin(), combined_ancestors.end(), n->names.begin(),
                      n->names.end())) {
      return false;
    }
    if (intersects(combined_names, n->ancestors)) return true;
    for (const std::string& a : n->ancestors) {
      if (!combined_ancestors.count(a) && found_path(name_to_node_.at(a))) return true;
    }
    return false;
  };
  for (const std::string& a : combined_ancestors) {
    if (found_path(name_to_node_.at(a))) return true;
  }
  return false;
}

FusionScore Scheduler::score_fusion(const SchedNode& node1, const SchedNode& node2) const {
  std::set<std::string> used1 = node1.used_names();
  int64_t memory = 0;
  for (const std::string& name : node2.used_names()) {
    if (used1.count(name)) memory += buffer_bytes(name);
  }
  int proximity = std::max(std::abs(node1.min_order - node2.max_order),
                           std::abs(node2.min_order - node1.max_order));
  return {node1.is_reduction() == node2.is_reduction() && memory > 0, memory, -proximity};
}

std::vector<std::pair<std::string, std::string>> Scheduler::possible_fusions() {
  struct Candidate {
    SchedNode* node1;
    SchedNode* node2;
    FusionScore score;
    int priority;
  };
  std::vector<Candidate> candidates;
  std::set<std::pair<const SchedNode*, const SchedNode*>> seen;
  auto check_all_pairs = [&](const std::vector<SchedNode*>& group) {
    for (size_t i = 0; i < group.size(); ++i) {
      for (size_t j = i + 1; j < group.size(); ++j) {
        if (!seen.insert({group[i], group[j]}).second) continue;
        KernelGroup fused;
        if (auto reason = why_no_fuse(*group[i], *group[j], &fused)) {
          record(*group[i], *group[j], false, *reason);
          continue;
        }
        int priority = backend_.fusion_pair_priority(group[i]->info(), group[j]->info());
        candidates.push_back({group[i], group[j], score_fusion(*group[i], *group[j]), priority});
      }
    }
  };
  std::map<std::string, std::vector<SchedNode*>> by_buffer;
  for (SchedNode* n : nodes_) {
    for (const std::string& name : n->used_names()) by_buffer[name].push_back(n);
  }
  for (const auto& [name, group] : by_buffer) check_all_pairs(group);
  if (options_.aggressive_fusion) {
    std::map<std::string, std::vector<SchedNode*>> by_key;
    for (SchedNode* n : nodes_) {
      if (!n->is_extern) by_key[backend_.group_key(n->group).str()].push_back(n);
    }
    for (const auto& [key, group] : by_key) check_all_pairs(group);
  }
  if (candidates.empty()) return {};
  int best = std::min_element(candidates.begin(), candidates.end(), [](auto& a, auto& b) {
               return a.priority < b.priority;
             })->priority;
  std::erase_if(candidates, [&](const Candidate& c) { return c.priority != best; });
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const Candidate& c : candidates)
    pairs.emplace_back(c.node1->first_name(), c.node2->first_name());
  log::write(log::Category::kFusion, "found {} possible fusions", pairs.size());
  return pairs;
}

SchedNode* Scheduler::fuse(SchedNode* node1, SchedNode* node2, const KernelGroup& group) {
  auto fused = std::make_unique<SchedNode>();
  std::vector<std::pair<int, std::pair<SchedNode*, size_t>>> parts;
  for (SchedNode* n : {node1, node2}) {
    for (size_t k = 0; k < n->buffers.size(); ++k) {
      parts.push_back({buffer_order_.at(n->buffers[k]->name), {n, k}});
    }
  }
  std::sort(parts.begin(), parts.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [order, part] : parts) {
    fused->buffers.push_back(part.first->buffers[part.second]);
    fused->rw.push_back(part.first->rw[part.second]);
  }
  fused->group = group;
  auto members = map_members(fused->buffers, group, program_.analyzer, nullptr);
  KILN_CHECK(members.has_value(), "fused node {} does not map onto {}", fused->name(), group.str());
  fused->members = std::move(*members);
  for (SchedNode* n : {node1, node2}) {
    fused->names.insert(n->names.begin(), n->names.end());
    fused->unmet.insert(n->unmet.begin(), n->unmet.end());
    fused->ancestors.insert(n->ancestors.begin(), n->ancestors.end());
  }
  for (const std::string& name : fused->names) {
    fused->unmet.erase(name);
    fused->ancestors.erase(name);
  }
  fused->compute_ops = node1->compute_ops + node2->compute_ops;
  fused->min_order = std::min(node1->min_order, node2->min_order);
  fused->max_order = std::max(node1->max_order, node2->max_order);
  SchedNode* result = fused.get();
  for (const std::string& name : result->names) name_to_node_[name] = result;
  storage_.push_back(std::move(fused));
  return result;
}

bool Scheduler::fuse_nodes_once() {
  size_t before = nodes_.size();
  std::set<SchedNode*> current(nodes_.begin(), nodes_.end());
  for (const auto& [name1, name2] : possible_fusions()) {
    SchedNode* node1 = name_to_node_.at(name1);
    SchedNode* node2 = name_to_node_.at(name2);
    if (node1 == node2) continue;
    KernelGroup group;
    if (auto reason = why_no_fuse(*node1, *node2, &group)) {
      record(*node1, *node2, false, *reason);
      continue;
    }
    if (will_fusion_create_cycle(*node1, *node2)) {
      record(*node1, *node2, false, "would create a cycle");
      continue;
    }
    record(*node1, *node2, true, "");
    SchedNode* fused = fuse(node1, node2, group);
    current.erase(node1);
    current.erase(node2);
    current.insert(fused);
  }
  nodes_.assign(current.begin(), current.end());
  std::stable_sort(nodes_.begin(), nodes_.end(), [](const SchedNode* a, const SchedNode* b) {
    return a->min_order < b->min_order;
  });
  topological_sort();
  return nodes_.size() != before;
}

void Scheduler::fuse_nodes() {
  for (int round = 0; round < options_.max_fusion_rounds; ++round) {
    size_t before = nodes_.size();
    log::write(log::Category::kFusion, "===== attempting fusion ({}/{}): {} nodes =====", round + 1,
               options_.max_fusion_rounds, before);
    bool changed = fuse_nodes_once();
    if (!changed || nodes_.size() <= 1) break;
  }
}

}  // namespace kiln::sched
