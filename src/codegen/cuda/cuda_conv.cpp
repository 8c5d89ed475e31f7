#include "codegen/cuda/cuda_conv.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <vector>

#include "codegen/cpp/cpp_host_text.h"
#include "codegen/cuda/cuda_matmul.h"
#include "sched/template_epilogue.h"
#include "support/error.h"

namespace kiln::codegen {

using ir::OpCode;
using ir::ValueId;

namespace {

/// An activation fused into a convolution (ir::ConvCall::activation, alpha, beta).
struct Activation {
  ir::ConvActivation kind = ir::ConvActivation::kNone;
  double alpha = 0, beta = 0;
};

/// `v`'s tree as text: "x" for the activation's input (any of the values `x`: the product may be
/// loaded once per use, as x * Sigmoid(x) does), "c" for a constant (its value appended to
/// `constants`, in the order the text names them), op(operands) for the ops an activation is
/// made of. Empty when it reads anything else.
std::string tree_text(const ir::LoopBody& body, ValueId v, const std::set<ValueId>& x,
                      std::vector<double>& constants, int depth = 0) {
  if (x.count(v)) return "x";
  if (v == ir::kNoValue || depth > 12) return "";
  const ir::Op& op = body.op(v);
  // Float32 values, but for the comparison (bool) a Where's condition is.
  if (op.dtype != (op.code == OpCode::kLt ? graph::DType::kBool : graph::DType::kFloat32))
    return "";
  if (op.code == OpCode::kConstant) {
    if (!std::isfinite(op.float_value)) return "";
    constants.push_back(op.float_value);
    return "c";
  }
  switch (op.code) {
    case OpCode::kRelu:
    case OpCode::kSigmoid:
    case OpCode::kTanh:
    case OpCode::kErf:
    case OpCode::kExpm1:
    case OpCode::kAdd:
    case OpCode::kMul:
    case OpCode::kMinimum:
    case OpCode::kMaximum:
    case OpCode::kWhere:
    case OpCode::kLt:
      break;
    default:
      return "";
  }
  std::string text(ir::op_name(op.code));
  text += "(";
  for (int k = 0; k < ir::op_arity(op.code); ++k) {
    const ValueId operand = op.operands[static_cast<size_t>(k)];
    if (op.code == OpCode::kWhere && k == 0) {  // the condition: x < c
      const ir::Op& cond = body.op(operand);
      if (cond.code != OpCode::kLt) return "";
    }
    const std::string sub = tree_text(body, operand, x, constants, depth + 1);
    if (sub.empty()) return "";
    text += (k > 0 ? "," : "") + sub;
  }
  return text + ")";
}

/// Whether float32 constants `a` and `b` agree (the lowering rounds double constants to float).
bool same_constant(double a, double b) {
  return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b));
}

