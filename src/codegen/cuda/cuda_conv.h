#pragma once
/// Convolutions on the GPU (ir::ConvCall under --device cuda) through cuDNN 9's graph API: the
/// wrapper's call of kiln_rt_cuda.h's RunState::conv. Lowering gives a float32 convolution its
/// bias as input 2 (a float64 one as a pointwise consumer) and, for networks of convolutions,
/// channels-last activations with the weight packed [M, KH, KW, C] (lower/nn.cpp); it makes no
/// CPU convolution choice. fuse_conv_epilogue folds the pointwise reader that adds a residual
/// and applies an activation (Relu, Sigmoid, Tanh, Clip, LeakyRelu, Elu, Gelu, Swish: cuDNN's
/// pointwise modes) into the call, so that bias, residual Add and activation are nodes of the
/// one cuDNN graph (with a kernel of its own after the convolution, kiln_conv_epilogue, where
/// cuDNN has no engine for that graph).

#include <optional>
#include <string>

#include "ir/buffer.h"
#include "ir/device.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

/// When `consumer`, the only reader of the float32 convolution `product` (no epilogue yet), is
/// product [+ residual] [then an activation] elementwise, with a residual buffer of the
/// product's layout: rewrites `consumer` into the call with that epilogue (ConvCall::residual,
/// input 3; relu_post_ops for Relu, else ConvCall::activation) and returns true; else leaves
/// both alone and returns false.
bool fuse_conv_epilogue(const ir::Program& program, const ir::Buffer& product,
                        ir::Buffer& consumer);

/// Whether a convolution call on CUDA adds a bias, a residual or applies an activation after the
/// convolution: the model's module then carries kiln_conv_epilogue (conv_epilogue_source).
bool conv_has_epilogue(const ir::ExternCall& call);

/// The CUDA source of kiln_conv_epilogue_f32, _f64, _f16 and _bf16 (the half types computed in
/// float32): y = act(y + bias[c] + residual), the
/// epilogue the run applies after the convolution alone where cuDNN has no engine for the fused
/// graph.
std::string conv_epilogue_source();

/// Writes the call computing `buffer`, a ConvCall on the GPU (float32, float64, float16 or
/// bfloat16, contiguous X
/// and W). `site` numbers the call in the wrapper (the run state keeps a plan per site);
/// `precision` says whether float32 convolutions may use TF32 tensor cores; `label` names the
/// call in a profiled run, which waits for it.
void write_cuda_conv(IndentedBuffer& out, const ir::Buffer& buffer, int site,
                     ir::Precision precision, const std::string& label);

/// The text that names `buffer`'s convolution (a ConvCall on the GPU) in the autotune cache, as
/// kiln_rt_cuda.h's conv_problem_text writes it at run time, or nothing when a size is symbolic.
std::optional<std::string> cuda_conv_problem(const ir::Buffer& buffer, ir::Precision precision);

}  // namespace kiln::codegen
