// Constant folding by interpretation: a foldable value or buffer is evaluated by copying the
// buffers it needs into a small Program and running the reference interpreter on it, so folded
// results have exactly the dtype semantics of generated code (wrapping integers, float16
// rounding) without a second implementation of the ops.
#include "lower/constant_fold.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ir/interpreter.h"
#include "support/error.h"
#include "support/log.h"

namespace kiln::lower {

namespace {

bool has_index(ir::OpCode code) {
  return code == ir::OpCode::kLoad || code == ir::OpCode::kStore ||
         code == ir::OpCode::kIndexExpr || code == ir::OpCode::kIndirect;
}

bool all_integers(const std::vector<sym::Expr>& exprs) {
  return std::all_of(exprs.begin(), exprs.end(), [](const sym::Expr& e) { return e.is_integer(); });
}

bool is_static_layout(const ir::Layout& layout) {
  return all_integers(layout.sizes) && all_integers(layout.strides) && layout.offset.is_integer();
}

/// Whether every index of `body` mentions only index variables (loop, reduction or indirect),
/// never a size symbol, and its loop sizes are static: then it evaluates without any binding.
bool has_static_indices(const ir::LoopBody& body) {
  if (!all_integers(body.sizes()) || !all_integers(body.reduce_sizes())) return false;
  for (const ir::Op& op : body.ops()) {
    if (!has_index(op.code)) continue;
    for (const sym::Expr& s : sym::free_symbols(op.index)) {
      if (s.symbol_kind() != sym::SymbolKind::kIndex) return false;
    }
  }
  return true;
}

double static_numel(const std::vector<sym::Expr>& sizes) {
  double n = 1;
  for (const sym::Expr& s : sizes) n *= static_cast<double>(*s.as_integer());
  return n;
}

/// Elements times ops: the interpreter's cost of evaluating a body (at least one op per element,
/// so copies count too).
double body_work(const ir::LoopBody& body) {
  return static_numel(body.sizes()) * std::max(1.0, static_numel(body.reduce_sizes())) *
         std::max<double>(1, static_cast<double>(body.ops().size()));
}

/// Multiply-adds of a reference extern call: each output element sums over the contracted dim
/// (matmul) or over one output channel's weights (conv).
double extern_work(const ir::Buffer& buffer) {
  double out = static_numel(buffer.layout.sizes);
  const ir::ExternCall& call = buffer.call;
  const bool matmul = call.as<ir::MatMulCall>() != nullptr;
  size_t weight = matmul ? 0 : 1;
  if (call.inputs.size() <= weight || !call.inputs[weight]) return out;
  const std::vector<sym::Expr>& sizes = call.inputs[weight]->layout.sizes;
  if (sizes.empty()) return out;
  if (matmul) return out * static_cast<double>(*sizes.back().as_integer());
  return out * static_numel(sizes) /
         std::max<double>(1, static_cast<double>(*sizes[0].as_integer()));
}

/// Answers which buffers of a program can be evaluated at compile time and evaluates them.
/// Answers are remembered in `foldable` by buffer name: a buffer's body and reads do not change
/// once lowered, so lowering keeps one memo for the whole graph (LoweringContext), and settling
/// each node costs only its own reads instead of a walk back through every buffer before it.
class Folder {
 public:
  Folder(const ir::Program& program, std::map<std::string, bool>& foldable)
      : program_(program), foldable_(foldable) {}

  /// Whether buffer `name` depends only on constants and evaluates without a size binding.
  bool is_foldable(const std::string& name) {
    auto it = foldable_.find(name);
    if (it != foldable_.end()) return it->second;
    const ir::Buffer* buffer = program_.find(name);
    bool foldable = buffer != nullptr && is_foldable(*buffer);
    foldable_[name] = foldable;
    return foldable;
  }

  bool reads_foldable(const std::vector<std::string>& reads) {
    return std::all_of(reads.begin(), reads.end(),
                       [&](const std::string& name) { return is_foldable(name); });
  }

  /// The work of evaluating `target` and every non-constant buffer it needs.
  double work(const ir::Buffer& target) {
    double total = own_work(target);
    for (const ir::Buffer* b : needed(target)) total += own_work(*b);
    return total;
  }

