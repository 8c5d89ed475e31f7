// The reference interpreter's driver: binds size symbols, evaluates buffers in program order and
// reads the outputs back. A LoopBody is evaluated per pointwise index in three phases: ops that
// do not depend on the reduction variables (once), ops that do (once per reduction index, in
// row-major order, feeding the reductions' accumulators), and ops that use a reduction's result.
#include "ir/interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/interpreter_memory.h"
#include "ir/interpreter_scalar.h"
#include "support/error.h"

namespace kiln::ir {

using graph::DType;
using interp::Scalar;
using interp::Storage;
using interp::Storages;

namespace {

/// The largest / smallest value of an integer dtype, as stored in Scalar::i.
int64_t int_limit(DType dtype, bool want_max) {
  if (dtype == DType::kBool) return want_max ? 1 : 0;
  int64_t bits = 8 * graph::dtype_size(dtype);
  if (!graph::is_signed(dtype)) {
    if (!want_max) return 0;
    return bits == 64 ? -1 : (int64_t{1} << bits) - 1;  // uint64 max is all ones
  }
  if (bits == 64) {
    return want_max ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  }
  return want_max ? (int64_t{1} << (bits - 1)) - 1 : -(int64_t{1} << (bits - 1));
}

/// a < b in the order of dtype `t`; NaN compares as neither.
bool less_than(Scalar a, Scalar b, DType t) {
  if (interp::is_float_dtype(t)) return a.f < b.f;
  if (t == DType::kUInt64) return static_cast<uint64_t>(a.i) < static_cast<uint64_t>(b.i);
  return a.i < b.i;
}

bool is_nan(Scalar a, DType t) { return interp::is_float_dtype(t) && std::isnan(a.f); }

/// One reduction's running state. Values are accumulated in double (floats) or wrapping 64-bit
/// integers and converted to the reduction's dtype at the end.
class Accumulator {
 public:
  Accumulator(const Op& op, DType in) : type_(op.reduction), in_(in), out_(op.dtype) {
    select_last_ = op.select_last;
  }

  void add(Scalar v) {
    switch (type_) {
      case ReductionType::kSum:
        return add_sum(v);
      case ReductionType::kProd:
        return add_prod(v);
      case ReductionType::kMax:
      case ReductionType::kMin:
        return add_extremum(v, type_ == ReductionType::kMax);
      case ReductionType::kArgMax:
      case ReductionType::kArgMin:
        return add_arg(v, type_ == ReductionType::kArgMax);
      case ReductionType::kWelfordMean:
      case ReductionType::kWelfordVar:
        return add_welford(interp::to_double(v, in_));
      case ReductionType::kAny:
        any_ = any_ || v.i != 0;
        return;
      case ReductionType::kAll:
        all_ = all_ && v.i != 0;
        return;
    }
  }

  Scalar result() const {
    switch (type_) {
      case ReductionType::kSum:
        return in_float() ? of_double(sum_) : of_int(isum_);
      case ReductionType::kProd:
        if (count_ == 0) return interp::cast(Scalar{1, 1}, in_, out_);  // empty product
        return in_float() ? of_double(sum_) : of_int(isum_);
      case ReductionType::kMax:
      case ReductionType::kMin:
        return extremum_result();
      case ReductionType::kArgMax:
      case ReductionType::kArgMin:
        return interp::cast(Scalar{0, best_index_}, DType::kInt64, out_);
      case ReductionType::kWelfordMean:
        return of_double(count_ == 0 ? NAN : mean_);
      case ReductionType::kWelfordVar:
        return of_double(count_ == 0 ? NAN : m2_ / count_);
      case ReductionType::kAny:
        return interp::cast(Scalar{0, any_}, DType::kBool, out_);
      case ReductionType::kAll:
        return interp::cast(Scalar{0, all_}, DType::kBool, out_);
    }
    internal_error("interpreter: unknown reduction");
  }

 private:
  bool in_float() const { return interp::is_float_dtype(in_); }
  Scalar of_double(double v) const { return interp::cast(Scalar{v, 0}, DType::kFloat64, out_); }
  Scalar of_int(uint64_t v) const {
    return interp::cast(Scalar{0, interp::wrap_int(static_cast<int64_t>(v), in_)}, in_, out_);
  }

