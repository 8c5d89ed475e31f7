// Matrix products and convolutions on the GPU through cuBLASLt and cuDNN
// (codegen/cuda/cuda_matmul.h, cuda_conv.h). Without a GPU: the wrapper of MatMul and Gemm models
// compiled for CUDA calls cuBLASLt with transposes folded into the strides it passes, broadcast
// batch dims as stride 0, a bias and Relu or tanh-Gelu fused as the epilogue (and an erf-Gelu
// not), the compute type of --precision, and no wait for the GPU; a Conv is one cuDNN call with
// its bias and Relu one kernel after it. With a GPU: products of awkward shapes (1 x 1, vectors,
// K = 1, odd sizes, broadcast and partly broadcast batches, transposed and strided operands,
// float64, fused epilogues) and convolutions (1-D to 3-D, strided, dilated, asymmetric padding,
// grouped, depthwise, 1 x 1, float64) match a reference computed here in double, at fp32 within
// float32's rounding and at tf32 within TF32's. Without the toolkit or a device the tests skip
// and say why.

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "codegen/cuda/nvrtc_compile.h"
#include "cuda_test_util.h"
#include "driver/compile.h"
#include "model_builder.h"
#include "support/files.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;
using graph::Value;
using test_models::ModelBuilder;

constexpr int64_t kOpset = 20;  // Gelu's first version

using namespace cuda_test;  // NOLINT: the shared fixtures

CompiledModel compile_cuda(const graph::Model& model, const fs::path& dir, ir::Precision precision,
                           bool fused_attention = true, bool channels_last = false) {
  CompileOptions options;
  options.lowering.cuda_fused_attention = fused_attention;  // the attention cases' kernel
  options.device = ir::Device::kCuda;
  options.precision = precision;
  options.lowering.conv_layout =
      channels_last ? lower::ConvLayout::kChannelsLast : lower::ConvLayout::kNchw;
  options.dump_dir = dir / "dump";
  options.cache_dir = dir / "cache";
  return compile(model, options);
}

/// The wrapper of `model` compiled for CUDA (kernels for sm_90 only).
std::string cuda_wrapper(const graph::Model& model, const fs::path& dir,
                         ir::Precision precision = ir::Precision::kTf32,
                         bool fused_attention = true, bool channels_last = false) {
  setenv("KILN_CUDA_ARCHS", "90", 1);
  compile_cuda(model, dir, precision, fused_attention, channels_last);
  unsetenv("KILN_CUDA_ARCHS");
  return files::read(dir / "dump" / "5_wrapper.cpp");
}

/// Deterministic values in [-1, 1) that are not a simple pattern.
double wave(int64_t i, int64_t salt) {
  return std::sin(0.37 * static_cast<double>(i) + 1.3 * salt);
}

Tensor tensor(DType dtype, std::vector<int64_t> dims, int64_t salt) {
  Tensor t(dtype, std::move(dims));
  if (dtype == DType::kFloat64) {
    auto v = t.mutable_values<double>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = wave(static_cast<int64_t>(i), salt);
  } else {
    auto v = t.mutable_values<float>();
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(wave(static_cast<int64_t>(i), salt));
  }
  return t;
}

std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> out;
  if (t.dtype() == DType::kFloat64) {
    for (double v : t.values<double>()) out.push_back(v);
  } else {
    for (float v : t.values<float>()) out.push_back(v);
  }
  return out;
}

/// A dense tensor in double for the references: dims and row-major values.
struct Dense {
  std::vector<int64_t> dims;
  std::vector<double> values;
  double at(const std::vector<int64_t>& index) const {
    int64_t flat = 0;
    for (size_t d = 0; d < dims.size(); ++d) flat = flat * dims[d] + index[d];
    return values[static_cast<size_t>(flat)];
  }
};

/// numpy.matmul in double (1-D operands lifted and their dim dropped), and the sum of |a * b|
/// over each element's K terms (the scale of its rounding error).
std::pair<Dense, std::vector<double>> matmul_reference(Dense a, Dense b) {
  const bool vec_a = a.dims.size() == 1, vec_b = b.dims.size() == 1;
  if (vec_a) a.dims.insert(a.dims.begin(), 1);
  if (vec_b) b.dims.push_back(1);
  const size_t ra = a.dims.size(), rb = b.dims.size(), rank = std::max(ra, rb);
  std::vector<int64_t> batch(rank - 2, 1);
  for (size_t d = 0; d + 2 < rank; ++d) {
    const int64_t da = d + ra >= rank ? a.dims[d + ra - rank] : 1;
    const int64_t db = d + rb >= rank ? b.dims[d + rb - rank] : 1;
    batch[d] = std::max(da, db);
  }
  const int64_t m = a.dims[ra - 2], k = a.dims[ra - 1], n = b.dims[rb - 1];
  Dense out;
  out.dims = batch;
  out.dims.push_back(m);
  out.dims.push_back(n);
  std::vector<double> scale;
  int64_t batches = 1;
  for (int64_t s : batch) batches *= s;
  for (int64_t flat = 0; flat < batches; ++flat) {
    std::vector<int64_t> bi(batch.size());
    for (size_t d = batch.size(), rest = static_cast<size_t>(flat); d-- > 0;) {
      bi[d] = static_cast<int64_t>(rest % static_cast<size_t>(batch[d]));
      rest /= static_cast<size_t>(batch[d]);
    }
    auto operand_index = [&](const Dense& x, size_t r) {
      std::vector<int64_t> index;
      for (size_t d = rank - r; d + 2 < rank; ++d)
        index.push_back(x.dims[d - (rank - r)] == 1 ? 0 : bi[d]);
      return index;
    };
    std::vector<int64_t> ia = operand_index(a, ra), ib = operand_index(b, rb);
    ia.resize(ra);
    ib.resize(rb);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, abs_sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          ia[ra - 2] = i;
          ia[ra - 1] = p;
          ib[rb - 2] = p;
          ib[rb - 1] = j;
          const double term = a.at(ia) * b.at(ib);
          sum += term;
          abs_sum += std::abs(term);
        }
        out.values.push_back(sum);
        scale.push_back(abs_sum);
      }
    }
  }
  if (vec_b) out.dims.pop_back();
  if (vec_a) out.dims.erase(out.dims.end() - (vec_b ? 1 : 2));
  return {out, scale};
}

Dense dense(const Tensor& t) { return {t.dims(), as_doubles(t)}; }

