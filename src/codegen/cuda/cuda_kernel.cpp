#include "codegen/cuda/cuda_kernel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
/// elements for the tile to pay (a symbolic side is taken: the sizes it stands for are
/// run-time shapes, batch or sequence, and the edge tiles are bounds-checked either way). The
/// combinations of the other variables are gridDim.y, at most kTileMaxBatch: where there may be
/// more (a symbolic or large product), each block loops over them gridDim.y apart.
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

/// A static row of at most kRegisterElements elements per thread is held in registers: each
/// thread loads its share of every input the row's members read once, up front (16-byte vectors
/// where the row is contiguous), the members' per-element values stay in register arrays in place
/// of shared memory, and the outputs leave in 16-byte vectors. Longer rows loop over the row.
constexpr int64_t kRegisterElements = 32;
/// Rows a warp of a warp-per-row kernel with the row in registers takes at most.
constexpr int64_t kMaxRowsPerWarp = 4;

/// How a reduction kernel maps rows to threads: a warp per row (rows_per_block rows, one per
/// threadIdx.y) or a block of `threads` per row (rows_per_block 0). Either way threadIdx.x
/// walks the row, blockDim.x at a time (a looped reduction for rows longer than the block), or,
/// with the row in registers (registers > 0), each thread takes `registers` elements: chunks of
/// `vector` consecutive elements, blockDim.x chunks apart.
struct ReduceConfig {
  int64_t threads = kReduceThreads;  // blockDim.x
  int64_t rows_per_block = 0;        // blockDim.y of a warp-per-row kernel
  int64_t registers = 0;             // elements per thread of a row held in registers, or 0
  int64_t vector = 1;                // 4: the row's contiguous buffers move in 16-byte vectors
  int64_t rows_per_warp = 1;         // rows a warp takes in turn, their inputs loaded together
};

/// Completes a configuration of `threads` per row (rows_per_block warps of a warp-per-row
/// kernel, or 0 for a block per row) for a row of `n` elements (nothing: symbolic): a static
/// row of at most kRegisterElements per thread stays in registers, in 16-byte vectors when
/// `vectorizable` and its length is a multiple of 4; a warp of a warp-per-row kernel with the
/// row in registers then takes up to `rows_per_warp` rows while its registers per input stay
/// within `register_budget` elements.
ReduceConfig shape_config(std::optional<int64_t> n, bool vectorizable, int64_t threads,
                          int64_t rows_per_block, int64_t rows_per_warp, int64_t register_budget) {
  ReduceConfig config;
  config.threads = threads;
  config.rows_per_block = rows_per_block;
  if (!n || (*n + threads - 1) / threads > kRegisterElements) return config;
  config.vector = vectorizable && *n % kVectorElements == 0 ? kVectorElements : 1;
  const int64_t span = config.threads * config.vector;  // elements of one chunk of the row
  config.registers = (*n + span - 1) / span * config.vector;
  if (rows_per_block > 0) {
    while (config.rows_per_warp < rows_per_warp &&
           config.registers * config.rows_per_warp * 2 <= register_budget) {
      config.rows_per_warp *= 2;
    }
  }
  return config;
}

/// The heuristic: a warp per row for short static rows; else a block per row whose size is
/// the smallest power of two from 64 that covers the row, kReduceThreads for long or symbolic
/// rows. A static row of at most kRegisterElements per thread stays in registers; a warp of
/// short rows in registers takes several of them, so that more of its loads are in flight (a
/// warp's row alone is a few hundred bytes), while they fit in half the register budget.
ReduceConfig reduce_config(std::optional<int64_t> n, bool vectorizable) {
  if (!n) return ReduceConfig{};
  if (*n <= kWarpRowMax)
    return shape_config(n, vectorizable, 32, kWarpRows, kMaxRowsPerWarp, kRegisterElements);
  int64_t threads = 64;
  while (threads < *n && threads < kReduceThreads) threads *= 2;
  return shape_config(n, vectorizable, threads, 0, 1, kRegisterElements);
}

bool operator==(const ReduceConfig& a, const ReduceConfig& b) {
  return a.threads == b.threads && a.rows_per_block == b.rows_per_block &&
         a.registers == b.registers && a.vector == b.vector && a.rows_per_warp == b.rows_per_warp;
}

/// The launch configurations `--autotune max` times for a row of `r` elements: the heuristic's
/// first, then at most kReduceCandidates - 1 others, in a fixed order (a cached choice is an
/// index into this list, under a key that names Kiln's version):
/// - static rows of at most kWarpRowMax: a warp per row with the row in registers and 2 or 4
///   rows to a warp (their loads in flight together; up to 2 * kRegisterElements registers per
///   input, twice the heuristic's budget), and the heuristic's warps 8 to a block;
/// - a block per row of 128, 256 or 512 threads, and of one 16-byte vector per thread where that
///   is a whole number of warps (192 for a row of 768), none with a warp beyond the row;
/// - symbolic rows: a block per row of 128, 512 or 1024 threads besides the heuristic's 256.
constexpr size_t kReduceCandidates = 6;
std::vector<ReduceConfig> reduce_candidates(std::optional<int64_t> n, bool vectorizable) {
  std::vector<ReduceConfig> configs{reduce_config(n, vectorizable)};
  auto add = [&](const ReduceConfig& c) {
    if (configs.size() < kReduceCandidates &&
        std::find(configs.begin(), configs.end(), c) == configs.end()) {
      configs.push_back(c);
    }
  };
  if (!n) {
    for (int64_t threads : {128, 512, 1024}) add(shape_config(n, vectorizable, threads, 0, 1, 0));
    return configs;
  }
  if (*n <= 0) return configs;  // an empty row: nothing to time
  if (*n <= kWarpRowMax) {
    for (int64_t rows : {2, 4}) {
      ReduceConfig c = shape_config(n, vectorizable, 32, kWarpRows, rows, 2 * kRegisterElements);
      if (c.rows_per_warp == rows) add(c);
    }
    add(shape_config(n, vectorizable, 32, 2 * kWarpRows, kMaxRowsPerWarp, kRegisterElements));
  }
  std::vector<int64_t> blocks;
  if (*n % (32 * kVectorElements) == 0 && *n / kVectorElements <= 1024)
    blocks.push_back(*n / kVectorElements);
  for (int64_t threads : {128, 256, 512}) blocks.push_back(threads);
  for (int64_t threads : blocks) {
    if (threads - 32 < *n) add(shape_config(n, vectorizable, threads, 0, 1, kRegisterElements));
  }
  return configs;
}

