#include "codegen/cpp/cpp_epilogue.h"

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "codegen/cpp/cpp_ops.h"
#include "sched/conv_epilogue_match.h"
#include "sched/template_epilogue.h"
#include "support/error.h"

namespace kiln::codegen {

using ir::OpCode;

namespace {

/// Whether `op` has a C++ form an epilogue statement can hold.
bool has_scalar_form(const ir::Op& op) {
  switch (op.code) {
    case OpCode::kLoad:
    case OpCode::kStore:
    case OpCode::kConstant:
    case OpCode::kIndexExpr:
    case OpCode::kCast:
    case OpCode::kWhere:
      return true;
    default:
      return cpp_op_templates(op.code).scalar != nullptr;  // not reductions, indirect indexing
  }
}

/// The vector form (TemplateEpilogue::vector_expr's kv_ helpers) of a float32 arithmetic op,
/// or nullptr: the ops of bias, activation-clamp and residual epilogues.
const char* vector_form(const ir::Op& op) {
  if (op.dtype != graph::DType::kFloat32) return nullptr;
  switch (op.code) {
    case OpCode::kAdd:
      return "kv_add({0}, {1})";
    case OpCode::kSub:
      return "kv_sub({0}, {1})";
    case OpCode::kMul:
      return "kv_mul({0}, {1})";
    case OpCode::kMaximum:
      return "kv_max({0}, {1})";
    case OpCode::kMinimum:
      return "kv_min({0}, {1})";
    case OpCode::kRelu:
      return "kv_relu({0})";
    default:
      return nullptr;
  }
}

/// The row-major flat index of `vars` over `sizes`: what a load of a buffer of the epilogue's
/// own shape and contiguous layout reads, element for element (dims of size 1 have no term, as
/// the index simplifies them away).
sym::Expr flat_index(const std::vector<sym::Expr>& vars, const std::vector<sym::Expr>& sizes) {
  sym::Expr index(int64_t{0});
  sym::Expr stride(int64_t{1});
  for (size_t d = vars.size(); d-- > 0;) {
    if (sizes[d].as_integer() != std::optional<int64_t>(1)) index = index + vars[d] * stride;
    stride = stride * sizes[d];
  }
  return index;
}

}  // namespace

std::string epilogue_refusal(const ir::Program& program, const ir::Buffer& product,
                             const ir::Buffer& consumer) {
  if (consumer.kind != ir::BufferKind::kComputed || consumer.is_reduction())
    return "the reader is not pointwise";
  if (consumer.dtype != graph::DType::kFloat32) return "the reader is not float32";
  const std::vector<sym::Expr>& sizes = product.layout.sizes;
  if (sizes.size() < 2) return "the product has fewer than 2 dims";
  if (consumer.layout.sizes != sizes || !consumer.layout.is_contiguous())
    return "the reader's shape or layout differs";
  for (size_t d = 1; d + 1 < sizes.size(); ++d) {
    if (!sizes[d].is_integer()) return "a symbolic inner batch dim";
  }
  const ir::LoopBody& body = consumer.body;
  if (body.sizes() != sizes) return "the reader's loops differ";
  const sym::Expr identity = sched::elementwise_index(program, product.layout, body);
  const sym::Expr own = sched::elementwise_index(program, consumer.layout, body);
  int stores = 0;
  for (const ir::Op& op : body.ops()) {
    if (op.code == ir::OpCode::kIndirect) return "indirect indexing";
    if (!has_scalar_form(op)) return "an op without a scalar form";
    if (op.code == ir::OpCode::kIndexExpr && !sym::only_index_symbols(op.index))
      return "a symbolic index";
    if (op.code == ir::OpCode::kStore) {
      ++stores;
      if (op.index != own) return "a non-contiguous store";
    }
    if (op.code != ir::OpCode::kLoad) continue;
    if (op.mask != ir::kNoValue) return "a masked load";
    if (!sym::only_index_symbols(op.index)) return "a load with a symbolic index";
    if (op.buffer == product.name) {
      if (op.index != identity) return "the product is not read elementwise";
    } else if (op.buffer_dtype != graph::DType::kFloat32) {
      return "a load of a buffer other than float32";
    }
  }
  if (stores != 1) return "more than one store";
  if (!ir::dynamic_size_sources(program, consumer).empty()) return "a run-time size";
  return "";
}

EpilogueCode epilogue_code(const ir::Buffer& fused) {
  // Each condition below was checked by epilogue_refusal when the body fused.
  auto fail = [&](const char* what) -> EpilogueCode {
    internal_error("the epilogue of {} has {}, which epilogue_refusal refuses", fused.name, what);
  };
  std::vector<const ir::Buffer*> stages;
  for (const auto& b : fused.call.epilogue_chain) stages.push_back(b.get());
  stages.push_back(&fused);
  const std::vector<sym::Expr>& vars = fused.body.vars();
  const std::vector<sym::Expr>& sizes = fused.layout.sizes;
  if (vars.size() < 2 || vars.size() != sizes.size()) return fail("fewer than 2 dims");
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
    if (!size) return fail("a symbolic inner batch dim");
    text += fmt::format("const int64_t {} = rest % {}; rest /= {}; ", vars[d].name(), *size, *size);
  }
  for (const sym::Expr& v : vars) text += fmt::format("(void){}; ", v.name());
  EpilogueCode code;
  std::map<std::string, std::string> params;  // buffer -> parameter name
  // The parameter that points to `buffer`, added at its first load.
  auto param = [&](const std::string& buffer) -> const std::string& {
    if (!params.count(buffer)) {
      params[buffer] = fmt::format("e{}", params.size());
      code.epilogue.args.push_back(params[buffer]);
      code.buffers.push_back(buffer);
    }
    return params[buffer];
  };
  std::string input = "v";  // the value each stage reads as its product
  // The vector form, built beside the scalar one while every op has one: loads of the product,
  // of a buffer along n only (a bias) or of one of the epilogue's own shape (a residual), float
  // constants and vector_form's ops. It ends up empty otherwise.
  std::optional<std::string> vector = "[&]() -> kv_t { ";
  const std::optional<int64_t> row = sizes.back().as_integer();
  const sym::Expr flat = flat_index(vars, sizes);
  for (size_t stage = 0; stage < stages.size(); ++stage) {
    const ir::Buffer& b = *stages[stage];
    const ir::LoopBody& body = b.body;
    if (body.is_reduction() || body.vars() != vars) return fail("a reduction or other loops");
    const std::string& product = b.call.product;
    auto name = [&](ir::ValueId id) { return fmt::format("s{}_t{}", stage, id); };
    std::string result;
    const auto& ops = body.ops();
    for (size_t id = 0; id < ops.size(); ++id) {
      const ir::Op& op = ops[id];
      std::string type(cpp_compute_type(op.dtype));
      if (vector) {
        std::optional<std::string> vvalue;
        std::vector<std::string> vargs;
        for (ir::ValueId operand : op.operands) {
          if (operand != ir::kNoValue) vargs.push_back(fmt::format("s{}_v{}", stage, operand));
        }
        const bool f32 = op.dtype == graph::DType::kFloat32;
        if (op.code == OpCode::kLoad && f32 && op.mask == ir::kNoValue) {
          if (op.buffer == product) {
            vvalue = stage == 0 ? "v" : fmt::format("s{}", stage - 1);
          } else if (op.buffer_dtype == graph::DType::kFloat32 && op.index == vars.back()) {
            vvalue = fmt::format("kv_load({} + n0)", param(op.buffer));
          } else if (op.buffer_dtype == graph::DType::kFloat32 && row && op.index == flat) {
            vvalue = fmt::format("kv_load({} + m * {} + n0)", param(op.buffer), *row);
          }
        } else if (op.code == OpCode::kConstant && f32) {
          vvalue = fmt::format("kv_set1({})", cpp_literal(op));
        } else if (op.code == OpCode::kStore) {
          *vector += fmt::format("const kv_t s{} = {}; ", stage, vargs.at(0));
        } else if (auto bounded = format_number_bound(op, ops, vargs, OpForm::kKv)) {
          vvalue = *bounded;
        } else if (const char* tmpl = vector_form(op)) {
          vvalue = format_op(tmpl, vargs);
        }
        if (vvalue) {
          *vector += fmt::format("const kv_t s{}_v{} = {}; ", stage, id, *vvalue);
        } else if (op.code != OpCode::kStore) {
          vector.reset();
        }
      }
      std::vector<std::string> operands;
      for (ir::ValueId operand : op.operands) {
        if (operand != ir::kNoValue) operands.push_back(name(operand));
      }
      std::string value;
      switch (op.code) {
        case OpCode::kLoad:
          if (op.mask != ir::kNoValue || !sym::only_index_symbols(op.index))
            return fail("a masked load or a symbolic index");
          if (op.buffer == product) {
            value = fmt::format("static_cast<{}>({})", type, input);
            break;
          }
          if (op.buffer_dtype != graph::DType::kFloat32) return fail("a load other than float32");
          value =
              fmt::format("static_cast<{}>({}[{}])", type, param(op.buffer), sym::to_cpp(op.index));
          break;
        case OpCode::kStore:
          if (!result.empty()) return fail("more than one store");
          result = operands.at(0);
          continue;
        case OpCode::kConstant:
          value = cpp_literal(op);
          break;
        case OpCode::kIndexExpr:
          if (!sym::only_index_symbols(op.index)) return fail("a symbolic index");
          value = fmt::format("static_cast<{}>({})", type, sym::to_cpp(op.index));
          break;
        case OpCode::kCast:
          value = fmt::format("static_cast<{}>({})", type, operands.at(0));
          break;
        case OpCode::kWhere:
          value = fmt::format("({} ? {} : {})", operands.at(0), operands.at(1), operands.at(2));
          break;
        default: {
          if (auto bounded = format_number_bound(op, ops, operands, OpForm::kScalar)) {
            value = *bounded;
            break;
          }
          const char* tmpl = cpp_simd_math_form(op);
          if (tmpl == nullptr) tmpl = cpp_op_templates(op.code).scalar;
          if (tmpl == nullptr) return fail("an op without a scalar form");
          value = format_op(tmpl, operands);
        }
      }
      text += fmt::format("const {} {} = {}; ", type, name(static_cast<ir::ValueId>(id)), value);
    }
    if (result.empty()) return fail("no store");
    input = result;
  }
  text += fmt::format("return static_cast<float>({}); }}()", input);
  code.epilogue.expr = text;
  if (vector) {
    code.epilogue.vector_expr = *vector + fmt::format("return s{}; }}()", stages.size() - 1);
  }
  return code;
}

