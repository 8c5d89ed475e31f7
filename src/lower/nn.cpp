/// Neural-network lowerings: MatMul and Gemm as an ir::MatMulCall (float32/float64; other
/// dtypes as a loop-IR reduction over K) or, against a constant float32 weight, an ir::GemmCall
/// through an autotune choice; Conv as an ir::ConvCall. Operands are strided views of their
/// buffers: transposes and batch broadcasts are strides (0 for broadcast dims), not copies. The
/// pools live in pool.cpp. Each call's inputs and parameters are documented with its struct in
/// ir/library_call.h.
///
/// Tests: the ONNX node suite (interpreter_cases.txt).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "autotune/select.h"
#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"
#include "support/log.h"

namespace kiln::lower {

using graph::DType;
using ir::LoopBody;
using ir::OpCode;
using ir::ValueId;
using sym::Expr;

namespace {

/// Whether products and convolutions of `dtype` go to the library call: float32 and float64,
/// and on CUDA also float16 and bfloat16 (cuBLASLt and cuDNN accumulate those in float32, as
/// --precision fp16|bf16 stores its activations).
bool uses_extern_gemm(const LoweringContext& ctx, DType dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kFloat64) return true;
  return ctx.options().device == ir::Device::kCuda &&
         (dtype == DType::kFloat16 || dtype == DType::kBFloat16);
}

/// Swaps the last two dims of a view (a transpose without a copy).
void transpose_last_two(ir::Layout& layout) {
  size_t r = layout.rank();
  std::swap(layout.sizes[r - 1], layout.sizes[r - 2]);
  std::swap(layout.strides[r - 1], layout.strides[r - 2]);
}

/// A matrix product operand: the value, whether its last two dims are swapped, its rows/cols.
struct Operand {
  TensorValue value;  // rank >= 2
  bool transposed = false;
  Expr rows() const { return value.shape[value.rank() - (transposed ? 1 : 2)]; }
  Expr cols() const { return value.shape[value.rank() - (transposed ? 2 : 1)]; }
  std::vector<Expr> batch() const {
    return std::vector<Expr>(value.shape.begin(), value.shape.end() - 2);
  }
};

/// Whether `extent` is known to be at least `at_least` (both sizes or strides).
bool known_at_least(const Expr& extent, const Expr& at_least) {
  if (extent == at_least) return true;
  std::optional<int64_t> e = extent.as_integer(), a = at_least.as_integer();
  return e && a && *e >= std::max<int64_t>(*a, 1);
}

/// Whether cuBLASLt reads the matrix of the last two dims of `layout` as it is: rows or columns
/// contiguous (a transpose is the op's flag) with a leading dimension that spans the other
/// extent. Sizes of 1 take any stride. Known when compiling or not at all: the runtime checks
/// again (kiln_rt_cuda.h blas_matrix).
bool blas_matrix(const ir::Layout& layout) {
  const size_t r = layout.rank();
  const Expr &rows = layout.sizes[r - 2], &cols = layout.sizes[r - 1];
  const Expr &rs = layout.strides[r - 2], &cs = layout.strides[r - 1];
  const Expr one(1);
  const bool row_major = (cs == one || cols == one) && (rows == one || known_at_least(rs, cols));
  const bool col_major = (rs == one || rows == one) && (cols == one || known_at_least(cs, rows));
  return row_major || col_major;
}

/// The view of an operand broadcast to batch dims `batch`. For CUDA, an operand whose matrix
/// cuBLASLt cannot read as a view (a stride-2 slice, a broadcast row) is made contiguous first.
ir::View operand_view(LoweringContext& ctx, const Operand& op, const std::vector<Expr>& batch) {
  std::vector<Expr> sizes = batch;
  sizes.push_back(op.rows());
  sizes.push_back(op.cols());
  auto make = [&](bool contiguous) {
    ir::View view = ctx.as_view(op.value, contiguous);
    if (op.transposed) transpose_last_two(view.layout);
    view.layout = broadcast_layout(view.layout, sizes);
    return view;
  };
  ir::View view = make(false);
  if (ctx.options().device == ir::Device::kCuda && !blas_matrix(view.layout)) view = make(true);
  return view;
}

/// The element of an operand at (batch index, row, col) under broadcasting.
ValueId operand_at(LoweringContext& ctx, LoopBody& body, const Operand& op,
                   const std::vector<Expr>& batch_index, const Expr& row, const Expr& col) {
  std::vector<Expr> index = LoweringContext::broadcast_index(batch_index, op.batch());
  index.push_back(op.transposed ? col : row);
  index.push_back(op.transposed ? row : col);
  return ctx.load_at(body, op.value, index);
}

/// The 2-D constant buffer of which `value` is the transpose (a view: sizes [K, N] over a
/// contiguous constant [N, K], strides [1, K]), or nullptr.
const ir::Buffer* transposed_constant(LoweringContext& ctx, const TensorValue& value) {
  if (value.rank() != 2 || !value.body || value.body->ops().size() != 1) return nullptr;
  const ir::Op& load = value.body->op(0);
  if (load.code != OpCode::kLoad || load.mask != ir::kNoValue) return nullptr;
  const ir::Buffer* buffer = ctx.program().find(load.buffer);
  if (buffer == nullptr || buffer->kind != ir::BufferKind::kConstant || !buffer->constant ||
      buffer->constant->dims().size() != 2 || !buffer->layout.is_contiguous()) {
    return nullptr;
  }
  // The load's index must be i0 + K * i1 in the value's loop variables (i0 over K, i1 over N):
  // checked on the index itself, so nothing is realized (as_view would copy a view that is not
  // affine, a Gather of the constant's rows say).
  const std::vector<Expr>& vars = value.body->vars();
  const std::vector<int64_t>& dims = buffer->constant->dims();
  if (vars.size() != 2 || value.shape[0] != Expr(dims[1]) || value.shape[1] != Expr(dims[0])) {
    return nullptr;
  }
  const Expr expected = vars[0] + vars[1] * Expr(dims[1]);
  if (load.index != expected) return nullptr;
  return buffer;
}

/// A selected GEMM choice (autotune/choice.h: the C++ GEMM template or a library) for
/// A [..., M, K] @ B when B is a constant float32 [K, N] matrix (op(B) = B, or its transpose with
/// `transpose_b`) scaled by `alpha`: B is transposed, scaled and prepared (packed into the
/// template's panels) when compiling, and the extern "gemm" computes contiguous [..., M, N] from
/// A (made contiguous). Pointwise consumers fuse into it as its epilogue
/// (sched/template_epilogue.h). nullopt when B is not such a constant.
std::optional<TensorValue> template_gemm(LoweringContext& ctx, const TensorValue& a,
                                         const TensorValue& b, bool transpose_b, double alpha) {
  if (a.dtype != DType::kFloat32 || a.rank() < 2 || b.rank() != 2) return std::nullopt;
  std::optional<std::string> name = ctx.as_buffer(b);
  const ir::Buffer* buffer = name ? ctx.program().find(*name) : nullptr;
  if (buffer == nullptr) {
    // A Transpose of a constant [N, K] matrix (a tied embedding as a language model's head:
    // MatMul(x, Transpose(wte))) is that constant with op(B) transposed.
    buffer = transposed_constant(ctx, b);
    if (buffer != nullptr) transpose_b = !transpose_b;
  }
  if (buffer == nullptr || buffer->kind != ir::BufferKind::kConstant) return std::nullopt;
  std::optional<std::string> a_name = ctx.as_buffer(a);
  const ir::Buffer* a_buffer = a_name ? ctx.program().find(*a_name) : nullptr;
  if (a_buffer != nullptr && a_buffer->kind == ir::BufferKind::kConstant) return std::nullopt;
  const graph::Tensor& weight = *buffer->constant;
  if (weight.dtype() != DType::kFloat32) return std::nullopt;
  const int64_t k = weight.dims()[transpose_b ? 1 : 0], n = weight.dims()[transpose_b ? 0 : 1];
  if (a.shape.back() != Expr(k) || k == 0 || n == 0) return std::nullopt;
  // B as the choice takes it, row-major K x N: the weight itself when it is already so, else a
  // transposed and scaled copy.
  std::span<const float> w = weight.values<float>();
  std::vector<float> b_kn;
  if (transpose_b || alpha != 1.0) {
    b_kn.resize(static_cast<size_t>(k * n));
    for (int64_t r = 0; r < k; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        b_kn[static_cast<size_t>(r * n + c)] =
            static_cast<float>(alpha) * w[static_cast<size_t>(transpose_b ? c * k + r : r * n + c)];
      }
    }
  }
  const float* b_data = b_kn.empty() ? w.data() : b_kn.data();
  Expr rows = sym::product(std::vector<Expr>(a.shape.begin(), a.shape.end() - 1));
  // Algorithm selection (autotune/select.h): the heuristic, the autotune cache or benchmarks,
  // as the options' mode says; a symbolic M selects for a typical 128 rows.
  autotune::GemmSelectRequest request;
  request.m = rows.as_integer().value_or(128);
  request.n = n;
  request.k = k;
  request.threads = ctx.options().threads;
  request.mode = ctx.options().autotune;
  request.code_cache_dir = ctx.options().code_cache_dir;
  request.isa = ctx.options().template_isa;
  const autotune::GemmChoicePtr choice = autotune::select_gemm(request).choice;
  std::shared_ptr<const graph::Tensor> prepared_tensor =
      prepared_weight(ctx.options(), choice->prepare(b_data, k, n));
  // The weight was read whole to prepare it; a mapped one (external data) gives its pages back.
  weight.release_pages();
  std::vector<Expr> shape = a.shape;
  shape.back() = Expr(n);
  return ctx.extern_call(
      ir::GemmCall{choice, n, k}, DType::kFloat32, std::move(shape),
      {ctx.as_view(a, true), ctx.as_view(ctx.from_constant(prepared_tensor), true)});
}