/// The text of `c` in the kernels' comments: "a warp per row, 4 warps a block, 2 rows a warp,
/// 24 elements a thread in registers in 16-byte vectors".
std::string config_text(const ReduceConfig& c) {
  std::string text = c.rows_per_block > 0
                         ? fmt::format("a warp per row, {} warps a block", c.rows_per_block)
                         : fmt::format("a block of {} per row", c.threads);
  if (c.rows_per_warp > 1) text += fmt::format(", {} rows a warp", c.rows_per_warp);
  if (c.registers > 0)
    text += fmt::format(", {} elements a thread in registers{}", c.registers,
                        c.vector > 1 ? " in 16-byte vectors" : "");
  return text;
}

class CudaKernelBuilder {
 public:
  /// `config`: the index of the reduction's launch configuration in reduce_candidates (0: the
  /// heuristic's).
  CudaKernelBuilder(const sched::ScheduleItem& item, const ir::Program& program, size_t config = 0)
      : config_index_(config), item_(item), group_(item.group) {
    ctx_.program = &program;
    ctx_.item = &item;
    ctx_.analyzer = group_.analyzer(program.analyzer);
    ir::Layout reduce = ir::Layout::contiguous(group_.reduce_sizes);
    ctx_.scratch_index = ctx_.analyzer.simplify(sym::dot(group_.reduce_vars, reduce.strides));
  }

