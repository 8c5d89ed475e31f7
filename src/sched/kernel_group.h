#pragma once
/// The loop structure of one kernel (Inductor's CPU style), shared by the scheduler, which decides
/// which buffers may share it, and by the backends, which generate its loops.
///
/// A kernel iterates an outer (parallel) space P and, when it contains reductions, a reduction
/// space R. Its loop variables are x0..x{n-1} over the outer dims and x{n}.. over the reduction
/// dims. Every member buffer runs inside `for p in P`: a reduction member loops over R
/// accumulating, a pointwise member over P x R loops over R, a pointwise member over P runs once.
/// A member's body variables (i<k>, r<k>) are rewritten onto the kernel's loop variables by its
/// `var_map`: directly where its dims equal the kernel's, else through flattening with
/// floor_div / modular_indexing. Tested in tests/unit/sched/kernel_group_test.cpp.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/buffer.h"
#include "sym/analyzer.h"
#include "sym/expr.h"

namespace kiln::sched {

/// How one member buffer iterates inside its kernel.
enum class MemberKind : uint8_t {
  kReduction,       // over P, reducing over R
  kPointwiseInner,  // pointwise over P x R: loops over R inside each p
  kPointwiseOuter,  // pointwise over P: once per p
};

/// One buffer computed by a kernel and how its body maps onto the kernel's loops.
struct KernelMember {
  const ir::Buffer* buffer = nullptr;
  MemberKind kind = MemberKind::kPointwiseOuter;
  /// Replaces the body's variables (i<k>, r<k>) by expressions over the kernel's loop variables.
  sym::Substitution var_map;
};

/// The iteration space of a kernel.
struct KernelGroup {
  std::vector<sym::Expr> sizes;         // outer dims P
  std::vector<sym::Expr> reduce_sizes;  // reduction dims R; empty for pointwise kernels
  std::vector<sym::Expr> vars;          // x0.. over `sizes`
  std::vector<sym::Expr> reduce_vars;   // x<n>.. over `reduce_sizes`

  bool is_reduction() const { return !reduce_sizes.empty(); }
  sym::Expr numel() const { return sym::product(sizes); }
  sym::Expr reduce_numel() const { return sym::product(reduce_sizes); }
  /// `facts` plus the ranges of the loop variables.
  sym::Analyzer analyzer(const sym::Analyzer& facts) const;
  /// "[8, s0] x [16]" (reduction dims after the x), "[8, s0]" for pointwise kernels.
  std::string str() const;
};

/// A kernel group over `sizes` x `reduce_sizes` with fresh loop variables.
KernelGroup make_group(std::vector<sym::Expr> sizes, std::vector<sym::Expr> reduce_sizes);

/// The group of a single computed buffer: its body's dims.
KernelGroup group_of(const ir::Buffer& buffer);

/// The group two fused nodes would share, or nullopt with `reason` set when their iteration
/// spaces are incompatible: reductions need equal P and R; a pointwise group joins a reduction
/// group when its numel equals P x R or P; two pointwise groups need equal numel. The result
/// keeps the reduction group's dims, else `a`'s.
std::optional<KernelGroup> merge_groups(const KernelGroup& a, const KernelGroup& b,
                                        const sym::Analyzer& facts, std::string* reason);

/// How `buffer` runs inside `group`; nullopt when its dims cannot be mapped onto the group's.
std::optional<KernelMember> map_member(const ir::Buffer& buffer, const KernelGroup& group,
                                       const sym::Analyzer& facts);

/// An index of `member`'s body rewritten onto the group's loop variables and simplified by
/// `group_analyzer` (from KernelGroup::analyzer).
sym::Expr to_group_index(const sym::Expr& index, const KernelMember& member,
                         const sym::Analyzer& group_analyzer);

}  // namespace kiln::sched