/// The activation the value `stored` of `body` is of the value `x` (any of them), recognized by its
/// tree of ops over `x` and float32 constants in the forms lower/activation.cpp builds (Relu,
/// Sigmoid, Tanh, Clip, LeakyRelu, Elu, Gelu in both forms; Swish and SiLU as x * Sigmoid(alpha
/// x)); nullopt for any other tree. HardSigmoid and HardSwish have no pointwise mode in cuDNN and
/// stay kernels of their own.
std::optional<Activation> match_activation(const ir::LoopBody& body, ValueId stored,
                                           const std::set<ValueId>& x) {
  using ir::ConvActivation;
  std::vector<double> c;
  const std::string t = tree_text(body, stored, x, c);
  if (t.empty()) return std::nullopt;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // Relu(Relu(z)) is Relu(z).
  if (t == "relu(x)" || t == "relu(relu(x))") return Activation{ConvActivation::kRelu};
  if (t == "sigmoid(x)") return Activation{ConvActivation::kSigmoid};
  if (t == "tanh(x)") return Activation{ConvActivation::kTanh};
  // Clip before opset 11 (maximum then minimum), with bounds from inputs (either alone), and
  // HardSigmoid-style clamps (minimum then maximum): the same where lo <= hi.
  std::optional<std::pair<double, double>> clip;
  if (t == "minimum(maximum(x,c),c)") clip = {c[0], c[1]};
  if (t == "maximum(minimum(x,c),c)") clip = {c[1], c[0]};
  if (t == "maximum(x,c)") clip = {c[0], kInf};
  if (t == "minimum(x,c)") clip = {-kInf, c[0]};
  if (clip) {
    if (clip->first > clip->second) return std::nullopt;
    // cuDNN takes finite clips: float32's range stands for an open side.
    const double big = std::numeric_limits<float>::max();
    return Activation{ConvActivation::kClip, std::max(clip->first, -big),
                      std::min(clip->second, big)};
  }
  if (t == "where(lt(x,c),mul(x,c),x)" && c[0] == 0)
    return Activation{ConvActivation::kLeakyRelu, c[1]};
  if (t == "where(lt(x,c),mul(expm1(x),c),x)" && c[0] == 0)
    return Activation{ConvActivation::kElu, c[1]};
  if (t == "mul(mul(x,c),add(c,erf(mul(x,c))))" && same_constant(c[0], 0.5) &&
      same_constant(c[1], 1) && same_constant(c[2], M_SQRT1_2)) {
    return Activation{ConvActivation::kGelu};
  }
  if (t == "mul(mul(x,c),add(c,tanh(mul(add(x,mul(mul(mul(x,x),x),c)),c))))" &&
      same_constant(c[0], 0.5) && same_constant(c[1], 1) && same_constant(c[2], 0.044715) &&
      same_constant(c[3], std::sqrt(2.0 / M_PI))) {
    return Activation{ConvActivation::kGeluTanh};
  }
  if (t == "mul(x,sigmoid(x))") return Activation{ConvActivation::kSwish, 1.0};
  if (t == "mul(x,sigmoid(mul(x,c)))") return Activation{ConvActivation::kSwish, c[0]};
  return std::nullopt;
}

}  // namespace

