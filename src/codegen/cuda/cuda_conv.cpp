#include "codegen/cuda/cuda_conv.h"

#include <fmt/format.h>

#include <optional>

#include "codegen/cpp/cpp_host_text.h"
#include "codegen/cuda/cuda_matmul.h"
#include "sched/template_epilogue.h"
#include "support/error.h"

namespace kiln::codegen {

using ir::OpCode;
using ir::ValueId;

bool fuse_conv_epilogue(const ir::Program& program, const ir::Buffer& product,
                        ir::Buffer& consumer) {
  const ir::ConvCall* call = product.call.as<ir::ConvCall>();
  if (call == nullptr || call->choice != nullptr || call->residual || call->relu_post_ops != 0 ||
      product.call.inputs.size() > 3 || product.dtype != graph::DType::kFloat32 ||
      consumer.kind != ir::BufferKind::kComputed || consumer.is_reduction() ||
      consumer.dtype != graph::DType::kFloat32 || consumer.layout.sizes != product.layout.sizes ||
      !consumer.layout.is_contiguous() || !product.layout.is_contiguous() ||
      consumer.body.sizes() != product.layout.sizes) {
    return false;
  }
  const ir::LoopBody& body = consumer.body;
  const sym::Expr identity = sched::elementwise_index(program, product.layout, body);
  const sym::Expr stored_at = sched::elementwise_index(program, consumer.layout, body);
  // The value so far (the product, + residual, then Relus), the residual's load and buffer.
  std::optional<ValueId> current, residual;
  const ir::Buffer* residual_buffer = nullptr;
  bool added = false, stored = false;
  int relus = 0;
  for (size_t id = 0; id < body.ops().size(); ++id) {
    const auto v = static_cast<ValueId>(id);
    const ir::Op& op = body.op(v);
    if (stored) return false;
    switch (op.code) {
      case OpCode::kLoad: {
        if (op.mask != ir::kNoValue || op.buffer_dtype != graph::DType::kFloat32 ||
            op.dtype != graph::DType::kFloat32) {
          return false;
        }
        if (op.buffer == product.name && op.index == identity && !current) {
          current = v;
          break;
        }
        // Any other buffer of the product's sizes, contiguous, read at the element the
        // iteration computes: the residual.
        const ir::Buffer* r = program.find(op.buffer);
        if (residual || r == nullptr || op.buffer == product.name ||
            r->dtype != graph::DType::kFloat32 || r->layout.sizes != product.layout.sizes ||
            !r->layout.is_contiguous() ||
            op.index != sched::elementwise_index(program, r->layout, body)) {
          return false;
        }
        residual = v;
        residual_buffer = r;
        break;
      }
      case OpCode::kAdd:
        // current + residual, in either order, once, before any Relu.
        if (!current || !residual || added || relus > 0 ||
            !((op.operands[0] == *current && op.operands[1] == *residual) ||
              (op.operands[1] == *current && op.operands[0] == *residual))) {
          return false;
        }
        added = true;
        current = v;
        break;
      case OpCode::kRelu:
        if (!current || op.operands[0] != *current) return false;
        ++relus;  // Relu(Relu(z)) is Relu(z)
        current = v;
        break;
      case OpCode::kStore:
        if (!current || op.operands[0] != *current || op.index != stored_at) return false;
        stored = true;
        break;
      default:
        return false;
    }
  }
  if (!stored || (residual && !added) || (!added && relus == 0)) return false;
  ir::ConvCall fused = *call;
  fused.residual = added;
  fused.relu_post_ops = relus > 0 ? 1 : 0;
  consumer.kind = ir::BufferKind::kExtern;
  consumer.call = product.call;
  if (added) {
    consumer.call.inputs.resize(3);  // no bias: input 2 absent
    consumer.call.inputs.push_back(
        ir::View{residual_buffer->name, graph::DType::kFloat32, residual_buffer->layout});
  }
  consumer.call.op = fused;
  for (const ir::Origin& o : product.origins) consumer.add_origin(o);
  return true;
}

bool conv_has_epilogue(const ir::ExternCall& call) {
  const ir::ConvCall* conv = call.as<ir::ConvCall>();
  return conv != nullptr && ((call.inputs.size() > 2 && call.inputs[2].has_value()) ||
                             conv->residual || conv->relu_post_ops > 0);
}

std::string conv_epilogue_source() {
  return R"(
// A convolution's epilogue where cuDNN has no engine for the convolution fused with it
// (kiln_rt_cuda.h RunState::conv): y = y + bias[c] (bias not null), + residual (not null), then
// Relu (relu != 0), over n elements; the channel of element i is i / inner % channels (inner 1
// for channels-last activations, H * W for NCHW ones).
template <typename T>
__device__ void kiln_conv_epilogue(T* y, const T* bias, const T* residual, int64_t relu,
                                   int64_t n, int64_t channels, int64_t inner) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T v = y[i];
    if (bias != nullptr) v = v + bias[i / inner % channels];
    if (residual != nullptr) v = v + residual[i];
    if (relu != 0) v = v < T(0) ? T(0) : v;  // NaN stays NaN
    y[i] = v;
  }
}