  /// Evaluates `target` (a computed or extern buffer whose reads are all foldable; it need not
  /// be in the program). Nullopt when the evaluation raises a UserError, which the generated code
  /// will raise again at run time.
  std::optional<graph::Tensor> evaluate(const ir::Buffer& target) {
    ir::Program small;
    std::set<std::string> names;
    for (const ir::Buffer* b : needed(target)) {
      small.buffers.push_back(std::make_unique<ir::Buffer>(*b));  // constants share their tensor
      names.insert(b->name);
    }
    small.buffers.push_back(std::make_unique<ir::Buffer>(target));
    names.insert(target.name);
    for (const ir::IndexCheck& check : program_.index_checks) {
      if (names.count(check.buffer)) small.index_checks.push_back(check);
    }
    small.outputs.push_back({"folded", target.name, target.dtype, target.layout.sizes});
    try {
      return std::move(ir::interpret(small, {}).at("folded"));
    } catch (const UserError& e) {
      log::write(log::Category::kSchedule, "not folding {}: {}", target.name, e.what());
      return std::nullopt;
    }
  }

 private:
  bool is_foldable(const ir::Buffer& buffer) {
    switch (buffer.kind) {
      case ir::BufferKind::kInput:
        return false;
      case ir::BufferKind::kConstant:
        return buffer.constant != nullptr && buffer.dtype != graph::DType::kString;
      case ir::BufferKind::kComputed:
        return is_static_layout(buffer.layout) && has_static_indices(buffer.body) &&
               reads_foldable(buffer.reads());
      case ir::BufferKind::kExtern: {
        const ir::ExternCall& call = buffer.call;
        if (!call.as<ir::MatMulCall>() && !call.as<ir::ConvCall>()) return false;  // no reference
        for (const auto& view : call.inputs) {
          if (view && !is_static_layout(view->layout)) return false;
        }
        return is_static_layout(buffer.layout) && reads_foldable(buffer.reads());
      }
    }
    return false;
  }

  static double own_work(const ir::Buffer& buffer) {
    switch (buffer.kind) {
      case ir::BufferKind::kComputed:
        return body_work(buffer.body);
      case ir::BufferKind::kExtern:
        return extern_work(buffer);
      default:
        return 0;
    }
  }

  /// The program's buffers that `target` reads, directly or transitively, in program order.
  std::vector<const ir::Buffer*> needed(const ir::Buffer& target) const {
    std::set<std::string> seen;
    std::vector<std::string> stack = target.reads();
    while (!stack.empty()) {
      std::string name = std::move(stack.back());
      stack.pop_back();
      if (!seen.insert(name).second) continue;
      const ir::Buffer* b = program_.find(name);
      KILN_CHECK(b != nullptr, "constant folding: {} reads missing buffer {}", target.name, name);
      for (std::string& r : b->reads()) stack.push_back(std::move(r));
    }
    std::vector<const ir::Buffer*> out;
    for (const auto& b : program_.buffers) {
      if (seen.count(b->name)) out.push_back(b.get());
    }
    return out;
  }

