#include "codegen/cuda/cuda_conv.h"

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codegen/cpp/cpp_host_text.h"
#include "codegen/cuda/cuda_matmul.h"
#include "sched/conv_epilogue_match.h"
#include "support/error.h"

namespace kiln::codegen {

bool fuse_conv_epilogue(const ir::Program& program, const ir::Buffer& product,
                        ir::Buffer& consumer) {
  const ir::ConvCall* call = product.call.as<ir::ConvCall>();
  // float32, or a half type (its loads compute in float32; cuDNN's pointwise nodes too).
  const graph::DType dtype = product.dtype;
  if (call == nullptr || call->choice != nullptr || call->residual ||
      call->applied_activation() != ir::ConvActivation::kNone || product.call.inputs.size() > 3 ||
      (dtype != graph::DType::kFloat32 && dtype != graph::DType::kFloat16 &&
       dtype != graph::DType::kBFloat16)) {
    return false;
  }
  const std::optional<sched::ConvEpilogueMatch> match =
      sched::match_conv_epilogue(program, product, consumer);
  if (!match) return false;
  ir::ConvCall fused = *call;
  fused.residual = match->residual != nullptr;
  fused.relu_post_ops = match->activation == ir::ConvActivation::kRelu ? 1 : 0;
  if (match->activation != ir::ConvActivation::kRelu) {
    fused.activation = match->activation;
    fused.alpha = match->alpha;
    fused.beta = match->beta;
  }
  consumer.kind = ir::BufferKind::kExtern;
  consumer.call = product.call;
  if (match->residual) {
    consumer.call.inputs.resize(3);  // no bias: input 2 absent
    consumer.call.inputs.push_back(ir::View{match->residual->name, dtype, match->residual->layout});
  }
  consumer.call.op = fused;
  for (const ir::Origin& o : product.origins) consumer.add_origin(o);
  return true;
}

bool conv_has_epilogue(const ir::ExternCall& call) {
  const ir::ConvCall* conv = call.as<ir::ConvCall>();
  return conv != nullptr &&
         ((call.inputs.size() > 2 && call.inputs[2].has_value()) || conv->residual ||
          conv->applied_activation() != ir::ConvActivation::kNone);
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
  const ir::ConvActivation act = call.applied_activation();
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
  const ir::ConvActivation act = call.applied_activation();
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