bool fuse_conv_epilogue(const ir::Program& program, const ir::Buffer& product,
                        ir::Buffer& consumer) {
  const ir::ConvCall* call = product.call.as<ir::ConvCall>();
  // float32, or a half type (its loads compute in float32; cuDNN's pointwise nodes too).
  const graph::DType dtype = product.dtype;
  if (call == nullptr || call->choice != nullptr || call->residual || call->relu_post_ops != 0 ||
      call->activation != ir::ConvActivation::kNone || product.call.inputs.size() > 3 ||
      (dtype != graph::DType::kFloat32 && dtype != graph::DType::kFloat16 &&
       dtype != graph::DType::kBFloat16) ||
      consumer.kind != ir::BufferKind::kComputed || consumer.is_reduction() ||
      consumer.dtype != dtype || consumer.layout.sizes != product.layout.sizes ||
      !consumer.layout.is_contiguous() || !product.layout.is_contiguous() ||
      consumer.body.sizes() != product.layout.sizes) {
    return false;
  }
  const ir::LoopBody& body = consumer.body;
  const sym::Expr identity = sched::elementwise_index(program, product.layout, body);
  const sym::Expr stored_at = sched::elementwise_index(program, consumer.layout, body);
  // The product's loads (one, or one per use without a residual), the residual's load and
  // buffer, the Add of the two, the stored value.
  std::set<ValueId> loads;
  std::optional<ValueId> loaded, residual, added, stored;
  const ir::Buffer* residual_buffer = nullptr;
  for (size_t id = 0; id < body.ops().size(); ++id) {
    const auto v = static_cast<ValueId>(id);
    const ir::Op& op = body.op(v);
    if (stored) return false;
    switch (op.code) {
      case OpCode::kLoad: {
        if (op.mask != ir::kNoValue || op.buffer_dtype != dtype ||
            op.dtype != graph::DType::kFloat32) {
          return false;
        }
        if (op.buffer == product.name && op.index == identity) {
          if (!loaded) loaded = v;
          loads.insert(v);
          break;
        }
        // Any other buffer of the product's sizes, contiguous, read at the element the
        // iteration computes: the residual.
        const ir::Buffer* r = program.find(op.buffer);
        if (residual || r == nullptr || op.buffer == product.name || r->dtype != dtype ||
            r->layout.sizes != product.layout.sizes || !r->layout.is_contiguous() ||
            op.index != sched::elementwise_index(program, r->layout, body)) {
          return false;
        }
        residual = v;
        residual_buffer = r;
        break;
      }
      case OpCode::kStore:
        if (op.index != stored_at) return false;
        stored = op.operands[0];
        break;
      default:
        // product + residual, in either order, once: the activation's input.
        if (op.code == OpCode::kAdd && loaded && residual && !added &&
            ((op.operands[0] == *loaded && op.operands[1] == *residual) ||
             (op.operands[1] == *loaded && op.operands[0] == *residual))) {
          added = v;
        }
        // Anything else is checked below as part of the activation's tree (a value the stored
        // one does not use is left out of the call).
        break;
    }
  }
  if (!stored || !loaded || (residual && (!added || loads.size() > 1))) return false;
  const ValueId input = added ? *added : *loaded;
  Activation act;
  if (!(added ? *stored == input : loads.count(*stored) > 0)) {
    std::optional<Activation> matched =
        match_activation(body, *stored, added ? std::set<ValueId>{input} : loads);
    if (!matched) return false;
    act = *matched;
  } else if (!added) {
    return false;  // the product stored unchanged: nothing to fuse
  }
  ir::ConvCall fused = *call;
  fused.residual = added.has_value();
  fused.relu_post_ops = act.kind == ir::ConvActivation::kRelu ? 1 : 0;
  if (act.kind != ir::ConvActivation::kRelu) {
    fused.activation = act.kind;
    fused.alpha = act.alpha;
    fused.beta = act.beta;
  }
  consumer.kind = ir::BufferKind::kExtern;
  consumer.call = product.call;
  if (added) {
    consumer.call.inputs.resize(3);  // no bias: input 2 absent
    consumer.call.inputs.push_back(ir::View{residual_buffer->name, dtype, residual_buffer->layout});
  }
  consumer.call.op = fused;
  for (const ir::Origin& o : product.origins) consumer.add_origin(o);
  return true;
}

bool conv_has_epilogue(const ir::ExternCall& call) {
  const ir::ConvCall* conv = call.as<ir::ConvCall>();
  return conv != nullptr &&
         ((call.inputs.size() > 2 && call.inputs[2].has_value()) || conv->residual ||
          conv->relu_post_ops > 0 || conv->activation != ir::ConvActivation::kNone);
}