  GeneratedKernel build();
  /// After build(): a reduction's launch configurations (reduce_candidates), the chosen one and
  /// whether the kernel writes a buffer it also reads (then it cannot run again to be timed).
  const std::vector<ReduceConfig>& configs() const { return configs_; }
  const ReduceConfig& config() const { return config_; }
  bool in_place() const;

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
    sym::Expr size_a, size_b, batch;  // run-time sizes where the group's are symbolic
    bool batch_loop = false;          // batch may exceed kTileMaxBatch: blocks loop over it
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
  /// Declares the arrays of a row held in registers (and kiln_aligned) ...
  void emit_row_preload(IndentedBuffer& out);
  /// ... and loads the preloaded inputs of the row xindex (its variables split).
  void emit_row_loads(IndentedBuffer& out);
  /// Indexes a preloaded array by the warp's row: "[kiln_w]" when a warp takes several rows.
  std::string row_sub_;
  bool has_aligned_ = false;
  void emit_row_loop(IndentedBuffer& out, MemberEmitter& m);
  /// blockDim.x of a reduction kernel, written as a literal in its row loops: with a static row
  /// length the compiler unrolls them and issues their loads together.
  int64_t row_threads_ = kReduceThreads;
  /// A buffer parameter of a row held in registers: every access of it by the row's members is
  /// at `index` (over the kernel's variables); a thread's elements of it live in `array`
  /// (ReduceConfig::registers of them), moved in 16-byte vectors when `vector`.
  struct RowBuffer {
    sym::Expr index;
    graph::DType dtype = graph::DType::kFloat32;
    bool vector = false;
    std::string array;
  };
  /// The inputs of the row's members that are loaded into registers up front (row_loads_) and
  /// the outputs of its pointwise members gathered in registers and stored in vectors
  /// (row_stores_). Returns true when one of them can move in 16-byte vectors.
  bool plan_register_row();
  std::map<std::string, RowBuffer> row_loads_, row_stores_;
  ReduceConfig config_;
  size_t config_index_ = 0;
  std::vector<ReduceConfig> configs_;
  /// The loop over a thread's elements of a row held in registers: kiln_k counts them, rindex
  /// is the element's position in the row (the reduction variables split from it). `body`
  /// emits what each element does; `vector_body`, when given, replaces the elements of one
  /// chunk where every vector pointer is aligned (kiln_aligned): it gets the chunk's first
  /// rindex with the reduction variables split from it and the chunk number in kiln_c.
  void emit_register_loop(IndentedBuffer& out, const std::function<void()>& body,
                          const std::function<void()>& vector_body = nullptr);
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

/// The bytes of one element of a buffer a pointwise kernel may move in vectors of
/// kVectorElements, or 0: 4- and 8-byte types whose compute type is their storage type (float,
/// int32, int64, double: the lanes are the values the scalar body uses) and the 16-bit floats
/// (each lane widened to float as a scalar load would).
int64_t vector_bytes(const ir::Op& op) {
  switch (op.buffer_dtype) {
    case graph::DType::kFloat32:
    case graph::DType::kInt32:
      return op.dtype == op.buffer_dtype ? 4 : 0;
    case graph::DType::kFloat64:
    case graph::DType::kInt64:
      return op.dtype == op.buffer_dtype ? 8 : 0;
    case graph::DType::kFloat16:
    case graph::DType::kBFloat16:
      return op.dtype == graph::DType::kFloat32 ? 2 : 0;
    default:
      return 0;
  }
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
      const std::optional<int64_t> offset =
          ctx_.analyzer.simplify(m->op_index(static_cast<ir::ValueId>(k)) - flat).as_integer();
      const bool ok =
          vector_bytes(op) > 0 && op.mask == ir::kNoValue && offset == std::optional<int64_t>(0);
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
  // A thread's kVectorElements elements of a buffer: one 16-byte vector of a 4-byte type, two of
  // an 8-byte type, one 8-byte vector of a 16-bit float (its 4 codes copied out of it).
  auto widen16 = [](graph::DType t, const std::string& code) {
    return fmt::format("kiln::{}_to_float({})", t == graph::DType::kFloat16 ? "half" : "bf16",
                       code);
  };
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
    out.linef("// {} consecutive elements: vector loads and stores of the contiguous buffers.",
              kVectorElements);
    LoopPass pass;
    int n = 0;
    std::vector<std::string> vector_stores;  // after the elements
    for (const auto& [buffer, dtype] : vector.loads) {
      const std::string v = fmt::format("kiln_v{}", n++);
      const std::string t(graph::dtype_cpp_storage(dtype));
      const std::string& ptr = ctx_.params.at(buffer);
      if (graph::dtype_size(dtype) == 4) {
        const char* vt = dtype == graph::DType::kFloat32 ? "float4" : "int4";
        out.linef("const {0} {1}_raw = *reinterpret_cast<const {0}*>({2} + xbase);", vt, v, ptr);
        out.linef("const {0} {1}[{2}] = {{{3}}};", t, v, kVectorElements,
                  fmt::format("{0}_raw.x, {0}_raw.y, {0}_raw.z, {0}_raw.w", v));
        pass.forwarded[buffer] = v + "[kiln_e]";
        continue;
      }
      // The thread's elements as stored, copied out of the vector (bit for bit).
      out.linef("{} {}[{}];", t, v, kVectorElements);
      const int64_t bytes = static_cast<int64_t>(graph::dtype_size(dtype)) * kVectorElements;
      for (int64_t off = 0; off < bytes; off += 16) {
        const char* vt = bytes == 8 ? "uint2" : "uint4";
        out.linef(
            "{{ const {0} kiln_raw = *reinterpret_cast<const {0}*>(reinterpret_cast<const "
            "char*>({1} + xbase) + {2}); memcpy(reinterpret_cast<char*>({3}) + {2}, "
            "&kiln_raw, sizeof kiln_raw); }}",
            vt, ptr, off, v);
      }
      const bool half = graph::dtype_size(dtype) == 2;
      pass.forwarded[buffer] = half ? widen16(dtype, v + "[kiln_e]") : v + "[kiln_e]";
    }
    for (const auto& [buffer, dtype] : vector.stores) {
      const std::string v = fmt::format("kiln_s{}", n++);
      out.linef("{} {}[{}];", graph::dtype_cpp_storage(dtype), v, kVectorElements);
      pass.staged[buffer] = v + "[kiln_e]";
      if (graph::dtype_size(dtype) == 4) {
        const char* vt = dtype == graph::DType::kFloat32 ? "float4" : "int4";
        vector_stores.push_back(fmt::format("*reinterpret_cast<{0}*>({1} + xbase) = {0}{{{2}}};",
                                            vt, ctx_.params.at(buffer),
                                            fmt::format("{0}[0], {0}[1], {0}[2], {0}[3]", v)));
        continue;
      }
      const int64_t bytes = static_cast<int64_t>(graph::dtype_size(dtype)) * kVectorElements;
      for (int64_t off = 0; off < bytes; off += 16) {
        const char* vt = bytes == 8 ? "uint2" : "uint4";
        vector_stores.push_back(fmt::format(
            "{{ {0} kiln_raw; memcpy(&kiln_raw, reinterpret_cast<const char*>({3}) + {2}, sizeof "
            "kiln_raw); *reinterpret_cast<{0}*>(reinterpret_cast<char*>({1} + xbase) + {2}) = "
            "kiln_raw; }}",
            vt, ctx_.params.at(buffer), off, v));
      }
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
  std::vector<sym::Expr> sizes;
  for (const sym::Expr& size : group_.sizes) sizes.push_back(ctx_.analyzer.simplify(size));
  // A side too short for a tile to pay: known when compiling and under kTileMinSide.
  auto short_side = [](const sym::Expr& size) {
    const std::optional<int64_t> v = size.as_integer();
    return v && *v < kTileMinSide;
  };
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
        if (short_side(sizes[a]) || short_side(sizes[n - 1])) break;
        TilePlan p;
        p.buffer = op.buffer;
        p.index = index;
        p.a = a;
        p.b = n - 1;
        p.size_a = sizes[a];
        p.size_b = sizes[n - 1];
        std::vector<sym::Expr> others;
        for (size_t v = 0; v + 1 < n; ++v) {
          if (v != a) others.push_back(sizes[v]);
        }
        p.batch = ctx_.analyzer.simplify(sym::product(others));
        const std::optional<int64_t> batch = p.batch.as_integer();
        p.batch_loop = !batch || *batch > kTileMaxBatch;
        plan = p;
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
  // The sizes as C++ expressions: literals where static, else of the kernel's size arguments.
  const std::string size_a = ctx_.cpp(plan.size_a), size_b = ctx_.cpp(plan.size_b);
  const sym::Expr tiles = ctx_.analyzer.simplify(sym::ceil_div(plan.size_b, sym::Expr(kTile)));
  const std::string tiles_b =
      tiles.is_integer() ? ctx_.cpp(tiles) : fmt::format("({})", ctx_.cpp(tiles));
  out.linef("// {} is read along {} and written along {}: through a {} x {} tile.", plan.buffer, a,
            b, kTile, kTile);
  out.linef("__shared__ {} kiln_tile[{}][{}];", t, kTile, kTile + 1);
  out.linef("const int64_t kiln_a0 = static_cast<int64_t>(blockIdx.x / {}) * {};", tiles_b, kTile);
  out.linef("const int64_t kiln_b0 = static_cast<int64_t>(blockIdx.x % {}) * {};", tiles_b, kTile);
  // The other variables, from blockIdx.y, or where there may be more of their combinations than
  // blocks along y, from a loop over them gridDim.y apart (the same trip count for every thread
  // of the block, so the barriers inside stay uniform).
  std::vector<sym::Expr> others, other_sizes;
  for (size_t v = 0; v + 1 < group_.vars.size(); ++v) {
    if (v == plan.a) continue;
    others.push_back(group_.vars[v]);
    other_sizes.push_back(group_.sizes[v]);
  }
  if (plan.batch_loop) {
    out.linef("for (int64_t kiln_batch = blockIdx.y; kiln_batch < {}; kiln_batch += gridDim.y) {{",
              ctx_.cpp(plan.batch));
    out.indent();
    out.line("__syncthreads();  // the previous combination's tile has been read");
    split_index(out, "kiln_batch", others, other_sizes);
  } else if (!others.empty()) {
    out.line("const int64_t kiln_batch = blockIdx.y;");
    split_index(out, "kiln_batch", others, other_sizes);
  }
  out.line("// Consecutive threads read consecutive elements of the tile's column ...");
  out.linef("for (int kiln_j = threadIdx.y; kiln_j < {}; kiln_j += {}) {{", kTile, kTileRows);
  {
    auto _ = out.scope();
    out.linef("const int64_t {} = kiln_a0 + threadIdx.x;", a);
    out.linef("const int64_t {} = kiln_b0 + kiln_j;", b);
    out.linef("if ({} < {} && {} < {}) kiln_tile[kiln_j][threadIdx.x] = {}[{}];", a, size_a, b,
              size_b, ctx_.params.at(plan.buffer), ctx_.cpp(plan.index));
  }
  out.line("}");
  out.line("__syncthreads();");
  out.line("// ... and the members run along the output's rows, reading it from the tile.");
  out.linef("for (int kiln_j = threadIdx.y; kiln_j < {}; kiln_j += {}) {{", kTile, kTileRows);
  {
    auto _ = out.scope();
    out.linef("const int64_t {} = kiln_a0 + kiln_j;", a);
    out.linef("const int64_t {} = kiln_b0 + threadIdx.x;", b);
    out.linef("if ({} >= {} || {} >= {}) continue;", a, size_a, b, size_b);
    LoopPass pass;
    pass.forwarded[plan.buffer] = "kiln_tile[threadIdx.x][kiln_j]";
    for (auto& m : members_) m->emit_loop_body(out, pass);
  }
  out.line("}");
  if (plan.batch_loop) {
    out.dedent();
    out.line("}");
  }
}

bool CudaKernelBuilder::plan_register_row() {
  std::optional<int64_t> n = ctx_.analyzer.simplify(group_.reduce_numel()).as_integer();
  if (!n) return false;
  // A buffer's vector of 4 starts at a row position that is a multiple of 4 (rindex): it is one
  // aligned 16-byte access when the index is the row position plus a multiple of 4 that does
  // not depend on it (an aligned pointer checked when the kernel runs).
  const sym::Expr& row_flat = ctx_.scratch_index;
  auto vector_ok = [&](const ir::Op& op, const sym::Expr& index) {
    if (op.buffer_dtype != graph::DType::kFloat32 && op.buffer_dtype != graph::DType::kInt32) {
      return false;
    }
    const sym::Expr offset = ctx_.analyzer.simplify(index - row_flat);
    for (const sym::Expr& v : group_.reduce_vars) {
      if (sym::has_symbol(offset, v)) return false;
    }
    return ctx_.analyzer.statically_known_multiple_of(offset, sym::Expr(kVectorElements));
  };
  auto uses_row = [&](const sym::Expr& index) {
    for (const sym::Expr& v : group_.reduce_vars) {
      if (sym::has_symbol(index, v)) return true;
    }
    return false;
  };
  std::set<std::string> bad, stored;
  std::map<std::string, int> store_members;
  for (const auto& m : members_) {
    const ir::LoopBody& body = m->body();
    const bool in_row = m->member().kind != MemberKind::kPointwiseOuter;
    for (size_t k = 0; k < body.ops().size(); ++k) {
      const ir::Op& op = body.ops()[k];
      if (op.code == ir::OpCode::kStore && !ctx_.locals.count(op.buffer)) stored.insert(op.buffer);
    }
    std::set<std::string> stored_here;
    for (size_t k = 0; k < body.ops().size(); ++k) {
      const ir::Op& op = body.ops()[k];
      const bool is_load = op.code == ir::OpCode::kLoad;
      if ((!is_load && op.code != ir::OpCode::kStore) || ctx_.locals.count(op.buffer)) continue;
      const sym::Expr& index = m->op_index(static_cast<ir::ValueId>(k));
      // Plain accesses of the member's loop only: no mask, no indirection, no conversion.
      bool ok = in_row && op.mask == ir::kNoValue && !m->has_indirect_or_mask() &&
                op.dtype == op.buffer_dtype && uses_row(index);
      if (!is_load) {
        ok = ok && m->member().kind == MemberKind::kPointwiseInner;
        if (stored_here.insert(op.buffer).second) ++store_members[op.buffer];
      }
      auto& side = is_load ? row_loads_ : row_stores_;
      auto [it, fresh] = side.emplace(op.buffer, RowBuffer{index, op.buffer_dtype, true, ""});
      ok = ok && (fresh || it->second.index == index);
      it->second.vector = it->second.vector && vector_ok(op, index);
      if (!ok) bad.insert((is_load ? "load:" : "store:") + op.buffer);
    }
  }
  // Loads of a buffer some member writes read memory; a staged output is written by one member
  // and only in vectors (scalar stores are coalesced already).
  for (auto it = row_loads_.begin(); it != row_loads_.end();) {
    const bool drop = bad.count("load:" + it->first) || stored.count(it->first);
    it = drop ? row_loads_.erase(it) : std::next(it);
  }
  for (auto it = row_stores_.begin(); it != row_stores_.end();) {
    const bool drop = bad.count("store:" + it->first) || store_members[it->first] != 1 ||
                      !it->second.vector || row_loads_.count(it->first);
    it = drop ? row_stores_.erase(it) : std::next(it);
  }
  int n_array = 0;
  bool any_vector = false;
  for (auto* side : {&row_loads_, &row_stores_}) {
    for (auto& [buffer, row] : *side) {
      row.array = fmt::format("kiln_row{}", n_array++);
      any_vector = any_vector || row.vector;
    }
  }
  return any_vector;
}

void CudaKernelBuilder::emit_register_loop(IndentedBuffer& out, const std::function<void()>& body,
                                           const std::function<void()>& vector_body) {
  const int64_t v = config_.vector;
  const std::string r = ctx_.cpp(group_.reduce_numel());
  auto scalar_loop = [&] {
    out.line("#pragma unroll");
    out.linef("for (int kiln_k = 0; kiln_k < {}; ++kiln_k) {{", config_.registers);
    {
      auto _ = out.scope();
      if (v == 1) {
        out.linef("const int64_t rindex = kiln_k * {} + threadIdx.x;", row_threads_);
      } else {
        out.linef("const int64_t rindex = (kiln_k / {0} * {1} + threadIdx.x) * {0} + kiln_k % {0};",
                  v, row_threads_);
      }
      out.linef("if (rindex >= {}) break;", r);
      split_index(out, "rindex", group_.reduce_vars, group_.reduce_sizes);
      body();
    }
    out.line("}");
  };
  if (!vector_body) {
    scalar_loop();
    return;
  }
  out.line("if (kiln_aligned) {");
  {
    auto _ = out.scope();
    out.line("#pragma unroll");
    out.linef("for (int kiln_c = 0; kiln_c < {}; ++kiln_c) {{", config_.registers / v);
    {
      auto _ = out.scope();
      out.linef("const int64_t rindex = (kiln_c * {} + threadIdx.x) * {};", row_threads_, v);
      out.linef("if (rindex >= {}) break;", r);
      split_index(out, "rindex", group_.reduce_vars, group_.reduce_sizes);
      vector_body();
    }
    out.line("}");
  }
  out.line("} else {");
  {
    auto _ = out.scope();
    scalar_loop();
  }
  out.line("}");
}

void CudaKernelBuilder::emit_row_loop(IndentedBuffer& out, MemberEmitter& m) {
  if (config_.registers > 0) {
    // The row is in registers: the member's loads of preloaded inputs read the thread's
    // arrays, its stores of staged outputs fill them, and the staged outputs leave in vectors.
    std::map<std::string, std::string> staged;
    for (const auto& [buffer, row] : row_stores_) {
      const ir::LoopBody& body = m.body();
      for (const ir::Op& op : body.ops()) {
        if (op.code == ir::OpCode::kStore && op.buffer == buffer) staged[buffer] = row.array;
      }
    }
    emit_register_loop(out, [&] {
      LoopPass pass;
      for (const auto& [buffer, row] : row_loads_) {
        pass.forwarded[buffer] = row.array + row_sub_ + "[kiln_k]";
      }
      for (const auto& [buffer, array] : staged) pass.staged[buffer] = array + "[kiln_k]";
      m.emit_loop_body(out, pass);
    });
    for (const auto& [buffer, array] : staged) {
      const RowBuffer& row = row_stores_.at(buffer);
      const std::string& ptr = ctx_.params.at(buffer);
      const std::string vec = row.dtype == graph::DType::kFloat32 ? "float4" : "int4";
      emit_register_loop(
          out, [&] { out.linef("{}[{}] = {}[kiln_k];", ptr, ctx_.cpp(row.index), array); },
          [&] {
            out.linef(
                "*reinterpret_cast<{0}*>({1} + {2}) = {0}{{{3}[kiln_c * 4], {3}[kiln_c * 4 + 1], "
                "{3}[kiln_c * 4 + 2], {3}[kiln_c * 4 + 3]}};",
                vec, ptr, ctx_.cpp(row.index), array);
          });
    }
    return;
  }
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

void CudaKernelBuilder::emit_row_preload(IndentedBuffer& out) {
  std::set<std::string> vector_pointers;
  for (const auto* side : {&row_loads_, &row_stores_}) {
    for (const auto& [buffer, row] : *side) {
      if (row.vector && config_.vector > 1) vector_pointers.insert(ctx_.params.at(buffer));
    }
  }
  if (!vector_pointers.empty()) {
    std::string aligned;
    for (const std::string& p : vector_pointers) {
      aligned += fmt::format("{}reinterpret_cast<unsigned long long>({})",
                             aligned.empty() ? "" : " | ", p);
    }
    out.linef("const bool kiln_aligned = ({}) % 16 == 0;", aligned);
    has_aligned_ = true;
  }
  out.linef("// The row in registers: {} elements a thread, {} at a time, {} elements apart.",
            config_.registers, config_.vector, row_threads_ * config_.vector);
  for (const auto& [buffer, row] : row_stores_) {
    out.linef("{} {}[{}];", cpp_compute_type(row.dtype), row.array, config_.registers);
  }
  for (const auto& [buffer, row] : row_loads_) {
    out.linef("{} {}{}[{}];", cpp_compute_type(row.dtype), row.array,
              config_.rows_per_warp > 1 ? fmt::format("[{}]", config_.rows_per_warp) : "",
              config_.registers);
  }
}

void CudaKernelBuilder::emit_row_loads(IndentedBuffer& out) {
  for (const auto& [buffer, row] : row_loads_) {
    const std::string& ptr = ctx_.params.at(buffer);
    const std::string array = row.array + row_sub_;
    auto scalar = [&] { out.linef("{}[kiln_k] = {}[{}];", array, ptr, ctx_.cpp(row.index)); };
    if (!row.vector || config_.vector == 1 || !has_aligned_) {
      emit_register_loop(out, scalar);
      continue;
    }
    const std::string vec = row.dtype == graph::DType::kFloat32 ? "float4" : "int4";
    emit_register_loop(out, scalar, [&] {
      out.linef("const {} kiln_v = *reinterpret_cast<const {}*>({} + {});", vec, vec, ptr,
                ctx_.cpp(row.index));
      out.linef("{0}[kiln_c * 4] = kiln_v.x; {0}[kiln_c * 4 + 1] = kiln_v.y;", array);
      out.linef("{0}[kiln_c * 4 + 2] = kiln_v.z; {0}[kiln_c * 4 + 3] = kiln_v.w;", array);
    });
  }
}

/// True when reduction members `a` and `b` accumulate the same values the same way: one
/// reduction each, of the same operand computed by the same ops from the same loads (the ops
/// before the result, none a store), of the same type or both Welford (mean and variance read
/// the same state). What they do with the result may differ.
bool same_accumulation(const MemberEmitter& a, const MemberEmitter& b) {
  if (a.member().kind != MemberKind::kReduction || b.member().kind != MemberKind::kReduction)
    return false;
  const std::vector<ir::Op>& x = a.body().ops();
  const std::vector<ir::Op>& y = b.body().ops();
  auto reduction_of = [](const std::vector<ir::Op>& ops) -> std::optional<size_t> {
    std::optional<size_t> found;
    for (size_t k = 0; k < ops.size(); ++k) {
      if (ops[k].code != ir::OpCode::kReduction) continue;
      if (found) return std::nullopt;  // several reductions
      found = k;
    }
    return found;
  };
  const std::optional<size_t> rx = reduction_of(x), ry = reduction_of(y);
  if (!rx || rx != ry) return false;
  auto welford = [](ReductionType t) {
    return t == ReductionType::kWelfordMean || t == ReductionType::kWelfordVar;
  };
  const ir::Op &ox = x[*rx], &oy = y[*ry];
  if (ox.dtype != oy.dtype || ox.operands != oy.operands ||
      !(ox.reduction == oy.reduction || (welford(ox.reduction) && welford(oy.reduction))) ||
      ox.reduction == ReductionType::kArgMax || ox.reduction == ReductionType::kArgMin) {
    return false;
  }
  // What `b` does after its reduction must use the result (emit_reduction_end writes it): no
  // store of a value computed without it.
  std::vector<bool> after(y.size(), false);
  after[*ry] = true;
  for (size_t k = *ry + 1; k < y.size(); ++k) {
    for (ir::ValueId v : y[k].operands) after[k] = after[k] || (v != ir::kNoValue && after[v]);
    if (y[k].code == ir::OpCode::kStore && !after[k]) return false;
  }
  for (size_t k = 0; k < *rx; ++k) {
    const ir::Op &p = x[k], &q = y[k];
    const auto id = static_cast<ir::ValueId>(k);
    if (p.code == ir::OpCode::kStore || q.code == ir::OpCode::kStore || p.code != q.code ||
        p.dtype != q.dtype || p.operands != q.operands || p.buffer != q.buffer ||
        p.buffer_dtype != q.buffer_dtype || p.float_value != q.float_value ||
        p.int_value != q.int_value || p.mask != q.mask || p.select_last != q.select_last ||
        p.bits_from != q.bits_from || p.bits_to != q.bits_to || !(p.symbol == q.symbol) ||
        !(p.index == q.index)) {
      return false;
    }
    if ((p.code == ir::OpCode::kLoad || p.code == ir::OpCode::kIndexExpr) &&
        !(a.op_index(id) == b.op_index(id))) {
      return false;
    }
  }
  return true;
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
    if (config.registers > 0) {
      // A row in registers: the per-element values of each thread's elements, by kiln_k.
      scratch.push_back(
          fmt::format("{} {}[{}];  // {}", t, ctx_.local_names.at(name), config.registers, name));
      continue;
    }
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
  const std::string numel = ctx_.cpp(group_.numel());
  const int64_t rows_per_warp = config.rows_per_warp;
  if (rows_per_warp > 1) {
    // A warp takes rows_per_warp consecutive rows: first the inputs of all of them into
    // registers, then each row's members in turn (a whole warp leaves together: its shuffles
    // need all its lanes, and no block barrier follows).
    row_sub_ = "[kiln_w]";
    out.linef(
        "const int64_t kiln_xbase = (static_cast<int64_t>(blockIdx.x) * blockDim.y + "
        "threadIdx.y) * {};",
        rows_per_warp);
    out.linef("if (kiln_xbase >= {}) return;", numel);
    emit_row_preload(out);
    out.line("#pragma unroll");
    out.linef("for (int kiln_w = 0; kiln_w < {}; ++kiln_w) {{", rows_per_warp);
    {
      auto _ = out.scope();
      out.line("const int64_t xindex = kiln_xbase + kiln_w;");
      out.linef("if (xindex >= {}) break;", numel);
      split_index(out, "xindex", group_.vars, group_.sizes);
      emit_row_loads(out);
    }
    out.line("}");
    out.line("#pragma unroll");
    out.linef("for (int kiln_w = 0; kiln_w < {}; ++kiln_w) {{", rows_per_warp);
    out.indent();
    out.line("const int64_t xindex = kiln_xbase + kiln_w;");
    out.linef("if (xindex >= {}) break;", numel);
  } else if (warp_rows) {
    // A whole warp leaves together past the last row: the warp's shuffles need all its lanes,
    // and no block barrier follows.
    out.line("const int64_t xindex = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;");
    out.linef("if (xindex >= {}) return;", numel);
  } else {
    out.line("const int64_t xindex = blockIdx.x;");
  }
  split_index(out, "xindex", group_.vars, group_.sizes);
  for (const auto& [name, storage] : ctx_.locals) {
    if (storage != LocalStorage::kScalar) continue;
    out.linef("{} {}{{}};  // {}", cpp_compute_type(ctx_.local_dtypes.at(name)),
              ctx_.local_names.at(name), name);
  }
  if (config.registers > 0 && rows_per_warp == 1) {
    emit_row_preload(out);
    emit_row_loads(out);
  }
  // A reduction member whose accumulation repeats an earlier member's (LayerNorm's Welford mean
  // and variance of the same row) declares its accumulator here and takes the earlier one's
  // combined state instead of a row loop and a combine of its own.
  std::vector<std::optional<size_t>> shares(members_.size());
  for (size_t j = 0; j < members_.size(); ++j) {
    for (size_t i = 0; i < j && !shares[j]; ++i) {
      if (!shares[i] && same_accumulation(*members_[i], *members_[j])) shares[j] = i;
    }
  }
  for (size_t k = 0; k < members_.size(); ++k) {
    auto& m = members_[k];
    for (size_t j = k + 1; j < members_.size(); ++j) {
      if (shares[j] == k) members_[j]->emit_accumulators(out, false);
    }
    out.linef("{{  // {}", m->member().buffer->name);
    {
      auto _ = out.scope();
      switch (m->member().kind) {
        case MemberKind::kReduction:
          if (shares[k]) {
            out.linef("// The accumulation of {}'s.", members_[*shares[k]]->member().buffer->name);
            m->emit_reduction_end(out, false);
            break;
          }
          m->emit_accumulators(out, false);
          emit_row_loop(out, *m);
          emit_block_combine(out, *m);
          for (size_t j = k + 1; j < members_.size(); ++j) {
            if (shares[j] != k) continue;
            out.linef("{} = {};", members_[j]->accumulators().begin()->second,
                      m->accumulators().begin()->second);
          }
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
  if (rows_per_warp > 1) {
    out.dedent();
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
    const bool vectorizable = plan_register_row();
    configs_ =
        reduce_candidates(ctx_.analyzer.simplify(group_.reduce_numel()).as_integer(), vectorizable);
    KILN_CHECK(config_index_ < configs_.size(), "{}: launch configuration {} of {}", item_.name,
               config_index_, configs_.size());
    const ReduceConfig config = configs_[config_index_];
    config_ = config;
    if (config.registers > 0) {
      // Scratch values of a row in registers are indexed by the thread's element number.
      ctx_.scratch_index = sym::Expr::symbol("kiln_k", sym::SymbolKind::kIndex);
    } else {
      row_loads_.clear();
      row_stores_.clear();
    }
    if (config.vector == 1) {
      for (auto* side : {&row_loads_, &row_stores_}) {
        for (auto& [buffer, row] : *side) row.vector = false;
      }
      row_stores_.clear();
    }
    threads = config.threads;
    row_threads_ = config.threads;
    emit_reduction(body, config);
    if (config.rows_per_block > 0) {
      threads *= config.rows_per_block;
      launch.block[1] = sym::Expr(config.rows_per_block);
      launch.grid[0] =
          sym::ceil_div(group_.numel(), sym::Expr(config.rows_per_block * config.rows_per_warp));
    } else {
      launch.grid[0] = group_.numel();
    }
    launch.block[0] = sym::Expr(config.threads);
  } else if (std::optional<TilePlan> tile = tile_plan()) {
    emit_pointwise_tiled(body, *tile);
    threads = kTile * kTileRows;
    launch.block[0] = sym::Expr(kTile);
    launch.block[1] = sym::Expr(kTileRows);
    launch.grid[0] = sym::ceil_div(tile->size_a, sym::Expr(kTile)) *
                     sym::ceil_div(tile->size_b, sym::Expr(kTile));
    launch.grid[1] =
        tile->batch_loop ? sym::min(tile->batch, sym::Expr(kTileMaxBatch)) : tile->batch;
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
  launch.grid[1] = ctx_.analyzer.simplify(launch.grid[1]);
  if (!group_.is_reduction() && launch.block[1] == sym::Expr(1)) {
    launch.block[0] = sym::Expr(threads);
  }
  launch.shared_bytes = shared_bytes_;
  GeneratedKernel kernel = assemble_kernel(item_, signature(threads), body, args_);
  kernel.launch = launch;
  return kernel;
}

bool CudaKernelBuilder::in_place() const {
  for (const std::string& p : param_names_) {
    if (p.rfind("in_out", 0) == 0) return true;
  }
  return false;
}

/// 64-bit FNV-1a of `text`: the problem text's digest of a kernel's code.
uint64_t fnv1a(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

GeneratedKernel generate_cuda_kernel(const sched::ScheduleItem& item, const ir::Program& program,
                                     const CudaLaunchOptions& options) {
  CudaKernelBuilder builder(item, program, options.config.value_or(0));
  GeneratedKernel kernel = builder.build();
  const std::vector<ReduceConfig>& configs = builder.configs();
  if (configs.size() < 2 || builder.in_place()) return kernel;
  // The heuristic's code names the kernel's structure (its members, dtypes, indexing) and its
  // static sizes; the digest keeps the problem text short and free of names.
  CudaKernelBuilder heuristic(item, program);
  const GeneratedKernel first = options.config.value_or(0) == 0 ? kernel : heuristic.build();
  const sym::Analyzer analyzer = item.group.analyzer(program.analyzer);
  const std::optional<int64_t> rows = analyzer.simplify(item.group.numel()).as_integer();
  const std::optional<int64_t> row = analyzer.simplify(item.group.reduce_numel()).as_integer();
  kernel.launch_problem =
      fmt::format("reduction {:016x} rows {} row {} configs {}", fnv1a(first.anonymous()),
                  rows ? std::to_string(*rows) : "dynamic", row ? std::to_string(*row) : "dynamic",
                  configs.size());
  kernel.launch_configs = static_cast<int>(configs.size());
  if (options.config) {
    kernel.comment += fmt::format("//   launch configuration #{} of {}: {}\n", *options.config,
                                  configs.size(), config_text(builder.config()));
  }
  if (!options.candidates) return kernel;
  kernel.comment += fmt::format("//   --autotune max: launch configuration #0 of {}: {}\n",
                                configs.size(), config_text(configs[0]));
  for (size_t c = 1; c < configs.size(); ++c) {
    CudaKernelBuilder other(item, program, c);
    GeneratedKernel candidate = other.build();
    const std::string name = fmt::format("{}_c{}", kernel.name, c);
    candidate.definition.replace(candidate.name_offset, candidate.name.size(), name);
    candidate.comment = fmt::format("// {}: launch configuration #{} of {}: {}\n", name, c,
                                    configs.size(), config_text(configs[c]));
    candidate.name = name;
    kernel.candidates.push_back(std::move(candidate));
  }
  return kernel;
}

std::string cuda_kernel_prelude() {
  std::string text =
      R"(// NVRTC has no C library: kiln_half.h's one builtin comes from the CUDA math library.
#define __builtin_fabsf(x) ::fabsf(x)
#include <algorithm>

#include "kiln_half.h"
#include "kiln_scalar.h"

namespace kiln {
// kiln::Welford<float> on the GPU: the same arithmetic as kiln_scalar.h's, with a 32-bit count
// (a row of a reduction kernel has fewer than 2^31 elements). The 64-bit count's increments and
// conversions are long instruction sequences on the GPU, and the state shuffles in three 32-bit
// words instead of four. The divisions by a count are __fdividef (a reciprocal and a product,
// within 2 ulp for counts below 2^126) rather than IEEE division (about 8 instructions and a
// branch): a LayerNormalization updates a Welford state per element, and at an H100's copy
// bandwidth a kernel may spend only about 70 instructions per element (an estimate: 132 SMs x 4
// warp instructions a cycle at 1.75 GHz over 8 bytes an element at 3.35 TB/s).
template <>
struct Welford<float> {
  float mean = 0.0f;
  float m2 = 0.0f;
  int32_t n = 0;

  void update(float x) {
    ++n;
    const float delta = x - mean;
    mean += __fdividef(delta, static_cast<float>(n));
    m2 += delta * (x - mean);
  }
  void combine(float other_mean, float other_m2, int32_t other_n) {
    if (other_n == 0) return;
    if (n == 0) {
      mean = other_mean;
      m2 = other_m2;
      n = other_n;
      return;
    }
    const int32_t total = n + other_n;
    const float delta = other_mean - mean;
    const float w = __fdividef(static_cast<float>(other_n), static_cast<float>(total));
    mean += delta * w;
    m2 += other_m2 + delta * delta * static_cast<float>(n) * w;
    n = total;
  }
  float variance() const { return n > 0 ? m2 / static_cast<float>(n) : __int_as_float(0x7fc00000); }
  float result_mean() const { return n > 0 ? mean : __int_as_float(0x7fc00000); }
};
}  // namespace kiln

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
