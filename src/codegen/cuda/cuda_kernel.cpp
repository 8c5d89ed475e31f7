#include "codegen/cuda/cuda_kernel.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "codegen/cpp/cpp_body.h"
#include "codegen/cpp/cpp_kernel.h"
#include "codegen/cpp/cpp_ops.h"
#include "codegen/cuda/cuda_conv.h"
#include "codegen/cuda/cuda_matmul.h"
#include "support/error.h"
#include "support/identifier.h"
#include "support/log.h"
#include "sym/prelude.h"

namespace kiln::codegen {
namespace {

using ir::ReductionType;
using sched::MemberKind;

/// Threads per block of a pointwise kernel.
constexpr int64_t kPointwiseThreads = 256;
/// Elements per thread of a pointwise kernel, kPointwiseThreads apart (each load instruction of
/// a warp stays contiguous): an unrolled loop, so each thread has this many loads in flight.
constexpr int64_t kPointwiseElements = 4;
/// Elements of one 16-byte vector of a 4-byte type: what a thread of a vectorized pointwise
/// kernel takes (in place of kPointwiseElements elements kPointwiseThreads apart).
constexpr int64_t kVectorElements = 4;
/// The tiled transpose: kTile x kTile tiles (one more column in shared memory, so that a warp
/// reading a column hits 32 different banks), kTileRows rows of threads, each taking
/// kTile / kTileRows rows of the tile. Both sides of a tile must hold at least kTileMinSide
/// elements for the tile to pay, and the other variables at most kTileMaxBatch combinations
/// (gridDim.y).
constexpr int64_t kTile = 32;
constexpr int64_t kTileRows = 8;
constexpr int64_t kTileMinSide = 16;
constexpr int64_t kTileMaxBatch = 65535;
/// Threads per block of a reduction kernel at most (a whole number of warps, at most 32 of
/// them: kiln_block_reduce keeps one value per warp in shared memory).
constexpr int64_t kReduceThreads = 256;
/// Rows of at most this many elements (known when compiling) are reduced by one warp each,
/// kWarpRows rows to a block: the combine is shuffles only, with no block barrier, and short
/// rows do not leave most of a block idle. Longer rows, and rows of symbolic length, take a
/// block each.
constexpr int64_t kWarpRowMax = 1024;
constexpr int64_t kWarpRows = 4;

/// How a reduction kernel maps rows to threads: a warp per row (rows_per_block rows, one per
/// threadIdx.y) or a block of `threads` per row (rows_per_block 0). Either way threadIdx.x
/// walks the row, blockDim.x at a time (a looped reduction for rows longer than the block).
struct ReduceConfig {
  int64_t threads = kReduceThreads;  // blockDim.x
  int64_t rows_per_block = 0;        // blockDim.y of a warp-per-row kernel
};

/// The heuristic: a warp per row for short static rows; else a block per row whose size is
/// the smallest power of two from 64 that covers the row, kReduceThreads for long or symbolic
/// rows.
ReduceConfig reduce_config(const sym::Expr& r) {
  std::optional<int64_t> n = r.as_integer();
  if (n && *n <= kWarpRowMax) return {32, kWarpRows};
  ReduceConfig config;
  if (!n) return config;
  config.threads = 64;
  while (config.threads < *n && config.threads < kReduceThreads) config.threads *= 2;
  return config;
}

class CudaKernelBuilder {
 public:
  CudaKernelBuilder(const sched::ScheduleItem& item, const ir::Program& program)
      : item_(item), group_(item.group) {
    ctx_.program = &program;
    ctx_.item = &item;
    ctx_.analyzer = group_.analyzer(program.analyzer);
    ir::Layout reduce = ir::Layout::contiguous(group_.reduce_sizes);
    ctx_.scratch_index = ctx_.analyzer.simplify(sym::dot(group_.reduce_vars, reduce.strides));
  }

  GeneratedKernel build();