/// A @ B (batched) as a loop-IR reduction over K, for dtypes without an extern GEMM.
TensorValue matmul_loop(LoweringContext& ctx, DType dtype, const Operand& a, const Operand& b,
                        const std::vector<Expr>& batch) {
  std::vector<Expr> shape = batch;
  shape.push_back(a.rows());
  shape.push_back(b.cols());
  size_t nb = batch.size();
  return ctx.reduction(
      dtype, shape, {a.cols()}, ir::ReductionType::kSum,
      [&](LoopBody& body, const std::vector<Expr>& index, const std::vector<Expr>& r) {
        std::vector<Expr> batch_index(index.begin(), index.begin() + nb);
        ValueId x = operand_at(ctx, body, a, batch_index, index[nb], r[0]);
        ValueId y = operand_at(ctx, body, b, batch_index, r[0], index[nb + 1]);
        return body.binary(OpCode::kMul, x, y);
      });
}

void check_inner_dims(LoweringContext& ctx, const Operand& a, const Operand& b) {
  Expr k1 = a.cols(), k2 = b.rows();
  if (k1.is_integer() && k2.is_integer() && k1 != k2) {
    ctx.fail("inner dimensions differ: A has " + k1.str() + " columns, B has " + k2.str() +
             " rows");
  }
}

