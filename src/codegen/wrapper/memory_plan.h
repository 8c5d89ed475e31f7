#pragma once
/// Reuse-based memory planning for the wrapper (Inductor's wrapper memory_plan_reuse): a list of
/// planning lines — allocate, free-if-not-reused, in-place reuse — planned in one pass (a pool
/// of freed buffers keyed by dtype and 64-byte aligned symbolic size; an allocation takes the
/// most recently freed buffer with its key) and emitted in a second.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "codegen/wrapper/stream_plan.h"
#include "ir/buffer.h"
#include "sched/schedule.h"

namespace kiln::codegen {

/// One planned storage decision, in program order, attached to the schedule item it precedes or
/// follows.
struct PlanLine {
  enum class Kind : uint8_t {
    kAllocate,  // `buffer` gets fresh storage
    kReuse,     // `buffer` takes the storage of `from` (freed earlier, or in place)
    kFree,      // `buffer`'s storage is released (it was not reused)
  };
  Kind kind = Kind::kAllocate;
  std::string buffer;
  std::string from;      // kReuse
  bool inplace = false;  // kReuse decided by the scheduler (input's last use is this kernel)
};

struct MemoryPlan {
  /// before[i]: lines to emit before item i (allocations); after[i]: after it (frees).
  std::vector<std::vector<PlanLine>> before;
  std::vector<std::vector<PlanLine>> after;
  /// Buffers that live only inside their kernel (never allocated).
  std::vector<std::string> kernel_local;
  /// The storage each buffer ends up in (its own name, or the buffer whose storage it took).
  std::map<std::string, std::string> storage;

  /// Count of fresh allocations of intermediates (outputs excluded).
  int intermediate_allocations(const ir::Program& program) const;
  /// Text for --dump and tests: one line per decision, with sizes.
  std::string str(const ir::Program& program, const sched::Schedule& schedule) const;
};

/// Where the intermediates of one run live (Inductor's wrapper alloc_from_pool): one block (the
/// arena), each storage of the MemoryPlan at a 64-byte aligned offset. Storages of static size are
/// packed at offsets computed here, two sharing bytes only when their lifetimes do not overlap
/// (greedy by size: each takes the lowest offset free over its lifetime); storages whose size
/// depends on size symbols follow them, one after the other, at offsets that are expressions of
/// those symbols. A storage whose size is known only mid-run (a data-dependent shape), and the
/// outputs, stay outside the arena.
struct ArenaPlan {
  struct Slot {
    std::string storage;  // the buffer whose storage it is (MemoryPlan::storage's values)
    sym::Expr bytes;      // 64-byte aligned
    /// Byte offset in the arena; for a dynamic slot, the offset after the static region and the
    /// dynamic slots before it (see `dynamic`).
    int64_t offset = 0;
    bool dynamic = false;
    size_t first = 0, last = 0;  // schedule items it is live over
  };
  std::vector<Slot> slots;  // static slots by offset, then the dynamic ones in offset order
  int64_t static_bytes = 0;
  /// The arena's size in bytes: static_bytes plus every dynamic slot.
  sym::Expr total;
  /// Every intermediate buffer's aligned bytes summed (what separate allocations would take).
  sym::Expr intermediates;

  const Slot* find(const std::string& storage) const;
  std::string str() const;
};

/// Plans the arena over `plan` for the storages whose sizes use only `bound` symbols (those
/// known when a run starts).
ArenaPlan plan_arena(const ir::Program& program, const sched::Schedule& schedule,
                     const MemoryPlan& plan, const std::set<std::string>& bound);

/// Plans storage for every buffer the schedule computes. Graph outputs always get their own
/// storage and are never handed to another buffer; inputs and constants are never freed.
/// With `streams`, a buffer whose last use lies in a fork's window [fork, join) is freed after
/// the join's call instead: its storage is reused only once both streams are done with it.
MemoryPlan plan_memory(const ir::Program& program, const sched::Schedule& schedule,
                       const StreamPlan* streams = nullptr);

/// The reuse key of a buffer: "<dtype>:<aligned bytes expression>".
std::string reuse_key(const ir::Buffer& buffer);

}  // namespace kiln::codegen