 private:
  std::string signature(int64_t threads) const;
  /// True when a member reads a buffer whose values are checked indices (Program::index_checks).
  bool reads_checked_indices() const;
  /// Declares `vars` from the flat index `flat` over `sizes` (row-major).
  void split_index(IndentedBuffer& out, const std::string& flat, const std::vector<sym::Expr>& vars,
                   const std::vector<sym::Expr>& sizes);
  void emit_pointwise(IndentedBuffer& out);
  /// The buffer parameters a pointwise kernel reads or writes whole in 16-byte vectors, or
  /// none when it has none.
  struct VectorBuffers {
    std::map<std::string, graph::DType> loads;   // buffer -> dtype: every load of it is at the
                                                 // flat index, unmasked
    std::map<std::string, graph::DType> stores;  // likewise for its stores
    bool empty() const { return loads.empty() && stores.empty(); }
  };
  VectorBuffers vector_buffers() const;
  /// A pointwise kernel whose output is contiguous along its last variable `b` but which reads
  /// `buffer` contiguously along another variable `a` (a transpose, NCHW <-> NHWC): both are
  /// coalesced through a shared-memory tile.
  struct TilePlan {
    std::string buffer;
    sym::Expr index;  // of every load of `buffer`
    size_t a = 0, b = 0;
    int64_t size_a = 0, size_b = 0, batch = 1;
  };
  std::optional<TilePlan> tile_plan() const;
  /// The tiled kernel of `plan`: a block of kTileRows x kTile threads per kTile x kTile tile of
  /// (a, b) (blockIdx.x) and combination of the other variables (blockIdx.y). The block reads
  /// the tile of `plan.buffer` with consecutive threads along `a` into shared memory, then runs
  /// the members with consecutive threads along `b`, taking that buffer's value from the tile.
  void emit_pointwise_tiled(IndentedBuffer& out, const TilePlan& plan);
  /// The pointwise kernel with 16-byte loads and stores (vector_buffers): each thread takes
  /// kVectorElements consecutive elements; where they lie inside the P space and every vector
  /// pointer is 16-byte aligned, one load per vector input and one store per vector output, and
  /// the members' scalar bodies in between on registers; elsewhere (the tail, or an unaligned
  /// view) the same elements with scalar loads and stores.
  void emit_pointwise_vector(IndentedBuffer& out, const VectorBuffers& vector);
  void emit_reduction(IndentedBuffer& out, const ReduceConfig& config);
  void emit_row_loop(IndentedBuffer& out, MemberEmitter& m);
  /// blockDim.x of a reduction kernel, written as a literal in its row loops: with a static row
  /// length the compiler unrolls them and issues their loads together.
  int64_t row_threads_ = kReduceThreads;
  void emit_block_combine(IndentedBuffer& out, MemberEmitter& m);

