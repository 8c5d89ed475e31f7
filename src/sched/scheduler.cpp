#include "sched/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sched/scheduler_impl.h"
#include "support/error.h"
#include "support/log.h"

namespace kiln::sched {

// ---- Backend defaults ----------------------------------------------------------------------

GroupKey Backend::group_key(const KernelGroup& group) const {
  return GroupKey{group.numel(), group.reduce_numel()};
}

std::optional<std::string> Backend::can_fuse_vertical(const NodeInfo&, const NodeInfo&,
                                                      const KernelGroup&) const {
  return std::nullopt;
}

std::optional<std::string> Backend::can_fuse_horizontal(const NodeInfo&, const NodeInfo&,
                                                        const KernelGroup&) const {
  return std::nullopt;
}

std::string Schedule::decisions_text() const {
  std::string out;
  for (const FusionDecision& d : decisions) {
    out += fmt::format("{} {} + {}{}{}\n", d.fused ? "fused  " : "refused", d.node1, d.node2,
                       d.reason.empty() ? "" : ": ", d.reason);
  }
  return out;
}

// ---- SchedNode -----------------------------------------------------------------------------

std::string SchedNode::name() const {
  std::string out;
  for (const ir::Buffer* b : buffers) {
    if (!out.empty()) out += "+";
    out += b->name;
  }
  return out;
}

bool SchedNode::is_reduction() const {
  return std::any_of(buffers.begin(), buffers.end(),
                     [](const ir::Buffer* b) { return b->is_reduction(); });
}

std::set<std::string> SchedNode::used_names() const {
  std::set<std::string> used = names;
  for (const ReadWrites& r : rw) {
    for (const Dep& d : r.reads) used.insert(d.buffer);
  }
  return used;
}

NodeInfo SchedNode::info() const { return NodeInfo{name(), buffers, group, is_reduction()}; }

// ---- Scheduler -----------------------------------------------------------------------------

Scheduler::Scheduler(const ir::Program& program, const Backend& backend,
                     const SchedulerOptions& options)
    : program_(program), backend_(backend), options_(options) {
  for (const ir::OutputSpec& out : program.outputs) outputs_.insert(out.buffer);
  for (const ir::IndexCheck& check : program.index_checks) checked_indices_.insert(check.buffer);
}

bool Scheduler::is_graph_output(const std::string& name) const { return outputs_.count(name) > 0; }

int64_t Scheduler::buffer_bytes(const std::string& name) const {
  const ir::Buffer* b = program_.find(name);
  if (b == nullptr) return 0;
  sym::Binding hints;
  for (const sym::Expr& s : sym::free_symbols(b->layout.numel())) {
    hints[s.name()] = options_.size_hint;
  }
  return sym::evaluate(b->layout.numel(), hints) * graph::dtype_size(b->dtype);
}

void Scheduler::create_nodes() {
  std::set<std::string> available;
  for (const auto& b : program_.buffers) {
    if (b->kind == ir::BufferKind::kInput || b->kind == ir::BufferKind::kConstant) {
      available.insert(b->name);
    }
  }
  std::set<std::string> produced;
  for (const auto& b : program_.buffers) {
    if (b->kind != ir::BufferKind::kComputed && b->kind != ir::BufferKind::kExtern) continue;
    auto node = std::make_unique<SchedNode>();
    node->buffers = {b.get()};
    node->rw = {extract_read_writes(*b)};
    node->names = {b->name};
    node->is_extern = b->kind == ir::BufferKind::kExtern;
    if (!node->is_extern) node->compute_ops = b->body.compute_op_count();
    for (const std::string& name : node->rw[0].read_names()) {
      if (available.count(name)) continue;
      KILN_CHECK(program_.find(name) != nullptr, "buffer {} reads unknown buffer {}", b->name,
                 name);
      if (name != b->name) node->unmet.insert(name);
    }
    for (const std::string& name : ir::dynamic_size_sources(program_, *b)) {
      if (!available.count(name)) node->unmet.insert(name);
    }
    if (!node->is_extern) {
      node->group = group_of(*b);
      auto member = map_member(*b, node->group, program_.analyzer);
      KILN_CHECK(member.has_value(), "buffer {} does not map onto its own loops", b->name);
      node->members = {*member};
    }
    produced.insert(b->name);
    name_to_node_[b->name] = node.get();
    nodes_.push_back(node.get());
    storage_.push_back(std::move(node));
  }
  for (const SchedNode* n : nodes_) {
    for (const std::string& dep : n->unmet) {
      KILN_CHECK(produced.count(dep), "buffer {} reads {}, which nothing computes", n->name(), dep);
    }
  }
  for (const std::string& out : outputs_) {
    KILN_CHECK(produced.count(out) || available.count(out), "output buffer {} is not computed",
               out);
  }
}

void Scheduler::topological_sort() {
  std::set<const SchedNode*> seen;
  std::vector<SchedNode*> result;
  std::function<void(SchedNode*)> visit = [&](SchedNode* n) {
    if (!seen.insert(n).second) return;
    for (const std::string& dep : n->unmet) visit(name_to_node_.at(dep));  // sorted by name
    result.push_back(n);
  };
  for (SchedNode* n : nodes_) visit(n);
  nodes_ = std::move(result);
}

void Scheduler::dead_node_elimination() {
  std::set<std::string> live(outputs_.begin(), outputs_.end());
  std::vector<SchedNode*> kept;
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    SchedNode* n = *it;
    bool used = std::any_of(n->names.begin(), n->names.end(),
                            [&](const std::string& name) { return live.count(name) > 0; });
    if (!used) {
      log::write(log::Category::kSchedule, "removed dead node: {}", n->name());
      for (const std::string& name : n->names) name_to_node_.erase(name);
      continue;
    }
    live.insert(n->unmet.begin(), n->unmet.end());
    kept.push_back(n);
  }
  nodes_.assign(kept.rbegin(), kept.rend());
}