/// The transpose of the last two dims.
Dense transposed(const Dense& x) {
  Dense out = x;
  const size_t r = x.dims.size();
  std::swap(out.dims[r - 1], out.dims[r - 2]);
  const int64_t rows = x.dims[r - 2], cols = x.dims[r - 1];
  const int64_t blocks = static_cast<int64_t>(x.values.size()) / std::max<int64_t>(rows * cols, 1);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        out.values[static_cast<size_t>(blk * rows * cols + j * rows + i)] =
            x.values[static_cast<size_t>(blk * rows * cols + i * cols + j)];
      }
    }
  }
  return out;
}

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/// ONNX Conv in double (X [N, C, ...], W [M, C / group, ...], no bias), and the sum of |x w| over
/// each output's terms.
std::pair<Dense, std::vector<double>> conv_reference(const Dense& x, const Dense& w, int64_t group,
                                                     const std::vector<int64_t>& strides,
                                                     const std::vector<int64_t>& pads,
                                                     const std::vector<int64_t>& dilations) {
  const size_t spatial = x.dims.size() - 2;
  const int64_t n = x.dims[0], c = x.dims[1], m = w.dims[0], cg = w.dims[1];
  Dense out;
  out.dims = {n, m};
  for (size_t d = 0; d < spatial; ++d) {
    const int64_t span = dilations[d] * (w.dims[2 + d] - 1) + 1;
    out.dims.push_back((x.dims[2 + d] + pads[d] + pads[spatial + d] - span) / strides[d] + 1);
  }
  std::vector<double> scale;
  std::vector<int64_t> o(out.dims.size(), 0);
  const int64_t per_group = m / group;
  for (bool more = true; more;) {
    double sum = 0, abs_sum = 0;
    const int64_t g = o[1] / per_group;
    std::vector<int64_t> kk(spatial, 0);
    for (int64_t ci = 0; ci < cg; ++ci) {
      for (bool taps = true; taps;) {
        std::vector<int64_t> xi = {o[0], g * cg + ci};
        bool inside = true;
        for (size_t d = 0; d < spatial; ++d) {
          const int64_t at = o[2 + d] * strides[d] - pads[d] + kk[d] * dilations[d];
          inside = inside && at >= 0 && at < x.dims[2 + d];
          xi.push_back(at);
        }
        if (inside) {
          std::vector<int64_t> wi = {o[1], ci};
          wi.insert(wi.end(), kk.begin(), kk.end());
          const double term = x.at(xi) * w.at(wi);
          sum += term;
          abs_sum += std::abs(term);
        }
        size_t d = spatial;
        while (d > 0 && ++kk[d - 1] == w.dims[1 + d]) kk[--d] = 0;
        taps = d > 0;
      }
    }
    (void)c;
    out.values.push_back(sum);
    scale.push_back(abs_sum);
    size_t d = o.size();
    while (d > 0 && ++o[d - 1] == out.dims[d - 1]) o[--d] = 0;
    more = d > 0;
  }
  return {out, scale};
}

/// Attention in double: out[b, i, :] = sum_j softmax_j(s[b, i, j]) V[b, j, :] with s =
/// score(b, i, j, q_b,i . k_b,j) (the scale and mask applied), Q [B, Lq, D], K [B, Lk, D] and V
/// [B, Lk, Dv] flattened over their batch dims; the scale of each output's rounding error is
/// max |V| (the output is a convex combination of V's rows).
std::pair<Dense, std::vector<double>> attention_reference(
    const Dense& q, const Dense& k, const Dense& v,
    const std::function<double(int64_t, int64_t, int64_t, double)>& score) {
  const size_t r = q.dims.size();
  const int64_t lq = q.dims[r - 2], d = q.dims[r - 1], lk = k.dims[r - 2], dv = v.dims[r - 1];
  const int64_t batches = static_cast<int64_t>(q.values.size()) / (lq * d);
  Dense out;
  out.dims = q.dims;
  out.dims[r - 1] = dv;
  double v_max = 0;
  for (double x : v.values) v_max = std::max(v_max, std::abs(x));
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t i = 0; i < lq; ++i) {
      std::vector<double> s(static_cast<size_t>(lk));
      double top = -INFINITY;
      for (int64_t j = 0; j < lk; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += q.values[static_cast<size_t>((b * lq + i) * d + c)] *
                 k.values[static_cast<size_t>((b * lk + j) * d + c)];
        s[static_cast<size_t>(j)] = score(b, i, j, dot);
        top = std::max(top, s[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - top));
      for (int64_t c = 0; c < dv; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < lk; ++j)
          acc += s[static_cast<size_t>(j)] * v.values[static_cast<size_t>((b * lk + j) * dv + c)];
        out.values.push_back(acc / sum);
      }
    }
  }
  return {out, std::vector<double>(out.values.size(), v_max)};
}

/// One product: its model (inputs x0, x1, ...), the inputs' dims, and its reference from them.
struct Case {
  const char* name;
  std::vector<std::vector<int64_t>> inputs;
  std::function<void(ModelBuilder&, const std::vector<Value*>&)> build;
  std::function<std::pair<Dense, std::vector<double>>(const std::vector<Dense>&)> reference;
  DType dtype = DType::kFloat32;
  /// Compiled with --conv-layout nhwc (channels-last activations, weights packed [M, KH, KW, C]).
  bool channels_last = false;
};

/// MatMul(x0, x1).
Case matmul_case(const char* name, std::vector<int64_t> a, std::vector<int64_t> b,
                 DType dtype = DType::kFloat32) {
  return {name,
          {std::move(a), std::move(b)},
          [](ModelBuilder& m, const std::vector<Value*>& x) {
            m.output(m.op("MatMul", {x[0], x[1]}));
          },
          [](const std::vector<Dense>& x) { return matmul_reference(x[0], x[1]); },
          dtype};
}

/// The convolutions of the activation cases: X [2, 8, 9, 7], W [16, 8, 3, 3] (NCHW) and X
/// [1, 16, 7, 6], W [16, 16, 3, 3] (channels-last), each with a bias, padding 1.
struct ConvActivationShape {
  std::vector<int64_t> x, w;
};
const ConvActivationShape kActivationNchw{{2, 8, 9, 7}, {16, 8, 3, 3}};
const ConvActivationShape kActivationNhwc{{1, 16, 7, 6}, {16, 16, 3, 3}};

/// An activation after a convolution + bias: how the model applies it, its value in double, and
/// the kiln_cuda::ConvActivation the wrapper passes for it (empty: it is not fused).
struct ActivationCase {
  const char* name;
  std::function<Value*(ModelBuilder&, Value*)> apply;
  std::function<double(double)> reference;
  std::string passed;
  bool channels_last = false;
};

/// A float32 scalar constant.
Value* scalar(ModelBuilder& m, float v) {
  Tensor t(DType::kFloat32, {});
  t.mutable_values<float>()[0] = v;
  return m.constant(std::move(t));
}