// The expanded activations fused below this size stay apart: at MobileNetV2's 28 x 28 x 192
// (588 KiB) the expansion's output is still in L2 when the depthwise convolution reads it, each
// thread's run recomputes its first two rows (a seventh of a run at 28 rows on 2 threads), and
// the expansion's GEMM, called a row at a time, reads all of its weight for a few pixels. On 2
// threads of the GPU device host's Xeon, MobileNetV2 with the pairs from 300 KB fused (its 28 x 28
// and 14 x 14 ones too) ran 2 % slower at AVX-512 and 5 % with x86-64-v3 forced than with
// this threshold, with all of them fused 4 % and 9 % slower. A depthwise convolution fused into
// the projection after it (MobileNetV2's first block: 1.6 MB at 112 x 112) takes the same
// threshold.
constexpr int64_t kMinPrologueBytes = int64_t{1} << 20;

std::optional<InputScale> input_scale_operands(const ir::Program& program,
                                               const ir::Buffer& buffer) {
  if (buffer.kind != ir::BufferKind::kComputed || buffer.is_reduction() ||
      buffer.dtype != graph::DType::kFloat32 || buffer.layout.rank() != 4) {
    return std::nullopt;
  }
  const ir::LoopBody& body = buffer.body;
  const std::vector<ir::Op>& ops = body.ops();
  if (ops.size() != 4 || ops[2].code != ir::OpCode::kMul || ops[3].code != ir::OpCode::kStore) {
    return std::nullopt;
  }
  const std::optional<int64_t> channels = buffer.layout.sizes[3].as_integer();
  if (!channels || body.vars().size() != 4) return std::nullopt;
  sym::Analyzer analyzer = program.analyzer;
  for (size_t k = 0; k < body.vars().size(); ++k) {
    analyzer.bind_index(body.vars()[k], body.sizes()[k]);
  }
  const sym::Expr per_channel = analyzer.simplify(body.vars()[0] * *channels + body.vars()[3]);
  std::optional<ir::View> x, s;
  for (const ir::Op& op : {ops[0], ops[1]}) {
    if (op.code != ir::OpCode::kLoad || op.mask != ir::kNoValue ||
        op.buffer_dtype != graph::DType::kFloat32) {
      return std::nullopt;
    }
    const ir::Buffer* b = program.find(op.buffer);
    if (b == nullptr) return std::nullopt;
    if (!x && b->layout == buffer.layout &&
        op.index == sched::elementwise_index(program, buffer.layout, body)) {
      x = ir::View{op.buffer, b->dtype, b->layout};
    } else if (!s && analyzer.simplify(op.index) == per_channel) {
      // Read from the buffer's start: image n's scales at n * C.
      s = ir::View{op.buffer, b->dtype,
                   ir::Layout::contiguous({buffer.layout.sizes[0], *channels})};
    } else {
      return std::nullopt;
    }
  }
  // The product of the two loads (values 0 and 1), stored at the body's own element.
  const ir::Op &mul = ops[2], &store = ops[3];
  const bool product = (mul.operands[0] == 0 && mul.operands[1] == 1) ||
                       (mul.operands[0] == 1 && mul.operands[1] == 0);
  if (!x || !s || !product || store.operands[0] != 2 || store.buffer != buffer.name ||
      store.index != sched::elementwise_index(program, buffer.layout, body)) {
    return std::nullopt;
  }
  return InputScale{*x, *s};
}