void check_matmul_dtype(LoweringContext& ctx, DType dtype) {
  if (!graph::is_floating(dtype) && !graph::is_integer(dtype)) {
    ctx.fail("unsupported dtype " + std::string(graph::dtype_name(dtype)));
  }
}

std::vector<TensorValue> lower_matmul(LoweringContext& ctx, const graph::Node&,
                                      const LowerInputs& inputs) {
  const TensorValue& a_in = required_input(ctx, inputs, 0, "A");
  const TensorValue& b_in = required_input(ctx, inputs, 1, "B");
  if (a_in.rank() == 0 || b_in.rank() == 0)
    ctx.fail("expected operands of rank >= 1, found a scalar");
  if (a_in.dtype != b_in.dtype) ctx.fail("operand dtypes differ");
  check_matmul_dtype(ctx, a_in.dtype);
  // Numpy rules: a 1-D A is a row [1, K], a 1-D B a column [K, 1]; the added dim is dropped.
  bool vec_a = a_in.rank() == 1, vec_b = b_in.rank() == 1;
  auto lift = [&](const TensorValue& v, bool row) {
    std::vector<Expr> shape =
        row ? std::vector<Expr>{1, v.shape[0]} : std::vector<Expr>{v.shape[0], 1};
    return make_view(ctx, v, std::move(shape), [row](const std::vector<Expr>& index) {
      return std::vector<Expr>{index[row ? 1 : 0]};
    });
  };
  Operand a{vec_a ? lift(a_in, true) : a_in};
  Operand b{vec_b ? lift(b_in, false) : b_in};
  check_inner_dims(ctx, a, b);
  std::vector<Expr> batch = ctx.broadcast_shapes({a.batch(), b.batch()});
  DType dtype = a_in.dtype;
  TensorValue out;
  // CPU GEMM choices only for the CPU; CUDA takes every product to cuBLASLt.
  const bool cpu = ctx.options().device == ir::Device::kCpu;
  std::optional<TensorValue> templated =
      vec_b || !cpu ? std::nullopt : template_gemm(ctx, a.value, b.value, false, 1.0);
  if (templated) {
    out = *templated;
  } else if (uses_extern_gemm(ctx, dtype)) {
    std::vector<Expr> shape = batch;
    shape.push_back(a.rows());
    shape.push_back(b.cols());
    out = ctx.extern_call(ir::MatMulCall{1.0, 1.0}, dtype, shape,
                          {operand_view(ctx, a, batch), operand_view(ctx, b, batch)});
  } else {
    out = matmul_loop(ctx, dtype, a, b, batch);
  }
  if (!vec_a && !vec_b) return {out};
  size_t nb = batch.size();
  std::vector<Expr> shape = batch;
  if (!vec_a) shape.push_back(a.rows());
  if (!vec_b) shape.push_back(b.cols());
  return {make_view(ctx, out, std::move(shape), [nb, vec_a, vec_b](const std::vector<Expr>& i) {
    std::vector<Expr> in(i.begin(), i.begin() + nb);
    in.push_back(vec_a ? Expr(0) : i[nb]);
    in.push_back(vec_b ? Expr(0) : i[i.size() - 1]);
    return in;
  })};
}

