#include "codegen/cuda/cuda_split_reduction.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "support/error.h"
#include "support/log.h"

namespace kiln::codegen {
namespace {

using ir::Op;
using ir::OpCode;
using ir::ReductionType;
using ir::ValueId;

/// Output rows below which a long reduction is split: fewer rows than about two blocks per
/// multiprocessor of an H100 (132) would leave most of the GPU idle.
constexpr int64_t kSplitMaxRows = 256;
/// The split aims at rows x chunks of at least this many blocks ...
constexpr int64_t kSplitTargetBlocks = 512;
/// ... with chunks of at least kSplitMinChunk elements (a block of 256 threads looping several
/// times) and at most kSplitMaxChunks chunks per row (the second reduction's row: one warp's
/// or one block's row held in registers).
constexpr int64_t kSplitMinChunk = 2048;
constexpr int64_t kSplitMaxChunks = 1024;

/// A reduction that combines partial results of itself: sums of sums, maxima of maxima.
bool combines_with_itself(ReductionType type) {
  switch (type) {
    case ReductionType::kSum:
    case ReductionType::kProd:
    case ReductionType::kMax:
    case ReductionType::kMin:
    case ReductionType::kAny:
    case ReductionType::kAll:
      return true;
    default:
      return false;
  }
}

/// The chunks per row of `rows` output rows of `row` elements: a power of two dividing `row`,
/// or nullopt when the reduction stays whole.
std::optional<int64_t> split_chunks(int64_t rows, int64_t row) {
  if (rows <= 0 || rows >= kSplitMaxRows || row < kSplitMinRow) return std::nullopt;
  int64_t chunks = 1;
  while (rows * chunks < kSplitTargetBlocks && chunks < kSplitMaxChunks &&
         row / (chunks * 2) >= kSplitMinChunk) {
    chunks *= 2;
  }
  while (chunks > 1 && row % chunks != 0) chunks /= 2;
  if (chunks < 2) return std::nullopt;
  return chunks;
}

/// The two bodies of a split reduction, or nullopt when `buffer` is not one to split.
struct Split {
  ir::LoopBody partial, final;
  graph::DType partial_dtype;
};

std::optional<Split> split_body(const ir::Program& program, const ir::Buffer& buffer,
                                const std::string& partial_name) {
  const ir::LoopBody& body = buffer.body;
  const std::vector<Op>& ops = body.ops();
  ValueId reduction = ir::kNoValue;
  int stores = 0;
  for (size_t k = 0; k < ops.size(); ++k) {
    if (ops[k].code == OpCode::kReduction) {
      if (reduction != ir::kNoValue) return std::nullopt;  // one reduction only
      reduction = static_cast<ValueId>(k);
    }
    if (ops[k].code == OpCode::kStore) {
      if (ops[k].buffer != buffer.name) return std::nullopt;
      ++stores;
    }
  }
  if (reduction == ir::kNoValue || stores != 1) return std::nullopt;
  const Op& red = body.op(reduction);
  if (!combines_with_itself(red.reduction)) return std::nullopt;
  const std::optional<int64_t> rows =
      program.analyzer.simplify(sym::product(body.sizes())).as_integer();
  const std::optional<int64_t> row =
      program.analyzer.simplify(sym::product(body.reduce_sizes())).as_integer();
  if (!rows || !row) return std::nullopt;
  const std::optional<int64_t> chunks = split_chunks(*rows, *row);
  if (!chunks) return std::nullopt;
  const int64_t chunk = *row / *chunks;

  // Which ops vary along the row: those indexed by a reduction variable (or by an indirect
  // symbol defined from one) and those computed from them, up to the reduction.
  std::set<sym::Expr> row_symbols(body.reduce_vars().begin(), body.reduce_vars().end());
  auto uses_row = [&](const sym::Expr& e) {
    for (const sym::Expr& s : row_symbols) {
      if (sym::has_symbol(e, s)) return true;
    }
    return false;
  };
  std::vector<bool> in_row(ops.size(), false);
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& op = ops[k];
    if (op.code == OpCode::kReduction) continue;
    bool v = uses_row(op.index);
    for (int j = 0; j < ir::op_arity(op.code); ++j) v = v || in_row[op.operands[j]];
    if (op.mask != ir::kNoValue) v = v || in_row[op.mask];
    in_row[k] = v;
    if (v && op.code == OpCode::kIndirect) row_symbols.insert(op.symbol);
  }