std::vector<ActivationCase> activation_cases() {
  auto unary = [](const char* op, std::map<std::string, graph::AttributeValue> attributes = {}) {
    return [op, attributes](ModelBuilder& m, Value* y) { return m.op(op, {y}, attributes); };
  };
  auto clip = [](float lo, float hi) {
    return [lo, hi](ModelBuilder& m, Value* y) {
      return m.op("Clip", {y, scalar(m, lo), scalar(m, hi)});
    };
  };
  auto clamp = [](double lo, double hi) {
    return [lo, hi](double v) { return std::min(std::max(v, lo), hi); };
  };
  auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  auto gelu = [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
  return {
      {"conv2d_bias_sigmoid", unary("Sigmoid"), sigmoid, "{2, 0, 0}"},
      {"conv2d_bias_tanh", unary("Tanh"), [](double v) { return std::tanh(v); }, "{3, 0, 0}"},
      {"conv2d_bias_relu6", clip(0, 6), clamp(0, 6), "{4, 0, 6}"},
      {"conv2d_bias_clip", clip(-1, 1.5f), clamp(-1, 1.5), "{4, -1, 1.5}"},
      {"conv2d_bias_leaky_relu", unary("LeakyRelu", {{"alpha", 0.25f}}),
       [](double v) { return v < 0 ? 0.25 * v : v; }, "{5, 0.25, 0}"},
      {"conv2d_bias_elu", unary("Elu", {{"alpha", 0.5f}}),
       [](double v) { return v < 0 ? 0.5 * std::expm1(v) : v; }, "{6, 0.5, 0}"},
      {"conv2d_bias_gelu", unary("Gelu"), gelu, "{7, 0, 0}"},
      {"conv2d_bias_gelu_tanh", unary("Gelu", {{"approximate", std::string("tanh")}}), gelu_tanh,
       "{8, 0, 0}"},
      {"conv2d_bias_silu",
       [](ModelBuilder& m, Value* y) {
         return m.op("Mul", {y, m.op("Sigmoid", {y})});
       },
       [sigmoid](double v) { return v * sigmoid(v); }, "{9, 1, 0}"},
      // No pointwise mode of cuDNN: the call stops at the bias, the activation is a kernel.
      {"conv2d_bias_hard_sigmoid", unary("HardSigmoid", {{"alpha", 0.25f}, {"beta", 0.5f}}),
       [](double v) { return std::min(std::max(0.25 * v + 0.5, 0.0), 1.0); }, ""},
      {"conv2d_bias_relu6_nhwc", clip(0, 6), clamp(0, 6), "{4, 0, 6}", true},
      {"conv2d_bias_silu_nhwc",
       [](ModelBuilder& m, Value* y) {
         return m.op("Mul", {y, m.op("Sigmoid", {y})});
       },
       [sigmoid](double v) { return v * sigmoid(v); }, "{9, 1, 0}", true},
  };
}

std::vector<Case> cases() {
  std::vector<Case> c = {
      matmul_case("one_by_one", {1, 1}, {1, 1}),
      matmul_case("k_is_one", {6, 1}, {1, 5}),
      matmul_case("odd_sizes", {17, 33}, {33, 9}),
      matmul_case("row_times_wide_matrix", {1, 300}, {300, 257}),
      matmul_case("tall_times_column", {1000, 3}, {3, 1}),
      matmul_case("vector_dot_vector", {7}, {7}),
      matmul_case("matrix_times_vector", {5, 8}, {8}),
      matmul_case("vector_times_matrix", {8}, {8, 3}),
      matmul_case("batch_broadcast_both_ways", {2, 1, 5, 7}, {3, 7, 4}),
      matmul_case("attention_scores", {2, 4, 9, 16}, {2, 4, 16, 9}),
      // B broadcast in the inner batch dim only: the outer dim is looped, the inner one batched.
      matmul_case("partly_broadcast_batch", {3, 2, 5, 6}, {3, 1, 6, 7}),
      matmul_case("float64", {6, 5}, {5, 3}, DType::kFloat64),
      matmul_case("float64_batched", {4, 3, 5}, {5, 2}, DType::kFloat64),
  };
  // A transposed by a Transpose node: a view with swapped strides, folded into the op.
  c.push_back(
      {"transposed_operand",
       {{7, 5}, {7, 3}},
       [](ModelBuilder& m, const std::vector<Value*>& x) {
         Value* t = m.op("Transpose", {x[0]}, {{"perm", std::vector<int64_t>{1, 0}}});
         m.output(m.op("MatMul", {t, x[1]}));
       },
       [](const std::vector<Dense>& x) { return matmul_reference(transposed(x[0]), x[1]); }});
  // Attention's head split: [B, S, H, D] permuted to [B, H, S, D] (batch strides that do not
  // merge, rows of stride H * D).
  c.push_back({"permuted_heads",
               {{2, 6, 3, 4}, {2, 3, 4, 6}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 Value* q = m.op("Transpose", {x[0]}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
                 m.output(m.op("MatMul", {q, x[1]}));
               },
               [](const std::vector<Dense>& x) {
                 Dense q;
                 q.dims = {2, 3, 6, 4};
                 for (int64_t b = 0; b < 2; ++b)
                   for (int64_t h = 0; h < 3; ++h)
                     for (int64_t s = 0; s < 6; ++s)
                       for (int64_t d = 0; d < 4; ++d) q.values.push_back(x[0].at({b, s, h, d}));
                 return matmul_reference(q, x[1]);
               }});
  // Every second column of A: a stride cuBLASLt cannot read, made contiguous first.
  c.push_back({"column_stride_two",
               {{5, 12}, {6, 4}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 Value* s = m.op("Slice", {x[0], m.ints({0}, {1}), m.ints({12}, {1}),
                                           m.ints({1}, {1}), m.ints({2}, {1})});
                 m.output(m.op("MatMul", {s, x[1]}));
               },
               [](const std::vector<Dense>& x) {
                 Dense s;
                 s.dims = {5, 6};
                 for (int64_t i = 0; i < 5; ++i)
                   for (int64_t j = 0; j < 6; ++j) s.values.push_back(x[0].at({i, 2 * j}));
                 return matmul_reference(s, x[1]);
               }});
  // Gemm with both transposes, alpha, and a bias C of [N] (fused as cuBLASLt's BIAS epilogue).
  c.push_back({"gemm_transposes_alpha_bias",
               {{6, 4}, {5, 6}, {5}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 m.output(m.op("Gemm", {x[0], x[1], x[2]},
                               {{"transA", int64_t{1}}, {"transB", int64_t{1}}, {"alpha", 0.5f}}));
               },
               [](const std::vector<Dense>& x) {
                 auto [out, scale] = matmul_reference(transposed(x[0]), transposed(x[1]));
                 for (size_t i = 0; i < out.values.size(); ++i) {
                   out.values[i] = 0.5 * out.values[i] + x[2].values[i % 5];
                   scale[i] = 0.5 * scale[i] + 1;
                 }
                 return std::make_pair(out, scale);
               }});
  // Gemm with a full C and beta: a pointwise kernel after the product.
  c.push_back({"gemm_beta_matrix",
               {{4, 3}, {3, 5}, {4, 5}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 m.output(m.op("Gemm", {x[0], x[1], x[2]}, {{"beta", 0.25f}}));
               },
               [](const std::vector<Dense>& x) {
                 auto [out, scale] = matmul_reference(x[0], x[1]);
                 for (size_t i = 0; i < out.values.size(); ++i) {
                   out.values[i] += 0.25 * x[2].values[i];
                   scale[i] += 1;
                 }
                 return std::make_pair(out, scale);
               }});
  // MatMul, Add of a bias vector, Relu: cuBLASLt's RELU_BIAS epilogue, batched.
  c.push_back({"matmul_bias_relu",
               {{3, 10, 16}, {16, 24}, {24}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 m.output(m.op("Relu", {m.op("Add", {m.op("MatMul", {x[0], x[1]}), x[2]})}));
               },
               [](const std::vector<Dense>& x) {
                 auto [out, scale] = matmul_reference(x[0], x[1]);
                 for (size_t i = 0; i < out.values.size(); ++i) {
                   out.values[i] = std::max(0.0, out.values[i] + x[2].values[i % 24]);
                   scale[i] += 1;
                 }
                 return std::make_pair(out, scale);
               }});
  // A transformer's projection: MatMul, Add of a bias vector, Add of the layer's input (the
  // residual): cuBLASLt's BIAS epilogue with the residual as C (beta 1), batched.
  c.push_back({"matmul_bias_residual",
               {{2, 7, 16}, {16, 24}, {24}, {2, 7, 24}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 m.output(m.op("Add", {x[3], m.op("Add", {m.op("MatMul", {x[0], x[1]}), x[2]})}));
               },
               [](const std::vector<Dense>& x) {
                 auto [out, scale] = matmul_reference(x[0], x[1]);
                 for (size_t i = 0; i < out.values.size(); ++i) {
                   out.values[i] += x[2].values[i % 24] + x[3].values[i];
                   scale[i] += 2;
                 }
                 return std::make_pair(out, scale);
               }});
  // A residual without a bias, then Relu: RELU with the residual as C.
  c.push_back({"matmul_residual_relu",
               {{9, 12}, {12, 5}, {9, 5}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 m.output(m.op("Relu", {m.op("Add", {m.op("MatMul", {x[0], x[1]}), x[2]})}));
               },
               [](const std::vector<Dense>& x) {
                 auto [out, scale] = matmul_reference(x[0], x[1]);
                 for (size_t i = 0; i < out.values.size(); ++i) {
                   out.values[i] = std::max(0.0, out.values[i] + x[2].values[i]);
                   scale[i] += 1;
                 }
                 return std::make_pair(out, scale);
               }});
  // MatMul then tanh-Gelu: cuBLASLt's GELU epilogue.
  c.push_back({"matmul_gelu_tanh",
               {{10, 32}, {32, 20}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 m.output(m.op("Gelu", {m.op("MatMul", {x[0], x[1]})},
                               {{"approximate", std::string("tanh")}}));
               },
               [](const std::vector<Dense>& x) {
                 auto [out, scale] = matmul_reference(x[0], x[1]);
                 for (double& v : out.values) v = gelu_tanh(v);
                 return std::make_pair(out, scale);
               }});
  // Three projections of one input (a transformer's Q, K and V: MatMul by a constant weight,
  // Add of a constant bias), combined as q * k + v: one product against the weights
  // concatenated along N (24 columns), with the concatenated bias as its epilogue.
  c.push_back({"qkv_projections",
               {{2, 5, 16}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 Value* out[3];
                 for (int64_t p = 0; p < 3; ++p) {
                   Value* w = m.constant(tensor(DType::kFloat32, {16, 8}, 10 + p));
                   Value* b = m.constant(tensor(DType::kFloat32, {8}, 20 + p));
                   out[p] = m.op("Add", {m.op("MatMul", {x[0], w}), b});
                 }
                 m.output(m.op("Add", {m.op("Mul", {out[0], out[1]}), out[2]}));
               },
               [](const std::vector<Dense>& x) {
                 std::vector<Dense> y;
                 std::vector<std::vector<double>> scales;
                 for (int64_t p = 0; p < 3; ++p) {
                   auto [out, scale] =
                       matmul_reference(x[0], dense(tensor(DType::kFloat32, {16, 8}, 10 + p)));
                   const Dense b = dense(tensor(DType::kFloat32, {8}, 20 + p));
                   for (size_t i = 0; i < out.values.size(); ++i) {
                     out.values[i] += b.values[i % 8];
                     scale[i] += 1;
                   }
                   y.push_back(out);
                   scales.push_back(scale);
                 }
                 Dense out = y[2];
                 std::vector<double> scale = scales[2];
                 for (size_t i = 0; i < out.values.size(); ++i) {
                   out.values[i] += y[0].values[i] * y[1].values[i];
                   scale[i] += scales[0][i] * std::abs(y[1].values[i]) +
                               scales[1][i] * std::abs(y[0].values[i]);
                 }
                 return std::make_pair(out, scale);
               }});
  // Attention as exporters write it, fused into Kiln's kernel (codegen/cuda/cuda_attention.h;
  // float32 at either precision). K given as [B, H, Lk, D] and transposed (K^T read along D),
  // a Div scale, 2 x 3 heads, partial tiles (Lq 40: 5 blocks of 8; Lk 70: 3 tiles of 32) and
  // Dv 72 (three output columns a lane, the last partly).
  c.push_back(
      {"attention_div_scale",
       {{2, 3, 40, 64}, {2, 3, 70, 64}, {2, 3, 70, 72}},
       [](ModelBuilder& m, const std::vector<Value*>& x) {
         Tensor eight(DType::kFloat32, {});
         eight.mutable_values<float>()[0] = 8.0f;
         Value* kt = m.op("Transpose", {x[1]}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
         Value* s = m.op("Div", {m.op("MatMul", {x[0], kt}), m.constant(eight)});
         m.output(m.op("MatMul", {m.op("Softmax", {s}, {{"axis", int64_t{-1}}}), x[2]}));
       },
       [](const std::vector<Dense>& x) {
         return attention_reference(
             x[0], x[1], x[2], [](int64_t, int64_t, int64_t, double dot) { return dot / 8.0; });
       }});
  // K^T given as [B, D, Lk] (read along the keys), a Mul scale and an additive float mask
  // [Lq, Lk] broadcast over the batch; D 8, Dv 16 (lanes past Dv idle), Lk 45.
  c.push_back({"attention_add_mask",
               {{3, 33, 8}, {3, 8, 45}, {3, 45, 16}, {33, 45}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 Tensor scale(DType::kFloat32, {});
                 scale.mutable_values<float>()[0] = 0.75f;
                 Value* s = m.op("Mul", {m.op("MatMul", {x[0], x[1]}), m.constant(scale)});
                 s = m.op("Add", {s, x[3]});
                 m.output(m.op("MatMul", {m.op("Softmax", {s}, {{"axis", int64_t{-1}}}), x[2]}));
               },
               [](const std::vector<Dense>& x) {
                 const Dense k = transposed(x[1]);
                 const Dense mask = x[3];
                 return attention_reference(
                     x[0], k, x[2], [mask](int64_t, int64_t i, int64_t j, double dot) {
                       return static_cast<double>(0.75f) * dot + mask.at({i, j});
                     });
               }});
  // A bool mask from data (x3 < 0.2, [B, 1, Lq, Lk] broadcast over the heads) keeping the
  // scores where true, -1e4 elsewhere (Where); Lq 20 and Lk 20.
  c.push_back({"attention_where_mask",
               {{2, 2, 20, 32}, {2, 2, 32, 20}, {2, 2, 20, 24}, {2, 1, 20, 20}},
               [](ModelBuilder& m, const std::vector<Value*>& x) {
                 Tensor scale(DType::kFloat32, {}), cut(DType::kFloat32, {}),
                     fill(DType::kFloat32, {});
                 scale.mutable_values<float>()[0] = 0.125f;
                 cut.mutable_values<float>()[0] = 0.2f;
                 fill.mutable_values<float>()[0] = -1e4f;
                 Value* s = m.op("Mul", {m.constant(scale), m.op("MatMul", {x[0], x[1]})});
                 Value* keep = m.op("Less", {x[3], m.constant(cut)});
                 s = m.op("Where", {keep, s, m.constant(fill)});
                 m.output(m.op("MatMul", {m.op("Softmax", {s}, {{"axis", int64_t{-1}}}), x[2]}));
               },
               [](const std::vector<Dense>& x) {
                 const Dense k = transposed(x[1]);
                 const Dense mask = x[3];
                 return attention_reference(
                     x[0], k, x[2], [mask](int64_t b, int64_t i, int64_t j, double dot) {
                       const bool keep = static_cast<float>(mask.at({b / 2, 0, i, j})) < 0.2f;
                       return keep ? 0.125 * dot : -1e4;
                     });
               }});
  // Convolutions on cuDNN (the same file: the same harness; all run at both precisions).
  struct ConvCase {
    const char* name;
    std::vector<int64_t> x, w;
    int64_t group;
    std::vector<int64_t> strides, pads, dilations;
    bool bias_relu;
    DType dtype = DType::kFloat32;
    // Relu(Conv + bias + residual): 1 the residual is x3 (the output's dims); 2 a first
    // convolution Y1 = Conv(X, W) (no bias) is both the input and the residual, Relu(Conv(Y1, W)
    // + bias + Y1) (C == M, stride 1, same padding), as in a network where Y1 is an
    // intermediate channels-last buffer.
    int residual = 0;
    bool channels_last = false;
  };
  const std::vector<ConvCase> convs = {
      {"conv2d_strided_dilated_bias_relu",
       {2, 3, 9, 11},
       {4, 3, 3, 3},
       1,
       {2, 1},
       {1, 0, 2, 1},
       {1, 2},
       true},
      {"conv1d_grouped", {1, 4, 20}, {6, 2, 5}, 2, {3}, {2, 2}, {1}, false},
      {"conv3d",
       {1, 2, 5, 6, 4},
       {3, 2, 3, 2, 2},
       1,
       {1, 1, 1},
       {1, 1, 1, 1, 0, 1},
       {1, 1, 1},
       true},
      {"conv2d_depthwise", {1, 8, 7, 7}, {8, 1, 3, 3}, 8, {1, 1}, {1, 1, 1, 1}, {1, 1}, true},
      {"conv2d_one_by_one", {3, 16, 5, 5}, {32, 16, 1, 1}, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, false},
      {"conv2d_float64",
       {1, 3, 6, 5},
       {2, 3, 3, 3},
       1,
       {1, 1},
       {1, 1, 1, 1},
       {1, 1},
       true,
       DType::kFloat64},
      // The epilogues cuDNN takes into the convolution's graph (cuda_conv.h), NCHW and
      // channels-last (the weight packed [M, KH, KW, C] when compiling).
      {"conv2d_bias_residual_relu",
       {2, 8, 9, 7},
       {16, 8, 3, 3},
       1,
       {1, 1},
       {1, 1, 1, 1},
       {1, 1},
       true,
       DType::kFloat32,
       1},
      {"conv2d_bias_residual_relu_nhwc",
       {2, 16, 9, 7},
       {16, 16, 3, 3},
       1,
       {1, 1},
       {1, 1, 1, 1},
       {1, 1},
       true,
       DType::kFloat32,
       2,
       true},
      {"conv2d_strided_bias_relu_nhwc",
       {1, 12, 11, 10},
       {24, 12, 3, 3},
       1,
       {2, 2},
       {1, 0, 1, 2},
       {1, 1},
       true,
       DType::kFloat32,
       0,
       true},
      {"conv2d_depthwise_nhwc",
       {1, 16, 7, 7},
       {16, 1, 3, 3},
       16,
       {1, 1},
       {1, 1, 1, 1},
       {1, 1},
       true,
       DType::kFloat32,
       0,
       true},
  };
  for (const ConvCase& v : convs) {
    std::vector<std::vector<int64_t>> inputs = {v.x, v.w};
    if (v.bias_relu) inputs.push_back({v.w[0]});
    if (v.residual == 1) {  // the output's dims (stride 1, same padding)
      std::vector<int64_t> dims = v.x;
      dims[1] = v.w[0];
      inputs.push_back(dims);
    }
    c.push_back({v.name, inputs,
                 [v](ModelBuilder& m, const std::vector<Value*>& x) {
                   const std::map<std::string, graph::AttributeValue> attributes = {
                       {"group", v.group},
                       {"strides", v.strides},
                       {"pads", v.pads},
                       {"dilations", v.dilations}};
                   Value* first = v.residual == 2 ? m.op("Conv", {x[0], x[1]}, attributes) : x[0];
                   std::vector<Value*> in = {first, x[1]};
                   if (v.bias_relu) in.push_back(x[2]);
                   Value* y = m.op("Conv", in, attributes);
                   if (v.residual) y = m.op("Add", {y, v.residual == 1 ? x[3] : first});
                   if (v.bias_relu) y = m.op("Relu", {y});
                   // A channels-last model's output is NCHW: a 1x1 MaxPool (the identity) keeps
                   // the Relu channels-last, as between a network's convolutions, so that it
                   // fuses into the call.
                   if (v.channels_last)
                     y = m.op("MaxPool", {y}, {{"kernel_shape", std::vector<int64_t>{1, 1}}});
                   m.output(y);
                 },
                 [v](const std::vector<Dense>& x) {
                   Dense first = x[0];
                   std::vector<double> first_scale(x[0].values.size(), 0.0);
                   if (v.residual == 2) {
                     std::tie(first, first_scale) =
                         conv_reference(x[0], x[1], v.group, v.strides, v.pads, v.dilations);
                   }
                   auto [out, scale] =
                       conv_reference(first, x[1], v.group, v.strides, v.pads, v.dilations);
                   if (v.residual == 2) {
                     // Y1's rounding carries into the second convolution: at most the largest
                     // sum of |W| over an output channel's taps times Y1's largest bound.
                     double w_sum = 0, s1 = 0;
                     const size_t taps = x[1].values.size() / static_cast<size_t>(x[1].dims[0]);
                     for (size_t mm = 0; mm < static_cast<size_t>(x[1].dims[0]); ++mm) {
                       double sum = 0;
                       for (size_t t = 0; t < taps; ++t)
                         sum += std::abs(x[1].values[mm * taps + t]);
                       w_sum = std::max(w_sum, sum);
                     }
                     for (double b : first_scale) s1 = std::max(s1, b);
                     for (size_t i = 0; i < scale.size(); ++i)
                       scale[i] += first_scale[i] + w_sum * s1;
                   }
                   if (v.bias_relu) {
                     int64_t inner = 1;
                     for (size_t d = 2; d < out.dims.size(); ++d) inner *= out.dims[d];
                     for (size_t i = 0; i < out.values.size(); ++i) {
                       const int64_t channel = static_cast<int64_t>(i) / inner % out.dims[1];
                       double value = out.values[i] + x[2].values[static_cast<size_t>(channel)];
                       if (v.residual) value += (v.residual == 1 ? x[3] : first).values[i];
                       out.values[i] = std::max(0.0, value);
                       scale[i] += v.residual ? 2 : 1;
                     }
                   }
                   return std::make_pair(out, scale);
                 },
                 v.dtype, v.channels_last});
  }
  // Activations other than Relu in the convolution's graph (cuda_conv.h: cuDNN's pointwise
  // modes): Conv + bias, then the activation, checked against the double reference. The bound
  // is the convolution's times 1.2, the largest slope of these activations (Gelu's 1.13,
  // Swish's 1.1), plus their own float32 rounding (a few ulps of the output, inside the
  // harness's 1e-6 absolute and the relative part).
  for (const ActivationCase& a : activation_cases()) {
    const ConvActivationShape& v = a.channels_last ? kActivationNhwc : kActivationNchw;
    c.push_back({a.name,
                 {v.x, v.w, {v.w[0]}},
                 [a](ModelBuilder& m, const std::vector<Value*>& x) {
                   const std::map<std::string, graph::AttributeValue> attributes = {
                       {"pads", std::vector<int64_t>{1, 1, 1, 1}}};
                   Value* y = a.apply(m, m.op("Conv", {x[0], x[1], x[2]}, attributes));
                   // Channels-last: a 1x1 MaxPool keeps the activation channels-last, as between
                   // a network's convolutions, so that it fuses into the call.
                   if (a.channels_last)
                     y = m.op("MaxPool", {y}, {{"kernel_shape", std::vector<int64_t>{1, 1}}});
                   m.output(y);
                 },
                 [a](const std::vector<Dense>& x) {
                   auto [out, scale] = conv_reference(x[0], x[1], 1, {1, 1}, {1, 1, 1, 1}, {1, 1});
                   int64_t inner = 1;
                   for (size_t d = 2; d < out.dims.size(); ++d) inner *= out.dims[d];
                   for (size_t i = 0; i < out.values.size(); ++i) {
                     const int64_t channel = static_cast<int64_t>(i) / inner % out.dims[1];
                     out.values[i] =
                         a.reference(out.values[i] + x[2].values[static_cast<size_t>(channel)]);
                     scale[i] = 1.2 * (scale[i] + 1);
                   }
                   return std::make_pair(out, scale);
                 },
                 DType::kFloat32,
                 a.channels_last});
  }
  return c;
}

/// Builds `c`'s model with inputs x0, x1, ... of its dims.
graph::Model build(const Case& c) {
  ModelBuilder m(kOpset);
  std::vector<Value*> inputs;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    graph::Shape shape;
    for (int64_t d : c.inputs[k]) shape.push_back(sym::Expr(d));
    std::string name = "x";  // (not "x" + ...: GCC 12 warns wrongly about that, -Wrestrict)
    name += std::to_string(k);
    inputs.push_back(m.input(name, c.dtype, shape));
  }
  c.build(m, inputs);
  return std::move(m.model);
}

/// Runs `c` on the GPU at `precision` and compares with its reference: each element within
/// `relative` times the sum of its |a * b| terms (plus 1e-6).
void run_and_compare(const Case& c, ir::Precision precision, double relative) {
  TempDir dir;
  CompiledModel compiled = compile_cuda(build(c), dir.path, precision, true, c.channels_last);
  std::vector<Tensor> inputs;
  std::vector<Dense> dense_inputs;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    inputs.push_back(tensor(c.dtype, c.inputs[k], static_cast<int64_t>(k)));
    dense_inputs.push_back(dense(inputs.back()));
  }
  // Twice: the second run reuses the call sites' plans.
  for (int run = 0; run < 2; ++run) {
    std::vector<Tensor> y = compiled.run(inputs);
    ASSERT_EQ(y.size(), 1u);
    auto [want, scale] = c.reference(dense_inputs);
    ASSERT_EQ(y[0].dims(), want.dims) << c.name;
    const std::vector<double> got = as_doubles(y[0]);
    ASSERT_EQ(got.size(), want.values.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want.values[i], relative * scale[i] + 1e-6)
          << c.name << " at " << i << " (run " << run << ")";
    }
  }
}

