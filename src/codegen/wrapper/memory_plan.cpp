#include "codegen/wrapper/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/error.h"

namespace kiln::codegen {

namespace {

sym::Expr aligned_bytes(const ir::Buffer& buffer) {
  sym::Expr bytes = buffer.layout.storage_size() * graph::dtype_size(buffer.dtype);
  return sym::ceil_div(bytes, ir::kAlignBytes) * ir::kAlignBytes;
}

bool uses_only(const sym::Expr& e, const std::set<std::string>& bound) {
  for (const sym::Expr& s : sym::free_symbols(e)) {
    if (!bound.count(s.name())) return false;
  }
  return true;
}

std::string bytes_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string bytes_text(const sym::Expr& bytes) {
  if (auto v = bytes.as_integer()) return bytes_text(*v);
  return bytes.str() + " bytes";
}

}  // namespace

std::string reuse_key(const ir::Buffer& buffer) {
  return fmt::format("{}:{}", graph::dtype_name(buffer.dtype), aligned_bytes(buffer).str());
}

MemoryPlan plan_memory(const ir::Program& program, const sched::Schedule& schedule,
                       const StreamPlan* streams) {
  MemoryPlan plan;
  const size_t n = schedule.items.size();
  plan.before.resize(n);
  plan.after.resize(n);

  std::set<std::string> outputs;
  for (const ir::OutputSpec& out : program.outputs) outputs.insert(out.buffer);
  std::set<std::string> local;
  for (const auto& item : schedule.items) {
    for (const std::string& name : item.kernel_local) local.insert(name);
  }
  plan.kernel_local.assign(local.begin(), local.end());

  // Pass 1: walk the schedule with a pool of freed storage per reuse key (LIFO).
  std::map<std::string, std::vector<std::string>> pool;
  std::set<std::string> taken_inplace;  // inputs whose storage an in-place output took
  std::map<size_t, std::vector<std::string>> deferred;  // join item -> last uses held for it
  for (size_t i = 0; i < n; ++i) {
    const sched::ScheduleItem& item = schedule.items[i];
    std::map<std::string, std::string> inplace(item.inplace.begin(), item.inplace.end());
    for (const ir::Buffer* buffer : item.buffers) {
      const std::string& name = buffer->name;
      if (local.count(name) || ir::is_control_flow(*buffer)) continue;
      if (ir::is_control_flow_result(*buffer)) {  // the subgraph allocated it
        plan.storage[name] = name;
        continue;
      }
      auto in = inplace.find(name);
      if (in != inplace.end() && !outputs.count(name)) {
        plan.before[i].push_back({PlanLine::Kind::kReuse, name, in->second, true});
        plan.storage[name] = plan.storage.at(in->second);
        taken_inplace.insert(in->second);
        continue;
      }
      auto& free_list = pool[reuse_key(*buffer)];
      if (!outputs.count(name) && !free_list.empty()) {
        std::string from = free_list.back();
        free_list.pop_back();
        plan.before[i].push_back({PlanLine::Kind::kReuse, name, from, false});
        plan.storage[name] = plan.storage.at(from);
        continue;
      }
      plan.before[i].push_back({PlanLine::Kind::kAllocate, name, "", false});
      plan.storage[name] = name;
    }
    // Last uses inside a fork's window wait for its join (deferred); the join's call then
    // frees its own and theirs.
    // (A join's call may open the next window: then what it frees waits for that join.)
    std::vector<std::string> last_use = item.last_use;
    if (auto d = deferred.find(i); d != deferred.end()) {
      last_use.insert(last_use.end(), d->second.begin(), d->second.end());
      deferred.erase(d);
    }
    const StreamPlan::Fork* window = streams != nullptr ? streams->window_of(i) : nullptr;
    if (window != nullptr) {
      std::vector<std::string>& held = deferred[window->join];
      held.insert(held.end(), last_use.begin(), last_use.end());
      continue;
    }
    for (const std::string& name : last_use) {
      const ir::Buffer* buffer = program.find(name);
      KILN_CHECK(buffer != nullptr, "last use of unknown buffer {}", name);
      if (buffer->kind == ir::BufferKind::kInput || buffer->kind == ir::BufferKind::kConstant ||
          ir::is_control_flow(*buffer))
        continue;
      if (outputs.count(name) || local.count(name) || taken_inplace.count(name)) continue;
      pool[reuse_key(*buffer)].push_back(name);
      plan.after[i].push_back({PlanLine::Kind::kFree, name, "", false});
    }
  }

  // Pass 2 decides which frees are real: a freed buffer whose storage a later allocation took
  // is not released (the taker releases it).
  std::set<std::string> reused_from;
  for (const auto& lines : plan.before) {
    for (const PlanLine& line : lines) {
      if (line.kind == PlanLine::Kind::kReuse && !line.inplace) reused_from.insert(line.from);
    }
  }
  for (auto& lines : plan.after) {
    std::erase_if(lines, [&](const PlanLine& l) { return reused_from.count(l.buffer) != 0; });
  }
  return plan;
}

ArenaPlan plan_arena(const ir::Program& program, const sched::Schedule& schedule,
                     const MemoryPlan& plan, const std::set<std::string>& bound) {
  std::set<std::string> outputs;
  for (const ir::OutputSpec& out : program.outputs) outputs.insert(out.buffer);
  ArenaPlan arena;
  arena.intermediates = sym::Expr(0);
  // Each allocation starts a storage. It is live from there through the last item of any buffer
  // holding it: a buffer that takes it over (reuse) keeps it live until that buffer's free, and
  // one never freed keeps it to the end of the run.
  std::map<std::string, size_t> index;  // storage -> slot
  std::vector<ArenaPlan::Slot> slots;
  std::vector<bool> open;  // a buffer holding the slot has not been freed yet
  const size_t n = schedule.items.size();
  for (size_t i = 0; i < n; ++i) {
    for (const PlanLine& line : plan.before[i]) {
      if (outputs.count(line.buffer)) continue;
      const sym::Expr bytes = aligned_bytes(*program.find(line.buffer));
      arena.intermediates += bytes;
      if (line.kind == PlanLine::Kind::kReuse) {
        auto it = index.find(plan.storage.at(line.buffer));
        if (it != index.end()) open[it->second] = true;
        continue;
      }
      if (!uses_only(bytes, bound)) continue;
      ArenaPlan::Slot slot;
      slot.storage = line.buffer;
      slot.bytes = bytes;
      slot.dynamic = !bytes.is_integer();
      slot.first = slot.last = i;
      index[line.buffer] = slots.size();
      slots.push_back(slot);
      open.push_back(true);
    }
    for (const PlanLine& line : plan.after[i]) {
      auto it = index.find(plan.storage.at(line.buffer));
      if (it == index.end()) continue;
      slots[it->second].last = i;
      open[it->second] = false;
    }
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    if (open[k]) slots[k].last = n;
  }

  // Static slots: largest first, each at the lowest offset that no slot placed before it uses
  // over an overlapping lifetime (ties by first use, so the result is deterministic).
  std::vector<ArenaPlan::Slot*> order;
  for (ArenaPlan::Slot& slot : slots) {
    if (!slot.dynamic) order.push_back(&slot);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return *a->bytes.as_integer() > *b->bytes.as_integer();
  });
  std::vector<const ArenaPlan::Slot*> placed;
  for (ArenaPlan::Slot* slot : order) {
    const int64_t size = *slot->bytes.as_integer();
    std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of live overlapping slots
    for (const ArenaPlan::Slot* other : placed) {
      if (other->last < slot->first || slot->last < other->first) continue;
      busy.emplace_back(other->offset, other->offset + *other->bytes.as_integer());
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + size <= begin) break;
      offset = std::max(offset, end);
    }
    slot->offset = offset;
    arena.static_bytes = std::max(arena.static_bytes, offset + size);
    placed.push_back(slot);
  }
  std::stable_sort(slots.begin(), slots.end(), [](const auto& a, const auto& b) {
    if (a.dynamic != b.dynamic) return !a.dynamic;
    return !a.dynamic && a.offset < b.offset;
  });
  arena.total = sym::Expr(arena.static_bytes);
  for (ArenaPlan::Slot& slot : slots) {
    if (slot.dynamic) arena.total += slot.bytes;
  }
  arena.slots = std::move(slots);
  return arena;
}