extern "C" __global__ void kiln_conv_epilogue_f32(float* y, const float* bias,
                                                  const float* residual, int64_t relu, int64_t n,
                                                  int64_t channels, int64_t inner) {
  kiln_conv_epilogue(y, bias, residual, relu, n, channels, inner);
}

extern "C" __global__ void kiln_conv_epilogue_f64(double* y, const double* bias,
                                                  const double* residual, int64_t relu, int64_t n,
                                                  int64_t channels, int64_t inner) {
  kiln_conv_epilogue(y, bias, residual, relu, n, channels, inner);
}
)";
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
  KILN_CHECK(buffer.dtype == graph::DType::kFloat32 || buffer.dtype == graph::DType::kFloat64,
             "conv {}: cuDNN convolutions are float32 or float64, not {}", buffer.name,
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
  const bool tf32 = buffer.dtype == graph::DType::kFloat32 && precision == ir::Precision::kTf32;
  std::string epilogue;
  if (bias) epilogue += " + bias";
  if (call.residual) epilogue += " + residual";
  if (call.relu_post_ops > 0) epilogue += ", Relu";
  out.linef("// cuDNN convolution{}{}, {}", call.channels_last ? " (channels-last)" : "",
            epilogue.empty() ? "" : epilogue + " in its graph",
            buffer.dtype == graph::DType::kFloat64 ? "float64"
            : tf32                                 ? "TF32 allowed"
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
  out.linef("state.cuda.conv<{}>({}, shape, {}, {}, {}, {}, {}, {}, {}, {});", ctype(buffer.dtype),
            site, data_pointer(x), data_pointer(w), buffer.name,
            bias ? data_pointer(*in[2]) : "nullptr",
            call.residual ? data_pointer(*in[3]) : "nullptr",
            call.relu_post_ops > 0 ? "true" : "false", tf32 ? "true" : "false", cpp_quote(label));
  // A profiled run waits for each call, so that its event times the convolution.
  out.linef("if (profile != nullptr) state.cuda.synchronize({});", cpp_quote(label));
}

std::optional<std::string> cuda_conv_problem(const ir::Buffer& buffer, ir::Precision precision) {
  const ir::ConvCall& call = *buffer.call.as<ir::ConvCall>();
  const auto& in = buffer.call.inputs;
  if (in.size() < 2 || !in[0] || !in[1]) return std::nullopt;
  const bool bias = in.size() > 2 && in[2].has_value();
  const bool f64 = buffer.dtype == graph::DType::kFloat64;
  const bool tf32 = !f64 && precision == ir::Precision::kTf32;
  // NCHW-ordered dims, as write_cuda_conv passes them.
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
      "{} {} {} bias {} residual {} relu {} x {} w {} y {} strides {} pads {} dilations {}",
      f64 ? "f64" : "f32",
      f64    ? "fp64"
      : tf32 ? "tf32"
             : "fp32",
      call.channels_last ? "nhwc" : "nchw", bias ? 1 : 0, call.residual ? 1 : 0,
      call.relu_post_ops > 0 ? 1 : 0, *x, *w, *y, fmt::join(strides, ","), fmt::join(begin, ","),
      fmt::join(dilations, ","));
}

}  // namespace kiln::codegen
