#include "codegen/wrapper/memory_plan.h"

#include <fmt/format.h>

#include <set>

#include "support/error.h"

namespace kiln::codegen {

namespace {

sym::Expr aligned_bytes(const ir::Buffer& buffer) {
  sym::Expr bytes = buffer.layout.storage_size() * graph::dtype_size(buffer.dtype);
  return sym::ceil_div(bytes, ir::kAlignBytes) * ir::kAlignBytes;
}

}  // namespace

std::string reuse_key(const ir::Buffer& buffer) {
  return fmt::format("{}:{}", graph::dtype_name(buffer.dtype), aligned_bytes(buffer).str());
}

MemoryPlan plan_memory(const ir::Program& program, const sched::Schedule& schedule) {
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
    for (const std::string& name : item.last_use) {
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