class CudaMatMulRun : public ::testing::TestWithParam<Case> {};

// float32 at --precision fp32: float32 rounding of each term and of the sum (2^-24 per
// operation, summed over at most K + 1 operations, bounded by 1e-6 per unit of sum |a b| for
// K <= 300 here, with room); float64 the same bound, far looser than needed.
TEST_P(CudaMatMulRun, Fp32MatchesADoubleReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  run_and_compare(GetParam(), ir::Precision::kFp32, 2e-5);
}

// TF32 rounds each input to 10 mantissa bits (relative 2^-11 each, so about 1e-3 per term):
// the bound is 2e-3 per unit of sum |a b|.
TEST_P(CudaMatMulRun, Tf32MatchesADoubleReferenceWithinTf32Rounding) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  run_and_compare(GetParam(), ir::Precision::kTf32, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMatMulRun, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.name);
                         });

const Case& named(const std::string& name) {
  static const std::vector<Case> all = cases();
  for (const Case& c : all) {
    if (name == c.name) return c;
  }
  throw std::runtime_error("no case " + name);
}

TEST(CudaMatMul, GemmIsOneCublasLtCallWithItsBiasFusedAndItsTransposesFolded) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string wrapper = cuda_wrapper(build(named("gemm_transposes_alpha_bias")), dir.path);
  EXPECT_EQ(count(wrapper, "state.cuda.matmul<float>("), 1u) << wrapper;
  EXPECT_NE(wrapper.find("kiln_cuda::Epilogue::kBias"), std::string::npos) << wrapper;
  // A is [6, 4] read as its transpose [4, 6]: strides {1, 4}; B [5, 6] as [6, 5]: {1, 6}.
  EXPECT_NE(wrapper.find("const int64_t a_strides[] = {1, 4};"), std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("const int64_t b_strides[] = {1, 6};"), std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("state.cuda.reserve_library_workspace();"), std::string::npos);
  // Nothing on the host, no kernel (the bias is the epilogue), no wait but a profiled run's.
  EXPECT_EQ(wrapper.find("// on the host"), std::string::npos) << wrapper;
  EXPECT_EQ(wrapper.find("launch_cuda"), std::string::npos) << wrapper;
  EXPECT_EQ(count(wrapper, "synchronize("),
            count(wrapper, "if (profile != nullptr) state.cuda.synchronize("));
}