std::string conv_epilogue_source() {
  return R"(
// A convolution's epilogue where cuDNN has no engine for the convolution fused with it
// (kiln_rt_cuda.h RunState::conv): y = y + bias[c] (bias not null), + residual (not null), then
// the activation `act` with its parameters alpha and beta (kiln_cuda::ConvActivation's numbers:
// 0 none, 1 Relu, 2 Sigmoid, 3 Tanh, 4 Clip to [alpha, beta], 5 LeakyRelu, 6 Elu, 7 Gelu, 8 Gelu's
// tanh form, 9 Swish x sigmoid(alpha x)), over n elements; the channel of element i is
// i / inner % channels (inner 1 for channels-last activations, H * W for NCHW ones). NaN stays
// NaN through each.
template <typename T>
__device__ T kiln_conv_activation(T v, int64_t act, T alpha, T beta) {
  switch (act) {
    case 1:
      return v < T(0) ? T(0) : v;
    case 2:
      return T(1) / (T(1) + exp(-v));
    case 3:
      return tanh(v);
    case 4:
      return v < alpha ? alpha : (v > beta ? beta : v);
    case 5:
      return v < T(0) ? alpha * v : v;
    case 6:
      return v < T(0) ? alpha * expm1(v) : v;
    case 7:
      return T(0.5) * v * (T(1) + erf(v * T(0.70710678118654752440)));
    case 8:
      return T(0.5) * v *
             (T(1) + tanh(T(0.79788456080286535588) * (v + T(0.044715) * v * v * v)));
    case 9:
      return v / (T(1) + exp(-alpha * v));
    default:
      return v;
  }
}

// How an element type S is stored and computed: float and double as they are; float16 and
// bfloat16 (uint16_t bits) computed in float32 and rounded once when stored.
template <typename S>
struct KilnConvElement {
  using Compute = S;
  __device__ static S load(S v) { return v; }
  __device__ static S store(S v) { return v; }
};
struct KilnConvF16 {
  using Compute = float;
  __device__ static float load(uint16_t v) { return kiln::half_to_float(v); }
  __device__ static uint16_t store(float v) { return kiln::float_to_half(v); }
};
struct KilnConvBf16 {
  using Compute = float;
  __device__ static float load(uint16_t v) { return kiln::bf16_to_float(v); }
  __device__ static uint16_t store(float v) { return kiln::float_to_bf16(v); }
};

template <typename E, typename S>
__device__ void kiln_conv_epilogue(S* y, const S* bias, const S* residual, int64_t act,
                                   double alpha, double beta, int64_t n, int64_t channels,
                                   int64_t inner) {
  using T = typename E::Compute;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T v = E::load(y[i]);
    if (bias != nullptr) v = v + E::load(bias[i / inner % channels]);
    if (residual != nullptr) v = v + E::load(residual[i]);
    y[i] = E::store(kiln_conv_activation(v, act, static_cast<T>(alpha), static_cast<T>(beta)));
  }
}

#define KILN_CONV_EPILOGUE_KERNEL(NAME, S, E)                                                  \
  extern "C" __global__ void NAME(S* y, const S* bias, const S* residual, int64_t act,         \
                                  double alpha, double beta, int64_t n, int64_t channels,      \
                                  int64_t inner) {                                             \
    kiln_conv_epilogue<E>(y, bias, residual, act, alpha, beta, n, channels, inner);            \
  }
KILN_CONV_EPILOGUE_KERNEL(kiln_conv_epilogue_f32, float, KilnConvElement<float>)
KILN_CONV_EPILOGUE_KERNEL(kiln_conv_epilogue_f64, double, KilnConvElement<double>)
KILN_CONV_EPILOGUE_KERNEL(kiln_conv_epilogue_f16, uint16_t, KilnConvF16)
KILN_CONV_EPILOGUE_KERNEL(kiln_conv_epilogue_bf16, uint16_t, KilnConvBf16)
#undef KILN_CONV_EPILOGUE_KERNEL
)";
}

/// The activation's name in the wrapper's comment (indexed by ir::ConvActivation's numbers).
const char* activation_name(ir::ConvActivation a) {
  static constexpr const char* kNames[] = {
      "",    "Relu", "Sigmoid",          "Tanh", "Clip", "LeakyRelu",
      "Elu", "Gelu", "Gelu (tanh form)", "Swish"};
  return kNames[static_cast<size_t>(a)];
}

