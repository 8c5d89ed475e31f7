#pragma once
/// The scheduler's result: the program's buffers grouped into kernels, in execution order, with
/// the lifetime facts the wrapper needs for memory planning. Produced by sched::schedule()
/// (scheduler.h), consumed by the backend's kernel code generator and by the wrapper.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ir/buffer.h"
#include "sched/kernel_group.h"

namespace kiln::sched {

/// Why two nodes were not fused, kept for `KILN_LOG=fusion` and `--dump`.
struct FusionDecision {
  std::string node1;
  std::string node2;
  bool fused = false;
  std::string reason;  // for refusals: "memory deps did not match", "would create a cycle", ...
};

enum class ItemKind : uint8_t { kKernel, kExtern };

/// One call in the wrapper: a generated kernel computing one or more fused buffers, or one extern
/// library call.
struct ScheduleItem {
  ItemKind kind = ItemKind::kKernel;
  /// Where it runs: its buffers' device (the scheduler fuses only buffers of one device).
  ir::Device device = ir::Device::kCpu;
  /// Descriptive kernel name from the ONNX ops it covers, unique in the schedule, e.g.
  /// "cpp_fused_add_relu_3"; the extern kernel name for externs.
  std::string name;
  /// The buffers computed here, in the order the kernel computes them (one for externs).
  std::vector<const ir::Buffer*> buffers;
  /// Buffers written here that no one reads outside this kernel and that are not outputs: they
  /// are never allocated (the kernel keeps them in registers or local scratch).
  std::vector<std::string> kernel_local;
  /// (output buffer, input buffer): the output is written into the input's memory, whose last
  /// use is this item (in-place reuse decided by the scheduler). The generated kernel then takes
  /// one pointer for both, named after the output.
  std::vector<std::pair<std::string, std::string>> inplace;
  /// Buffers whose last use is this item: the wrapper may free or reuse them afterwards. Lists
  /// only buffers the wrapper allocates (computed or extern, not graph outputs, not kernel-local,
  /// not the input side of an in-place pair, whose memory lives on as the output).
  std::vector<std::string> last_use;
  /// kKernel: the loop structure and how each buffer of `buffers` (same order) maps onto it.
  KernelGroup group;
  std::vector<KernelMember> members;
  /// The ONNX nodes covered, "name (OpType)" with the name as comment_text writes it (so it can
  /// go into generated comments as is), in kernel order, unique.
  std::vector<std::string> onnx_nodes;
};

struct Schedule {
  std::vector<ScheduleItem> items;
  std::vector<FusionDecision> decisions;
  /// Text for --dump: nodes before fusion (with their read/write deps), after fusion, decisions.
  std::string before_fusion_text;
  std::string after_fusion_text;
  std::string decisions_text() const;
};

}  // namespace kiln::sched
