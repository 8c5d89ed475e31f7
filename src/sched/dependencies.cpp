#include "sched/dependencies.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace kiln::sched {
namespace {

std::vector<sym::Expr> all_sizes(const ir::LoopBody& body) {
  std::vector<sym::Expr> sizes = body.sizes();
  sizes.insert(sizes.end(), body.reduce_sizes().begin(), body.reduce_sizes().end());
  return sizes;
}

void sort_unique(std::vector<Dep>& deps) {
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
}

Dep star_dep(const std::string& buffer) {
  Dep d;
  d.kind = DepKind::kStar;
  d.buffer = buffer;
  return d;
}

}  // namespace

bool Dep::operator==(const Dep& other) const {
  return kind == other.kind && buffer == other.buffer && index == other.index &&
         sizes == other.sizes;
}

bool Dep::operator<(const Dep& other) const {
  if (buffer != other.buffer) return buffer < other.buffer;
  if (kind != other.kind) return kind < other.kind;
  if (index != other.index) return index < other.index;
  return std::lexicographical_compare(sizes.begin(), sizes.end(), other.sizes.begin(),
                                      other.sizes.end());
}

std::string Dep::str() const {
  switch (kind) {
    case DepKind::kMemory: {
      std::string dims;
      for (size_t k = 0; k < sizes.size(); ++k) {
        if (k) dims += ", ";
        dims += sizes[k].str();
      }
      return fmt::format("MemoryDep({}, {}, [{}])", buffer, index.str(), dims);
    }
    case DepKind::kStar:
      return fmt::format("StarDep({})", buffer);
    case DepKind::kWeak:
      return fmt::format("WeakDep({})", buffer);
  }
  return "?";
}

std::vector<std::string> ReadWrites::read_names() const {
  std::vector<std::string> names;
  for (const Dep& d : reads) names.push_back(d.buffer);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

bool is_indirect_index(const ir::LoopBody& body, const sym::Expr& index) {
  for (const ir::Op& op : body.ops()) {
    if (op.code == ir::OpCode::kIndirect && sym::has_symbol(index, op.symbol)) return true;
  }
  return false;
}

ReadWrites extract_read_writes(const ir::Buffer& buffer) {
  ReadWrites rw;
  if (buffer.kind == ir::BufferKind::kExtern) {
    for (const std::string& name : buffer.reads()) rw.reads.push_back(star_dep(name));
    rw.writes.push_back(star_dep(buffer.name));
    return rw;
  }
  if (buffer.kind != ir::BufferKind::kComputed) return rw;
  const ir::LoopBody& body = buffer.body;
  std::vector<sym::Expr> sizes = all_sizes(body);
  for (const ir::Op& op : body.ops()) {
    if (op.code != ir::OpCode::kLoad && op.code != ir::OpCode::kStore) continue;
    Dep d;
    d.buffer = op.buffer;
    if (is_indirect_index(body, op.index)) {
      d.kind = DepKind::kStar;
    } else {
      d.index = op.index;
      d.sizes = sizes;
    }
    (op.code == ir::OpCode::kLoad ? rw.reads : rw.writes).push_back(std::move(d));
  }
  sort_unique(rw.reads);
  sort_unique(rw.writes);
  return rw;
}

}  // namespace kiln::sched
