#include "codegen/wrapper/stream_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kiln::codegen {

namespace {

/// What the pass needs of each schedule item: what it reads from other items (or inputs and
/// constants) and the buffers it makes for others.
struct ItemIo {
  std::set<std::string> reads;
  std::vector<std::string> writes;
};

std::vector<ItemIo> item_io(const sched::Schedule& schedule) {
  std::vector<ItemIo> io(schedule.items.size());
  for (size_t i = 0; i < schedule.items.size(); ++i) {
    const sched::ScheduleItem& item = schedule.items[i];
    std::set<std::string> own;
    for (const ir::Buffer* b : item.buffers) own.insert(b->name);
    const std::set<std::string> local(item.kernel_local.begin(), item.kernel_local.end());
    for (const ir::Buffer* b : item.buffers) {
      for (const std::string& r : b->reads()) {
        if (!own.count(r)) io[i].reads.insert(r);
      }
      if (!local.count(b->name)) io[i].writes.push_back(b->name);
    }
  }
  return io;
}

bool uses_only(const sym::Expr& e, const std::set<std::string>& bound) {
  for (const sym::Expr& s : sym::free_symbols(e)) {
    if (!bound.count(s.name())) return false;
  }
  return true;
}

}  // namespace

const StreamPlan::Fork* StreamPlan::window_of(size_t i) const {
  for (const Fork& f : forks) {
    if (f.fork <= i && i < f.join) return &f;
  }
  return nullptr;
}

bool StreamPlan::on_side(size_t i) const {
  const Fork* f = window_of(i);
  return f != nullptr && std::find(f->side.begin(), f->side.end(), i) != f->side.end();
}

std::string StreamPlan::str(const sched::Schedule& schedule) const {
  std::string text;
  for (size_t k = 0; k < forks.size(); ++k) {
    const Fork& f = forks[k];
    // Items by number and name, with the buffer they make (extern items share their name).
    auto describe = [&](size_t i) {
      const sched::ScheduleItem& item = schedule.items[i];
      return fmt::format("#{} {}{}", i, item.name,
                         item.kind == sched::ItemKind::kExtern && !item.buffers.empty()
                             ? " " + item.buffers.front()->name
                             : "");
    };
    std::vector<std::string> side, main;
    for (size_t i = f.fork; i < f.join; ++i) (on_side(i) ? side : main).push_back(describe(i));
    text += fmt::format(
        "fork {} at {} (before #{}): side stream [{}] overlaps main [{}], join before {}\n", k,
        f.value, f.fork, fmt::join(side, ", "), fmt::join(main, ", "), describe(f.join));
  }
  return text;
}

namespace {

/// Of every chain allowed (`candidates`), the windows taken: in order of their start, the
/// shortest chain first (a projection shortcut rather than the main branch beside it); a window
/// starts at or after the join of the one before.
std::vector<StreamPlan::Fork> choose_windows(std::vector<StreamPlan::Fork> candidates) {
  std::stable_sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    if (a.fork != b.fork) return a.fork < b.fork;
    return a.side.size() < b.side.size();
  });
  std::vector<StreamPlan::Fork> taken;
  size_t free_from = 0;
  for (StreamPlan::Fork& f : candidates) {
    if (f.fork < free_from) continue;
    free_from = f.join;
    taken.push_back(std::move(f));
  }
  return taken;
}

}  // namespace