TEST(CudaMatMul, BiasReluAndTanhGeluFuseButErfGeluDoesNot) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string relu = cuda_wrapper(build(named("matmul_bias_relu")), dir.path / "relu");
  EXPECT_NE(relu.find("kiln_cuda::Epilogue::kReluBias"), std::string::npos) << relu;
  EXPECT_EQ(relu.find("launch_cuda"), std::string::npos) << relu;
  const std::string gelu = cuda_wrapper(build(named("matmul_gelu_tanh")), dir.path / "gelu");
  EXPECT_NE(gelu.find("kiln_cuda::Epilogue::kGelu,"), std::string::npos) << gelu;
  EXPECT_EQ(gelu.find("launch_cuda"), std::string::npos) << gelu;
  // The erf form is not cuBLASLt's: a kernel of its own after the product.
  Case erf = named("matmul_gelu_tanh");
  erf.build = [](ModelBuilder& m, const std::vector<Value*>& x) {
    m.output(m.op("Gelu", {m.op("MatMul", {x[0], x[1]})}));
  };
  const std::string plain = cuda_wrapper(build(erf), dir.path / "erf");
  EXPECT_NE(plain.find("kiln_cuda::Epilogue::kNone"), std::string::npos) << plain;
  EXPECT_NE(plain.find("launch_cuda"), std::string::npos) << plain;
}

