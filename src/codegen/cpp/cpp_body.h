#pragma once
/// Emission of one kernel member's LoopBody as C++ statements, scalar or with kiln::vec vectors
/// (internal to the C++ backend; cpp_kernel.cpp builds the loops around it).
///
/// Values are emitted lazily (an op is written when a store or a reduction first needs it, once
/// per loop pass). Kernel-local buffers never touch memory: in a pointwise kernel a later
/// member's load takes the stored value itself (register), in a reduction kernel a value stored
/// once per outer iteration lives in a scalar variable and a value stored per reduction element
/// in a per-thread scratch array indexed by the reduction position.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codegen/common/kernel.h"
#include "ir/buffer.h"
#include "sched/schedule.h"
#include "support/indented_buffer.h"
#include "sym/analyzer.h"

namespace kiln::codegen {

enum class LocalStorage : uint8_t { kRegister, kScalar, kScratch };

/// What every member of one kernel shares: parameter names, kernel-local storage, temporaries.
struct KernelContext {
  const ir::Program* program = nullptr;
  const sched::ScheduleItem* item = nullptr;
  sym::Analyzer analyzer;                      // size facts plus the loop variables' ranges
  std::map<std::string, std::string> params;   // buffer -> pointer parameter
  std::map<std::string, LocalStorage> locals;  // kernel-local buffers
  std::map<std::string, std::string> local_names;
  std::map<std::string, graph::DType> local_dtypes;
  sym::Expr scratch_index;  // position in a scratch array: linear over the reduction variables
  int next_tmp = 0;
  int next_symbol = 0;

  /// A fresh C++ variable name: tmp0, acc1, ...
  std::string tmp(const char* prefix = "tmp");
  /// C++ text of an index over the loop variables.
  std::string cpp(const sym::Expr& e) const;
};

/// One loop pass: scalar or vector, and (for pointwise kernels) the values stored by earlier
/// members in the same pass, by buffer.
struct LoopPass {
  bool vector = false;
  sym::Expr vector_var;
  /// A scalar pass in a loop the C++ compiler vectorizes (across a reduction's outputs): float32
  /// exp, log, tanh, erf and sigmoid take their cpp_simd_math_form, so that the loop stays a
  /// vector loop.
  bool simd_math = false;
  std::map<std::string, std::string> forwarded;
  /// Stores to these buffers (kernel parameters) assign the named variable instead of writing
  /// memory: the CUDA backend's vectorized pointwise kernels gather a thread's elements and
  /// store them in one 16-byte store. The C++ backend leaves it empty.
  std::map<std::string, std::string> staged;
  /// A scalar pass in which range_var runs over [range_lo, range_hi), so comparisons of it with
  /// constants (a Concat's or a Pad's index ranges) fold, and a select or masked load they
  /// decide emits only its live side.
  bool ranged = false;
  sym::Expr range_var;
  int64_t range_lo = 0, range_hi = 0;
  /// With a substitution, every index is rewritten by it and simplified by `analyzer` (which
  /// knows range_var's range) before use: the inner variable as k * q + g, one pass per g.
  sym::Substitution substitution;
  const sym::Analyzer* analyzer = nullptr;
};

/// The parameters of `ctx.item`'s kernel, shared by the C++ and CUDA backends: one input per
/// buffer its members load that none of them writes (in_ptrN), one output per member that is not
/// kernel-local (out_ptrN, or in_out_ptrN when it takes over an input in place). Fills
/// ctx.params, `args` and `param_names` (one per buffer argument).
void assign_kernel_params(KernelContext& ctx, std::vector<KernelArg>& args,
                          std::vector<std::string>& param_names);
/// Where `ctx.item`'s kernel-local buffers live: registers in a pointwise kernel; in a
/// reduction kernel a scalar per outer iteration, or scratch indexed by the reduction position
/// for a member over P x R.
void assign_kernel_locals(KernelContext& ctx);
/// The size arguments of `item`'s kernel: every size symbol its loops and indices use, by name.
void add_size_args(const sched::ScheduleItem& item, std::vector<KernelArg>& args);
/// `item`'s kernel as both backends finish it: `head` (the signature, which names the kernel)
/// with `body` in braces, `args`, and the comment naming the group, the ONNX nodes and the
/// buffers it covers; logged as output code.
GeneratedKernel assemble_kernel(const sched::ScheduleItem& item, const std::string& head,
                                const IndentedBuffer& body, std::vector<KernelArg> args);

class MemberEmitter {
 public:
  MemberEmitter(KernelContext& ctx, const sched::KernelMember& member);