  void add_sum(Scalar v) {
    if (in_float()) {
      sum_ = count_ == 0 ? v.f : sum_ + v.f;
    } else {
      isum_ = count_ == 0 ? static_cast<uint64_t>(v.i) : isum_ + static_cast<uint64_t>(v.i);
    }
    ++count_;
  }

  void add_prod(Scalar v) {
    if (in_float()) {
      sum_ = count_ == 0 ? v.f : sum_ * v.f;
    } else {
      isum_ = count_ == 0 ? static_cast<uint64_t>(v.i) : isum_ * static_cast<uint64_t>(v.i);
    }
    ++count_;
  }

  void add_extremum(Scalar v, bool want_max) {
    if (count_ == 0 || is_nan(best_, in_)) {
      if (count_ == 0) best_ = v;
    } else if (is_nan(v, in_)) {
      best_ = v;  // NaN propagates
    } else if (want_max ? less_than(best_, v, in_) : less_than(v, best_, in_)) {
      best_ = v;
    }
    ++count_;
  }

  Scalar extremum_result() const {
    if (count_ > 0) return interp::cast(best_, in_, out_);
    bool want_max = type_ == ReductionType::kMax;  // identity: -inf for max, +inf for min
    if (in_float()) return of_double(want_max ? -INFINITY : INFINITY);
    return interp::cast(Scalar{0, int_limit(in_, !want_max)}, in_, out_);
  }

  /// numpy's argmax / argmin: NaN wins (first NaN, or last with select_last); ties keep the
  /// first index unless select_last.
  void add_arg(Scalar v, bool want_max) {
    int64_t index = static_cast<int64_t>(count_++);
    if (index == 0) return take(v, index);
    bool best_nan = is_nan(best_, in_);
    bool v_nan = is_nan(v, in_);
    if (best_nan || v_nan) {
      if (v_nan && (!best_nan || select_last_)) take(v, index);
      return;
    }
    bool better = want_max ? less_than(best_, v, in_) : less_than(v, best_, in_);
    bool tie = !less_than(best_, v, in_) && !less_than(v, best_, in_);
    if (better || (tie && select_last_)) take(v, index);
  }

  void take(Scalar v, int64_t index) {
    best_ = v;
    best_index_ = index;
  }

  void add_welford(double x) {
    ++count_;
    double delta = x - mean_;
    mean_ += delta / static_cast<double>(count_);
    m2_ += delta * (x - mean_);
  }

  ReductionType type_;
  DType in_;
  DType out_;
  bool select_last_ = false;
  uint64_t count_ = 0;
  double sum_ = 0;
  uint64_t isum_ = 0;
  Scalar best_;
  int64_t best_index_ = 0;
  double mean_ = 0;
  double m2_ = 0;
  bool any_ = false;
  bool all_ = true;
};

enum class Phase : uint8_t { kInvariant, kInner, kPost };

bool has_index(OpCode code) {
  return code == OpCode::kLoad || code == OpCode::kStore || code == OpCode::kIndexExpr ||
         code == OpCode::kIndirect;
}

/// Evaluates one buffer's LoopBody over all its indices.
class BodyEvaluator {
 public:
  BodyEvaluator(const Buffer& buffer, Storages& storages, sym::Binding binding)
      : buffer_(buffer), body_(buffer.body), storages_(storages), binding_(std::move(binding)) {
    values_.resize(body_.ops().size());
    classify();
  }

  void run() {
    std::vector<int64_t> sizes = interp::evaluate_all(body_.sizes(), binding_);
    std::vector<int64_t> reduce_sizes = interp::evaluate_all(body_.reduce_sizes(), binding_);
    interp::for_each_index(sizes, [&](const std::vector<int64_t>& index) {
      bind(body_.vars(), index);
      eval_phase(Phase::kInvariant);
      if (!body_.is_reduction()) return;
      std::vector<Accumulator> accumulators;
      for (ValueId id : reductions_) accumulators.emplace_back(body_.op(id), operand_dtype(id));
      interp::for_each_index(reduce_sizes, [&](const std::vector<int64_t>& rindex) {
        bind(body_.reduce_vars(), rindex);
        eval_phase(Phase::kInner);
        for (size_t k = 0; k < reductions_.size(); ++k) {
          accumulators[k].add(values_[static_cast<size_t>(body_.op(reductions_[k]).operands[0])]);
        }
      });
      for (const sym::Expr& r : body_.reduce_vars()) binding_.erase(r.name());
      for (size_t k = 0; k < reductions_.size(); ++k) {
        values_[static_cast<size_t>(reductions_[k])] = accumulators[k].result();
      }
      eval_phase(Phase::kPost);
    });
  }

