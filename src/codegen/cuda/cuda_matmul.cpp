#include "codegen/cuda/cuda_matmul.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cpp/cpp_host_text.h"
#include "sched/template_epilogue.h"
#include "support/error.h"

namespace kiln::codegen {

using ir::MatMulActivation;
using ir::OpCode;
using ir::ValueId;

namespace {

/// Matches the body of a pointwise consumer of a matrix product against the epilogues
/// cuBLASLt computes. `z` is the sum of the product and whichever of a bias vector and a
/// residual matrix the consumer loads (cuBLASLt adds the residual as its C with beta 1 and the
/// bias in its epilogue), each once, in any order and grouping; the stored value must be z,
/// relu(z) or gelu_tanh(z) written as lower/activation.cpp writes it.
class EpilogueMatcher {
 public:
  EpilogueMatcher(const ir::LoopBody& body, ValueId product, std::optional<ValueId> bias,
                  std::optional<ValueId> residual)
      : body_(body), product_(product), bias_(bias), residual_(residual) {}

  /// The activation when the stored value `v` is one of the forms.
  std::optional<MatMulActivation> activation(ValueId v) const {
    if ((bias_ || residual_) && is_z(v)) return MatMulActivation::kNone;
    const ir::Op& op = body_.op(v);
    if (op.code == OpCode::kRelu && is_z(op.operands[0])) return MatMulActivation::kRelu;
    if (is_gelu_tanh(v)) return MatMulActivation::kGeluTanh;
    return std::nullopt;
  }

 private:
  /// The product plus the bias and the residual there are, each once.
  bool is_z(ValueId v) const {
    std::vector<ValueId> terms;
    if (!sum_terms(v, terms, 3)) return false;
    std::vector<ValueId> want = {product_};
    if (bias_) want.push_back(*bias_);
    if (residual_) want.push_back(*residual_);
    std::sort(terms.begin(), terms.end());
    std::sort(want.begin(), want.end());
    return terms == want;
  }
  /// The leaves of the tree of float Adds rooted at `v` (at most `limit` of them).
  bool sum_terms(ValueId v, std::vector<ValueId>& terms, size_t limit) const {
    const ir::Op& op = body_.op(v);
    if (op.code == OpCode::kAdd) {
      return sum_terms(op.operands[0], terms, limit) && sum_terms(op.operands[1], terms, limit);
    }
    terms.push_back(v);
    return terms.size() <= limit;
  }
  bool is_constant(ValueId v, double value) const {
    const ir::Op& op = body_.op(v);
    return op.code == OpCode::kConstant && std::abs(op.float_value - value) <= 1e-12;
  }
  /// `v` is `code`(f, g) with f and g matching in either order.
  bool is_binary(ValueId v, OpCode code, const std::function<bool(ValueId)>& f,
                 const std::function<bool(ValueId)>& g) const {
    const ir::Op& op = body_.op(v);
    if (op.code != code) return false;
    return (f(op.operands[0]) && g(op.operands[1])) || (f(op.operands[1]) && g(op.operands[0]));
  }
  /// 0.5 z * (1 + tanh(sqrt(2/pi) * (z + 0.044715 z^3))).
  bool is_gelu_tanh(ValueId v) const {
    auto z = [this](ValueId w) { return is_z(w); };
    auto constant = [this](double c) { return [this, c](ValueId w) { return is_constant(w, c); }; };
    auto square = [&](ValueId w) { return is_binary(w, OpCode::kMul, z, z); };
    auto cube = [&](ValueId w) { return is_binary(w, OpCode::kMul, square, z); };
    auto inner = [&](ValueId w) {
      return is_binary(w, OpCode::kAdd, z, [&](ValueId u) {
        return is_binary(u, OpCode::kMul, cube, constant(0.044715));
      });
    };
    auto tanh = [&](ValueId w) {
      const ir::Op& op = body_.op(w);
      return op.code == OpCode::kTanh &&
             is_binary(op.operands[0], OpCode::kMul, inner, constant(std::sqrt(2.0 / M_PI)));
    };
    auto half_z = [&](ValueId w) { return is_binary(w, OpCode::kMul, z, constant(0.5)); };
    auto one_plus_tanh = [&](ValueId w) { return is_binary(w, OpCode::kAdd, constant(1.0), tanh); };
    return is_binary(v, OpCode::kMul, half_z, one_plus_tanh);
  }