  // The partial reduction over [rows..., chunks], reducing `chunk` elements: the ops up to the
  // reduction with the row position written as chunk number * chunk + position in the chunk.
  const size_t n = body.sizes().size();
  std::vector<sym::Expr> partial_sizes = body.sizes();
  partial_sizes.push_back(sym::Expr(*chunks));
  Split split{ir::LoopBody(partial_sizes, {sym::Expr(chunk)}),
              ir::LoopBody(body.sizes(), {sym::Expr(*chunks)}), red.dtype};
  const sym::Expr position =
      ir::index_var(static_cast<int>(n)) * sym::Expr(chunk) + split.partial.reduce_vars()[0];
  sym::Substitution subst;
  {
    const ir::Layout row_layout = ir::Layout::contiguous(body.reduce_sizes());
    // The position is below the row's length: the first variable needs no modulo (and a
    // row of one variable is the position itself).
    for (size_t j = 0; j < body.reduce_vars().size(); ++j) {
      subst[body.reduce_vars()[j]] =
          j == 0 ? sym::floor_div(position, row_layout.strides[j])
                 : sym::modular_indexing(position, row_layout.strides[j], body.reduce_sizes()[j]);
    }
  }
  ValueId partial_value = ir::kNoValue;
  {
    // The body with the reduction as its result, inlined: its ops up to the reduction (the
    // later ones depend on the result and stay unused: kernels emit only what a store needs).
    ir::LoopBody source = body;
    source.set_result(reduction);
    partial_value = split.partial.inline_body(source, subst);
  }
  const sym::Expr rows_flat = sym::dot(body.vars(), ir::Layout::contiguous(body.sizes()).strides);
  split.partial.store(partial_name, red.dtype,
                      rows_flat * sym::Expr(*chunks) + ir::index_var(static_cast<int>(n)),
                      partial_value);

  // The final reduction: the row's partials in order, then every op that does not vary along
  // the row (what follows the reduction, and the per-row values it uses), rebuilt op by op.
  std::vector<ValueId> remap(ops.size(), ir::kNoValue);
  sym::Substitution symbols;  // indirect symbols of the body -> the final body's
  ir::LoopBody& f = split.final;
  const ValueId loaded =
      f.load(partial_name, red.dtype, rows_flat * sym::Expr(*chunks) + f.reduce_vars()[0]);
  for (size_t k = 0; k < ops.size(); ++k) {
    if (static_cast<ValueId>(k) == reduction) {
      remap[k] = f.reduction(red.reduction, loaded, red.dtype, red.select_last);
      continue;
    }
    if (in_row[k]) continue;
    const Op& op = ops[k];
    ValueId a[3] = {ir::kNoValue, ir::kNoValue, ir::kNoValue};
    for (int j = 0; j < ir::op_arity(op.code); ++j) {
      a[j] = remap[op.operands[j]];
      if (a[j] == ir::kNoValue) return std::nullopt;
    }
    const sym::Expr index = sym::substitute(op.index, symbols);
    ValueId v = ir::kNoValue;
    switch (op.code) {
      case OpCode::kLoad:
        if (op.mask == ir::kNoValue) {
          v = f.load(op.buffer, op.buffer_dtype, index);
        } else {
          if (remap[op.mask] == ir::kNoValue) return std::nullopt;
          v = f.masked_load(op.buffer, op.buffer_dtype, index, remap[op.mask], op.float_value);
        }
        break;
      case OpCode::kStore:
        v = f.store(op.buffer, op.buffer_dtype, index, a[0]);
        break;
      case OpCode::kConstant: {
        if (graph::is_floating(op.dtype)) {
          v = f.constant(op.float_value, op.dtype);
        } else {
          // Integer constants pass through a double: exact up to 2^53.
          if (op.int_value > (int64_t{1} << 53) || op.int_value < -(int64_t{1} << 53)) {
            return std::nullopt;
          }
          v = f.constant(static_cast<double>(op.int_value), op.dtype);
        }
        break;
      }
      case OpCode::kIndexExpr:
        v = f.index_expr(index, op.dtype);
        break;
      case OpCode::kIndirect:
        v = f.indirect(a[0], index);
        symbols[op.symbol] = f.op(v).symbol;
        break;
      case OpCode::kCast:
        v = f.cast(a[0], op.dtype);
        break;
      case OpCode::kBitCast:
        v = f.bitcast(a[0], op.bits_from, op.bits_to);
        break;
      case OpCode::kWhere:
        v = f.where(a[0], a[1], a[2]);
        break;
      case OpCode::kReduction:
        return std::nullopt;
      default:
        v = ir::op_arity(op.code) == 1 ? f.unary(op.code, a[0]) : f.binary(op.code, a[0], a[1]);
        break;
    }
    if (f.op(v).dtype != op.dtype) return std::nullopt;  // rebuilt as it was, or not at all
    remap[k] = v;
  }
  return split;
}

}  // namespace

int split_long_reductions(ir::Program& program) {
  int count = 0;
  for (size_t k = 0; k < program.buffers.size(); ++k) {
    ir::Buffer& buffer = *program.buffers[k];
    if (buffer.device != ir::Device::kCuda || !buffer.is_reduction()) continue;
    const std::string partial_name = buffer.name + "_partial";
    if (program.find(partial_name) != nullptr) continue;
    std::optional<Split> split = split_body(program, buffer, partial_name);
    if (!split) continue;
    auto partial = std::make_unique<ir::Buffer>();
    partial->name = partial_name;
    partial->kind = ir::BufferKind::kComputed;
    partial->dtype = split->partial_dtype;
    partial->device = ir::Device::kCuda;
    partial->layout = ir::Layout::contiguous(split->partial.sizes());
    partial->origins = buffer.origins;
    partial->body = std::move(split->partial);
    log::write(log::Category::kSchedule, "split reduction {}: partials {} in {}", buffer.name,
               partial->layout.str(), partial_name);
    buffer.body = std::move(split->final);
    program.buffers.insert(program.buffers.begin() + static_cast<std::ptrdiff_t>(k),
                           std::move(partial));
    ++k;
    ++count;
  }
  return count;
}

}  // namespace kiln::codegen
