#pragma once
/// Internals of sched::schedule() shared by scheduler.cpp (nodes, dead-node elimination, order,
/// lifetimes), fusion.cpp (fusion) and lifetimes.cpp (kernel-local buffers, in-place reuse, last
/// use). Not for use outside src/sched.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sched/dependencies.h"
#include "sched/scheduler.h"

namespace kiln::sched {

/// One node of the scheduler: a single buffer, or a group of fused buffers (one kernel).
struct SchedNode {
  std::vector<const ir::Buffer*> buffers;  // in execution order
  std::vector<ReadWrites> rw;              // per buffer
  std::vector<KernelMember> members;       // per buffer (kernels only)
  KernelGroup group;                       // kernels only
  std::set<std::string> names;             // buffers written
  std::set<std::string> unmet;             // buffers read that other nodes write
  std::set<std::string> ancestors;         // buffers this node transitively depends on
  int min_order = 0;
  int max_order = 0;
  int compute_ops = 0;  // summed over the buffers' bodies (ir::LoopBody::compute_op_count)
  bool is_extern = false;

  std::string name() const;
  const std::string& first_name() const { return buffers.front()->name; }
  bool is_fused() const { return buffers.size() > 1; }
  bool is_reduction() const;
  /// Buffers read or written, sorted.
  std::set<std::string> used_names() const;
  NodeInfo info() const;
};

/// Fusion score, compared lexicographically, higher first.
using FusionScore = std::tuple<bool, int64_t, int>;

class Scheduler {
 public:
  Scheduler(const ir::Program& program, const Backend& backend, const SchedulerOptions& options);
  Schedule run();

 private:
  // scheduler.cpp
  void create_nodes();
  void dead_node_elimination();
  void topological_sort();
  void compute_ancestors();
  std::string nodes_text() const;
  bool is_graph_output(const std::string& name) const;
  int64_t buffer_bytes(const std::string& name) const;

  // fusion.cpp
  void fuse_nodes();
  bool fuse_nodes_once();
  std::vector<std::pair<std::string, std::string>> possible_fusions();
  /// nullopt when node1 and node2 may fuse (then `fused` is set); else the reason.
  std::optional<std::string> why_no_fuse(const SchedNode& node1, const SchedNode& node2,
                                         KernelGroup* fused);
  std::optional<std::string> why_no_fuse_vertical(const SchedNode& node1, const SchedNode& node2,
                                                  const KernelGroup& fused);
  bool will_fusion_create_cycle(const SchedNode& node1, const SchedNode& node2);
  FusionScore score_fusion(const SchedNode& node1, const SchedNode& node2) const;
  SchedNode* fuse(SchedNode* node1, SchedNode* node2, const KernelGroup& group);
  void record(const SchedNode& node1, const SchedNode& node2, bool fused, std::string reason);

  // lifetimes.cpp
  std::vector<ScheduleItem> make_items() const;
  void find_kernel_local(std::vector<ScheduleItem>& items) const;
  void compute_last_use(std::vector<ScheduleItem>& items) const;
  void decide_inplace(ScheduleItem& item) const;
  void decide_extern_inplace(ScheduleItem& item) const;
  void name_kernels(std::vector<ScheduleItem>& items) const;

  const ir::Program& program_;
  const Backend& backend_;
  const SchedulerOptions& options_;
  std::vector<std::unique_ptr<SchedNode>> storage_;
  std::vector<SchedNode*> nodes_;
  std::map<std::string, SchedNode*> name_to_node_;
  std::map<std::string, int> buffer_order_;  // position in the first topological order
  std::set<std::string> outputs_;
  std::set<std::string> checked_indices_;  // buffers the wrapper checks before their readers
  std::vector<FusionDecision> decisions_;
  std::set<std::tuple<std::string, std::string, std::string>> recorded_;
};

/// Members of a kernel node over `group`, or nullopt naming the buffer that does not fit.
std::optional<std::vector<KernelMember>> map_members(const std::vector<const ir::Buffer*>& buffers,
                                                     const KernelGroup& group,
                                                     const sym::Analyzer& facts,
                                                     std::string* misfit);

/// The index at which `member` stores its buffer, over the group's loop variables; nullopt when
/// it stores at several different indices.
std::optional<sym::Expr> group_store_index(const KernelMember& member, const sym::Analyzer& ga);

}  // namespace kiln::sched