 private:
  DType operand_dtype(ValueId id) const { return body_.dtype(body_.op(id).operands[0]); }

  void bind(const std::vector<sym::Expr>& vars, const std::vector<int64_t>& index) {
    for (size_t k = 0; k < vars.size(); ++k) binding_[vars[k].name()] = index[k];
  }

  /// Sorts ops into phases by what they depend on: reduction variables (directly or through
  /// indirect symbols and operands) make an op inner; a reduction's result makes it post.
  void classify() {
    std::map<std::string, Phase> symbol_phase;
    for (const sym::Expr& r : body_.reduce_vars()) symbol_phase[r.name()] = Phase::kInner;
    phases_.resize(body_.ops().size(), Phase::kInvariant);
    for (size_t k = 0; k < body_.ops().size(); ++k) {
      const Op& op = body_.ops()[k];
      Phase phase = Phase::kInvariant;
      for (int j = 0; j < op_arity(op.code); ++j) {
        phase = std::max(phase, phases_[static_cast<size_t>(op.operands[j])]);
      }
      if (op.mask != kNoValue) phase = std::max(phase, phases_[static_cast<size_t>(op.mask)]);
      if (has_index(op.code)) {
        for (const sym::Expr& s : sym::free_symbols(op.index)) {
          auto it = symbol_phase.find(s.name());
          if (it != symbol_phase.end()) phase = std::max(phase, it->second);
        }
      }
      if (op.code == OpCode::kReduction) {
        KILN_CHECK(phase != Phase::kPost, "buffer {}: reduction %{} of a reduction's result",
                   buffer_.name, k);
        reductions_.push_back(static_cast<ValueId>(k));
        phase = Phase::kPost;
      }
      if (op.code == OpCode::kIndirect) symbol_phase[op.symbol.name()] = phase;
      phases_[k] = phase;
      if (op.code != OpCode::kReduction) by_phase_[static_cast<size_t>(phase)].push_back(k);
    }
  }

  void eval_phase(Phase phase) {
    for (size_t k : by_phase_[static_cast<size_t>(phase)]) values_[k] = eval(body_.ops()[k]);
  }

  Scalar value(ValueId id) const { return values_[static_cast<size_t>(id)]; }

  Scalar eval(const Op& op) {
    switch (op.code) {
      case OpCode::kLoad:
        return load(op);
      case OpCode::kStore:
        return store(op);
      case OpCode::kConstant:
        return interp::is_float_dtype(op.dtype)
                   ? interp::from_double(op.float_value, op.dtype)
                   : Scalar{0, interp::wrap_int(op.int_value, op.dtype)};
      case OpCode::kIndexExpr:
        return interp::cast(Scalar{0, sym::evaluate(op.index, binding_)}, DType::kInt64, op.dtype);
      case OpCode::kIndirect:
        return indirect(op);
      case OpCode::kCast:
        return interp::cast(value(op.operands[0]), body_.dtype(op.operands[0]), op.dtype);
      case OpCode::kBitCast:
        return interp::bitcast(value(op.operands[0]), op.bits_from, op.bits_to);
      case OpCode::kWhere:
        return value(op.operands[0]).i != 0 ? value(op.operands[1]) : value(op.operands[2]);
      case OpCode::kReduction:
        internal_error("interpreter: reduction evaluated as an op");
      default:
        break;
    }
    if (op_arity(op.code) == 1) {
      return interp::apply_unary(op.code, value(op.operands[0]), body_.dtype(op.operands[0]),
                                 op.dtype);
    }
    return interp::apply_binary(op.code, value(op.operands[0]), body_.dtype(op.operands[0]),
                                value(op.operands[1]), body_.dtype(op.operands[1]), op.dtype);
  }

  Storage& storage(const Op& op) {
    auto it = storages_.find(op.buffer);
    KILN_CHECK(it != storages_.end(), "buffer {} accesses {} before it exists", buffer_.name,
               op.buffer);
    KILN_CHECK(it->second.dtype == op.buffer_dtype, "buffer {} accesses {} as {}, but it is {}",
               buffer_.name, op.buffer, graph::dtype_name(op.buffer_dtype),
               graph::dtype_name(it->second.dtype));
    return it->second;
  }

