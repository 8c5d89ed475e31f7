#pragma once
/// Helpers shared by the shape, index and nn lowerings (shape.cpp, slice_concat.cpp, index.cpp,
/// nn.cpp, pool.cpp):
/// views as index remaps with `known` propagation, loads guarded by a mask (padding, Concat
/// ranges), and reading compile-time integer arguments with errors that name the node.
///
/// Tests: tests/unit/lower/shape_test.cpp.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/loop_body.h"
#include "lower/lowering.h"
#include "sym/expr.h"

namespace kiln::lower {

/// Prepared (prepacked) weights of at least this many bytes are kept in a temporary file rather
/// than in memory until the compile writes them out (prepared_weight).
inline constexpr size_t kSpillBytes = size_t{64} << 20;

/// A constant float32 [values.size()] holding a weight prepared at compile time (packed for a
/// GEMM or convolution template): in memory, or, from kSpillBytes up, in an unlinked file under
/// the code cache (graph::Tensor::spilled), so that a model's prepared weights need not be
/// resident all together besides the weights they come from.
std::shared_ptr<const graph::Tensor> prepared_weight(const LoweringOptions& options,
                                                     const std::vector<float>& values);

/// Maps an output index (one expr per output dim) to the input index it reads.
using IndexRemap = std::function<std::vector<sym::Expr>(const std::vector<sym::Expr>& out_index)>;

/// A view of `input` with shape `shape` whose element at `out_index` is input[remap(out_index)]:
/// no copy, the input's body is inlined at the remapped index (simplified under the output's
/// index ranges). `known` and `known_float` are carried over when the shapes are static.
TensorValue make_view(LoweringContext& ctx, const TensorValue& input, std::vector<sym::Expr> shape,
                      const IndexRemap& remap);

/// A row-major reshape of `input` to `shape` (same number of elements) as a view: the output
/// index is flattened and unflattened into the input's dims.
TensorValue reshape_view(LoweringContext& ctx, const TensorValue& input,
                         std::vector<sym::Expr> shape);

/// The element of `value` at `index` where `mask` (bool) is true, `other` elsewhere. The index
/// may be out of bounds where the mask is false: a value that is a plain load of a buffer becomes
/// a masked load; any other body is evaluated at the index clamped into bounds and selected.
ir::ValueId load_masked(LoweringContext& ctx, ir::LoopBody& body, const TensorValue& value,
                        const std::vector<sym::Expr>& index, ir::ValueId mask, double other);

/// The bool value lo <= e < hi.
ir::ValueId in_range(ir::LoopBody& body, const sym::Expr& e, const sym::Expr& lo,
                     const sym::Expr& hi);
/// Logical and of two bool values; kNoValue stands for "true".
ir::ValueId and_mask(ir::LoopBody& body, ir::ValueId a, ir::ValueId b);

/// The compile-time integer contents of input `what` (possibly symbolic); fails naming the node
/// when they are not known (data-dependent shapes are not supported yet).
const std::vector<sym::Expr>& require_known(const LoweringContext& ctx, const TensorValue& value,
                                            const std::string& what);
/// Sizes given by a small integer tensor (a shape, repeats, TopK's k): its values when known at
/// compile time; else, computed at run time (Inductor's dynamic scalars: sizes read from data at
/// run time), one fresh size symbol per element, bound right after a library call copies them,
/// which checks each is in [0, `max`] (>= 0 without `max`). The tensor must have a static length.
std::vector<sym::Expr> sizes_from_tensor(LoweringContext& ctx, const TensorValue& value,
                                         const std::string& what,
                                         const std::optional<sym::Expr>& max = std::nullopt);
/// The int64 [n] result of a shape library call, each element bound to a fresh size symbol.
std::vector<sym::Expr> bind_sizes(LoweringContext& ctx, const TensorValue& sizes);
/// `what` for a shape library call's messages: "node 'r' (Reshape): input 'shape'".
std::string node_what(const LoweringContext& ctx, const std::string& what);

/// Like require_known, but every value must be a plain integer.
std::vector<int64_t> require_static_ints(const LoweringContext& ctx, const TensorValue& value,
                                         const std::string& what);
/// A dimension that must be a plain integer (kernel sizes, split sizes, ...).
int64_t require_static_dim(const LoweringContext& ctx, const sym::Expr& dim,
                           const std::string& what);

/// The node's inputs as lowering functions receive them.
using LowerInputs = std::vector<std::optional<TensorValue>>;
/// Input `i`; fails naming the node and the input when it is missing.
const TensorValue& required_input(const LoweringContext& ctx, const LowerInputs& inputs, size_t i,
                                  const std::string& name);
/// Input `i`, or null when omitted.
const TensorValue* optional_input(const LowerInputs& inputs, size_t i);

/// A value holding `values` as its known contents: ctx.from_known where it can build one (any
/// count for int64/int32/bool, up to 8 values otherwise); nullopt otherwise.
std::optional<TensorValue> make_known(LoweringContext& ctx, graph::DType dtype,
                                      const std::vector<sym::Expr>& shape,
                                      std::vector<sym::Expr> values);

/// The sliding-window geometry of Conv and the pools along the spatial dims.
struct WindowGeometry {
  std::vector<int64_t> kernel;
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  std::vector<int64_t> pads;   // all begins, then all ends (as ONNX)
  std::vector<sym::Expr> out;  // output spatial sizes
};

/// Reads strides, dilations, pads and auto_pad (NOTSET, VALID, SAME_UPPER, SAME_LOWER) of the
/// node for input spatial sizes `spatial` and `kernel`, and computes the output sizes (rounded up
/// when `ceil_mode`). SAME padding of a symbolic size is supported for stride 1 only (the pads
/// would depend on the size otherwise).
WindowGeometry window_geometry(LoweringContext& ctx, const graph::Node& node,
                               const std::vector<sym::Expr>& spatial, std::vector<int64_t> kernel,
                               bool ceil_mode);

/// Makes sure every index in `indices` lies in [-size, size) (or equals `ignored`): at compile
/// time when the indices and size are static, otherwise by an ir::IndexCheck the wrapper runs
/// before any kernel. Returns the value to read the indices from (realized when checked at run
/// time). Fails naming the node for non-integer indices.
TensorValue checked_indices(LoweringContext& ctx, const TensorValue& indices, const sym::Expr& size,
                            std::optional<int64_t> ignored = std::nullopt);

/// Arithmetic on values of one floating dtype inside a loop body, for lowerings that are long
/// formulas (GridSample, the optimizers).
struct FloatMath {
  ir::LoopBody& body;
  graph::DType dtype;
  ir::ValueId c(double v) const { return body.constant(v, dtype); }
  ir::ValueId add(ir::ValueId a, ir::ValueId b) const {
    return body.binary(ir::OpCode::kAdd, a, b);
  }
  ir::ValueId sub(ir::ValueId a, ir::ValueId b) const {
    return body.binary(ir::OpCode::kSub, a, b);
  }
  ir::ValueId mul(ir::ValueId a, ir::ValueId b) const {
    return body.binary(ir::OpCode::kMul, a, b);
  }
  ir::ValueId div(ir::ValueId a, ir::ValueId b) const {
    return body.binary(ir::OpCode::kDiv, a, b);
  }
  ir::ValueId scale(double k, ir::ValueId a) const { return mul(c(k), a); }
  ir::ValueId floor(ir::ValueId a) const { return body.unary(ir::OpCode::kFloor, a); }
  ir::ValueId sqrt(ir::ValueId a) const { return body.unary(ir::OpCode::kSqrt, a); }
};

/// Concatenation of `parts` (same rank, equal dims but `axis`) along `axis`: known contents
/// where all parts have them, else a pointwise selection of the part each index falls in.
TensorValue concat_values(LoweringContext& ctx, const std::vector<const TensorValue*>& parts,
                          size_t axis);

/// A known one-element value (integer or floating known contents) as a double; nullopt when its
/// contents are not known at compile time.
std::optional<double> known_scalar(const TensorValue& v);

/// `layout` right-aligned onto `sizes`: missing leading dims and size-1 dims that broadcast get
/// stride 0 (a matrix product's or attention's operand broadcast over batch dims).
ir::Layout broadcast_layout(const ir::Layout& layout, const std::vector<sym::Expr>& sizes);

/// Static dims of a shape, or an empty optional when any dim is symbolic.
std::optional<std::vector<int64_t>> static_shape(const std::vector<sym::Expr>& shape);

}  // namespace kiln::lower