std::vector<TensorValue> lower_gemm(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& inputs) {
  const TensorValue& a_in = required_input(ctx, inputs, 0, "A");
  const TensorValue& b_in = required_input(ctx, inputs, 1, "B");
  const TensorValue* c = optional_input(inputs, 2);
  if (a_in.rank() != 2 || b_in.rank() != 2) {
    ctx.fail("expected 2-D A and B, found ranks " + std::to_string(a_in.rank()) + " and " +
             std::to_string(b_in.rank()));
  }
  check_matmul_dtype(ctx, a_in.dtype);
  Operand a{a_in, node.attr_int("transA", 0) != 0};
  Operand b{b_in, node.attr_int("transB", 0) != 0};
  check_inner_dims(ctx, a, b);
  double alpha = node.attr_float("alpha", 1.0f);
  double beta = node.attr_float("beta", 1.0f);
  std::vector<Expr> shape = {a.rows(), b.cols()};
  if (c != nullptr) {
    if (c->rank() > 2) ctx.fail("expected C of rank <= 2, found " + graph::shape_str(c->shape));
    std::vector<Expr> joint = ctx.broadcast_shapes({shape, c->shape});
    if (static_shape(joint) && static_shape(shape) && joint != shape) {
      ctx.fail("C of shape " + graph::shape_str(c->shape) + " does not broadcast to " +
               graph::shape_str(shape));
    }
  }
  DType dtype = a_in.dtype;
  const bool cuda = ctx.options().device == ir::Device::kCuda;
  std::optional<TensorValue> templated =
      a.transposed || cuda ? std::nullopt : template_gemm(ctx, a_in, b_in, b.transposed, alpha);
  if (cuda && uses_extern_gemm(ctx, dtype)) {
    // alpha * A @ B in cuBLASLt; beta * C a pointwise consumer, which the CUDA backend fuses
    // into the call as its bias epilogue where C is a row vector and beta is 1.
    templated = ctx.extern_call(ir::MatMulCall{alpha, 0.0}, dtype, shape,
                                {operand_view(ctx, a, {}), operand_view(ctx, b, {})});
  }
  if (templated) {
    if (c == nullptr || beta == 0) return {*templated};
    // beta * C is a pointwise consumer: it fuses into the template as its epilogue.
    return {ctx.pointwise(dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
      ValueId cv = ctx.load_at(body, *c, LoweringContext::broadcast_index(index, c->shape));
      if (beta != 1) cv = body.binary(OpCode::kMul, cv, body.constant(beta, dtype));
      return body.binary(OpCode::kAdd, ctx.load_at(body, *templated, index), cv);
    })};
  }
  if (uses_extern_gemm(ctx, dtype)) {
    std::vector<std::optional<ir::View>> views = {operand_view(ctx, a, {}),
                                                  operand_view(ctx, b, {})};
    if (c != nullptr) {
      ir::View view = ctx.as_view(*c);
      view.layout = broadcast_layout(view.layout, shape);
      views.push_back(view);
    }
    return {ctx.extern_call(ir::MatMulCall{alpha, beta}, dtype, shape, std::move(views))};
  }
  TensorValue product = matmul_loop(ctx, dtype, a, b, {});
  return {ctx.pointwise(dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    // Integer Gemm scales in float64, as the reference computes alpha * A @ B + beta * C.
    DType compute = dtype == DType::kFloat16 || dtype == DType::kBFloat16 ? DType::kFloat32
                    : graph::is_floating(dtype)                           ? dtype
                                                                          : DType::kFloat64;
    ValueId acc = body.cast(ctx.load_at(body, product, index), compute);
    ValueId y = body.binary(OpCode::kMul, acc, body.constant(alpha, compute));
    if (c != nullptr) {
      ValueId cv = body.cast(
          ctx.load_at(body, *c, LoweringContext::broadcast_index(index, c->shape)), compute);
      y = body.binary(OpCode::kAdd, y, body.binary(OpCode::kMul, cv, body.constant(beta, compute)));
    }
    return body.cast(y, dtype);
  })};
}