TEST(CudaMatMul, ResidualAddIsCublasLtsCWithTheBiasInTheEpilogue) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string both = cuda_wrapper(build(named("matmul_bias_residual")), dir.path / "both");
  EXPECT_EQ(count(both, "state.cuda.matmul<float>("), 1u) << both;
  EXPECT_NE(both.find("// cuBLASLt, TF32 compute, epilogue Bias, residual added as C (beta 1)"),
            std::string::npos)
      << both;
  // The bias (input x2) and the residual (x3): the two pointers after the epilogue.
  EXPECT_NE(both.find("kiln_cuda::Epilogue::kBias, static_cast<const float*>(arg2_x2) + 0, "
                      "static_cast<const float*>(arg3_x3) + 0, true,"),
            std::string::npos)
      << both;
  EXPECT_EQ(both.find("launch_cuda"), std::string::npos) << both;
  const std::string relu = cuda_wrapper(build(named("matmul_residual_relu")), dir.path / "relu");
  EXPECT_NE(relu.find("kiln_cuda::Epilogue::kRelu, nullptr, "
                      "static_cast<const float*>(arg2_x2) + 0, true,"),
            std::string::npos)
      << relu;
  EXPECT_EQ(relu.find("launch_cuda"), std::string::npos) << relu;
  // A scaled C (Gemm's beta 0.25) is not a residual: a kernel after the product.
  const std::string beta = cuda_wrapper(build(named("gemm_beta_matrix")), dir.path / "beta");
  EXPECT_NE(beta.find("kiln_cuda::Epilogue::kNone, nullptr, nullptr,"), std::string::npos) << beta;
  EXPECT_NE(beta.find("launch_cuda"), std::string::npos) << beta;
}