void write_cuda_conv(IndentedBuffer& out, const ir::Buffer& buffer, int site,
                     ir::Precision precision, const std::string& label) {
  const ir::ConvCall& call = *buffer.call.as<ir::ConvCall>();
  const auto& in = buffer.call.inputs;
  KILN_CHECK(in.size() >= 2 && in.size() <= 4 && in[0] && in[1] && call.choice == nullptr,
             "conv {}: on CUDA, expected X, W, an optional bias and residual, no choice",
             buffer.name);
  KILN_CHECK(call.residual == (in.size() == 4 && in[3].has_value()),
             "conv {}: a residual flag without its input (or the reverse)", buffer.name);
  KILN_CHECK(call.channels_last == call.weight_channels_last,
             "conv {}: on CUDA, channels-last activations come with a [M, KH, KW, C] weight",
             buffer.name);
  const bool half =
      buffer.dtype == graph::DType::kFloat16 || buffer.dtype == graph::DType::kBFloat16;
  KILN_CHECK(
      buffer.dtype == graph::DType::kFloat32 || buffer.dtype == graph::DType::kFloat64 || half,
      "conv {}: cuDNN convolutions are float32, float64, float16 or bfloat16, not {}", buffer.name,
      graph::dtype_name(buffer.dtype));
  const ir::View &x = *in[0], &w = *in[1];
  const bool bias = in.size() > 2 && in[2].has_value();
  KILN_CHECK(x.layout.is_contiguous() && w.layout.is_contiguous() &&
                 buffer.layout.is_contiguous() && (!bias || in[2]->layout.is_contiguous()) &&
                 (!call.residual || in[3]->layout.is_contiguous()),
             "conv {}: cuDNN reads contiguous X, W, bias and residual here", buffer.name);
  const size_t spatial = x.layout.rank() - 2;
  std::vector<std::string> strides, begin, end, dilations;
  for (size_t k = 0; k < spatial; ++k) {
    strides.push_back(std::to_string(k < call.strides.size() ? call.strides[k] : 1));
    dilations.push_back(std::to_string(k < call.dilations.size() ? call.dilations[k] : 1));
    begin.push_back(std::to_string(k < call.pads.size() ? call.pads[k] : 0));
    end.push_back(std::to_string(spatial + k < call.pads.size() ? call.pads[spatial + k] : 0));
  }
  // The runtime takes dims in NCHW order (X [N, C, H, W], W [M, C, KH, KW], Y [N, M, OH, OW]);
  // channels-last buffers hold them as [N, H, W, C] and [M, KH, KW, C].
  auto nchw = [&](const std::vector<sym::Expr>& dims) {
    if (!call.channels_last) return dims;
    return std::vector<sym::Expr>{dims[0], dims[3], dims[1], dims[2]};
  };
  const bool tf32 = buffer.dtype == graph::DType::kFloat32 && ir::allows_tf32(precision);
  std::string epilogue;
  if (bias) epilogue += " + bias";
  if (call.residual) epilogue += " + residual";
  const ir::ConvActivation act =
      call.relu_post_ops > 0 ? ir::ConvActivation::kRelu : call.activation;
  if (act != ir::ConvActivation::kNone) epilogue += fmt::format(", {}", activation_name(act));
  out.linef("// cuDNN convolution{}{}, {}", call.channels_last ? " (channels-last)" : "",
            epilogue.empty() ? "" : epilogue + " in its graph",
            buffer.dtype == graph::DType::kFloat64 ? "float64"
            : half ? fmt::format("{} tensors, float32 compute", graph::dtype_name(buffer.dtype))
            : tf32 ? "TF32 allowed"
                   : "float32");
  out.linef("const int64_t x_dims[] = {{{}}};", dims_list(nchw(x.layout.sizes)));
  out.linef("const int64_t w_dims[] = {{{}}};", dims_list(nchw(w.layout.sizes)));
  out.linef("const int64_t y_dims[] = {{{}}};", dims_list(nchw(buffer.layout.sizes)));
  out.linef("const int64_t strides[] = {{{}}};", fmt::join(strides, ", "));
  out.linef("const int64_t pads_begin[] = {{{}}};", fmt::join(begin, ", "));
  out.linef("const int64_t pads_end[] = {{{}}};", fmt::join(end, ", "));
  out.linef("const int64_t dilations[] = {{{}}};", fmt::join(dilations, ", "));
  out.linef(
      "const kiln_cuda::ConvShape shape{{{}, x_dims, w_dims, y_dims, strides, pads_begin, "
      "pads_end, dilations, {}}};",
      spatial, call.channels_last ? "true" : "false");
  // The activation as kiln_cuda::ConvActivation{kind, alpha, beta}: the parameters printed
  // exactly (shortest round trip; the matcher took finite ones only).
  out.linef(
      "state.cuda.conv<{}>({}, shape, {}, {}, {}, {}, {}, kiln_cuda::ConvActivation{{{}, {}, {}}}, "
      "{}, {}{});",
      ctype(buffer.dtype), site, data_pointer(x), data_pointer(w), buffer.name,
      bias ? data_pointer(*in[2]) : "nullptr", call.residual ? data_pointer(*in[3]) : "nullptr",
      static_cast<int>(act), act == ir::ConvActivation::kRelu ? 0.0 : call.alpha,
      act == ir::ConvActivation::kRelu ? 0.0 : call.beta, tf32 ? "true" : "false", cpp_quote(label),
      buffer.dtype == graph::DType::kBFloat16 ? ", true" : "");
  // A profiled run waits for each call, so that its event times the convolution.
  out.linef("if (profile != nullptr) state.cuda.synchronize({});", cpp_quote(label));
}