// Whether a convolution runs channels-last (LoweringOptions::conv_layout): a 2-D float32 one
// that is ungrouped (any kernel, stride, padding and dilation: oneDNN's direct convolutions, the
// channels-last templates and cuDNN take [N, H, W, C] as it is) or depthwise with one output
// channel per input channel (each pixel a sum of channel vectors); on the CPU also any other
// grouped one (ResNeXt's), which oneDNN runs on [N, H, W, C] as well: in NCHW, each would
// reorder its input and output inside a channels-last network.
bool runs_channels_last(LoweringContext& ctx, const TensorValue& x, const TensorValue& w,
                        int64_t group) {
  // float32 anywhere; float16 and bfloat16 on CUDA (cuDNN's half convolutions run on the
  // tensor cores in channels-last; the CPU converts them to float32 before it gets here).
  const bool half = x.dtype == DType::kFloat16 || x.dtype == DType::kBFloat16;
  if (ctx.options().conv_layout != ConvLayout::kChannelsLast || x.rank() != 4 ||
      !(x.dtype == DType::kFloat32 || (half && ctx.options().device == ir::Device::kCuda))) {
    return false;
  }
  if (group == 1 || ctx.options().device != ir::Device::kCuda) return true;
  return w.shape[1] == sym::Expr(1) && w.shape[0] == sym::Expr(group) &&
         x.shape[1] == sym::Expr(group);
}

TensorValue conv_value(LoweringContext& ctx, const graph::Node& node, const TensorValue& x,
                       const TensorValue& w, const TensorValue* bias);