TEST(CudaAttention, AttentionIsOneKernelOfKilnsWithItsMaskAndScale) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string plain = cuda_wrapper(build(named("attention_div_scale")), dir.path / "div");
  // One launch of Kiln's kernel, no product through cuBLASLt, no Softmax kernel.
  EXPECT_EQ(count(plain, "state.cuda.attention(k_kiln_attention_f32_d64_v72, att,"), 1u) << plain;
  EXPECT_NE(plain.find("\"kiln_attention_f32_d64_v72\","), std::string::npos) << plain;
  EXPECT_EQ(plain.find("state.cuda.matmul<"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("// on the host"), std::string::npos) << plain;
  EXPECT_NE(plain.find("att.scale = static_cast<float>(0.125);"), std::string::npos) << plain;
  EXPECT_NE(plain.find("att.mask_kind = 0;"), std::string::npos) << plain;
  // K [2, 3, 70, 64] read as K^T [2, 3, 64, 70]: strides {13440, 4480, 1, 64}.
  EXPECT_NE(plain.find("att.kt_strides[2] = 1;"), std::string::npos) << plain;
  EXPECT_NE(plain.find("att.kt_strides[3] = 64;"), std::string::npos) << plain;
  EXPECT_NE(
      files::read(dir.path / "div" / "dump" / "5_kernels.cu").find("kiln_attention_f32_d64_v72("),
      std::string::npos);
  const std::string where = cuda_wrapper(build(named("attention_where_mask")), dir.path / "where");
  EXPECT_NE(where.find("att.mask_kind = 1;"), std::string::npos) << where;
  EXPECT_NE(where.find("att.fill = static_cast<float>(-10000);"), std::string::npos) << where;
  // The mask [2, 1, 20, 20] over the scores [2, 2, 20, 20]: the heads' stride 0.
  EXPECT_NE(where.find("att.mask_strides[1] = 0;"), std::string::npos) << where;
  const std::string add = cuda_wrapper(build(named("attention_add_mask")), dir.path / "add");
  EXPECT_NE(add.find("att.mask_kind = 3;"), std::string::npos) << add;
  EXPECT_NE(add.find("att.mask_strides[0] = 0;"), std::string::npos) << add;
}

TEST(CudaMatMul, ProjectionsOfOneInputAreOneProductWithTheirBiasesConcatenated) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string wrapper = cuda_wrapper(build(named("qkv_projections")), dir.path);
  EXPECT_EQ(count(wrapper, "state.cuda.matmul<float>("), 1u) << wrapper;
  EXPECT_NE(wrapper.find("const int64_t sizes[] = {2, 5, 24};"), std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("kiln_cuda::Epilogue::kBias,"), std::string::npos) << wrapper;
  // q * k + v over the slices: one kernel.
  EXPECT_EQ(count(wrapper, "static void launch_cuda_"), 1u) << wrapper;
}

TEST(CudaAttention, NotFusedUnlessAskedFor) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  // The default on CUDA: cuBLASLt's two batched products, a Softmax kernel between them.
  const std::string wrapper =
      cuda_wrapper(build(named("attention_div_scale")), dir.path, ir::Precision::kTf32, false);
  EXPECT_EQ(wrapper.find("state.cuda.attention("), std::string::npos) << wrapper;
  EXPECT_EQ(count(wrapper, "state.cuda.matmul<float>("), 2u) << wrapper;
}

TEST(CudaAttention, HeadsOver128AreNotFused) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  Case wide = named("attention_add_mask");
  wide.inputs = {{1, 4, 130}, {1, 130, 5}, {1, 5, 3}, {4, 5}};
  const std::string wrapper = cuda_wrapper(build(wide), dir.path);
  EXPECT_EQ(wrapper.find("state.cuda.attention("), std::string::npos) << wrapper;
  EXPECT_EQ(count(wrapper, "state.cuda.matmul<float>("), 2u) << wrapper;
}

TEST(CudaMatMul, BroadcastBatchDimsAreZeroStrides) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string wrapper = cuda_wrapper(build(named("batch_broadcast_both_ways")), dir.path);
  // A [2, 1, 5, 7] and B [3, 7, 4] over the output [2, 3, 5, 4].
  EXPECT_NE(wrapper.find("const int64_t a_strides[] = {35, 0, 7, 1};"), std::string::npos)
      << wrapper;
  EXPECT_NE(wrapper.find("const int64_t b_strides[] = {0, 28, 4, 1};"), std::string::npos)
      << wrapper;
  EXPECT_NE(wrapper.find("const int64_t sizes[] = {2, 3, 5, 4};"), std::string::npos) << wrapper;
}

TEST(CudaConv, ConvolutionIsOneCudnnGraphWithItsBiasAndRelu) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string wrapper =
      cuda_wrapper(build(named("conv2d_strided_dilated_bias_relu")), dir.path);
  EXPECT_EQ(count(wrapper, "state.cuda.conv<float>("), 1u) << wrapper;
  EXPECT_NE(wrapper.find("// cuDNN convolution + bias, Relu in its graph, TF32 allowed"),
            std::string::npos)
      << wrapper;
  EXPECT_NE(wrapper.find("const int64_t pads_begin[] = {1, 0};"), std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("const int64_t pads_end[] = {2, 1};"), std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("const int64_t dilations[] = {1, 2};"), std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("pads_end, dilations, false};"), std::string::npos) << wrapper;
  EXPECT_EQ(wrapper.find("// on the host"), std::string::npos) << wrapper;
  // Bias and Relu in the call: no kernel of Kiln's, the bias passed, Relu on, no residual.
  EXPECT_EQ(count(wrapper, "static void launch_cuda_"), 0u) << wrapper;
  EXPECT_NE(wrapper.find(", nullptr, kiln_cuda::ConvActivation{1, 0, 0}, true, \"conv ("),
            std::string::npos)
      << wrapper;
  // The epilogue's kernel is in the module for when cuDNN has no engine for the fused graph.
  const std::string kernels = files::read(dir.path / "dump" / "5_kernels.cu");
  EXPECT_NE(kernels.find("kiln_conv_epilogue_f32"), std::string::npos);
  EXPECT_EQ(count(wrapper, "synchronize("),
            count(wrapper, "if (profile != nullptr) state.cuda.synchronize("));
}