  const ir::Program& program_;
  std::map<std::string, bool>& foldable_;
};

/// A computed buffer, named apart from every buffer of `program`, storing `value` contiguously.
ir::Buffer value_buffer(const ir::Program& program, const TensorValue& value) {
  ir::Buffer buffer;
  buffer.name = "folded";
  while (program.find(buffer.name) != nullptr) buffer.name += "_";
  buffer.kind = ir::BufferKind::kComputed;
  buffer.dtype = value.dtype;
  buffer.layout = ir::Layout::contiguous(value.shape);
  buffer.body = *value.body;
  ir::ValueId result = buffer.body.result();
  buffer.body.set_result(ir::kNoValue);
  buffer.body.store(buffer.name, value.dtype, buffer.layout.index(buffer.body.vars()), result);
  return buffer;
}

bool within_budget(double work, const std::string& what) {
  if (work <= static_cast<double>(kMaxFoldWork)) return true;
  log::write(log::Category::kSchedule, "not folding {}: {:.0f} element-ops over the budget of {}",
             what, work, kMaxFoldWork);
  return false;
}

}  // namespace

bool is_small_transposing_view(const ir::Program& program, const ir::LoopBody& body) {
  if (body.vars().empty() || body.compute_op_count() > 0) return false;
  const sym::Expr& last = body.vars().back();
  if (body.sizes().back().as_integer() == std::optional<int64_t>(1)) return false;
  bool transposes = false;
  for (const ir::Op& op : body.ops()) {
    if (op.code != ir::OpCode::kLoad) continue;
    const ir::Buffer* base = program.find(op.buffer);
    if (base == nullptr || base->kind != ir::BufferKind::kConstant || !base->constant ||
        base->constant->nbytes() > kMaxTransposedViewBytes)
      return false;
    const std::optional<int64_t> step =
        (sym::substitute(op.index, sym::Substitution{{last, last + 1}}) - op.index).as_integer();
    transposes = transposes || !step || (*step != 0 && *step != 1);
  }
  return transposes;
}

std::optional<TensorValue> fold_constant(LoweringContext& ctx, const TensorValue& value) {
  if (!value.body || value.body->is_reduction() || !all_integers(value.shape)) return std::nullopt;
  if (!has_static_indices(*value.body)) return std::nullopt;
  Folder folder(ctx.program(), ctx.foldable_buffers());
  std::vector<std::string> reads = value.body->loaded_buffers();
  // A generator reading no buffer (Range, EyeLike, a filled tensor) is cheaper to compute where
  // it is consumed than to load from memory.
  if (reads.empty() || !folder.reads_foldable(reads)) return std::nullopt;
  // Views of constants cost nothing at run time (consumers inline the index remap or take a
  // strided view) and folding them would copy the weight; but not a small one that transposes.
  bool computes = value.body->compute_op_count() > 0;
  for (const std::string& name : reads) {
    computes = computes || ctx.program().find(name)->kind != ir::BufferKind::kConstant;
  }
  if (!computes && !is_small_transposing_view(ctx.program(), *value.body)) return std::nullopt;
  ir::Buffer target = value_buffer(ctx.program(), value);
  std::string what = ctx.node().describe();
  if (!within_budget(folder.work(target), what)) return std::nullopt;
  std::optional<graph::Tensor> tensor = folder.evaluate(target);
  if (!tensor) return std::nullopt;
  TensorValue folded = ctx.from_constant(std::make_shared<const graph::Tensor>(std::move(*tensor)));
  ir::Buffer* buffer = ctx.program().find(*ctx.as_buffer(folded));
  for (const ir::Origin& origin : value.origins) buffer->add_origin(origin);
  log::write(log::Category::kSchedule, "folded {} into constant {}", what, buffer->name);
  return folded;
}

void finish_constant_folding(ir::Program& program) {
  // Pruning first spares evaluating buffers whose users were folded already; pruning again drops
  // the buffers that only fed the newly folded ones.
  prune_unreachable_buffers(program);
  fold_constant_buffers(program);
  prune_unreachable_buffers(program);
}

void fold_constant_buffers(ir::Program& program) {
  std::set<std::string> outputs;
  for (const ir::OutputSpec& out : program.outputs) outputs.insert(out.buffer);
  // Folding turns buffers into constants as it goes, so this pass keeps its own memo.
  std::map<std::string, bool> foldable;
  Folder folder(program, foldable);
  for (auto& buffer : program.buffers) {
    bool runs =
        buffer->kind == ir::BufferKind::kComputed || buffer->kind == ir::BufferKind::kExtern;
    if (!runs || outputs.count(buffer->name) || !folder.is_foldable(buffer->name)) continue;
    // The wrapper binds a constant's data as a dense row-major array.
    if (!buffer->layout.is_contiguous()) continue;
    if (!within_budget(folder.work(*buffer), buffer->name)) continue;
    std::optional<graph::Tensor> tensor = folder.evaluate(*buffer);
    if (!tensor) continue;
    buffer->kind = ir::BufferKind::kConstant;
    buffer->constant = std::make_shared<const graph::Tensor>(std::move(*tensor));
    buffer->layout = ir::Layout::contiguous(buffer->layout.sizes);
    buffer->body = ir::LoopBody();
    buffer->call = ir::ExternCall();
    log::write(log::Category::kSchedule, "folded buffer {} into a constant", buffer->name);
  }
}

void prune_unreachable_buffers(ir::Program& program) {
  std::set<std::string> live;
  for (const ir::OutputSpec& out : program.outputs) live.insert(out.buffer);
  std::set<std::string> dead;
  for (auto it = program.buffers.rbegin(); it != program.buffers.rend(); ++it) {
    const ir::Buffer& b = **it;
    bool runs = b.kind == ir::BufferKind::kComputed || b.kind == ir::BufferKind::kExtern;
    if (runs && !live.count(b.name)) {
      log::write(log::Category::kSchedule, "pruned unreachable buffer {}", b.name);
      dead.insert(b.name);
      continue;
    }
    for (const std::string& r : b.reads()) live.insert(r);
    for (const std::string& r : ir::dynamic_size_sources(program, b)) live.insert(r);
  }
  std::erase_if(program.buffers,
                [&](const std::unique_ptr<ir::Buffer>& b) { return dead.count(b->name) > 0; });
  std::erase_if(program.index_checks,
                [&](const ir::IndexCheck& c) { return dead.count(c.buffer) > 0; });
  std::erase_if(program.extent_checks,
                [&](const ir::ExtentCheck& c) { return dead.count(c.buffer) > 0; });
}

}  // namespace kiln::lower