/// The data of `w` when it is a 4-D constant read as it is stored (a contiguous buffer from its
/// start), else null: a weight that the lowering may rewrite at compile time.
const graph::Tensor* constant_4d(LoweringContext& ctx, const TensorValue& w) {
  const std::optional<std::string> name = ctx.as_buffer(w);
  const ir::Buffer* buffer = name ? ctx.program().find(*name) : nullptr;
  if (buffer == nullptr || buffer->kind != ir::BufferKind::kConstant || !buffer->constant ||
      buffer->constant->dims().size() != 4 || !buffer->layout.is_contiguous() ||
      buffer->layout.offset != Expr(0)) {
    return nullptr;
  }
  return buffer->constant.get();
}

/// W [M, C, KH, KW] as [M, KH, KW, C] (KRSC, cuDNN's channels-last weight): a constant weight
/// (float32, or float16/bfloat16 as --precision converted it) packed here, so that a
/// BatchNormalization after the convolution still finds a constant weight to fold into
/// (lower/norm.cpp); any other weight reordered by a copy.
TensorValue weight_krsc(LoweringContext& ctx, const TensorValue& w) {
  const graph::Tensor* constant = constant_4d(ctx, w);
  const DType dtype = constant != nullptr ? constant->dtype() : DType::kUndefined;
  if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
    return ctx.realize(ctx.to_channels_last(w), "a convolution weight packed [M, KH, KW, C]");
  }
  const std::vector<int64_t> dims = constant->dims();
  const int64_t m = dims[0], c = dims[1], kh = dims[2], kw = dims[3];
  auto packed = std::make_shared<graph::Tensor>(dtype, std::vector<int64_t>{m, kh, kw, c});
  const size_t size = graph::dtype_size(dtype);
  const auto* from = static_cast<const unsigned char*>(constant->data());
  auto* to = static_cast<unsigned char*>(packed->mutable_data());
  for (int64_t o = 0; o < m; ++o) {
    for (int64_t i = 0; i < c; ++i) {
      for (int64_t r = 0; r < kh; ++r) {
        for (int64_t t = 0; t < kw; ++t) {
          std::memcpy(to + static_cast<size_t>(((o * kh + r) * kw + t) * c + i) * size,
                      from + static_cast<size_t>(((o * c + i) * kh + r) * kw + t) * size, size);
        }
      }
    }
  }
  return ctx.from_constant(packed);
}