std::optional<std::string> cuda_conv_problem(const ir::Buffer& buffer, ir::Precision precision) {
  const ir::ConvCall& call = *buffer.call.as<ir::ConvCall>();
  const auto& in = buffer.call.inputs;
  if (in.size() < 2 || !in[0] || !in[1]) return std::nullopt;
  const bool bias = in.size() > 2 && in[2].has_value();
  // As write_cuda_conv passes them: TF32 for float32 where allowed, the activation's kind and
  // parameters, NCHW-ordered dims.
  const bool tf32 = buffer.dtype == graph::DType::kFloat32 && ir::allows_tf32(precision);
  const ir::ConvActivation act =
      call.relu_post_ops > 0 ? ir::ConvActivation::kRelu : call.activation;
  const double alpha = act == ir::ConvActivation::kRelu ? 0.0 : call.alpha,
               beta = act == ir::ConvActivation::kRelu ? 0.0 : call.beta;
  auto nchw = [&](const std::vector<sym::Expr>& dims) {
    if (!call.channels_last) return dims;
    return std::vector<sym::Expr>{dims[0], dims[3], dims[1], dims[2]};
  };
  const std::optional<std::string> x = integer_dims(nchw(in[0]->layout.sizes)),
                                   w = integer_dims(nchw(in[1]->layout.sizes)),
                                   y = integer_dims(nchw(buffer.layout.sizes));
  if (!x || !w || !y) return std::nullopt;
  const size_t spatial = in[0]->layout.rank() - 2;
  std::vector<int64_t> strides, begin, end, dilations;
  for (size_t k = 0; k < spatial; ++k) {
    strides.push_back(k < call.strides.size() ? call.strides[k] : 1);
    dilations.push_back(k < call.dilations.size() ? call.dilations[k] : 1);
    begin.push_back(k < call.pads.size() ? call.pads[k] : 0);
    end.push_back(spatial + k < call.pads.size() ? call.pads[spatial + k] : 0);
  }
  begin.insert(begin.end(), end.begin(), end.end());
  // kiln_rt_cuda.h conv_problem_text's form, field for field.
  return fmt::format(
      "{} {} bias {} residual {} act {} alpha {:.17g} beta {:.17g} x {} w {} y {} strides {} pads "
      "{} dilations {}",
      problem_element_text(buffer.dtype, tf32), call.channels_last ? "nhwc" : "nchw", bias ? 1 : 0,
      call.residual ? 1 : 0, static_cast<int>(act), alpha, beta, *x, *w, *y,
      fmt::join(strides, ","), fmt::join(begin, ","), fmt::join(dilations, ","));
}

}  // namespace kiln::codegen
