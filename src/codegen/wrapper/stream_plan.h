#pragma once
/// Concurrent streams for the wrapper's device calls: a pass over the scheduled calls that
/// finds forks (a value read by two or more calls whose chains meet again later, like the
/// projection shortcut of a residual block next to its main branch) and puts a short chain of
/// one fork on an auxiliary ("side") stream. The wrapper records an event on the main stream
/// right after the calls that made what the chain reads (the side stream waits for it:
/// everything queued before is done) and one on the side stream before the join (the first call
/// that reads what the chain made; the main stream waits for it). The calls between the fork and
/// the join that are not the chain's stay on the main stream and overlap it.
///
/// Windows [fork, join) never overlap. Inside one, the memory planner (memory_plan.h) frees
/// nothing before the join: a buffer whose last use lies in the window keeps its storage until
/// the join's call is done, so neither stream can reuse bytes the other may still read or write.

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "ir/buffer.h"
#include "sched/schedule.h"

namespace kiln::codegen {

struct StreamPlan {
  struct Fork {
    size_t fork = 0;           // the side stream forks before this item (after what the chain
                               // reads was made; at or before its first call)
    size_t join = 0;           // the first call that reads what the chain made
    std::vector<size_t> side;  // the chain's calls (schedule items), ascending
    std::string value;         // the value whose readers fork there
  };
  std::vector<Fork> forks;  // in schedule order, windows [fork, join) disjoint

  /// The fork whose window [fork, join) holds item `i`, or null.
  const Fork* window_of(size_t i) const;
  /// Item `i` runs on the side stream.
  bool on_side(size_t i) const;
  /// One line per fork: the chain's calls on the side stream, the join, and the calls
  /// overlapped on the main stream (for the compile report and tests).
  std::string str(const sched::Schedule& schedule) const;
};

/// Finds the forks of `schedule`. `concurrent(item)` tells which items are device calls that
/// queue work without waiting for the device (the only ones allowed inside a window, and only
/// when they read no index-checked buffer and make no size the host reads); the side chain's
/// calls must also write only storage planned before the run (sizes of `bound` symbols, not
/// graph outputs). A chain is at most
/// kMaxSideCalls calls, each the only reader of the one before, reading nothing the main stream
/// makes inside the window; the window must hold another reader of the forked value on the main
/// stream, and no in-place write on one stream of a buffer the other stream reads there. Of the
/// chains whose windows overlap, the one starting first wins, the shortest among those.
StreamPlan plan_streams(const ir::Program& program, const sched::Schedule& schedule,
                        const std::set<std::string>& bound,
                        const std::function<bool(const sched::ScheduleItem&)>& concurrent);

/// The longest chain put on the side stream.
constexpr size_t kMaxSideCalls = 4;

}  // namespace kiln::codegen
