#pragma once
/// The scheduler (Inductor's scheduler.py): turns a lowered ir::Program into a Schedule.
///
/// Accepts: a Program whose buffers are in dependency order. Produces: kernels and extern calls
/// in execution order, with fusion decisions, kernel-local buffers, in-place reuse and last uses.
/// Stages: dependency extraction (dependencies.h), dead-node elimination, deterministic
/// topological sort, ancestors and order indices, up to `max_fusion_rounds` rounds of fusion
/// (fusion.cpp: legality in can_fuse, priority in score_fusion, reasons for every refusal), then
/// lifetime facts. Nothing here knows the target: a Backend vetoes fusions and names kernels.
/// Tested in tests/unit/sched/scheduler_test.cpp (fusion, refusals, lifetimes) and
/// tests/unit/codegen/cpp_kernel_test.cpp (the kernels it groups, compiled and run).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include "ir/buffer.h"

#include "sched/kernel_group.h"
#include "sched/schedule.h"

namespace kiln::sched {

/// What a backend groups kernels by: numel of P and numel of R (1 for pointwise kernels).
struct GroupKey {
  sym::Expr numel;
  sym::Expr reduce_numel;
  bool operator==(const GroupKey& other) const = default;
  std::string str() const { return fmt::format("({}, {})", numel.str(), reduce_numel.str()); }
};

/// A scheduler node as backends see it when asked about a fusion.
struct NodeInfo {
  std::string name;
  std::vector<const ir::Buffer*> buffers;
  KernelGroup group;
  bool is_reduction = false;
};

/// The hooks a code generator (CPU C++, later CUDA) gives the scheduler.
class Backend {
 public:
  virtual ~Backend() = default;
  /// Prefix of kernel names: "cpp" gives "cpp_fused_add_relu_3".
  virtual std::string_view kernel_prefix() const = 0;
  /// The group key of a kernel over `group`; kernels with equal keys may fuse horizontally.
  virtual GroupKey group_key(const KernelGroup& group) const;
  /// A reason to refuse fusing producer `node1` into consumer `node2` over `fused`, or nullopt.
  virtual std::optional<std::string> can_fuse_vertical(const NodeInfo& node1, const NodeInfo& node2,
                                                       const KernelGroup& fused) const;
  /// A reason to refuse fusing independent `node1` and `node2` over `fused`, or nullopt.
  virtual std::optional<std::string> can_fuse_horizontal(const NodeInfo& node1,
                                                         const NodeInfo& node2,
                                                         const KernelGroup& fused) const;
  /// Why `consumer`, the only reader of the GEMM or convolution choice call `product`, cannot
  /// become the call's epilogue, or "" when it can (sched/template_epilogue.h asks). The backend
  /// that renders the epilogue into its template owns the rule.
  virtual std::string template_epilogue_refusal(const ir::Program& /*program*/,
                                                const ir::Buffer& /*product*/,
                                                const ir::Buffer& /*consumer*/) const {
    return "the backend fuses no template epilogues";
  }
  /// Why `producer` (a convolution choice call or a pointwise buffer) cannot be fused into
  /// `consumer`, the convolution choice call that is its only reader and reads it as X, as its
  /// prologue (sched/template_epilogue.h fuse_conv_prologues), or "" when it can.
  virtual std::string conv_prologue_refusal(const ir::Program& /*program*/,
                                            const ir::Buffer& /*producer*/,
                                            const ir::Buffer& /*consumer*/) const {
    return "the backend fuses no convolution prologues";
  }
  /// Lets the backend fuse `consumer`, the only reader of `product` (a library call with no
  /// template, such as a oneDNN convolution), into the call its own way (oneDNN post-ops): it
  /// rewrites `consumer` into the call and returns true, or leaves both alone and returns false.
  virtual bool fuse_library_epilogue(const ir::Program& /*program*/, const ir::Buffer& /*product*/,
                                     ir::Buffer& /*consumer*/) const {
    return false;
  }
  /// Priority of a candidate pair; only the pairs with the lowest value are tried in a round.
  virtual int fusion_pair_priority(const NodeInfo& /*node1*/, const NodeInfo& /*node2*/) const {
    return 0;
  }
};

/// A backend with no opinions (prefix "kernel"); used by tests and dumps.
class GenericBackend final : public Backend {
 public:
  std::string_view kernel_prefix() const override { return "kernel"; }
};

struct SchedulerOptions {
  bool fuse = true;
  int max_fusion_rounds = 10;
  /// At most this many buffers in one kernel.
  int max_fusion_size = 64;
  /// At most this many compute ops (ir::LoopBody::compute_op_count, summed over the members) in
  /// one kernel made by fusion. The C++ compiler's time on one function grows faster than its
  /// length (its RTL passes are superlinear in straight-line scalar code), so a long chain of
  /// elementwise ops is cut into kernels of about this size: compile time then grows linearly
  /// with the chain. Far above what an ordinary model fuses into one kernel.
  int max_fusion_ops = 256;
  /// Horizontal fusion is refused when the nodes are further apart than this in the order.
  int max_proximity = 64;
  /// Also try pairs that share no buffer but have the same group key.
  bool aggressive_fusion = false;
  /// Value assumed for size symbols when estimating bytes for fusion scores.
  int64_t size_hint = 64;
  /// Most ONNX op names in a kernel name.
  int max_name_ops = 6;
};

/// Schedules `program` (see the file comment). The Schedule points into `program`'s buffers.
Schedule schedule(const ir::Program& program, const Backend& backend,
                  const SchedulerOptions& options = {});

}  // namespace kiln::sched