/// The kernel taps of a convolution with a constant weight and static spatial sizes that read
/// inside the input for some output: along each spatial dim, [first, last] of the taps k for
/// which o * stride - pad_begin + k * dilation lies in [0, size) for some output o. Taps outside
/// it read only padding (a dilated 3x3 whose dilation is as large as a 14 x 14 feature map, as
/// DeepLab's atrous pyramid has, reads the image through its centre tap alone): the weight is cut
/// to the live taps and the pads shifted, so the call does none of their multiply-adds (such a
/// 3x3 becomes a 1x1, the GEMM template's). The weight stays a constant, so a BatchNormalization
/// after the convolution still folds into it. `w` unchanged where nothing is cut or the cut
/// would need a negative pad.
TensorValue live_taps(LoweringContext& ctx, const TensorValue& x, const TensorValue& w,
                      WindowGeometry& g) {
  const size_t n = g.kernel.size();
  const graph::Tensor* constant = constant_4d(ctx, w);
  if (n != 2 || constant == nullptr) return w;
  const std::vector<int64_t> dims = constant->dims();
  if (dims[2] != g.kernel[0] || dims[3] != g.kernel[1]) return w;  // kernel_shape is not W's
  std::vector<int64_t> first(n), last(n), pads = g.pads;
  bool cut = false;
  for (size_t j = 0; j < n; ++j) {
    const Expr& size_expr = x.shape[j + 2];
    if (!size_expr.is_integer() || !g.out[j].is_integer()) return w;
    const int64_t size = *size_expr.as_integer(), out = *g.out[j].as_integer();
    const int64_t s = g.strides[j], d = g.dilations[j], begin = g.pads[j];
    // Tap k reads o * s - begin + k * d for o in [0, out): live when that range meets [0, size).
    auto live = [&](int64_t k) {
      const int64_t lo = -begin + k * d, hi = (out - 1) * s - begin + k * d;
      return hi >= 0 && lo < size;
    };
    first[j] = 0;
    last[j] = g.kernel[j] - 1;
    while (first[j] <= last[j] && !live(first[j])) ++first[j];
    while (last[j] >= first[j] && !live(last[j])) --last[j];
    if (first[j] > last[j]) return w;  // no tap reads the input: left as it is
    const int64_t taps = last[j] - first[j] + 1;
    const int64_t new_begin = begin - first[j] * d;
    const int64_t new_end = (out - 1) * s + (taps - 1) * d + 1 - size - new_begin;
    if (new_begin < 0 || new_end < 0) return w;
    pads[j] = new_begin;
    pads[j + n] = new_end;
    cut = cut || taps != g.kernel[j];
  }
  if (!cut) return w;
  const int64_t m = dims[0], c = dims[1], kh = dims[2], kw = dims[3];
  const int64_t th = last[0] - first[0] + 1, tw = last[1] - first[1] + 1;
  const graph::DType dtype = constant->dtype();
  auto live_weight = std::make_shared<graph::Tensor>(dtype, std::vector<int64_t>{m, c, th, tw});
  const size_t bytes = graph::dtype_size(dtype);
  const auto* from = static_cast<const unsigned char*>(constant->data());
  auto* to = static_cast<unsigned char*>(live_weight->mutable_data());
  for (int64_t o = 0; o < m * c; ++o) {
    for (int64_t r = 0; r < th; ++r) {
      std::memcpy(to + static_cast<size_t>((o * th + r) * tw) * bytes,
                  from + static_cast<size_t>((o * kh + first[0] + r) * kw + first[1]) * bytes,
                  static_cast<size_t>(tw) * bytes);
    }
  }
  log::write(log::Category::kFusion, "{}x{} convolution kernel cut to the {}x{} taps that read X",
             kh, kw, th, tw);
  g.kernel = {th, tw};
  g.pads = pads;
  for (size_t j = 0; j < n; ++j) {
    if (g.kernel[j] == 1) g.dilations[j] = 1;
  }
  return ctx.from_constant(live_weight);
}

/// `v` converted to float32, elementwise.
TensorValue to_float32(LoweringContext& ctx, const TensorValue& v) {
  return ctx.pointwise(DType::kFloat32, v.shape,
                       [&](LoopBody& body, const std::vector<Expr>& index) {
                         return body.cast(ctx.load_at(body, v, index), DType::kFloat32);
                       });
}

std::vector<TensorValue> lower_conv(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& w = required_input(ctx, inputs, 1, "W");
  const TensorValue* bias = optional_input(inputs, 2);
  if (x.rank() < 3 || x.rank() > 5 || w.rank() != x.rank()) {
    ctx.fail("expected X and W of the same rank 3 to 5 (1-D to 3-D convolution), found ranks " +
             std::to_string(x.rank()) + " and " + std::to_string(w.rank()));
  }
  if (w.dtype != x.dtype || (bias != nullptr && bias->dtype != x.dtype)) {
    ctx.fail(
        fmt::format("X is {}, W {}{}: they must have the same dtype", graph::dtype_name(x.dtype),
                    graph::dtype_name(w.dtype),
                    bias == nullptr ? "" : fmt::format(", B {}", graph::dtype_name(bias->dtype))));
  }
  if ((x.dtype != DType::kFloat16 && x.dtype != DType::kBFloat16) ||
      ctx.options().device == ir::Device::kCuda) {
    return {conv_value(ctx, node, x, w, bias)};
  }
  // float16 and bfloat16 convolve in float32 on the CPU (its library calls take float32 and
  // float64; cuDNN takes them as they are), one rounding to the storage type at the end.
  TensorValue xf = to_float32(ctx, x), wf = to_float32(ctx, w);
  std::optional<TensorValue> bf;
  if (bias != nullptr) bf = to_float32(ctx, *bias);
  TensorValue out = conv_value(ctx, node, xf, wf, bf ? &*bf : nullptr);
  const DType dtype = x.dtype;
  return {ctx.pointwise(dtype, out.shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    return body.cast(ctx.load_at(body, out, index), dtype);
  })};
}