  const sched::KernelMember& member() const { return member_; }
  /// True when everything this member does inside its loop can run on VecF32 lanes along `var`.
  /// With `strided_loads`, float32 loads of memory that move by a constant stride other than 0
  /// and 1 along `var` are vectorized too, one element a lane (VecF32::load_strided).
  bool can_vectorize(const sym::Expr& var, bool strided_loads = false) const;
  /// True when the member has an Indirect op or masked load (no `omp simd` then). With a ranged
  /// `pass`, masks that the range decides do not count.
  bool has_indirect_or_mask(const LoopPass* pass = nullptr) const;
  /// Adds to `points` the positions in (0, size) of `var` where a comparison of `var` plus a
  /// constant with a constant changes value: the boundaries of the ranges a ranged pass folds.
  void range_boundaries(const sym::Expr& var, int64_t size, std::set<int64_t>& points) const;
  /// Adds to `divisors` each constant that an index of the member divides `var` by or takes it
  /// modulo (a channel shuffle's var / 2 and var % 2; 0 for a divisor that is not constant).
  /// False when it has an Indirect op.
  bool index_divisors(const sym::Expr& var, std::set<int64_t>& divisors) const;
  /// True when every load and store of memory (not of a kernel-local buffer) moves by 0 or 1
  /// elements as `var` steps, with at least one moving by 1: iterations along `var` then read
  /// and write neighbouring elements.
  bool unit_stride_along(const sym::Expr& var) const;
  /// The first of `outer` along which a load of memory moves by 1 element while it moves by
  /// more (or by an unknown amount) along `inner`: the load of a transpose, such as a
  /// channels-last value read into an NCHW output. Null when no load is so.
  std::optional<sym::Expr> transposed_load_var(const sym::Expr& inner,
                                               const std::vector<sym::Expr>& outer) const;

  /// Declares the accumulators of the reductions (with vector ones for a vectorized loop).
  void emit_accumulators(IndentedBuffer& out, bool vectorized);
  /// Declares each reduction's accumulators as an array of `lanes`, one per output of a loop
  /// across outputs, and names them by element `lane` (the loop's position) from then on.
  void emit_accumulator_arrays(IndentedBuffer& out, int64_t lanes, const std::string& lane);
  /// True when every reduction is a sum, product, maximum or minimum (one value accumulates).
  bool plain_reductions() const;
  /// The inside of the loop: stores of a pointwise member, accumulator updates of a reduction.
  void emit_loop_body(IndentedBuffer& out, LoopPass& pass);
  /// After a reduction's loops: folds vector accumulators, then computes and stores the results.
  void emit_reduction_end(IndentedBuffer& out, bool vectorized);
  /// The scalar accumulators emit_accumulators declared, by reduction op.
  const std::map<ir::ValueId, std::string>& accumulators() const { return acc_; }
  const ir::LoopBody& body() const { return body_; }
  /// The index of op `id` (a load or store) over the kernel's loop variables.
  const sym::Expr& op_index(ir::ValueId id) const { return index_.at(id); }

 private:
  struct Scope {
    std::map<ir::ValueId, std::string> names;
  };
  std::string value(ir::ValueId id, IndentedBuffer& out, LoopPass& pass, Scope& scope);
  std::string scalar_op(const ir::Op& op, const std::vector<std::string>& args, IndentedBuffer& out,
                        LoopPass& pass, Scope& scope);
  std::string vector_op(const ir::Op& op, const std::vector<std::string>& args, LoopPass& pass);
  std::string load(const ir::Op& op, ir::ValueId id, IndentedBuffer& out, LoopPass& pass,
                   Scope& scope);
  /// Emits the Indirect ops whose symbols `index` uses (they are not operands of the user).
  void define_indirects(const sym::Expr& index, IndentedBuffer& out, LoopPass& pass, Scope& scope);
  void store(const ir::Op& op, const std::string& v, IndentedBuffer& out, LoopPass& pass);
  void update_accumulator(ir::ValueId id, const std::string& v, IndentedBuffer& out,
                          LoopPass& pass);
  bool op_vectorizable(const ir::Op& op, const sym::Expr& var, bool strided_loads) const;
  /// For a comparison of two index expressions whose difference is c + coef * var (coef 1, -1
  /// or 0, c an integer): {coef, c}.
  std::optional<std::pair<int64_t, int64_t>> index_difference(const ir::Op& op,
                                                              const sym::Expr& var,
                                                              const LoopPass* pass = nullptr) const;
  /// The index of op `id` in `pass` (index_, rewritten by the pass's substitution).
  sym::Expr pass_index(ir::ValueId id, const LoopPass& pass) const;
  /// The value of boolean op `id` wherever `pass`'s range puts its variable, when that decides
  /// it (comparisons of index expressions, constants, and, or, not).
  std::optional<bool> known_truth(ir::ValueId id, const LoopPass& pass) const;
  std::optional<int64_t> stride(const sym::Expr& index, const sym::Expr& var) const;

  KernelContext& ctx_;
  const sched::KernelMember& member_;
  const ir::LoopBody& body_;
  sym::Analyzer analyzer_;        // ctx analyzer plus the ranges of indirect symbols
  std::vector<sym::Expr> index_;  // per op: index over the loop variables
  std::vector<bool> post_;        // per op: depends on a reduction result
  std::map<ir::ValueId, std::string> indirect_names_;
  std::map<ir::ValueId, std::string> acc_;   // reduction op -> scalar accumulator
  std::map<ir::ValueId, std::string> vacc_;  // reduction op -> vector accumulator
  std::map<ir::ValueId, std::string> result_;
  sym::Expr arg_index_;  // ArgMax/ArgMin: linear reduction index over the loop variables
};

}  // namespace kiln::codegen
