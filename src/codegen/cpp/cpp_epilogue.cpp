#include "codegen/cpp/cpp_epilogue.h"

#include <fmt/format.h>

#include <map>

#include "codegen/cpp/cpp_ops.h"

namespace kiln::codegen {

using ir::OpCode;

std::optional<GemmEpilogueCode> gemm_epilogue(const ir::Buffer& fused) {
  std::vector<const ir::Buffer*> stages;
  for (const auto& b : fused.call.epilogue_chain) stages.push_back(b.get());
  stages.push_back(&fused);
  const std::vector<sym::Expr>& vars = fused.body.vars();
  const std::vector<sym::Expr>& sizes = fused.layout.sizes;
  if (vars.size() < 2 || vars.size() != sizes.size()) return std::nullopt;
  // The loop variables from (m, n): n is the last; m unravels over the others (static sizes but
  // the first).
  std::string text = "[&]() -> float { ";
  text += fmt::format("const int64_t {} = n; ", vars.back().name());
  text += "int64_t rest = m; (void)rest; ";
  for (size_t d = vars.size() - 1; d-- > 0;) {
    if (d == 0) {
      text += fmt::format("const int64_t {} = rest; ", vars[0].name());
      break;
    }
    std::optional<int64_t> size = sizes[d].as_integer();
    if (!size) return std::nullopt;
    text += fmt::format("const int64_t {} = rest % {}; rest /= {}; ", vars[d].name(), *size, *size);
  }
  for (const sym::Expr& v : vars) text += fmt::format("(void){}; ", v.name());
  GemmEpilogueCode code;
  std::map<std::string, std::string> params;  // buffer -> parameter name
  std::string input = "v";                    // the value each stage reads as its product
  for (size_t stage = 0; stage < stages.size(); ++stage) {
    const ir::Buffer& b = *stages[stage];
    const ir::LoopBody& body = b.body;
    if (body.is_reduction() || body.vars() != vars) return std::nullopt;
    const std::string& product = b.call.product;
    auto name = [&](ir::ValueId id) { return fmt::format("s{}_t{}", stage, id); };
    std::string result;
    const auto& ops = body.ops();
    for (size_t id = 0; id < ops.size(); ++id) {
      const ir::Op& op = ops[id];
      std::string type(cpp_compute_type(op.dtype));
      std::vector<std::string> operands;
      for (ir::ValueId operand : op.operands) {
        if (operand != ir::kNoValue) operands.push_back(name(operand));
      }
      std::string value;
      switch (op.code) {
        case OpCode::kLoad:
          if (op.mask != ir::kNoValue || !sym::only_index_symbols(op.index)) return std::nullopt;
          if (op.buffer == product) {
            value = fmt::format("static_cast<{}>({})", type, input);
            break;
          }
          if (op.buffer_dtype != graph::DType::kFloat32) return std::nullopt;
          if (!params.count(op.buffer)) {
            params[op.buffer] = fmt::format("e{}", params.size());
            code.epilogue.args.push_back(params[op.buffer]);
            code.buffers.push_back(op.buffer);
          }
          value = fmt::format("static_cast<{}>({}[{}])", type, params[op.buffer],
                              sym::to_cpp(op.index));
          break;
        case OpCode::kStore:
          if (!result.empty()) return std::nullopt;  // one output only
          result = operands.at(0);
          continue;
        case OpCode::kConstant:
          value = cpp_literal(op);
          break;
        case OpCode::kIndexExpr:
          if (!sym::only_index_symbols(op.index)) return std::nullopt;
          value = fmt::format("static_cast<{}>({})", type, sym::to_cpp(op.index));
          break;
        case OpCode::kCast:
          value = fmt::format("static_cast<{}>({})", type, operands.at(0));
          break;
        case OpCode::kWhere:
          value = fmt::format("({} ? {} : {})", operands.at(0), operands.at(1), operands.at(2));
          break;
        default: {
          const char* tmpl = cpp_op_templates(op.code).scalar;
          if (tmpl == nullptr) return std::nullopt;  // reductions, indirect indexing
          value = format_op(tmpl, operands);
        }
      }
      text += fmt::format("const {} {} = {}; ", type, name(static_cast<ir::ValueId>(id)), value);
    }
    if (result.empty()) return std::nullopt;
    input = result;
  }
  text += fmt::format("return static_cast<float>({}); }}()", input);
  code.epilogue.expr = text;
  return code;
}

}  // namespace kiln::codegen