/// Conv of float32 or float64 operands through the convolution library call.
TensorValue conv_value(LoweringContext& ctx, const graph::Node& node, const TensorValue& x,
                       const TensorValue& w, const TensorValue* bias) {
  if (!uses_extern_gemm(ctx, x.dtype)) {
    ctx.fail("unsupported dtype " + std::string(graph::dtype_name(x.dtype)) +
             " (float16, bfloat16, float32 and float64 are supported)");
  }
  size_t n = x.rank() - 2;
  std::vector<int64_t> kernel;
  for (size_t j = 0; j < n; ++j) {
    kernel.push_back(require_static_dim(ctx, w.shape[j + 2], "the kernel size"));
  }
  kernel = node.attr_ints("kernel_shape", kernel);
  int64_t group = node.attr_int("group", 1);
  if (group < 1) ctx.fail("expected group >= 1, found " + std::to_string(group));
  Expr channels = w.shape[1] * group;
  if (channels.is_integer() && x.shape[1].is_integer() && channels != x.shape[1]) {
    ctx.fail("X has " + x.shape[1].str() + " channels, W expects " + channels.str() +
             " (W's dim 1 times group " + std::to_string(group) + ")");
  }
  std::vector<Expr> spatial(x.shape.begin() + 2, x.shape.end());
  WindowGeometry g = window_geometry(ctx, node, spatial, kernel, false);
  const TensorValue w_live = live_taps(ctx, x, w, g);
  std::vector<Expr> shape = {x.shape[0], w.shape[0]};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  // Channels-last: X read as [N, H, W, C] (a view of a channels-last buffer as it is; anything
  // else is reordered as it is realized), the output [N, OH, OW, M] read through its NCHW view.
  const bool last = runs_channels_last(ctx, x, w, group);
  if (last) shape = {shape[0], shape[2], shape[3], shape[1]};
  const bool cuda = ctx.options().device == ir::Device::kCuda;
  // cuDNN's channels-last convolutions read W as [M, KH, KW, C / group] (KRSC): a constant
  // weight is packed so when compiling (finish_constant_folding folds the copy).
  const bool weight_last = cuda && last;
  std::vector<std::optional<ir::View>> views = {
      ctx.as_view(last ? ctx.to_channels_last(x) : x, true),
      ctx.as_view(weight_last ? weight_krsc(ctx, w_live) : w_live, true)};
  if (bias != nullptr && bias->rank() != 1)
    ctx.fail("expected a 1-D bias, found " + graph::shape_str(bias->shape));
  // On CUDA a float32, float16 or bfloat16 convolution takes its bias into cuDNN's graph with
  // what follows it (a residual Add, an activation: cuda_conv.h fuses them); a float64 one has
  // it as a pointwise consumer (fused with the ops after it into one generated kernel).
  const bool bias_input = !cuda || x.dtype != DType::kFloat64;
  if (bias != nullptr && bias_input) views.push_back(ctx.as_view(*bias, true));
  ir::ConvCall call;
  call.strides = g.strides;
  call.pads = g.pads;
  call.dilations = g.dilations;
  call.group = group;
  call.channels_last = last;
  call.weight_channels_last = weight_last;
  TensorValue out = ctx.extern_call(std::move(call), x.dtype, shape, std::move(views));
  if (last) {
    ctx.mark_channels_last(*ctx.as_buffer(out));
    return ctx.from_channels_last(out);
  }
  if (bias == nullptr || bias_input) return out;
  return ctx.pointwise(x.dtype, shape, [&](LoopBody& body, const std::vector<Expr>& index) {
    return body.binary(OpCode::kAdd, ctx.load_at(body, out, index),
                       ctx.load_at(body, *bias, {index[1]}));
  });
}

}  // namespace

void register_pool_ops(Registry& registry);

void register_nn_ops(Registry& registry) {
  registry.add("", "MatMul", {lower_matmul, 1, 17});
  registry.add("", "Gemm", {lower_gemm, 1, 17});
  registry.add("", "Conv", {lower_conv, 1, 17});
  register_pool_ops(registry);
}

}  // namespace kiln::lower
