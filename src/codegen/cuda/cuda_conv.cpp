#include "codegen/cuda/cuda_conv.h"

#include <fmt/format.h>

#include "codegen/cpp/cpp_host_text.h"
#include "support/error.h"

namespace kiln::codegen {

void write_cuda_conv(IndentedBuffer& out, const ir::Buffer& buffer, int site,
                     ir::Precision precision, const std::string& label) {
  const ir::ConvCall& call = *buffer.call.as<ir::ConvCall>();
  const auto& in = buffer.call.inputs;
  KILN_CHECK(in.size() == 2 && in[0] && in[1] && call.choice == nullptr &&
                 call.relu_post_ops == 0 && !call.channels_last,
             "conv {}: on CUDA, expected X and W only, no choice, no post-ops", buffer.name);
  KILN_CHECK(buffer.dtype == graph::DType::kFloat32 || buffer.dtype == graph::DType::kFloat64,
             "conv {}: cuDNN convolutions are float32 or float64, not {}", buffer.name,
             graph::dtype_name(buffer.dtype));
  const ir::View &x = *in[0], &w = *in[1];
  KILN_CHECK(x.layout.is_contiguous() && w.layout.is_contiguous() && buffer.layout.is_contiguous(),
             "conv {}: cuDNN reads contiguous X and W here", buffer.name);
  const size_t spatial = x.layout.rank() - 2;
  std::vector<std::string> strides, begin, end, dilations;
  for (size_t k = 0; k < spatial; ++k) {
    strides.push_back(std::to_string(k < call.strides.size() ? call.strides[k] : 1));
    dilations.push_back(std::to_string(k < call.dilations.size() ? call.dilations[k] : 1));
    begin.push_back(std::to_string(k < call.pads.size() ? call.pads[k] : 0));
    end.push_back(std::to_string(spatial + k < call.pads.size() ? call.pads[spatial + k] : 0));
  }
  const bool tf32 = buffer.dtype == graph::DType::kFloat32 && precision == ir::Precision::kTf32;
  out.linef("// cuDNN convolution, {}", buffer.dtype == graph::DType::kFloat64 ? "float64"
                                        : tf32                                 ? "TF32 allowed"
                                                                               : "float32");
  out.linef("const int64_t x_dims[] = {{{}}};", dims_list(x.layout.sizes));
  out.linef("const int64_t w_dims[] = {{{}}};", dims_list(w.layout.sizes));
  out.linef("const int64_t y_dims[] = {{{}}};", dims_list(buffer.layout.sizes));
  out.linef("const int64_t strides[] = {{{}}};", fmt::join(strides, ", "));
  out.linef("const int64_t pads_begin[] = {{{}}};", fmt::join(begin, ", "));
  out.linef("const int64_t pads_end[] = {{{}}};", fmt::join(end, ", "));
  out.linef("const int64_t dilations[] = {{{}}};", fmt::join(dilations, ", "));
  out.linef(
      "const kiln_cuda::ConvShape shape{{{}, x_dims, w_dims, y_dims, strides, pads_begin, "
      "pads_end, dilations}};",
      spatial);
  out.linef("state.cuda.conv<{}>({}, shape, {}, {}, {}, {}, {});", ctype(buffer.dtype), site,
            data_pointer(x), data_pointer(w), buffer.name, tf32 ? "true" : "false",
            cpp_quote(label));
  // A profiled run waits for each call, so that its event times the convolution.
  out.linef("if (profile != nullptr) state.cuda.synchronize({});", cpp_quote(label));
}

}  // namespace kiln::codegen
