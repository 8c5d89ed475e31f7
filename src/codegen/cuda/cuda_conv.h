#pragma once
/// Convolutions on the GPU (ir::ConvCall under --device cuda) through cuDNN 9's graph API: the
/// wrapper's call of kiln_rt_cuda.h's RunState::conv. Lowering for CUDA gives the convolution
/// without its bias (a pointwise consumer, fused with what follows into one kernel) and makes
/// no CPU convolution choice.

#include <string>

#include "ir/buffer.h"
#include "ir/device.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

/// Writes the call computing `buffer`, a ConvCall on the GPU (float32 or float64, contiguous X
/// and W). `site` numbers the call in the wrapper (the run state keeps a plan per site);
/// `precision` says whether float32 convolutions may use TF32 tensor cores; `label` names the
/// call in a profiled run, which waits for it.
void write_cuda_conv(IndentedBuffer& out, const ir::Buffer& buffer, int site,
                     ir::Precision precision, const std::string& label);

}  // namespace kiln::codegen
