#pragma once
/// Read and write dependencies of one buffer, extracted from its LoopBody (Inductor's
/// dependencies.extract_read_writes). A MemoryDep is an access at a known index; a StarDep
/// covers the whole buffer (inputs of extern calls, and loads whose index contains a symbol
/// defined by an Indirect op, whose position is data-dependent); a WeakDep only orders two nodes.
/// Tested in tests/unit/sched/dependencies_test.cpp.

#include <cstdint>
#include <string>
#include <vector>

#include "ir/buffer.h"
#include "sym/expr.h"

namespace kiln::sched {

enum class DepKind : uint8_t { kMemory, kStar, kWeak };

struct Dep {
  DepKind kind = DepKind::kMemory;
  std::string buffer;
  /// kMemory: the element index over the body's variables (i<k>, r<k>).
  sym::Expr index;
  /// kMemory: the sizes of the body's variables, pointwise dims then reduction dims.
  std::vector<sym::Expr> sizes;

  bool operator==(const Dep& other) const;
  bool operator<(const Dep& other) const;
  /// "MemoryDep(buf0, 16*i0 + i1, [8, 16])", "StarDep(buf0)", "WeakDep(buf0)".
  std::string str() const;
};

struct ReadWrites {
  std::vector<Dep> reads;   // sorted, unique
  std::vector<Dep> writes;  // sorted, unique
  /// Names of the buffers read, sorted, unique.
  std::vector<std::string> read_names() const;
};

/// The dependencies of a computed or extern buffer.
ReadWrites extract_read_writes(const ir::Buffer& buffer);

/// True when `index` contains a symbol defined by an Indirect op of `body`.
bool is_indirect_index(const ir::LoopBody& body, const sym::Expr& index);

}  // namespace kiln::sched