StreamPlan plan_streams(const ir::Program& program, const sched::Schedule& schedule,
                        const std::set<std::string>& bound,
                        const std::function<bool(const sched::ScheduleItem&)>& concurrent) {
  StreamPlan plan;
  const size_t n = schedule.items.size();
  const std::vector<ItemIo> io = item_io(schedule);

  // Who makes each buffer (inputs and constants: nobody, before every item) and who reads it.
  std::map<std::string, size_t> producer;
  std::map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& w : io[i].writes) producer[w] = i;
    for (const std::string& r : io[i].reads) readers[r].push_back(i);
  }
  std::set<std::string> outputs, checked, sized;
  for (const ir::OutputSpec& out : program.outputs) outputs.insert(out.buffer);
  for (const ir::IndexCheck& check : program.index_checks) checked.insert(check.buffer);
  for (const ir::DynamicSize& size : program.dynamic_sizes) sized.insert(size.buffer);

  // An item allowed in a window: a device call that waits for nothing, whose buffers give no
  // size to the host, and before which no index check runs (one may wait for the GPU).
  auto in_window_ok = [&](size_t i) {
    if (!concurrent(schedule.items[i])) return false;
    for (const std::string& w : io[i].writes) {
      if (sized.count(w)) return false;
    }
    for (const std::string& r : io[i].reads) {
      if (checked.count(r)) return false;
    }
    return true;
  };
  // An item allowed on the side stream: what it writes lives in storage planned before the
  // run (the arena).
  auto side_ok = [&](size_t i) {
    if (!in_window_ok(i) || io[i].writes.empty()) return false;
    for (const std::string& w : io[i].writes) {
      const ir::Buffer* b = program.find(w);
      if (b == nullptr || outputs.count(w) || !uses_only(b->layout.storage_size(), bound))
        return false;
    }
    return true;
  };
  auto made_before = [&](const std::string& name, size_t at) {
    auto p = producer.find(name);
    return p == producer.end() || p->second < at;
  };

  // The fork of a chain starting at c1, if one is allowed there.
  auto try_chain = [&](size_t c1) -> std::optional<StreamPlan::Fork> {
    if (!side_ok(c1)) return std::nullopt;
    // The side stream forks right after the last call that made what c1 reads. Then the chain
    // grows: each next call is the only reader of the one before and reads nothing else made
    // after the fork.
    size_t fork = 0;
    for (const std::string& r : io[c1].reads) {
      if (auto p = producer.find(r); p != producer.end()) fork = std::max(fork, p->second + 1);
    }
    std::vector<size_t> chain{c1};
    std::set<std::string> made(io[c1].writes.begin(), io[c1].writes.end());
    while (chain.size() < kMaxSideCalls) {
      std::set<size_t> next;
      for (const std::string& w : io[chain.back()].writes) {
        for (size_t r : readers[w]) next.insert(r);
      }
      if (next.size() != 1) break;
      const size_t nx = *next.begin();
      if (!side_ok(nx)) break;
      bool ok = true;
      for (const std::string& r : io[nx].reads) ok = ok && (made.count(r) || made_before(r, fork));
      if (!ok) break;
      chain.push_back(nx);
      made.insert(io[nx].writes.begin(), io[nx].writes.end());
    }
    // The join: the first reader of the chain's last call outside the chain.
    size_t join = n;
    for (const std::string& w : io[chain.back()].writes) {
      for (size_t r : readers[w]) join = std::min(join, r);
    }
    if (join == n) return std::nullopt;
    const std::set<size_t> side(chain.begin(), chain.end());
    // Every call of the window queues without waiting; one of them, on the main stream, reads
    // a value the chain's first call reads (the fork).
    for (size_t i = fork; i < join; ++i) {
      if (!in_window_ok(i)) return std::nullopt;
    }
    std::string forked;
    for (const std::string& r : io[c1].reads) {
      for (size_t other : readers[r]) {
        if (other >= fork && other < join && !side.count(other) && forked.empty()) forked = r;
      }
    }
    if (forked.empty()) return std::nullopt;
    // An in-place write must not overwrite what the other stream may still read.
    for (size_t i = fork; i < join; ++i) {
      for (const auto& [output, input] : schedule.items[i].inplace) {
        for (size_t other : readers[input]) {
          if (other >= fork && other < join && side.count(other) != side.count(i))
            return std::nullopt;
        }
      }
    }
    return StreamPlan::Fork{fork, join, chain, forked};
  };

  std::vector<StreamPlan::Fork> candidates;
  for (size_t c1 = 0; c1 < n; ++c1) {
    if (auto f = try_chain(c1)) candidates.push_back(std::move(*f));
  }
  plan.forks = choose_windows(std::move(candidates));
  return plan;
}

}  // namespace kiln::codegen