  const ir::LoopBody& body_;
  ValueId product_;
  std::optional<ValueId> bias_, residual_;
};

/// The cuBLASLt epilogue of a product on the GPU: kiln_cuda::Epilogue's name and
/// cublasLtEpilogue_t's value.
std::pair<std::string, int> blas_epilogue(const ir::MatMulCall& call, bool bias) {
  switch (call.activation) {
    case ir::MatMulActivation::kNone:
      break;
    case ir::MatMulActivation::kRelu:
      return bias ? std::pair{"kReluBias", 6} : std::pair{"kRelu", 2};
    case ir::MatMulActivation::kGeluTanh:
      return bias ? std::pair{"kGeluBias", 36} : std::pair{"kGelu", 32};
  }
  return bias ? std::pair{"kBias", 4} : std::pair{"kNone", 1};
}

}  // namespace

std::string problem_element_text(graph::DType dtype, bool tf32) {
  switch (dtype) {
    case graph::DType::kFloat64:
      return "f64 fp64";
    case graph::DType::kFloat16:
      return "f16 fp32";
    case graph::DType::kBFloat16:
      return "bf16 fp32";
    default:
      return tf32 ? "f32 tf32" : "f32 fp32";
  }
}

std::optional<std::string> integer_dims(const std::vector<sym::Expr>& dims) {
  std::string text;
  for (const sym::Expr& d : dims) {
    const std::optional<int64_t> v = d.as_integer();
    if (!v) return std::nullopt;
    if (!text.empty()) text += ',';
    text += std::to_string(*v);
  }
  return text;
}

bool fuse_matmul_epilogue(const ir::Program& program, const ir::Buffer& product,
                          ir::Buffer& consumer) {
  const ir::MatMulCall* call = product.call.as<ir::MatMulCall>();
  // float32, or a half type (--precision fp16|bf16): the bias and result in the product's type,
  // the epilogue computed in float32 by cuBLASLt as the generated kernel would.
  const graph::DType dtype = product.dtype;
  const bool half = dtype == graph::DType::kFloat16 || dtype == graph::DType::kBFloat16;
  if (call == nullptr || call->activation != MatMulActivation::kNone ||
      product.call.inputs.size() != 2 || (dtype != graph::DType::kFloat32 && !half) ||
      consumer.kind != ir::BufferKind::kComputed || consumer.is_reduction() ||
      consumer.dtype != dtype || consumer.layout.sizes != product.layout.sizes ||
      !consumer.layout.is_contiguous() || !product.layout.is_contiguous() ||
      consumer.body.sizes() != product.layout.sizes) {
    return false;
  }
  // cuBLASLt's epilogues need K > 0 (an empty sum is written as zeros without one).
  const std::optional<int64_t> depth = product.call.inputs[0]->layout.sizes.back().as_integer();
  if (!depth || *depth <= 0) return false;
  const ir::LoopBody& body = consumer.body;
  const sym::Expr identity = sched::elementwise_index(program, product.layout, body);
  const sym::Expr stored_at = sched::elementwise_index(program, consumer.layout, body);
  const sym::Expr& column = body.vars().back();
  std::optional<ValueId> loaded, bias, residual, stored;
  std::string bias_buffer, residual_buffer;
  for (size_t id = 0; id < body.ops().size(); ++id) {
    const auto v = static_cast<ValueId>(id);
    const ir::Op& op = body.op(v);
    if (op.code == OpCode::kLoad) {
      if (op.mask != ir::kNoValue || op.buffer_dtype != dtype ||
          (op.dtype != dtype && !(half && op.dtype == graph::DType::kFloat32))) {
        return false;
      }
      if (op.buffer == product.name && op.index == identity && !loaded) {
        loaded = v;
      } else if (op.buffer != product.name && op.index == column && !bias) {
        bias = v;  // element n of a buffer: a bias vector over the columns
        bias_buffer = op.buffer;
      } else if (op.buffer != product.name && op.index == identity && !residual) {
        residual = v;  // the element at the product's own position: a residual matrix
        residual_buffer = op.buffer;
      } else {
        return false;
      }
    } else if (op.code == OpCode::kStore) {
      if (stored || op.index != stored_at) return false;
      stored = op.operands[0];
    }
  }
  if (!loaded || !stored) return false;
  const std::optional<MatMulActivation> activation =
      EpilogueMatcher(body, *loaded, bias, residual).activation(*stored);
  if (!activation) return false;
  ir::MatMulCall fused = *call;
  fused.activation = *activation;
  consumer.kind = ir::BufferKind::kExtern;
  consumer.call = product.call;
  if (bias) {
    // out = act(alpha * A @ B + 1 * C) with C the bias broadcast over every dim but the last.
    fused.beta = 1.0;
    ir::Layout layout;
    layout.sizes = product.layout.sizes;
    layout.strides.assign(layout.sizes.size(), sym::Expr(0));
    layout.strides.back() = sym::Expr(1);
    layout.offset = sym::Expr(0);
    consumer.call.inputs.push_back(ir::View{bias_buffer, dtype, layout});
  }
  if (residual) {
    // cuBLASLt's C (beta 1): a matrix laid out as the product, contiguous from its start.
    if (!bias) consumer.call.inputs.emplace_back();
    ir::Layout layout = ir::Layout::contiguous(product.layout.sizes);
    consumer.call.inputs.push_back(ir::View{residual_buffer, dtype, layout});
  }
  consumer.call.op = fused;
  for (const ir::Origin& o : product.origins) consumer.add_origin(o);
  return true;
}

void write_cuda_matmul(IndentedBuffer& out, const ir::Buffer& buffer, int site,
                       ir::Precision precision, const std::string& label) {
  const ir::MatMulCall& call = *buffer.call.as<ir::MatMulCall>();
  const auto& in = buffer.call.inputs;
  KILN_CHECK(in.size() >= 2 && in[0] && in[1], "matmul {}: expected inputs A and B", buffer.name);
  const bool half =
      buffer.dtype == graph::DType::kFloat16 || buffer.dtype == graph::DType::kBFloat16;
  KILN_CHECK(
      buffer.dtype == graph::DType::kFloat32 || buffer.dtype == graph::DType::kFloat64 || half,
      "matmul {}: cuBLASLt products are float32, float64, float16 or bfloat16, not {}", buffer.name,
      graph::dtype_name(buffer.dtype));
  const ir::View &a = *in[0], &b = *in[1];
  const size_t rank = buffer.layout.rank();
  KILN_CHECK(a.layout.rank() == rank && b.layout.rank() == rank,
             "matmul {}: operands of rank {} and {} for an output of rank {}", buffer.name,
             a.layout.rank(), b.layout.rank(), rank);
  // Inputs 2 and 3 on the GPU are only ever the bias and residual fuse_matmul_epilogue adds.
  const bool bias = in.size() > 2 && in[2].has_value();
  const bool residual = in.size() > 3 && in[3].has_value();
  KILN_CHECK(!bias || call.beta == 1.0, "matmul {}: a C other than a fused bias on CUDA",
             buffer.name);
  const std::string epilogue = blas_epilogue(call, bias).first;
  const std::string t = ctype(buffer.dtype);
  out.linef("// cuBLASLt, {} compute{}{}",
            buffer.dtype == graph::DType::kFloat64 ? "float64"
            : half ? fmt::format("{} operands, float32", graph::dtype_name(buffer.dtype))
            : ir::allows_tf32(precision) ? "TF32"
                                         : "float32",
            epilogue == "kNone" ? "" : ", epilogue " + epilogue.substr(1),
            residual ? ", residual added as C (beta 1)" : "");
  out.linef("const int64_t sizes[] = {{{}}};", dims_list(buffer.layout.sizes));
  out.linef("const int64_t a_strides[] = {{{}}};", dims_list(a.layout.strides));
  out.linef("const int64_t b_strides[] = {{{}}};", dims_list(b.layout.strides));
  out.linef("const int64_t out_strides[] = {{{}}};", dims_list(buffer.layout.strides));
  out.linef(
      "const kiln_cuda::MatMulShape shape{{{}, sizes, {}, a_strides, b_strides, out_strides}};",
      rank, cexpr(a.layout.sizes[rank - 1]));
  out.linef(
      "state.cuda.matmul<{}>({}, shape, {}, {}, {}, {}, kiln_cuda::Epilogue::{}, {}, {}, {}, "
      "{}{});",
      t, site, data_pointer(a), data_pointer(b), buffer.name, call.alpha, epilogue,
      bias ? data_pointer(*in[2]) : "nullptr", residual ? data_pointer(*in[3]) : "nullptr",
      ir::allows_tf32(precision) ? "true" : "false", cpp_quote(label),
      buffer.dtype == graph::DType::kBFloat16 ? ", true" : "");
  // A profiled run waits for each call, so that its event times the product, not its launch.
  out.linef("if (profile != nullptr) state.cuda.synchronize({});", cpp_quote(label));
}

std::optional<std::string> cuda_matmul_problem(const ir::Buffer& buffer, ir::Precision precision) {
  const ir::MatMulCall& call = *buffer.call.as<ir::MatMulCall>();
  const auto& in = buffer.call.inputs;
  if (in.size() < 2 || !in[0] || !in[1]) return std::nullopt;
  const bool bias = in.size() > 2 && in[2].has_value();
  const bool residual = in.size() > 3 && in[3].has_value();
  const size_t rank = buffer.layout.rank();
  const std::optional<std::string> sizes = integer_dims(buffer.layout.sizes),
                                   k = integer_dims({in[0]->layout.sizes[rank - 1]}),
                                   a = integer_dims(in[0]->layout.strides),
                                   b = integer_dims(in[1]->layout.strides),
                                   out = integer_dims(buffer.layout.strides);
  if (!sizes || !k || !a || !b || !out) return std::nullopt;
  // kiln_rt_cuda.h matmul_problem_text's form, field for field.
  return fmt::format("{} epilogue {} residual {} sizes {} k {} a {} b {} out {}",
                     problem_element_text(buffer.dtype, ir::allows_tf32(precision)),
                     blas_epilogue(call, bias).second, residual ? 1 : 0, *sizes, *k, *a, *b, *out);
}

}  // namespace kiln::codegen