const ArenaPlan::Slot* ArenaPlan::find(const std::string& storage) const {
  for (const Slot& slot : slots) {
    if (slot.storage == storage) return &slot;
  }
  return nullptr;
}

std::string ArenaPlan::str() const {
  std::string text = fmt::format("arena: {} for intermediates of {} ({} slots)\n",
                                 bytes_text(total), bytes_text(intermediates), slots.size());
  for (const Slot& slot : slots) {
    if (slot.dynamic) {
      text += fmt::format("  {} bytes={} after the static region, items {}..{}\n", slot.storage,
                          slot.bytes.str(), slot.first, slot.last);
    } else {
      text += fmt::format("  {} offset={} bytes={} items {}..{}\n", slot.storage, slot.offset,
                          slot.bytes.str(), slot.first, slot.last);
    }
  }
  return text;
}

int MemoryPlan::intermediate_allocations(const ir::Program& program) const {
  std::set<std::string> outputs;
  for (const ir::OutputSpec& out : program.outputs) outputs.insert(out.buffer);
  int count = 0;
  for (const auto& lines : before) {
    for (const PlanLine& line : lines) {
      count += line.kind == PlanLine::Kind::kAllocate && !outputs.count(line.buffer);
    }
  }
  return count;
}

std::string MemoryPlan::str(const ir::Program& program, const sched::Schedule& schedule) const {
  std::set<std::string> outputs;
  for (const ir::OutputSpec& out : program.outputs) outputs.insert(out.buffer);
  std::string text;
  for (size_t i = 0; i < schedule.items.size(); ++i) {
    for (const PlanLine& line : before[i]) {
      const ir::Buffer* b = program.find(line.buffer);
      if (line.kind == PlanLine::Kind::kAllocate) {
        text += fmt::format("allocate {} {} bytes={}{}\n", line.buffer, graph::dtype_name(b->dtype),
                            (b->layout.storage_size() * graph::dtype_size(b->dtype)).str(),
                            outputs.count(line.buffer) ? " (output)" : "");
      } else {
        text += fmt::format("reuse {} <- {}{}\n", line.buffer, line.from,
                            line.inplace ? " (in place)" : "");
      }
    }
    text += fmt::format("call {}\n", schedule.items[i].name);
    for (const PlanLine& line : after[i]) text += fmt::format("free {}\n", line.buffer);
  }
  for (const std::string& name : kernel_local) text += fmt::format("kernel-local {}\n", name);
  text += fmt::format("intermediate allocations: {}\n", intermediate_allocations(program));
  return text;
}

}  // namespace kiln::codegen