namespace {

// What the epilogue fused into the call `fused` (its chain's bodies, then its own) reads besides
// the product: a buffer's name, "an index", or "" for nothing.
std::string epilogue_input(const ir::Buffer& fused) {
  if (fused.call.product.empty()) return "";
  std::vector<const ir::Buffer*> stages;
  for (const auto& b : fused.call.epilogue_chain) stages.push_back(b.get());
  stages.push_back(&fused);
  for (const ir::Buffer* stage : stages) {
    for (const ir::Op& op : stage->body.ops()) {
      if (op.code == ir::OpCode::kLoad && op.buffer != stage->call.product) return op.buffer;
      if (op.code == ir::OpCode::kIndexExpr || op.code == ir::OpCode::kIndirect) {
        return "an index";
      }
    }
  }
  return "";
}

}  // namespace

std::string prologue_refusal(const ir::Program& program, const ir::Buffer& producer,
                             const ir::Buffer& consumer) {
  const autotune::ConvChoice& choice = *consumer.call.as<ir::ConvCall>()->choice;
  if (producer.kind == ir::BufferKind::kComputed) {
    if (!choice.takes_input_scale()) {
      return fmt::format("the {} choice takes no input scale", choice.name());
    }
    if (!input_scale_operands(program, producer)) return "it is not X times a per-channel scale";
    // The call scales C x M weights on one thread where the multiply it replaces was a pass
    // over H x W x C values on all of them. EfficientNet-B0 on 2 threads of the AMD EPYC: at
    // 56 x 56 and 28 x 28 (16 to 80 output channels) each fused projection ran as fast as before
    // and saved the multiply's 19-70 us; at 14 x 14 with 112 output channels (672 x 112 weights)
    // the projection took 31-34 us longer than the 18 us multiply it saved.
    const autotune::ConvProblem& p = choice.problem();
    if (p.h * p.w < 4 * p.m) {
      return fmt::format("{} pixels for {} output channels: scaling the weight costs more",
                         p.h * p.w, p.m);
    }
    return "";
  }
  const autotune::ConvChoice& made = *producer.call.as<ir::ConvCall>()->choice;
  if (std::string why = choice.prologue_refusal(made); !why.empty()) {
    return why;
  }
  if (!choice.epilogue_reads_buffers_with_prologue()) {
    if (std::string read = epilogue_input(consumer); !read.empty()) {
      return fmt::format(
          "its epilogue reads {}, and with {} as its prologue it runs a row at a time", read,
          made.name());
    }
  }
  const autotune::ConvProblem& p = made.problem();
  const int64_t bytes = p.n * p.oh() * p.ow() * p.m * int64_t{sizeof(float)};
  if (bytes < kMinPrologueBytes) {
    return fmt::format("its output ({} bytes) is under {} bytes", bytes, kMinPrologueBytes);
  }
  if (std::string read = epilogue_input(producer); !read.empty()) {
    return fmt::format("its epilogue reads {}", read);
  }
  return "";
}

bool fuse_onednn_post_ops(const ir::Program& program, const ir::Buffer& product,
                          ir::Buffer& consumer) {
  const ir::ConvCall* conv = product.call.as<ir::ConvCall>();
  if (conv == nullptr || conv->choice != nullptr ||
      conv->applied_activation() != ir::ConvActivation::kNone ||
      product.dtype != graph::DType::kFloat32) {
    return false;
  }
  const std::optional<sched::ConvEpilogueMatch> match =
      sched::match_conv_epilogue(program, product, consumer);
  if (!match || match->residual != nullptr) return false;
  consumer.kind = ir::BufferKind::kExtern;
  consumer.call = product.call;
  ir::ConvCall* fused = consumer.call.as<ir::ConvCall>();
  if (match->activation == ir::ConvActivation::kRelu) {
    fused->relu_post_ops = 1;
  } else {
    fused->activation = match->activation;
    fused->alpha = match->alpha;
    fused->beta = match->beta;
  }
  for (const ir::Origin& o : product.origins) consumer.add_origin(o);
  return true;
}

}  // namespace kiln::codegen
