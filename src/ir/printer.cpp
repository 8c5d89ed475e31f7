// Text forms of the loop IR, used by --dump and by tests.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "ir/buffer.h"
#include "ir/loop_body.h"

namespace kiln::ir {

namespace {

std::string ranges_str(const std::vector<sym::Expr>& vars, const std::vector<sym::Expr>& sizes) {
  std::string out;
  for (size_t k = 0; k < vars.size(); ++k) {
    if (k) out += ", ";
    out += vars[k].str() + " < " + sizes[k].str();
  }
  return out;
}

std::string op_str(const LoopBody& body, ValueId id) {
  const Op& op = body.op(id);
  std::string dt(graph::dtype_name(op.dtype));
  auto v = [](ValueId x) { return fmt::format("%{}", x); };
  switch (op.code) {
    case OpCode::kLoad:
      if (op.mask != kNoValue) {
        return fmt::format("%{} = load {}[{}] if {} else {} : {}", id, op.buffer, op.index.str(),
                           v(op.mask), op.float_value, dt);
      }
      return fmt::format("%{} = load {}[{}] : {}", id, op.buffer, op.index.str(), dt);
    case OpCode::kStore:
      return fmt::format("store {}[{}] = {}", op.buffer, op.index.str(), v(op.operands[0]));
    case OpCode::kConstant:
      if (graph::is_floating(op.dtype)) {
        return fmt::format("%{} = constant {} : {}", id, op.float_value, dt);
      }
      return fmt::format("%{} = constant {} : {}", id, op.int_value, dt);
    case OpCode::kIndexExpr:
      return fmt::format("%{} = index_expr {} : {}", id, op.index.str(), dt);
    case OpCode::kIndirect:
      return fmt::format("%{} = indirect {} = {} wrap {}", id, op.symbol.str(), v(op.operands[0]),
                         op.index.str());
    case OpCode::kCast:
      return fmt::format("%{} = cast {} : {}", id, v(op.operands[0]), dt);
    case OpCode::kBitCast:
      return fmt::format("%{} = bitcast {} from {} to {} : {}", id, v(op.operands[0]),
                         graph::dtype_name(op.bits_from), graph::dtype_name(op.bits_to), dt);
    case OpCode::kReduction:
      return fmt::format("%{} = reduction {}{} {} : {}", id, reduction_name(op.reduction),
                         op.select_last ? " last" : "", v(op.operands[0]), dt);
    default:
      break;
  }
  std::string args;
  for (int k = 0; k < op_arity(op.code); ++k) {
    if (k) args += ", ";
    args += v(op.operands[k]);
  }
  return fmt::format("%{} = {} {} : {}", id, op_name(op.code), args, dt);
}

}  // namespace

std::string LoopBody::str() const {
  std::string out = fmt::format("loops [{}]", ranges_str(vars_, sizes_));
  if (is_reduction()) out += fmt::format(" reduce [{}]", ranges_str(reduce_vars_, reduce_sizes_));
  out += "\n";
  for (size_t k = 0; k < ops_.size(); ++k) {
    out += "  " + op_str(*this, static_cast<ValueId>(k)) + "\n";
  }
  if (result_ != kNoValue) out += fmt::format("  result %{}\n", result_);
  return out;
}

std::string Layout::str() const {
  std::string s = "[", t = "[";
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (k) {
      s += ", ";
      t += ", ";
    }
    s += sizes[k].str();
    t += strides[k].str();
  }
  return s + "] stride " + t + "] offset " + offset.str();
}

std::string View::str() const {
  return fmt::format("{}:{}{}", buffer, graph::dtype_name(dtype), layout.str());
}

std::string Buffer::str() const {
  static constexpr const char* kKinds[] = {"input", "constant", "computed", "extern"};
  std::string out = fmt::format("{} = {} {} {}", name, kKinds[static_cast<int>(kind)],
                                graph::dtype_name(dtype), layout.str());
  if (!origins.empty()) {
    out += "  # from";
    for (const Origin& o : origins) out += fmt::format(" {}({})", o.node, o.op_type);
  }
  out += "\n";
  if (kind == BufferKind::kComputed) {
    std::string body_text = body.str();
    size_t pos = 0;
    while (pos < body_text.size()) {
      size_t nl = body_text.find('\n', pos);
      out += "  " + body_text.substr(pos, nl - pos + 1);
      pos = nl + 1;
    }
  } else if (kind == BufferKind::kExtern) {
    out += "  extern " + call.name() + "(";
    for (size_t k = 0; k < call.inputs.size(); ++k) {
      if (k) out += ", ";
      out += call.inputs[k] ? call.inputs[k]->str() : "none";
    }
    out += ")\n";
  }
  return out;
}

std::string Program::str() const {
  std::string out;
  for (const InputSpec& in : inputs) {
    out += fmt::format("input {} -> {}\n", in.onnx_name, in.buffer);
  }
  for (const auto& b : buffers) out += b->str();
  for (const OutputSpec& o : outputs)
    out += fmt::format("output {} <- {}\n", o.onnx_name, o.buffer);
  for (const auto& g : subgraphs) {
    out += fmt::format("\nsubgraph {} (captures", g->name);
    for (const std::string& c : g->captures) out += " " + c;
    out += ")\n";
    std::string inner = g->program.str();
    for (size_t pos = 0, end; pos < inner.size(); pos = end + 1) {
      end = inner.find('\n', pos);
      if (end == std::string::npos) end = inner.size();
      out += "  " + inner.substr(pos, end - pos) + "\n";
    }
  }
  return out;
}

}  // namespace kiln::ir