  Scalar load(const Op& op) {
    if (op.mask != kNoValue && value(op.mask).i == 0) {
      return interp::from_double(op.float_value, op.dtype);
    }
    // A storage holds its elements as values of the compute dtype (float8 and float4 as float32,
    // int4 and int2 as int32), already rounded to the element type.
    Scalar v = storage(op).read(sym::evaluate(op.index, binding_), op.buffer);
    return interp::cast(v, graph::compute_dtype(op.buffer_dtype), op.dtype);
  }

  Scalar store(const Op& op) {
    Scalar v = value(op.operands[0]);
    storage(op).write(sym::evaluate(op.index, binding_),
                      interp::to_storage(v, body_.dtype(op.operands[0]), op.buffer_dtype),
                      op.buffer);
    return v;
  }

  Scalar indirect(const Op& op) {
    DType from = body_.dtype(op.operands[0]);
    Scalar raw = value(op.operands[0]);
    int64_t size = sym::evaluate(op.index, binding_);
    if (from == DType::kUInt64 && raw.i < 0) {
      user_error("buffer {}: index {} out of range [-{}, {})", buffer_.name,
                 static_cast<uint64_t>(raw.i), size, size);
    }
    int64_t v = raw.i < 0 ? raw.i + size : raw.i;
    if (v < 0 || v >= size) {
      user_error("buffer {}: index {} out of range [-{}, {})", buffer_.name, raw.i, size, size);
    }
    binding_[op.symbol.name()] = v;
    return Scalar{0, v};
  }

