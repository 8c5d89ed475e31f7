/// What the wrapper needs after fusion: schedule items, kernel-local buffers (never allocated),
/// last uses (Inductor's compute_last_usage) and in-place reuse of dying inputs.

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sched/scheduler_impl.h"
#include "sched/template_epilogue.h"
#include "support/error.h"
#include "support/identifier.h"
#include "support/log.h"

namespace kiln::sched {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::set<std::string> item_reads(const ScheduleItem& item) {
  std::set<std::string> reads;
  for (const ir::Buffer* b : item.buffers) {
    for (const std::string& name : b->reads()) reads.insert(name);
  }
  return reads;
}

// "ReduceMax" -> "reduce_max", "LayerNormalization" -> "layer_normalization".
std::string snake_case(const std::string& op_type) {
  std::string out;
  for (size_t k = 0; k < op_type.size(); ++k) {
    char c = op_type[k];
    if (!std::isalnum(static_cast<unsigned char>(c))) {
      if (!out.empty() && out.back() != '_') out += '_';
      continue;
    }
    bool upper = std::isupper(static_cast<unsigned char>(c));
    if (upper && k > 0 && std::islower(static_cast<unsigned char>(op_type[k - 1]))) out += '_';
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

// Members (by position) that read `name`, and whether every read is at `index`.
bool reads_only_at(const ScheduleItem& item, const std::string& name, const sym::Expr& index,
                   const sym::Analyzer& ga, size_t* last_reader) {
  for (size_t k = 0; k < item.members.size(); ++k) {
    const KernelMember& m = item.members[k];
    for (const ir::Op& op : m.buffer->body.ops()) {
      if (op.code != ir::OpCode::kLoad || op.buffer != name) continue;
      if (is_indirect_index(m.buffer->body, op.index)) return false;
      if (to_group_index(op.index, m, ga) != index) return false;
      *last_reader = k;
    }
  }
  return true;
}

// Whether a CPU call with an epilogue writes each element of its output once, by the store that
// applies the epilogue (GemmChoice::stores_once, ConvChoice::stores_once).
bool stores_once(const ir::Buffer& call) {
  if (call.device != ir::Device::kCpu || call.call.product.empty()) return false;
  if (const auto* conv = call.call.as<ir::ConvCall>()) {
    return conv->choice != nullptr && conv->choice->stores_once();
  }
  if (const auto* gemm = call.call.as<ir::GemmCall>()) {
    return gemm->choice != nullptr && gemm->choice->stores_once();
  }
  return false;
}

}  // namespace

std::vector<ScheduleItem> Scheduler::make_items() const {
  std::vector<ScheduleItem> items;
  for (const SchedNode* n : nodes_) {
    ScheduleItem item;
    item.kind = n->is_extern ? ItemKind::kExtern : ItemKind::kKernel;
    item.buffers = n->buffers;
    item.device = n->buffers.front()->device;
    if (!n->is_extern) {
      item.group = n->group;
      item.members = n->members;
    }
    for (const ir::Buffer* b : n->buffers) {
      for (const ir::Origin& o : b->origins) {
        std::string text = fmt::format("{} ({})", comment_text(o.node), o.op_type);
        if (!contains(item.onnx_nodes, text)) item.onnx_nodes.push_back(text);
      }
    }
    items.push_back(std::move(item));
  }
  return items;
}

void Scheduler::find_kernel_local(std::vector<ScheduleItem>& items) const {
  std::map<std::string, std::set<size_t>> readers;
  for (size_t k = 0; k < items.size(); ++k) {
    for (const std::string& name : item_reads(items[k])) readers[name].insert(k);
  }
  for (size_t k = 0; k < items.size(); ++k) {
    ScheduleItem& item = items[k];
    if (item.kind != ItemKind::kKernel) continue;
    for (const ir::Buffer* b : item.buffers) {
      if (is_graph_output(b->name)) continue;
      const auto& r = readers[b->name];
      if (!r.empty() && r.size() == 1 && *r.begin() == k) item.kernel_local.push_back(b->name);
    }
  }
}

void Scheduler::compute_last_use(std::vector<ScheduleItem>& items) const {
  std::set<std::string> future_used(outputs_.begin(), outputs_.end());
  for (auto it = items.rbegin(); it != items.rend(); ++it) {
    std::set<std::string> used = item_reads(*it);
    for (const ir::Buffer* b : it->buffers) used.insert(b->name);
    for (const std::string& name : used) {
      if (future_used.count(name)) continue;
      future_used.insert(name);
      const ir::Buffer* b = program_.find(name);
      bool owned =
          b && (b->kind == ir::BufferKind::kComputed || b->kind == ir::BufferKind::kExtern);
      if (owned && !contains(it->kernel_local, name)) it->last_use.push_back(name);
    }
  }
}

// A template call whose epilogue reads a dying buffer only at the element it stores (a residual
// Add) writes into that buffer's storage: ResNet's 1x1 expansions then read the residual where
// they write it, instead of reading it and writing (and first fetching) another buffer.
void Scheduler::decide_extern_inplace(ScheduleItem& item) const {
  if (item.buffers.size() != 1) return;
  const ir::Buffer& out = *item.buffers.front();
  if (is_graph_output(out.name) || !stores_once(out)) return;
  const sym::Expr store = elementwise_index(program_, out.layout, out.body);
  for (const std::string& in_name : item.last_use) {
    const ir::Buffer* in = program_.find(in_name);
    if (in == nullptr || is_graph_output(in_name) || in->dtype != out.dtype) continue;
    // Not an operand of the call itself (X, A, or a B computed at run time), which it reads at
    // other elements, nor an input of an earlier epilogue of the chain or of its prologue.
    bool operand = false;
    for (size_t k = 0; k < out.call.inputs.size() && k < 2; ++k) {
      operand = operand || (out.call.inputs[k] && out.call.inputs[k]->buffer == in_name);
    }
    for (const auto& earlier : out.call.epilogue_chain) {
      const std::vector<std::string> reads = earlier->reads();
      operand = operand || std::find(reads.begin(), reads.end(), in_name) != reads.end();
    }
    if (out.call.prologue) {  // what the call computes its X from
      const std::vector<std::string> reads = out.call.prologue->reads();
      operand = operand || std::find(reads.begin(), reads.end(), in_name) != reads.end();
    }
    if (operand || !program_.analyzer.statically_known_equal(in->layout.storage_size(),
                                                             out.layout.storage_size())) {
      continue;
    }
    bool elementwise = false;
    for (const ir::Op& op : out.body.ops()) {
      if (op.code != ir::OpCode::kLoad || op.buffer != in_name) continue;
      elementwise = !is_indirect_index(out.body, op.index) && op.index == store;
      if (!elementwise) break;
    }
    if (!elementwise) continue;
    item.inplace.emplace_back(out.name, in_name);
    log::write(log::Category::kMemory, "{} ({} call) reuses {} in place: its epilogue reads it",
               out.name, out.call.name(), in_name);
    std::erase(item.last_use, in_name);
    return;
  }
}

void Scheduler::decide_inplace(ScheduleItem& item) const {
  if (item.kind == ItemKind::kExtern) {
    decide_extern_inplace(item);
    return;
  }
  if (item.kind != ItemKind::kKernel) return;
  sym::Analyzer ga = item.group.analyzer(program_.analyzer);
  std::set<std::string> reads = item_reads(item);
  std::set<std::string> taken;
  for (size_t w = 0; w < item.members.size(); ++w) {
    const ir::Buffer& out = *item.members[w].buffer;
    if (is_graph_output(out.name) || contains(item.kernel_local, out.name)) continue;
    auto store = group_store_index(item.members[w], ga);
    if (!store) continue;
    for (const std::string& in_name : item.last_use) {
      const ir::Buffer* in = program_.find(in_name);
      if (!reads.count(in_name) || taken.count(in_name) || is_graph_output(in_name)) continue;
      if (contains(item.kernel_local, in_name) || in->dtype != out.dtype) continue;
      if (std::any_of(item.buffers.begin(), item.buffers.end(),
                      [&](const ir::Buffer* b) { return b->name == in_name; })) {
        continue;
      }
      if (!program_.analyzer.statically_known_equal(in->layout.storage_size(),
                                                    out.layout.storage_size())) {
        continue;
      }
      size_t last_reader = 0;
      if (!reads_only_at(item, in_name, *store, ga, &last_reader) || last_reader > w) continue;
      item.inplace.emplace_back(out.name, in_name);
      taken.insert(in_name);
      log::write(log::Category::kMemory, "{} reuses {} in place", out.name, in_name);
      break;
    }
  }
  std::erase_if(item.last_use, [&](const std::string& name) { return taken.count(name) > 0; });
}

void Scheduler::name_kernels(std::vector<ScheduleItem>& items) const {
  for (size_t k = 0; k < items.size(); ++k) {
    ScheduleItem& item = items[k];
    if (item.kind == ItemKind::kExtern) {
      item.name = item.buffers.front()->call.name();
      continue;
    }
    std::vector<std::string> ops;
    for (const ir::Buffer* b : item.buffers) {
      for (const ir::Origin& o : b->origins) {
        std::string op = snake_case(o.op_type);
        if (!op.empty() && !contains(ops, op)) ops.push_back(op);
      }
    }
    if (ops.size() > static_cast<size_t>(options_.max_name_ops)) ops.resize(options_.max_name_ops);
    std::string name =
        fmt::format("{}_{}", backend_.kernel_prefix(), ops.empty() ? "kernel" : "fused");
    for (const std::string& op : ops) {
      name += '_';
      name += op;
    }
    item.name = fmt::format("{}_{}", name, k);
  }
}

}  // namespace kiln::sched
