/// Kernel structure of the C++ backend: arguments, signature and loops around the members'
/// bodies (cpp_body.cpp). Pointwise kernels are one loop nest; reduction kernels loop over the
/// outer dims and run every member inside: a reduction loops over R accumulating, a pointwise
/// member over P x R loops over R, a pointwise member over P runs once.

#include "codegen/cpp/cpp_kernel.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "autotune/runtime_headers.h"
#include "codegen/cpp/cpp_body.h"
#include "codegen/cpp/cpp_ops.h"
#include "support/error.h"
#include "support/identifier.h"
#include "support/image_path.h"
#include "support/log.h"
#include "sym/prelude.h"

namespace kiln::codegen {
namespace {

using sched::KernelGroup;
using sched::MemberKind;

/// Lanes of kiln::vec::VecF32 (kWidth in src/runtime/kiln_vec.h).
constexpr int64_t kVectorWidth = 8;

/// Whether a vector loop over `size` elements can run at least once: a loop statically shorter
/// than one vector gets only the scalar loop, not a vector loop that never runs beside it (the
/// C++ compiler would still parse and optimize that dead copy of the body).
bool fills_a_vector(const sym::Expr& size) {
  std::optional<int64_t> n = size.as_integer();
  return !n || *n >= kVectorWidth;
}

/// A loop over [begin, size) as a vector loop in steps of the vector width up to `<v>_end`, then
/// a scalar loop over the tail; `pass(vector)` writes one pass's body.
void emit_vector_and_tail(IndentedBuffer& out, const std::string& v, const std::string& size,
                          const std::function<void(bool)>& pass, const std::string& begin = "0") {
  out.linef("const int64_t {0}_end = {2} + ({1} - {2}) / kiln::vec::kWidth * kiln::vec::kWidth;", v,
            size, begin);
  out.linef("for (int64_t {0} = {1}; {0} < {0}_end; {0} += kiln::vec::kWidth) {{", v, begin);
  {
    auto _ = out.scope();
    pass(true);
  }
  out.line("}");
  out.linef("for (int64_t {0} = {0}_end; {0} < {1}; ++{0}) {{", v, size);
  {
    auto _ = out.scope();
    pass(false);
  }
  out.line("}");
}

class CppKernelBuilder {
 public:
  CppKernelBuilder(const sched::ScheduleItem& item, const ir::Program& program,
                   const CppKernelOptions& options)
      : item_(item), program_(program), options_(options), group_(item.group) {
    ctx_.program = &program;
    ctx_.item = &item;
    ctx_.analyzer = group_.analyzer(program.analyzer);
    ir::Layout reduce = ir::Layout::contiguous(group_.reduce_sizes);
    ctx_.scratch_index = ctx_.analyzer.simplify(sym::dot(group_.reduce_vars, reduce.strides));
  }

  GeneratedKernel build();

 private:
  void assign_params();
  void assign_locals();
  void collect_sizes();
  std::string signature() const;
  std::string parallel_if() const;
  std::string chunk_params() const;
  std::string chunk_args() const;
  void emit_parallel_loops(IndentedBuffer& out, const std::vector<sym::Expr>& vars,
                           const std::vector<sym::Expr>& sizes,
                           const std::function<void(IndentedBuffer&)>& prologue,
                           const std::function<void(IndentedBuffer&)>& body);
  void emit_blocked_loops(IndentedBuffer& out, size_t at, std::vector<sym::Expr> vars,
                          std::vector<sym::Expr> sizes, int64_t block,
                          const std::function<void(IndentedBuffer&)>& body);
  void emit_pointwise(IndentedBuffer& out);
  void move_transposed_load_var(std::vector<sym::Expr>& vars, std::vector<sym::Expr>& sizes) const;
  void emit_pointwise_inner_loop(IndentedBuffer& out, const sym::Expr& var, const sym::Expr& size,
                                 bool vectorize, bool simd);
  void emit_pass(IndentedBuffer& out, bool vector, const sym::Expr& var);
  /// `[#pragma omp simd] for (v = lo; v < hi; ++v)` around each pass's members in turn (the
  /// pragma when no pass leaves a mask or an indirect load).
  void emit_passes_loop(IndentedBuffer& out, const std::string& v, int64_t lo, int64_t hi,
                        std::vector<LoopPass>& passes);
  /// The inner loop over `var` split at the constants its comparisons cross, or unrolled by the
  /// residues of the constants its indices divide it by (emit_pointwise_inner_loop); false
  /// (nothing emitted) when that does not apply.
  bool emit_split_by_ranges(IndentedBuffer& out, const sym::Expr& var, int64_t size);
  bool emit_unrolled_residues(IndentedBuffer& out, const sym::Expr& var, int64_t size);
  void emit_reduction(IndentedBuffer& out);
  bool runs_across_outputs() const;
  size_t across_dim() const;
  void emit_across_outputs(IndentedBuffer& out, int64_t lanes);
  void emit_outer_body(IndentedBuffer& out);
  void emit_member_in_reduction(IndentedBuffer& out, MemberEmitter& m);
  void emit_inner_loops(IndentedBuffer& out, MemberEmitter& m, bool vectorize);