  const sched::ScheduleItem& item_;
  const sched::KernelGroup& group_;
  KernelContext ctx_;
  std::vector<std::unique_ptr<MemberEmitter>> members_;
  std::vector<KernelArg> args_;
  std::vector<std::string> param_names_;
  sym::Expr shared_bytes_{0};
};

std::string CudaKernelBuilder::signature(int64_t threads) const {
  std::string text =
      fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}(", threads, item_.name);
  for (size_t k = 0; k < args_.size(); ++k) {
    const KernelArg& a = args_[k];
    if (k) text += ", ";
    if (a.kind == KernelArg::Kind::kSize) {
      text += fmt::format("int64_t {}", a.name);
      continue;
    }
    text += fmt::format("{}{}* __restrict__ {}", a.is_output ? "" : "const ",
                        graph::dtype_cpp_storage(a.dtype), param_names_[k]);
  }
  return text + ")";
}

bool CudaKernelBuilder::reads_checked_indices() const {
  for (const ir::IndexCheck& check : ctx_.program->index_checks) {
    for (const ir::Buffer* b : item_.buffers) {
      for (const std::string& r : b->reads()) {
        if (r == check.buffer) return true;
      }
    }
  }
  return false;
}

void CudaKernelBuilder::split_index(IndentedBuffer& out, const std::string& flat,
                                    const std::vector<sym::Expr>& vars,
                                    const std::vector<sym::Expr>& sizes) {
  ir::Layout layout = ir::Layout::contiguous(sizes);
  // A space of fewer than 2^31 elements known when compiling is split in 32-bit unsigned
  // arithmetic (a 64-bit division is a long instruction sequence on the GPU, a 32-bit one by a
  // constant a multiply and a shift); the variables stay int64_t for the indices.
  bool small = vars.size() > 1;
  for (const sym::Expr& size : sizes) small = small && size.as_integer().has_value();
  const std::optional<int64_t> numel = ctx_.analyzer.simplify(sym::product(sizes)).as_integer();
  if (small && numel && *numel < (int64_t{1} << 31)) {
    out.linef("const unsigned {}_u32 = static_cast<unsigned>({});", flat, flat);
    for (size_t k = 0; k < vars.size(); ++k) {
      std::string v = fmt::format("{}_u32 / {}u", flat, *layout.strides[k].as_integer());
      if (k > 0) v = fmt::format("{} % {}u", v, *sizes[k].as_integer());
      out.linef("const int64_t {} = {};", ctx_.cpp(vars[k]), v);
    }
    return;
  }
  for (size_t k = 0; k < vars.size(); ++k) {
    std::string v = fmt::format("{} / ({})", flat, ctx_.cpp(layout.strides[k]));
    if (k > 0) v = fmt::format("({}) % ({})", v, ctx_.cpp(sizes[k]));
    out.linef("const int64_t {} = {};", ctx_.cpp(vars[k]), v);
  }
}

void CudaKernelBuilder::emit_pointwise(IndentedBuffer& out) {
  out.linef("const int64_t xbase = static_cast<int64_t>(blockIdx.x) * {} + threadIdx.x;",
            kPointwiseThreads * kPointwiseElements);
  out.line("#pragma unroll");
  out.linef("for (int kiln_e = 0; kiln_e < {}; ++kiln_e) {{", kPointwiseElements);
  {
    auto _ = out.scope();
    out.linef("const int64_t xindex = xbase + kiln_e * {};", kPointwiseThreads);
    out.linef("if (xindex >= {}) break;", ctx_.cpp(group_.numel()));
    split_index(out, "xindex", group_.vars, group_.sizes);
    LoopPass pass;
    for (auto& m : members_) m->emit_loop_body(out, pass);
  }
  out.line("}");
}

CudaKernelBuilder::VectorBuffers CudaKernelBuilder::vector_buffers() const {
  // The flat index of the P space: a load or store at it touches the thread's consecutive
  // elements, so four of them are one aligned 16-byte access when the pointer is aligned.
  const sym::Expr flat =
      ctx_.analyzer.simplify(sym::dot(group_.vars, ir::Layout::contiguous(group_.sizes).strides));
  std::map<std::string, bool> load_ok, store_ok;
  std::map<std::string, graph::DType> dtypes;
  for (const auto& m : members_) {
    const ir::LoopBody& body = m->body();
    for (size_t k = 0; k < body.ops().size(); ++k) {
      const ir::Op& op = body.ops()[k];
      const bool is_load = op.code == ir::OpCode::kLoad;
      if ((!is_load && op.code != ir::OpCode::kStore) || ctx_.locals.count(op.buffer)) continue;
      // 4-byte types whose compute type is their storage type (float, int32): the vector's
      // lanes are the values the scalar body uses.
      const bool four_bytes =
          op.buffer_dtype == graph::DType::kFloat32 || op.buffer_dtype == graph::DType::kInt32;
      const std::optional<int64_t> offset =
          ctx_.analyzer.simplify(m->op_index(static_cast<ir::ValueId>(k)) - flat).as_integer();
      const bool ok = four_bytes && op.dtype == op.buffer_dtype && op.mask == ir::kNoValue &&
                      offset == std::optional<int64_t>(0);
      auto [it, fresh] = (is_load ? load_ok : store_ok).emplace(op.buffer, ok);
      if (!fresh) it->second = it->second && ok;
      dtypes[op.buffer] = op.buffer_dtype;
    }
  }
  VectorBuffers vector;
  for (const auto& [buffer, ok] : load_ok) {
    if (ok) vector.loads[buffer] = dtypes.at(buffer);
  }
  for (const auto& [buffer, ok] : store_ok) {
    if (ok) vector.stores[buffer] = dtypes.at(buffer);
  }
  return vector;
}

void CudaKernelBuilder::emit_pointwise_vector(IndentedBuffer& out, const VectorBuffers& vector) {
  const std::string numel = ctx_.cpp(group_.numel());
  auto vec_type = [](graph::DType t) { return t == graph::DType::kFloat32 ? "float4" : "int4"; };
  out.linef("const int64_t xbase = (static_cast<int64_t>(blockIdx.x) * {} + threadIdx.x) * {};",
            kPointwiseThreads, kVectorElements);
  // The pointers of the vector accesses (a parameter may be read and written in place).
  std::set<std::string> pointers;
  for (const auto* side : {&vector.loads, &vector.stores}) {
    for (const auto& [buffer, dtype] : *side) pointers.insert(ctx_.params.at(buffer));
  }
  std::string aligned;
  for (const std::string& p : pointers) {
    aligned += fmt::format(" && reinterpret_cast<unsigned long long>({}) % 16 == 0", p);
  }
  out.linef("if (xbase + {} <= {}{}) {{", kVectorElements, numel, aligned);
  {
    auto _ = out.scope();
    out.linef("// {} consecutive elements: 16-byte loads and stores of the contiguous buffers.",
              kVectorElements);
    LoopPass pass;
    int n = 0;
    std::vector<std::string> vector_stores;  // after the elements
    for (const auto& [buffer, dtype] : vector.loads) {
      const std::string v = fmt::format("kiln_v{}", n++);
      const std::string t(graph::dtype_cpp_storage(dtype));
      out.linef("const {0} {1}_raw = *reinterpret_cast<const {0}*>({2} + xbase);", vec_type(dtype),
                v, ctx_.params.at(buffer));
      out.linef("const {0} {1}[{2}] = {{{3}}};", t, v, kVectorElements,
                fmt::format("{0}_raw.x, {0}_raw.y, {0}_raw.z, {0}_raw.w", v));
      pass.forwarded[buffer] = v + "[kiln_e]";
    }
    for (const auto& [buffer, dtype] : vector.stores) {
      const std::string v = fmt::format("kiln_s{}", n++);
      out.linef("{} {}[{}];", graph::dtype_cpp_storage(dtype), v, kVectorElements);
      pass.staged[buffer] = v + "[kiln_e]";
      vector_stores.push_back(fmt::format("*reinterpret_cast<{0}*>({1} + xbase) = {0}{{{2}}};",
                                          vec_type(dtype), ctx_.params.at(buffer),
                                          fmt::format("{0}[0], {0}[1], {0}[2], {0}[3]", v)));
    }
    out.line("#pragma unroll");
    out.linef("for (int kiln_e = 0; kiln_e < {}; ++kiln_e) {{", kVectorElements);
    {
      auto _ = out.scope();
      out.line("const int64_t xindex = xbase + kiln_e;");
      split_index(out, "xindex", group_.vars, group_.sizes);
      for (auto& m : members_) m->emit_loop_body(out, pass);
    }
    out.line("}");
    for (const std::string& store : vector_stores) out.line(store);
  }
  out.line("} else {");
  {
    auto _ = out.scope();
    out.linef("for (int kiln_e = 0; kiln_e < {}; ++kiln_e) {{", kVectorElements);
    {
      auto _ = out.scope();
      out.line("const int64_t xindex = xbase + kiln_e;");
      out.linef("if (xindex >= {}) break;", numel);
      split_index(out, "xindex", group_.vars, group_.sizes);
      LoopPass pass;
      for (auto& m : members_) m->emit_loop_body(out, pass);
    }
    out.line("}");
  }
  out.line("}");
}

std::optional<CudaKernelBuilder::TilePlan> CudaKernelBuilder::tile_plan() const {
  const size_t n = group_.vars.size();
  if (n < 2) return std::nullopt;
  std::vector<int64_t> sizes;
  for (const sym::Expr& size : group_.sizes) {
    const std::optional<int64_t> v = ctx_.analyzer.simplify(size).as_integer();
    if (!v) return std::nullopt;  // static sizes only: the grid's split is decided here
    sizes.push_back(*v);
  }
  const sym::Expr flat =
      ctx_.analyzer.simplify(sym::dot(group_.vars, ir::Layout::contiguous(group_.sizes).strides));
  // How `index` moves when variable k does.
  auto step = [&](const sym::Expr& index, size_t k) {
    sym::Substitution next{{group_.vars[k], group_.vars[k] + sym::Expr(1)}};
    return ctx_.analyzer.simplify(sym::substitute(index, next) - index).as_integer();
  };
  // The names an index read into the tile may use: the variables and the size arguments (not
  // the symbols of indirect loads, which the members define).
  std::set<std::string> known;
  for (const sym::Expr& v : group_.vars) known.insert(v.name());
  for (const KernelArg& arg : args_) {
    if (arg.kind != KernelArg::Kind::kSize) continue;
    for (const sym::Expr& symbol : sym::free_symbols(arg.size)) known.insert(symbol.name());
  }
  auto uses_only_known = [&](const sym::Expr& index) {
    for (const sym::Expr& symbol : sym::free_symbols(index)) {
      if (!known.count(symbol.name())) return false;
    }
    return true;
  };
  std::optional<TilePlan> plan;
  std::set<std::string> rejected;
  for (const auto& m : members_) {
    const ir::LoopBody& body = m->body();
    for (size_t k = 0; k < body.ops().size(); ++k) {
      const ir::Op& op = body.ops()[k];
      if (op.code != ir::OpCode::kLoad && op.code != ir::OpCode::kStore) continue;
      if (ctx_.locals.count(op.buffer)) continue;
      const sym::Expr index = ctx_.analyzer.simplify(m->op_index(static_cast<ir::ValueId>(k)));
      if (op.code == ir::OpCode::kStore) {
        // The output must be contiguous: its last variable is the one to coalesce stores on.
        if (!(ctx_.analyzer.simplify(index - flat).as_integer() == std::optional<int64_t>(0)))
          return std::nullopt;
        continue;
      }
      if (rejected.count(op.buffer)) continue;
      if (plan && plan->buffer == op.buffer) {
        if (!(plan->index == index)) return std::nullopt;  // read at two places: no tile
        continue;
      }
      // Not a buffer written in place: other blocks' tiles would read what this one wrote.
      const bool in_place = ctx_.params.at(op.buffer).rfind("in_out", 0) == 0;
      if (plan || in_place || op.mask != ir::kNoValue || op.dtype != op.buffer_dtype ||
          !uses_only_known(index) || step(index, n - 1) == std::optional<int64_t>(1)) {
        rejected.insert(op.buffer);
        continue;
      }
      for (size_t a = 0; a + 1 < n; ++a) {
        if (step(index, a) != std::optional<int64_t>(1)) continue;
        if (sizes[a] < kTileMinSide || sizes[n - 1] < kTileMinSide) break;
        TilePlan p;
        p.buffer = op.buffer;
        p.index = index;
        p.a = a;
        p.b = n - 1;
        p.size_a = sizes[a];
        p.size_b = sizes[n - 1];
        for (size_t v = 0; v + 1 < n; ++v) {
          if (v != a) p.batch *= sizes[v];
        }
        if (p.batch <= kTileMaxBatch) plan = p;
        break;
      }
      if (!plan) rejected.insert(op.buffer);
    }
  }
  return plan;
}

void CudaKernelBuilder::emit_pointwise_tiled(IndentedBuffer& out, const TilePlan& plan) {
  const std::string t(graph::dtype_cpp_storage(ctx_.program->find(plan.buffer)->dtype));
  const std::string a = ctx_.cpp(group_.vars[plan.a]), b = ctx_.cpp(group_.vars[plan.b]);
  const int64_t tiles_b = (plan.size_b + kTile - 1) / kTile;
  out.linef("// {} is read along {} and written along {}: through a {} x {} tile.", plan.buffer, a,
            b, kTile, kTile);
  out.linef("__shared__ {} kiln_tile[{}][{}];", t, kTile, kTile + 1);
  out.linef("const int64_t kiln_a0 = static_cast<int64_t>(blockIdx.x / {}) * {};", tiles_b, kTile);
  out.linef("const int64_t kiln_b0 = static_cast<int64_t>(blockIdx.x % {}) * {};", tiles_b, kTile);
  // The other variables, from blockIdx.y.
  std::vector<sym::Expr> others, other_sizes;
  for (size_t v = 0; v + 1 < group_.vars.size(); ++v) {
    if (v == plan.a) continue;
    others.push_back(group_.vars[v]);
    other_sizes.push_back(group_.sizes[v]);
  }
  if (!others.empty()) {
    out.line("const int64_t kiln_batch = blockIdx.y;");
    split_index(out, "kiln_batch", others, other_sizes);
  }
  out.line("// Consecutive threads read consecutive elements of the tile's column ...");
  out.linef("for (int kiln_j = threadIdx.y; kiln_j < {}; kiln_j += {}) {{", kTile, kTileRows);
  {
    auto _ = out.scope();
    out.linef("const int64_t {} = kiln_a0 + threadIdx.x;", a);
    out.linef("const int64_t {} = kiln_b0 + kiln_j;", b);
    out.linef("if ({} < {} && {} < {}) kiln_tile[kiln_j][threadIdx.x] = {}[{}];", a, plan.size_a, b,
              plan.size_b, ctx_.params.at(plan.buffer), ctx_.cpp(plan.index));
  }
  out.line("}");
  out.line("__syncthreads();");
  out.line("// ... and the members run along the output's rows, reading it from the tile.");
  out.linef("for (int kiln_j = threadIdx.y; kiln_j < {}; kiln_j += {}) {{", kTile, kTileRows);
  {
    auto _ = out.scope();
    out.linef("const int64_t {} = kiln_a0 + kiln_j;", a);
    out.linef("const int64_t {} = kiln_b0 + threadIdx.x;", b);
    out.linef("if ({} >= {} || {} >= {}) continue;", a, plan.size_a, b, plan.size_b);
    LoopPass pass;
    pass.forwarded[plan.buffer] = "kiln_tile[threadIdx.x][kiln_j]";
    for (auto& m : members_) m->emit_loop_body(out, pass);
  }
  out.line("}");
}

void CudaKernelBuilder::emit_row_loop(IndentedBuffer& out, MemberEmitter& m) {
  out.linef("for (int64_t rindex = threadIdx.x; rindex < {}; rindex += {}) {{",
            ctx_.cpp(group_.reduce_numel()), row_threads_);
  {
    auto _ = out.scope();
    split_index(out, "rindex", group_.reduce_vars, group_.reduce_sizes);
    LoopPass pass;
    m.emit_loop_body(out, pass);
  }
  out.line("}");
}

/// Combines each thread's accumulator into the block's, which every thread then holds.
void CudaKernelBuilder::emit_block_combine(IndentedBuffer& out, MemberEmitter& m) {
  for (const auto& [id, acc] : m.accumulators()) {
    const ir::Op& op = m.body().op(id);
    const std::string t(cpp_compute_type(op.dtype));
    std::string combine;
    switch (op.reduction) {
      case ReductionType::kSum:
        combine = fmt::format("[]({0} a, {0} b) {{ return a + b; }}", t);
        break;
      case ReductionType::kProd:
        combine = fmt::format("[]({0} a, {0} b) {{ return a * b; }}", t);
        break;
      case ReductionType::kMax:
        combine = fmt::format("[]({0} a, {0} b) {{ return kiln::maximum(a, b); }}", t);
        break;
      case ReductionType::kMin:
        combine = fmt::format("[]({0} a, {0} b) {{ return kiln::minimum(a, b); }}", t);
        break;
      case ReductionType::kAny:
        combine = "[](bool a, bool b) { return a || b; }";
        break;
      case ReductionType::kAll:
        combine = "[](bool a, bool b) { return a && b; }";
        break;
      case ReductionType::kWelfordMean:
      case ReductionType::kWelfordVar:
        combine = fmt::format(
            "[](kiln::Welford<{0}> a, kiln::Welford<{0}> b) {{ a.combine(b.mean, b.m2, b.n); "
            "return a; }}",
            t);
        break;
      case ReductionType::kArgMax:
      case ReductionType::kArgMin: {
        const std::string v(cpp_compute_type(m.body().dtype(op.operands[0])));
        combine = fmt::format(
            "[](kiln::ArgReduce<{0}> a, kiln::ArgReduce<{0}> b) {{ return kiln_arg_combine(a, b, "
            "{1}, {2}); }}",
            v, op.reduction == ReductionType::kArgMax, op.select_last);
        break;
      }
    }
    out.linef("{0} = kiln_block_reduce({0}, {1});", acc, combine);
  }
}

void CudaKernelBuilder::emit_reduction(IndentedBuffer& out, const ReduceConfig& config) {
  const bool warp_rows = config.rows_per_block > 0;
  // A warp-per-row kernel's rows each have their own scratch arrays: row threadIdx.y's start
  // at kiln_row_smem.
  const std::string base = warp_rows ? "kiln_row_smem" : "kiln_smem";
  std::vector<std::string> scratch;
  for (const auto& [name, storage] : ctx_.locals) {
    if (storage != LocalStorage::kScratch) continue;
    const std::string t(cpp_compute_type(ctx_.local_dtypes.at(name)));
    scratch.push_back(fmt::format("{0}* const {1} = reinterpret_cast<{0}*>({4} + {2});  // {3}", t,
                                  ctx_.local_names.at(name), ctx_.cpp(shared_bytes_), name, base));
    // Each array starts 16-byte aligned.
    sym::Expr bytes =
        group_.reduce_numel() *
        sym::Expr(static_cast<int64_t>(graph::dtype_size(ctx_.local_dtypes.at(name))));
    shared_bytes_ =
        ctx_.analyzer.simplify(shared_bytes_ + sym::ceil_div(bytes, sym::Expr(16)) * sym::Expr(16));
  }
  if (!scratch.empty()) out.line("extern __shared__ __align__(16) unsigned char kiln_smem[];");
  if (!scratch.empty() && warp_rows) {
    out.linef("unsigned char* const kiln_row_smem = kiln_smem + threadIdx.y * ({});",
              ctx_.cpp(shared_bytes_));
    shared_bytes_ = ctx_.analyzer.simplify(shared_bytes_ * sym::Expr(config.rows_per_block));
  }
  for (const std::string& line : scratch) out.line(line);
  if (warp_rows) {
    // A whole warp leaves together past the last row: the warp's shuffles need all its lanes,
    // and no block barrier follows.
    out.line("const int64_t xindex = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;");
    out.linef("if (xindex >= {}) return;", ctx_.cpp(group_.numel()));
  } else {
    out.line("const int64_t xindex = blockIdx.x;");
  }
  split_index(out, "xindex", group_.vars, group_.sizes);
  for (const auto& [name, storage] : ctx_.locals) {
    if (storage != LocalStorage::kScalar) continue;
    out.linef("{} {}{{}};  // {}", cpp_compute_type(ctx_.local_dtypes.at(name)),
              ctx_.local_names.at(name), name);
  }
  for (auto& m : members_) {
    out.linef("{{  // {}", m->member().buffer->name);
    {
      auto _ = out.scope();
      switch (m->member().kind) {
        case MemberKind::kReduction:
          m->emit_accumulators(out, false);
          emit_row_loop(out, *m);
          emit_block_combine(out, *m);
          m->emit_reduction_end(out, false);
          break;
        case MemberKind::kPointwiseInner:
          emit_row_loop(out, *m);
          break;
        case MemberKind::kPointwiseOuter: {
          LoopPass pass;
          m->emit_loop_body(out, pass);
          break;
        }
      }
    }
    out.line("}");
  }
}

GeneratedKernel CudaKernelBuilder::build() {
  KILN_CHECK(item_.kind == sched::ItemKind::kKernel, "{} is not a kernel item", item_.name);
  KILN_CHECK(item_.members.size() == item_.buffers.size(), "{}: members and buffers differ",
             item_.name);
  assign_kernel_params(ctx_, args_, param_names_);
  assign_kernel_locals(ctx_);
  add_size_args(item_, args_);
  for (const sched::KernelMember& m : item_.members) {
    members_.push_back(std::make_unique<MemberEmitter>(ctx_, m));
  }
  LaunchSpec launch;
  int64_t threads = kPointwiseThreads;
  IndentedBuffer body;
  if (reads_checked_indices()) {
    body.line("if (kiln_error.code != 0) return;  // an index check failed: read no index");
  }
  if (group_.is_reduction()) {
    const ReduceConfig config = reduce_config(ctx_.analyzer.simplify(group_.reduce_numel()));
    threads = config.threads;
    row_threads_ = config.threads;
    emit_reduction(body, config);
    if (config.rows_per_block > 0) {
      threads *= config.rows_per_block;
      launch.block[1] = sym::Expr(config.rows_per_block);
      launch.grid[0] = sym::ceil_div(group_.numel(), sym::Expr(config.rows_per_block));
    } else {
      launch.grid[0] = group_.numel();
    }
    launch.block[0] = sym::Expr(config.threads);
  } else if (std::optional<TilePlan> tile = tile_plan()) {
    emit_pointwise_tiled(body, *tile);
    threads = kTile * kTileRows;
    launch.block[0] = sym::Expr(kTile);
    launch.block[1] = sym::Expr(kTileRows);
    launch.grid[0] =
        sym::Expr(((tile->size_a + kTile - 1) / kTile) * ((tile->size_b + kTile - 1) / kTile));
    launch.grid[1] = sym::Expr(tile->batch);
  } else {
    const VectorBuffers vector = vector_buffers();
    if (vector.empty()) {
      emit_pointwise(body);
    } else {
      emit_pointwise_vector(body, vector);
    }
    // Either way a block covers kPointwiseThreads * 4 elements.
    static_assert(kPointwiseElements == kVectorElements);
    launch.grid[0] =
        sym::ceil_div(group_.numel(), sym::Expr(kPointwiseThreads * kPointwiseElements));
  }
  launch.grid[0] = ctx_.analyzer.simplify(launch.grid[0]);
  if (!group_.is_reduction() && launch.block[1] == sym::Expr(1)) {
    launch.block[0] = sym::Expr(threads);
  }
  launch.shared_bytes = shared_bytes_;
  GeneratedKernel kernel = assemble_kernel(item_, signature(threads), body, args_);
  kernel.launch = launch;
  return kernel;
}

}  // namespace

GeneratedKernel generate_cuda_kernel(const sched::ScheduleItem& item, const ir::Program& program) {
  CudaKernelBuilder builder(item, program);
  return builder.build();
}

std::string cuda_kernel_prelude() {
  std::string text =
      R"(// NVRTC has no C library: kiln_half.h's one builtin comes from the CUDA math library.
#define __builtin_fabsf(x) ::fabsf(x)
#include <algorithm>

#include "kiln_half.h"
#include "kiln_scalar.h"

)";
  text += sym::cuda_prelude();
  text += R"(
// The run's error word (kiln_rt_cuda.h DeviceError): the first index check that failed, the
// position of its first index out of range and that index. The host clears it when a run
// starts and reads it whenever it waits for the GPU; kernels that read checked indices stop
// once it is set, so they never index out of bounds.
struct KilnDeviceError {
  int32_t code;
  int32_t check;
  long long position;
  long long value;
};
__device__ KilnDeviceError kiln_error;

// Index check `check` (one block): the first of `count` indices outside [-size, size), other
// than `ignored` when `has_ignored`, sets the error word, unless an earlier check already did.
template <typename T>
__device__ void kiln_check_indices(const T* indices, int64_t count, int64_t size,
                                   int64_t has_ignored, int64_t ignored, int64_t check) {
  if (kiln_error.code != 0) return;
  __shared__ long long first;
  if (threadIdx.x == 0) first = count;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const long long v = static_cast<long long>(indices[i]);
    if (has_ignored && v == ignored) continue;
    if (v < -size || v >= size) {
      atomicMin(&first, static_cast<long long>(i));
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && first < count) {
    kiln_error.check = static_cast<int32_t>(check);
    kiln_error.position = first;
    kiln_error.value = static_cast<long long>(indices[first]);
    __threadfence();
    kiln_error.code = 1;
  }
}

extern "C" __global__ void kiln_check_indices_i32(const int32_t* indices, int64_t count,
                                                  int64_t size, int64_t has_ignored,
                                                  int64_t ignored, int64_t check) {
  kiln_check_indices(indices, count, size, has_ignored, ignored, check);
}

extern "C" __global__ void kiln_check_indices_i64(const int64_t* indices, int64_t count,
                                                  int64_t size, int64_t has_ignored,
                                                  int64_t ignored, int64_t check) {
  kiln_check_indices(indices, count, size, has_ignored, ignored, check);
}

// `value` of lane (this lane ^ mask), as 32-bit words (any trivially copyable T: sums,
// Welford states, arg-extrema).
template <typename T>
__device__ T kiln_shfl_xor(T value, int mask) {
  constexpr int kWords = (sizeof(T) + 3) / 4;
  unsigned words[kWords] = {};
  memcpy(words, &value, sizeof(T));
  for (int w = 0; w < kWords; ++w) words[w] = __shfl_xor_sync(0xffffffffu, words[w], mask);
  T other;
  memcpy(&other, words, sizeof(T));
  return other;
}

// Combines the 32 lanes' values of a warp in a butterfly of shuffles; every lane gets the
// result. Each step combines the lower lane's value with the higher one's in that order on
// both lanes, so the lanes agree bit for bit (Welford's combine is not symmetric in rounding).
template <typename T, typename Combine>
__device__ T kiln_warp_reduce(T value, Combine combine) {
  const unsigned lane = threadIdx.x & 31u;
  for (int mask = 16; mask > 0; mask /= 2) {
    const T other = kiln_shfl_xor(value, mask);
    value = (lane & mask) ? combine(other, value) : combine(value, other);
  }
  return value;
}

// Combines the `value` of every thread of the row (blockDim.x threads, a whole number of warps,
// at most 32 warps); every thread gets the result. A row of one warp (a warp-per-row kernel) is
// shuffles only; a longer one combines each warp's result from shared memory, in warp order,
// the same on every thread.
template <typename T, typename Combine>
__device__ T kiln_block_reduce(T value, Combine combine) {
  value = kiln_warp_reduce(value, combine);
  if (blockDim.x == 32) return value;
  __shared__ __align__(16) unsigned char raw[32 * sizeof(T)];
  T* slots = reinterpret_cast<T*>(raw);
  if ((threadIdx.x & 31u) == 0) slots[threadIdx.x / 32] = value;
  __syncthreads();
  T result = slots[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w) result = combine(result, slots[w]);
  __syncthreads();
  return result;
}

// Two running arg-extrema over disjoint positions, as one over both would end (kiln::ArgReduce):
// the first NaN wins; else the better value; equal values: the first position, or the last.
template <typename T>
__device__ kiln::ArgReduce<T> kiln_arg_combine(kiln::ArgReduce<T> a, kiln::ArgReduce<T> b,
                                               bool is_max, bool select_last) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  const bool a_nan = kiln::isnan(a.best), b_nan = kiln::isnan(b.best);
  if (a_nan || b_nan) {
    if (a_nan && b_nan) return a.index < b.index ? a : b;
    return a_nan ? a : b;
  }
  if (is_max ? b.best > a.best : b.best < a.best) return b;
  if (is_max ? a.best > b.best : a.best < b.best) return a;
  return (select_last ? b.index > a.index : b.index < a.index) ? b : a;
}

)";
  return text;
}

std::optional<std::string> CudaBackend::can_fuse_vertical(const sched::NodeInfo& node1,
                                                          const sched::NodeInfo& node2,
                                                          const sched::KernelGroup& fused) const {
  return CppBackend().can_fuse_vertical(node1, node2, fused);
}

std::optional<std::string> CudaBackend::can_fuse_horizontal(const sched::NodeInfo& node1,
                                                            const sched::NodeInfo& node2,
                                                            const sched::KernelGroup& fused) const {
  return CppBackend().can_fuse_horizontal(node1, node2, fused);
}

bool CudaBackend::fuse_library_epilogue(const ir::Program& program, const ir::Buffer& product,
                                        ir::Buffer& consumer) const {
  return fuse_matmul_epilogue(program, product, consumer) ||
         fuse_conv_epilogue(program, product, consumer);
}

}  // namespace kiln::codegen