TEST(CudaConv, AutotuneMaxTimesCudnnEnginesAtTheFirstRun) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const graph::Model model = build(named("conv2d_one_by_one"));
  const std::string plain = cuda_wrapper(model, dir.path / "plain");
  EXPECT_EQ(plain.find("state.cuda.tune_convolutions();"), std::string::npos) << plain;
  CompileOptions options;
  options.device = ir::Device::kCuda;
  options.autotune = autotune::AutotuneMode::kMax;
  options.dump_dir = dir.path / "max" / "dump";
  options.cache_dir = dir.path / "max" / "cache";
  setenv("KILN_CUDA_ARCHS", "90", 1);
  compile(model, options);
  unsetenv("KILN_CUDA_ARCHS");
  const std::string tuned = files::read(dir.path / "max" / "dump" / "5_wrapper.cpp");
  EXPECT_NE(tuned.find("state.cuda.tune_convolutions();"), std::string::npos) << tuned;
}

TEST(CudaConv, ResidualAddAndReluFuseIntoTheChannelsLastCall) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const std::string wrapper = cuda_wrapper(build(named("conv2d_bias_residual_relu_nhwc")), dir.path,
                                           ir::Precision::kFp32, true, true);
  // Y1 = Conv(X, W), then Relu(Conv(Y1, W) + bias + Y1) as one call.
  EXPECT_EQ(count(wrapper, "state.cuda.conv<float>("), 2u) << wrapper;
  EXPECT_NE(wrapper.find("// cuDNN convolution (channels-last), float32"), std::string::npos)
      << wrapper;
  EXPECT_NE(wrapper.find("// cuDNN convolution (channels-last) + bias + residual, Relu in its "
                         "graph, float32"),
            std::string::npos)
      << wrapper;
  // Dims in NCHW order whatever the layout: X [2, 16, 9, 7], W [16, 16, 3, 3] (packed
  // [M, KH, KW, C] in memory), Y [2, 16, 9, 7].
  EXPECT_NE(wrapper.find("const int64_t x_dims[] = {2, 16, 9, 7};"), std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("const int64_t w_dims[] = {16, 16, 3, 3};"), std::string::npos) << wrapper;
  EXPECT_NE(wrapper.find("pads_end, dilations, true};"), std::string::npos) << wrapper;
  EXPECT_EQ(wrapper.find("pads_end, dilations, false};"), std::string::npos) << wrapper;
  EXPECT_EQ(wrapper.find("// on the host"), std::string::npos) << wrapper;
  // The second call: bias and residual (the first call's output) passed, Relu on, fp32.
  const size_t second =
      wrapper.find("state.cuda.conv<float>(", wrapper.find("state.cuda.conv<float>(") + 1);
  ASSERT_NE(second, std::string::npos);
  const std::string line = wrapper.substr(second, wrapper.find('\n', second) - second);
  EXPECT_EQ(line.find("nullptr"), std::string::npos) << line;
  EXPECT_NE(line.find(", kiln_cuda::ConvActivation{1, 0, 0}, false, \"conv ("), std::string::npos)
      << line;
}

// Each activation cuDNN has a pointwise mode for is a node of the convolution's graph: the call
// passes it (kiln_cuda::ConvActivation{kind, alpha, beta}) and no kernel of Kiln's runs after
// it; HardSigmoid (no such mode) stays a kernel after a call that adds the bias only. Every
// module carries kiln_conv_epilogue (for when cuDNN has no engine for the fused graph), which
// NVRTC compiled here.
TEST(CudaConv, ActivationsCudnnHasFuseIntoTheCall) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  for (const ActivationCase& a : activation_cases()) {
    SCOPED_TRACE(a.name);
    TempDir dir;
    const std::string wrapper =
        cuda_wrapper(build(named(a.name)), dir.path, ir::Precision::kTf32, true, a.channels_last);
    EXPECT_EQ(count(wrapper, "state.cuda.conv<float>("), 1u) << wrapper;
    if (a.passed.empty()) {
      EXPECT_NE(wrapper.find("kiln_cuda::ConvActivation{0, 0, 0}, true, \"conv ("),
                std::string::npos)
          << wrapper;
      EXPECT_EQ(count(wrapper, "static void launch_cuda_"), 1u) << wrapper;
      continue;
    }
    EXPECT_NE(wrapper.find("kiln_cuda::ConvActivation" + a.passed + ", true, \"conv ("),
              std::string::npos)
        << wrapper;
    // (A channels-last model's kernels are its layout changes: X and the output.)
    if (!a.channels_last) {
      EXPECT_EQ(count(wrapper, "static void launch_cuda_"), 0u) << wrapper;
    }
    EXPECT_NE(wrapper.find(" in its graph, TF32 allowed"), std::string::npos) << wrapper;
    const std::string kernels = files::read(dir.path / "dump" / "5_kernels.cu");
    EXPECT_NE(kernels.find("kiln_conv_epilogue_f32"), std::string::npos);
  }
}

// Where cuDNN has no engine for the fused graph, the convolution runs alone and
// kiln_conv_epilogue applies bias and activation after it (forced here by KILN_CUDNN_UNFUSED=1):
// the same values, within the fp32 bound.
TEST(CudaConv, UnfusedEpilogueKernelComputesEachActivation) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  setenv("KILN_CUDNN_UNFUSED", "1", 1);
  for (const ActivationCase& a : activation_cases()) {
    SCOPED_TRACE(a.name);
    run_and_compare(named(a.name), ir::Precision::kFp32, 2e-5);
  }
  unsetenv("KILN_CUDNN_UNFUSED");
}

TEST(CudaMatMul, PrecisionPicksTheComputeType) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const graph::Model model = build(named("odd_sizes"));
  const std::string tf32 = cuda_wrapper(model, dir.path / "tf32", ir::Precision::kTf32);
  EXPECT_NE(tf32.find("// cuBLASLt, TF32 compute"), std::string::npos) << tf32;
  EXPECT_NE(tf32.find("nullptr, true, \"matmul ("), std::string::npos) << tf32;
  const std::string fp32 = cuda_wrapper(model, dir.path / "fp32", ir::Precision::kFp32);
  EXPECT_NE(fp32.find("// cuBLASLt, float32 compute"), std::string::npos) << fp32;
  EXPECT_NE(fp32.find("nullptr, false, \"matmul ("), std::string::npos) << fp32;
}

}  // namespace
}  // namespace kiln::driver