  const sched::ScheduleItem& item_;
  const ir::Program& program_;
  const CppKernelOptions& options_;
  const KernelGroup& group_;
  KernelContext ctx_;
  std::vector<std::unique_ptr<MemberEmitter>> members_;
  std::vector<KernelArg> args_;
  std::vector<std::string> param_names_;  // per buffer arg
  std::vector<std::string> scratch_decls_;
};

void CppKernelBuilder::assign_params() { assign_kernel_params(ctx_, args_, param_names_); }

void CppKernelBuilder::assign_locals() { assign_kernel_locals(ctx_); }

void CppKernelBuilder::collect_sizes() { add_size_args(*ctx_.item, args_); }

std::string CppKernelBuilder::signature() const {
  std::vector<std::string> params;
  for (size_t k = 0; k < args_.size(); ++k) {
    const KernelArg& a = args_[k];
    if (a.kind == KernelArg::Kind::kSize) {
      params.push_back(fmt::format("int64_t {}", a.name));
      continue;
    }
    params.push_back(fmt::format("{}{}* __restrict__ {}", a.is_output ? "" : "const ",
                                 graph::dtype_cpp_storage(a.dtype), param_names_[k]));
  }
  std::string text = fmt::format("extern \"C\" void {}(", item_.name);
  for (size_t k = 0; k < params.size(); ++k) {
    if (k) text += ", ";
    text += params[k];
  }
  text += ")";
  return text;
}

/// The run-time test that a kernel's work pays for more threads (kiln_rt::parallel_for's first
/// argument).
std::string CppKernelBuilder::parallel_if() const {
  sym::Expr work = group_.numel() * group_.reduce_numel();
  return fmt::format("{} > {}", ctx_.cpp(work), options_.parallel_threshold);
}

/// The kernel's parameters (as in its signature, restrict included) and the names passing them:
/// the chunk function takes them as parameters, so the C++ compiler sees the same no-alias
/// promises inside a chunk as in the kernel.
std::string CppKernelBuilder::chunk_params() const {
  std::string text;
  for (size_t k = 0; k < args_.size(); ++k) {
    const KernelArg& a = args_[k];
    text += ", ";
    if (a.kind == KernelArg::Kind::kSize) {
      text += fmt::format("int64_t {}", a.name);
    } else {
      text += fmt::format("{}{}* __restrict__ {}", a.is_output ? "" : "const ",
                          graph::dtype_cpp_storage(a.dtype), param_names_[k]);
    }
  }
  return text;
}

std::string CppKernelBuilder::chunk_args() const {
  std::string text;
  for (size_t k = 0; k < args_.size(); ++k) {
    text += ", ";
    text += args_[k].kind == KernelArg::Kind::kSize ? args_[k].name : param_names_[k];
  }
  return text;
}

/// The loop nest over `vars` (sizes `sizes`) run on Kiln's thread pool (kiln_rt_pool.h): the
/// nest is flattened to one range cut into chunks; a chunk function (a lambda capturing nothing,
/// taking the kernel's parameters) runs [kiln_chunk_lo, kiln_chunk_hi), deriving the loop
/// variables at its first index and stepping them like an odometer. `prologue` writes what each
/// chunk declares first (scratch), `body` one iteration.
void CppKernelBuilder::emit_parallel_loops(IndentedBuffer& out, const std::vector<sym::Expr>& vars,
                                           const std::vector<sym::Expr>& sizes,
                                           const std::function<void(IndentedBuffer&)>& prologue,
                                           const std::function<void(IndentedBuffer&)>& body) {
  const size_t n = vars.size();
  std::string total;
  for (size_t k = 0; k < n; ++k) total += fmt::format("{}({})", k ? " * " : "", ctx_.cpp(sizes[k]));
  out.linef("auto kiln_chunk = [](int64_t kiln_chunk_lo, int64_t kiln_chunk_hi{}) {{",
            chunk_params());
  {
    auto _ = out.scope();
    prologue(out);
    // The loop variables at kiln_chunk_lo (the last one varies fastest).
    out.line("int64_t kiln_rest = kiln_chunk_lo;");
    for (size_t k = n; k-- > 0;) {
      const std::string v = ctx_.cpp(vars[k]);
      if (k == 0) {
        out.linef("int64_t {} = kiln_rest;", v);
      } else {
        out.linef("int64_t {0} = kiln_rest % ({1});", v, ctx_.cpp(sizes[k]));
        out.linef("kiln_rest /= ({});", ctx_.cpp(sizes[k]));
      }
    }
    out.line("(void)kiln_rest;");
    out.line("for (int64_t kiln_i = kiln_chunk_lo; kiln_i < kiln_chunk_hi; ++kiln_i) {");
    {
      auto _ = out.scope();
      body(out);
      // Next index: the odometer step (no division per iteration).
      for (size_t k = n; k-- > 1;) {
        out.linef("if (++{0} < ({1})) continue;", ctx_.cpp(vars[k]), ctx_.cpp(sizes[k]));
        out.linef("{} = 0;", ctx_.cpp(vars[k]));
      }
      out.linef("++{};", ctx_.cpp(vars[0]));
    }
    out.line("}");
  }
  out.line("};");
  out.linef("kiln_rt::parallel_for({}, {}, [&](int64_t kiln_chunk_lo, int64_t kiln_chunk_hi) {{",
            parallel_if(), total);
  out.linef("  kiln_chunk(kiln_chunk_lo, kiln_chunk_hi{});", chunk_args());
  out.line("});");
}

/// emit_parallel_loops over `vars` with vars[at] cut into blocks of `block`: the chunks step
/// through the blocks (kiln_block), and `body` writes one block, whose part of vars[at] is
/// [kiln_block_lo, kiln_block_end).
void CppKernelBuilder::emit_blocked_loops(IndentedBuffer& out, size_t at,
                                          std::vector<sym::Expr> vars, std::vector<sym::Expr> sizes,
                                          int64_t block,
                                          const std::function<void(IndentedBuffer&)>& body) {
  const sym::Expr size = sizes[at];
  vars[at] = sym::Expr::symbol("kiln_block", sym::SymbolKind::kIndex);
  sizes[at] = ctx_.analyzer.simplify(sym::ceil_div(size, sym::Expr(block)));
  emit_parallel_loops(
      out, vars, sizes, [](IndentedBuffer&) {},
      [&](IndentedBuffer& o) {
        o.linef("const int64_t kiln_block_lo = kiln_block * {};", block);
        o.linef("const int64_t kiln_block_end = std::min<int64_t>({}, kiln_block_lo + {});",
                ctx_.cpp(size), block);
        body(o);
      });
}

void CppKernelBuilder::emit_pass(IndentedBuffer& out, bool vector, const sym::Expr& var) {
  LoopPass pass;
  pass.vector = vector;
  pass.vector_var = var;
  for (auto& m : members_) m->emit_loop_body(out, pass);
}

/// The most ranges a scalar inner loop is split into (one loop each), and the largest divisor
/// of the loop variable whose residues it unrolls.
constexpr size_t kMaxLoopRanges = 64;
constexpr int64_t kMaxUnrolledResidues = 8;

void CppKernelBuilder::emit_passes_loop(IndentedBuffer& out, const std::string& v, int64_t lo,
                                        int64_t hi, std::vector<LoopPass>& passes) {
  bool simd = true;
  for (const LoopPass& pass : passes) {
    for (auto& m : members_) simd = simd && !m->has_indirect_or_mask(&pass);
  }
  if (simd) out.line("#pragma omp simd");
  out.linef("for (int64_t {0} = {1}; {0} < {2}; ++{0}) {{", v, lo, hi);
  {
    auto _ = out.scope();
    for (LoopPass& pass : passes) {
      for (auto& m : members_) m->emit_loop_body(out, pass);
    }
  }
  out.line("}");
}

bool CppKernelBuilder::emit_split_by_ranges(IndentedBuffer& out, const sym::Expr& var,
                                            int64_t size) {
  std::set<int64_t> points;
  for (auto& m : members_) m->range_boundaries(var, size, points);
  if (points.empty() || points.size() >= kMaxLoopRanges) return false;
  points.insert(0);
  points.insert(size);
  for (auto it = points.begin(); std::next(it) != points.end(); ++it) {
    std::vector<LoopPass> passes(1);
    passes[0].vector_var = passes[0].range_var = var;
    passes[0].ranged = true;
    passes[0].range_lo = *it;
    passes[0].range_hi = *std::next(it);
    emit_passes_loop(out, ctx_.cpp(var), *it, *std::next(it), passes);
  }
  return true;
}

bool CppKernelBuilder::emit_unrolled_residues(IndentedBuffer& out, const sym::Expr& var,
                                              int64_t size) {
  std::set<int64_t> divisors;
  for (auto& m : members_) {
    if (!m->index_divisors(var, divisors)) return false;
  }
  int64_t k = divisors.empty() ? 0 : 1;  // the divisors' least common multiple
  for (int64_t d : divisors) {
    if (d == 0 || k > kMaxUnrolledResidues) return false;
    k = std::lcm(k, d);
  }
  if (k < 2 || k > kMaxUnrolledResidues || size % k != 0) return false;
  const sym::Expr q = sym::Expr::symbol(ctx_.cpp(var) + "_q", sym::SymbolKind::kIndex);
  sym::Analyzer analyzer = ctx_.analyzer;
  analyzer.bind_index(q, sym::Expr(size / k));
  std::vector<LoopPass> passes(static_cast<size_t>(k));
  for (int64_t g = 0; g < k; ++g) {
    LoopPass& pass = passes[static_cast<size_t>(g)];
    pass.vector_var = var;
    pass.ranged = true;
    pass.range_var = q;
    pass.range_hi = size / k;
    pass.substitution = {{var, sym::Expr(k) * q + sym::Expr(g)}};
    pass.analyzer = &analyzer;
  }
  emit_passes_loop(out, ctx_.cpp(q), 0, size / k, passes);
  return true;
}

void CppKernelBuilder::emit_pointwise_inner_loop(IndentedBuffer& out, const sym::Expr& var,
                                                 const sym::Expr& size, bool vectorize, bool simd) {
  std::string v = ctx_.cpp(var);
  std::string n = ctx_.cpp(size);
  // A scalar loop of static size whose body compares the loop variable with constants (a
  // Concat or a Pad along the innermost dim: each element selects among the parts through
  // masked loads) runs as one loop per range between the constants, each with only the part
  // live there: no selects, no masks, contiguous loads the C++ compiler vectorizes (a
  // channels-last Concat of 13 parts had every element load all 13 under their masks). One
  // whose indices divide the loop variable by constants or take it modulo them (a channel
  // shuffle: element c reads c / 2 of the part c % 2 picks) runs over q = c / k, k their least
  // common multiple, with the k residues unrolled inside: in each copy c = k * q + g with g
  // constant, so the divisions, moduli and the selects on them fold and each copy reads
  // contiguously along q; the C++ compiler interleaves the copies' stores.
  if (const std::optional<int64_t> static_size = size.as_integer(); !vectorize && static_size) {
    if (emit_split_by_ranges(out, var, *static_size) ||
        emit_unrolled_residues(out, var, *static_size)) {
      return;
    }
  }
  if (!vectorize) {
    if (simd) out.line("#pragma omp simd");
    out.linef("for (int64_t {0} = 0; {0} < {1}; ++{0}) {{", v, n);
    {
      auto _ = out.scope();
      emit_pass(out, false, var);
    }
    out.line("}");
    return;
  }
  emit_vector_and_tail(out, v, n, [&](bool vector) { emit_pass(out, vector, var); });
}

void CppKernelBuilder::emit_pointwise(IndentedBuffer& out) {
  size_t n = group_.sizes.size();
  if (n == 0) {
    emit_pass(out, false, sym::Expr(0));
    return;
  }
  const sym::Expr& inner = group_.vars.back();
  bool vectorize = options_.vectorize && fills_a_vector(group_.sizes.back());
  bool simd = true;
  for (auto& m : members_) {
    // Strided loads too: a transpose's reads, a lane at a time, rather than a scalar loop (whose
    // NaN-propagating Clip branches on every element).
    vectorize = vectorize && m->can_vectorize(inner, true);
    simd = simd && !m->has_indirect_or_mask();
  }
  std::string v = ctx_.cpp(inner);
  std::string size = ctx_.cpp(group_.sizes.back());
  if (n == 1) {
    // One dim: chunks of whole vectors ([kiln_chunk_lo, kiln_chunk_hi) counts vectors), the
    // last chunk ending at the scalar tail.
    const std::string vectors =
        fmt::format("(({}) + kiln::vec::kWidth - 1) / kiln::vec::kWidth", size);
    out.linef("auto kiln_chunk = [](int64_t kiln_chunk_lo, int64_t kiln_chunk_hi{}) {{",
              chunk_params());
    {
      auto _ = out.scope();
      out.line("const int64_t kiln_begin = kiln_chunk_lo * kiln::vec::kWidth;");
      out.linef(
          "const int64_t kiln_end = std::min<int64_t>(kiln_chunk_hi * kiln::vec::kWidth, {});",
          size);
      if (!vectorize) {
        if (simd) out.line("#pragma omp simd");
        out.linef("for (int64_t {0} = kiln_begin; {0} < kiln_end; ++{0}) {{", v);
        {
          auto _ = out.scope();
          emit_pass(out, false, inner);
        }
        out.line("}");
      } else {
        emit_vector_and_tail(
            out, v, "kiln_end", [&](bool vector) { emit_pass(out, vector, inner); }, "kiln_begin");
      }
    }
    out.line("};");
    out.linef("kiln_rt::parallel_for({}, {}, [&](int64_t kiln_chunk_lo, int64_t kiln_chunk_hi) {{",
              parallel_if(), vectors);
    out.linef("  kiln_chunk(kiln_chunk_lo, kiln_chunk_hi{});", chunk_args());
    out.line("});");
    return;
  }
  std::vector<sym::Expr> vars(group_.vars.begin(), group_.vars.end() - 1);
  std::vector<sym::Expr> sizes(group_.sizes.begin(), group_.sizes.end() - 1);
  if (!fills_a_vector(group_.sizes.back())) {
    // The last dim is shorter than a vector (the 3 channels of an image going channels-last):
    // the loop over the dim before it, in blocks of kAlong, with the short loop inside, which
    // the C++ compiler unrolls and vectorizes along the longer loop.
    constexpr int64_t kAlong = 256;
    const std::string along = ctx_.cpp(vars.back());
    emit_blocked_loops(out, vars.size() - 1, vars, sizes, kAlong, [&](IndentedBuffer& o) {
      o.linef("for (int64_t {0} = kiln_block_lo; {0} < kiln_block_end; ++{0}) {{", along);
      {
        auto _ = o.scope();
        emit_pointwise_inner_loop(o, inner, group_.sizes.back(), false, false);
      }
      o.line("}");
    });
    return;
  }
  move_transposed_load_var(vars, sizes);
  emit_parallel_loops(
      out, vars, sizes, [](IndentedBuffer&) {},
      [&](IndentedBuffer& o) {
        emit_pointwise_inner_loop(o, inner, group_.sizes.back(), vectorize, simd);
      });
}

/// A pointwise kernel that reads some input across the inner loop with a stride, and along an
/// outer dim contiguously (a transpose: a channels-last value read into an NCHW output, the
/// channels outer and the columns inner), loops over that outer dim just outside the inner loop.
/// Each pass of the dims outside it then reads one compact block (a row of pixels with all their
/// channels), which stays in L1 while the loop over the channels revisits it. With the channels
/// outermost instead, every channel swept the whole input: a [1, 112, 112, 32] value written out
/// as [1, 32, 112, 112] read each cache line 32 times from L3 and took 0.79 ms.
void CppKernelBuilder::move_transposed_load_var(std::vector<sym::Expr>& vars,
                                                std::vector<sym::Expr>& sizes) const {
  if (vars.size() < 2) return;
  const std::vector<sym::Expr> candidates(vars.begin(), vars.end() - 1);
  for (const auto& m : members_) {
    const std::optional<sym::Expr> var = m->transposed_load_var(group_.vars.back(), candidates);
    if (!var) continue;
    const size_t at = static_cast<size_t>(std::find(vars.begin(), vars.end(), *var) - vars.begin());
    std::rotate(vars.begin() + at, vars.begin() + at + 1, vars.end());
    std::rotate(sizes.begin() + at, sizes.begin() + at + 1, sizes.end());
    return;
  }
}

void CppKernelBuilder::emit_inner_loops(IndentedBuffer& out, MemberEmitter& m, bool vectorize) {
  size_t n = group_.reduce_sizes.size();
  for (size_t k = 0; k + 1 < n; ++k) {
    out.linef("for (int64_t {0} = 0; {0} < {1}; ++{0}) {{", ctx_.cpp(group_.reduce_vars[k]),
              ctx_.cpp(group_.reduce_sizes[k]));
    out.indent();
  }
  const sym::Expr& var = group_.reduce_vars.back();
  std::string v = ctx_.cpp(var);
  std::string size = ctx_.cpp(group_.reduce_sizes.back());
  auto pass = [&](bool vector) {
    LoopPass loop;
    loop.vector = vector;
    loop.vector_var = var;
    m.emit_loop_body(out, loop);
  };
  if (vectorize) {
    emit_vector_and_tail(out, v, size, pass);
  } else {
    out.linef("for (int64_t {0} = 0; {0} < {1}; ++{0}) {{", v, size);
    {
      auto _ = out.scope();
      pass(false);
    }
    out.line("}");
  }
  for (size_t k = 0; k + 1 < n; ++k) {
    out.dedent();
    out.line("}");
  }
}

void CppKernelBuilder::emit_member_in_reduction(IndentedBuffer& out, MemberEmitter& m) {
  out.linef("{{  // {}", m.member().buffer->name);
  {
    auto _ = out.scope();
    const sym::Expr& inner = group_.reduce_vars.back();
    switch (m.member().kind) {
      case MemberKind::kReduction: {
        bool vectorize = options_.vectorize && fills_a_vector(group_.reduce_sizes.back()) &&
                         m.can_vectorize(inner);
        m.emit_accumulators(out, vectorize);
        emit_inner_loops(out, m, vectorize);
        m.emit_reduction_end(out, vectorize);
        break;
      }
      case MemberKind::kPointwiseInner:
        emit_inner_loops(out, m,
                         options_.vectorize && fills_a_vector(group_.reduce_sizes.back()) &&
                             m.can_vectorize(inner));
        break;
      case MemberKind::kPointwiseOuter: {
        LoopPass pass;
        m.emit_loop_body(out, pass);
        break;
      }
    }
  }
  out.line("}");
}

void CppKernelBuilder::emit_outer_body(IndentedBuffer& out) {
  for (const auto& [name, storage] : ctx_.locals) {
    if (storage != LocalStorage::kScalar) continue;
    out.linef("{} {}{{}};  // {}", cpp_compute_type(ctx_.local_dtypes.at(name)),
              ctx_.local_names.at(name), name);
  }
  for (auto& m : members_) emit_member_in_reduction(out, *m);
}

void CppKernelBuilder::emit_reduction(IndentedBuffer& out) {
  size_t n = group_.sizes.size();
  std::vector<std::string> scratch;
  for (const auto& [name, storage] : ctx_.locals) {
    if (storage != LocalStorage::kScratch) continue;
    const std::string& local = ctx_.local_names.at(name);
    std::string_view t = cpp_compute_type(ctx_.local_dtypes.at(name));
    scratch.push_back(fmt::format("std::vector<{}> {}_storage({});  // {}", t, local,
                                  ctx_.cpp(group_.reduce_numel()), name));
    scratch.push_back(fmt::format("{0}* __restrict__ {1} = {1}_storage.data();", t, local));
  }
  if (n == 0) {
    out.line("{");
    {
      auto _ = out.scope();
      for (const std::string& line : scratch) out.line(line);
      emit_outer_body(out);
    }
    out.line("}");
    return;
  }
  if (runs_across_outputs()) {
    constexpr int64_t kAcross = 64;
    emit_blocked_loops(out, across_dim(), group_.vars, group_.sizes, kAcross,
                       [&](IndentedBuffer& o) { emit_across_outputs(o, kAcross); });
    return;
  }
  // Each chunk has its own scratch.
  emit_parallel_loops(
      out, group_.vars, group_.sizes,
      [&](IndentedBuffer& o) {
        for (const std::string& line : scratch) o.line(line);
      },
      [&](IndentedBuffer& o) { emit_outer_body(o); });
}

/// Whether a reduction kernel runs blocks of outputs along an outer dim (across_dim) together
/// (emit_across_outputs) instead of one output at a time with the reduction loop innermost: when
/// the reduction's innermost loop strides through memory (a global average pool over
/// channels-last activations reads with a stride of C) and the neighbouring outputs read and
/// write neighbouring elements. Not with per-chunk scratch, which outputs could not share, and
/// only for sums, products, maxima and minima.
bool CppKernelBuilder::runs_across_outputs() const {
  if (!options_.vectorize || group_.vars.empty() || group_.reduce_vars.empty()) return false;
  const size_t at = across_dim();
  if (!fills_a_vector(group_.sizes[at])) return false;
  for (const auto& [name, storage] : ctx_.locals) {
    if (storage == LocalStorage::kScratch) return false;
  }
  for (const auto& m : members_) {
    if (m->has_indirect_or_mask() || !m->unit_stride_along(group_.vars[at])) return false;
    if (m->member().kind == MemberKind::kReduction &&
        (m->can_vectorize(group_.reduce_vars.back()) || !m->plain_reductions()))
      return false;
  }
  return true;
}

/// The outer dim whose outputs runs_across_outputs takes together: the last one of a size other
/// than 1. The dims after it have a single output each, as the kept dims of a ReduceMean over H
/// and W ([N, C, 1, 1] from channels-last activations, a squeeze-excitation's mean).
size_t CppKernelBuilder::across_dim() const {
  size_t at = group_.sizes.size() - 1;
  while (at > 0 && group_.sizes[at].as_integer() == std::optional<int64_t>(1)) --at;
  return at;
}

/// One block of `lanes` outputs along the outer dim across_dim() ([kiln_block_lo,
/// kiln_block_end) of emit_blocked_loops): each reduction
/// accumulates into an array over the block, the reduction loops outside and the loop across the
/// block's outputs inside, which reads neighbouring elements and which the C++ compiler
/// vectorizes; each output's lane adds its elements in the order of the one-output loop. The
/// kernel-local values are arrays over the block too, and the members after a reduction run in
/// loops across the block.
void CppKernelBuilder::emit_across_outputs(IndentedBuffer& out, int64_t lanes) {
  const std::string v = ctx_.cpp(group_.vars[across_dim()]);
  const std::string lane = fmt::format("{} - kiln_block_lo", v);
  for (const auto& [name, storage] : ctx_.locals) {
    std::string& local = ctx_.local_names.at(name);
    out.linef("{} {}[{}];  // {}", cpp_compute_type(ctx_.local_dtypes.at(name)), local, lanes,
              name);
    local = fmt::format("{}[{}]", local, lane);
  }
  auto across = [&](const std::function<void()>& body) {
    out.linef("for (int64_t {0} = kiln_block_lo; {0} < kiln_block_end; ++{0}) {{", v);
    {
      auto _ = out.scope();
      body();
    }
    out.line("}");
  };
  // A member's body in the loop across outputs, its exp, log, tanh, erf and sigmoid in forms
  // the C++ compiler calls a vector at a time, so that the loop stays a vector loop.
  auto across_body = [&](MemberEmitter& m) {
    across([&] {
      LoopPass pass;
      pass.simd_math = true;
      m.emit_loop_body(out, pass);
    });
  };
  for (auto& m : members_) {
    out.linef("{{  // {}", m->member().buffer->name);
    {
      auto _ = out.scope();
      if (m->member().kind == MemberKind::kReduction) {
        m->emit_accumulator_arrays(out, lanes, lane);
        const size_t n = group_.reduce_vars.size();
        for (size_t k = 0; k < n; ++k) {
          out.linef("for (int64_t {0} = 0; {0} < {1}; ++{0}) {{", ctx_.cpp(group_.reduce_vars[k]),
                    ctx_.cpp(group_.reduce_sizes[k]));
          out.indent();
        }
        across_body(*m);
        for (size_t k = 0; k < n; ++k) {
          out.dedent();
          out.line("}");
        }
        across([&] { m->emit_reduction_end(out, false); });
      } else {
        KILN_CHECK(m->member().kind == MemberKind::kPointwiseOuter,
                   "{}: a member over the reduction dims in a loop across outputs",
                   m->member().buffer->name);
        across_body(*m);
      }
    }
    out.line("}");
  }
}

GeneratedKernel CppKernelBuilder::build() {
  KILN_CHECK(item_.kind == sched::ItemKind::kKernel, "{} is not a kernel item", item_.name);
  KILN_CHECK(item_.members.size() == item_.buffers.size(), "{}: members and buffers differ",
             item_.name);
  assign_params();
  assign_locals();
  collect_sizes();
  for (const sched::KernelMember& m : item_.members) {
    members_.push_back(std::make_unique<MemberEmitter>(ctx_, m));
  }
  IndentedBuffer body;
  if (group_.is_reduction()) {
    emit_reduction(body);
  } else {
    emit_pointwise(body);
  }
  return assemble_kernel(item_, signature(), body, args_);
}

}  // namespace

GeneratedKernel generate_cpp_kernel(const sched::ScheduleItem& item, const ir::Program& program,
                                    const CppKernelOptions& options) {
  CppKernelBuilder builder(item, program, options);
  return builder.build();
}

std::string cpp_kernel_prelude() {
  std::string text = R"(#include <immintrin.h>
#include <sleef.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln_half.h"
#include "kiln_rt_pool.h"
#include "kiln_scalar.h"
#include "kiln_simd_math.h"
#include "kiln_vec.h"

)";
  text += sym::cpp_prelude();
  return text;
}

std::filesystem::path cpp_runtime_include_dir() { return autotune::runtime_include_dir(); }

std::filesystem::path cpp_public_include_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path installed = installed_path("include/kiln/runtime.h");
    installed = installed.empty() ? KILN_PUBLIC_INCLUDE_DIR : installed.parent_path().parent_path();
    log::write(log::Category::kCompile, "public headers: {}", installed.string());
    return installed;
  }();
  return dir;
}

}  // namespace kiln::codegen