void Scheduler::compute_ancestors() {
  std::map<std::string, std::set<std::string>> name_to_ancestors;
  for (SchedNode* n : nodes_) {
    std::set<std::string> ancestors;
    for (const std::string& dep : n->unmet) {
      ancestors.insert(dep);
      const auto& up = name_to_ancestors.at(dep);
      ancestors.insert(up.begin(), up.end());
    }
    for (const std::string& name : n->names) name_to_ancestors[name] = ancestors;
    n->ancestors = std::move(ancestors);
  }
  for (size_t k = 0; k < nodes_.size(); ++k) {
    nodes_[k]->min_order = nodes_[k]->max_order = static_cast<int>(k);
    for (const std::string& name : nodes_[k]->names) buffer_order_[name] = static_cast<int>(k);
  }
}

std::string Scheduler::nodes_text() const {
  std::string out;
  for (const SchedNode* n : nodes_) {
    out += fmt::format("{}: {}{}\n", n->name(), n->is_extern ? "extern" : "kernel ",
                       n->is_extern ? "" : n->group.str());
    for (size_t k = 0; k < n->buffers.size(); ++k) {
      if (n->is_fused()) out += fmt::format("  {}:\n", n->buffers[k]->name);
      for (const Dep& d : n->rw[k].reads) out += fmt::format("    read  {}\n", d.str());
      for (const Dep& d : n->rw[k].writes) out += fmt::format("    write {}\n", d.str());
    }
  }
  return out;
}

Schedule Scheduler::run() {
  create_nodes();
  topological_sort();
  dead_node_elimination();
  compute_ancestors();
  Schedule result;
  result.before_fusion_text = nodes_text();
  if (options_.fuse) fuse_nodes();
  result.after_fusion_text = nodes_text();
  result.items = make_items();
  find_kernel_local(result.items);
  compute_last_use(result.items);
  for (ScheduleItem& item : result.items) decide_inplace(item);
  name_kernels(result.items);
  result.decisions = std::move(decisions_);
  for (const ScheduleItem& item : result.items) {
    log::write(log::Category::kSchedule, "{}: {} buffer(s), group {}", item.name,
               item.buffers.size(), item.kind == ItemKind::kKernel ? item.group.str() : "extern");
  }
  return result;
}

Schedule schedule(const ir::Program& program, const Backend& backend,
                  const SchedulerOptions& options) {
  Scheduler scheduler(program, backend, options);
  return scheduler.run();
}

}  // namespace kiln::sched