  const Buffer& buffer_;
  const LoopBody& body_;
  Storages& storages_;
  sym::Binding binding_;
  std::vector<Scalar> values_;
  std::vector<Phase> phases_;
  std::vector<size_t> by_phase_[3];
  std::vector<ValueId> reductions_;
};

/// Binds every size symbol that appears alone as an input dim, then checks every dim.
sym::Binding bind_sizes(const Program& program,
                        const std::map<std::string, graph::Tensor>& inputs) {
  sym::Binding binding;
  for (const InputSpec& spec : program.inputs) {
    auto it = inputs.find(spec.onnx_name);
    if (it == inputs.end()) user_error("missing input '{}'", spec.onnx_name);
    const graph::Tensor& t = it->second;
    if (t.dtype() != spec.dtype) {
      user_error("input '{}': expected {}, found {}", spec.onnx_name, graph::dtype_name(spec.dtype),
                 graph::dtype_name(t.dtype()));
    }
    if (t.rank() != static_cast<int64_t>(spec.shape.size())) {
      user_error("input '{}': expected rank {}, found rank {}", spec.onnx_name, spec.shape.size(),
                 t.rank());
    }
    for (size_t k = 0; k < spec.shape.size(); ++k) {
      if (spec.shape[k].is_symbol()) binding.emplace(spec.shape[k].name(), t.dims()[k]);
    }
  }
  for (const InputSpec& spec : program.inputs) {
    const graph::Tensor& t = inputs.at(spec.onnx_name);
    for (size_t k = 0; k < spec.shape.size(); ++k) {
      int64_t expected = sym::evaluate(spec.shape[k], binding);
      if (expected != t.dims()[k]) {
        user_error("input '{}': dim {} is {}, expected {} ({})", spec.onnx_name, k, t.dims()[k],
                   expected, spec.shape[k].str());
      }
    }
  }
  for (const auto& [name, tensor] : inputs) {
    bool known = false;
    for (const InputSpec& spec : program.inputs) known = known || spec.onnx_name == name;
    if (!known) user_error("unknown input '{}'", name);
  }
  return binding;
}

/// Copies a row-major tensor into a buffer's storage through the buffer's layout.
Storage storage_from_tensor(const Buffer& buffer, const graph::Tensor& tensor,
                            const sym::Binding& binding) {
  interp::ConcreteLayout layout = interp::concretize(buffer.layout, binding);
  KILN_CHECK(layout.numel() == tensor.numel(), "buffer {} holds {} elements, its tensor {}",
             buffer.name, layout.numel(), tensor.numel());
  KILN_CHECK(tensor.dtype() == buffer.dtype, "buffer {} is {}, its tensor {}", buffer.name,
             graph::dtype_name(buffer.dtype), graph::dtype_name(tensor.dtype()));
  Storage storage(buffer.dtype, layout.storage_size());
  int64_t k = 0;
  interp::for_each_index(layout.sizes, [&](const std::vector<int64_t>& index) {
    storage.write(layout.at(index), interp::read_element(tensor, k++), buffer.name);
  });
  return storage;
}

void check_indices(const Program& program, const std::string& name, const Storages& storages,
                   const sym::Binding& binding) {
  for (const IndexCheck& check : program.index_checks) {
    if (check.buffer != name) continue;
    const Buffer* buffer = program.find(name);
    const Storage& storage = storages.at(name);
    interp::ConcreteLayout layout = interp::concretize(buffer->layout, binding);
    int64_t size = sym::evaluate(check.size, binding);
    interp::for_each_index(layout.sizes, [&](const std::vector<int64_t>& index) {
      Scalar v = storage.read(layout.at(index), name);
      double d = interp::to_double(v, storage.dtype);
      if (check.ignored && d == static_cast<double>(*check.ignored)) return;
      if (d < static_cast<double>(-size) || d >= static_cast<double>(size)) {
        user_error("{}: index {} out of range [-{}, {})", check.node, d, size, size);
      }
    });
  }
}

void evaluate_buffer(const Buffer& buffer, const Program& program,
                     const std::map<std::string, graph::Tensor>& inputs, Storages& storages,
                     const sym::Binding& binding) {
  switch (buffer.kind) {
    case BufferKind::kInput: {
      const InputSpec* spec = nullptr;
      for (const InputSpec& s : program.inputs) {
        if (s.buffer == buffer.name) spec = &s;
      }
      KILN_CHECK(spec != nullptr, "input buffer {} has no InputSpec", buffer.name);
      storages[buffer.name] = storage_from_tensor(buffer, inputs.at(spec->onnx_name), binding);
      return;
    }
    case BufferKind::kConstant:
      KILN_CHECK(buffer.constant != nullptr, "constant buffer {} has no data", buffer.name);
      storages[buffer.name] = storage_from_tensor(buffer, *buffer.constant, binding);
      return;
    case BufferKind::kComputed:
    case BufferKind::kExtern: {
      int64_t size = interp::concretize(buffer.layout, binding).storage_size();
      storages[buffer.name] = Storage(buffer.dtype, size);
      if (buffer.kind == BufferKind::kExtern) return interp::run_extern(buffer, storages, binding);
      BodyEvaluator(buffer, storages, binding).run();
      return;
    }
  }
}

graph::Tensor read_output(const OutputSpec& spec, const Program& program, const Storages& storages,
                          const sym::Binding& binding) {
  const Buffer* buffer = program.find(spec.buffer);
  KILN_CHECK(buffer != nullptr, "output '{}' names missing buffer {}", spec.onnx_name, spec.buffer);
  interp::ConcreteLayout layout = interp::concretize(buffer->layout, binding);
  std::vector<int64_t> dims = interp::evaluate_all(spec.shape, binding);
  KILN_CHECK(dims == layout.sizes, "output '{}': spec shape and layout of {} differ",
             spec.onnx_name, spec.buffer);
  const Storage& storage = storages.at(spec.buffer);
  graph::Tensor out(spec.dtype, dims);
  int64_t k = 0;
  interp::for_each_index(dims, [&](const std::vector<int64_t>& index) {
    interp::write_element(out, k++, storage.read(layout.at(index), spec.buffer),
                          graph::compute_dtype(storage.dtype));
  });
  return out;
}

}  // namespace

std::map<std::string, graph::Tensor> interpret(
    const Program& program, const std::map<std::string, graph::Tensor>& inputs_by_onnx_name) {
  sym::Binding binding = bind_sizes(program, inputs_by_onnx_name);
  for (const ExtentCheck& check : program.extent_checks) {
    int64_t outputs = sym::evaluate(check.outputs, binding);
    if (sym::evaluate(check.extent, binding) == 0 && outputs > 0) {
      user_error(
          "{}: the reduced axis is empty (size 0), so there is no index to return for {} "
          "outputs",
          check.node, outputs);
    }
  }
  Storages storages;
  for (const auto& buffer : program.buffers) {
    evaluate_buffer(*buffer, program, inputs_by_onnx_name, storages, binding);
    check_indices(program, buffer->name, storages, binding);
  }
  std::map<std::string, graph::Tensor> outputs;
  for (const OutputSpec& spec : program.outputs) {
    outputs.emplace(spec.onnx_name, read_output(spec, program, storages, binding));
  }
  return outputs;
}

}  // namespace kiln::ir
