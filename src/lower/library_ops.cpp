/// Ops lowered to library kernels of kiln_rt_library.h, whose loops the loop IR cannot express:
/// Det (LU factorization per matrix), RoiAlign (a per-box sampling grid whose size depends on
/// the box) and TfIdfVectorizer (n-gram matching against a pool).
///
/// Tests: the ONNX node suite (tests/onnx).

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lower/elementwise.h"
#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using sym::Expr;

namespace {

std::vector<TensorValue> lower_det(LoweringContext& ctx, const graph::Node&,
                                   const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  require_dtype(ctx, x.dtype, kFloats, "input 'X'");
  if (x.rank() < 2 || x.shape[x.rank() - 1] != x.shape[x.rank() - 2]) {
    ctx.fail(
        fmt::format("expected square matrices [..., M, M], found {}", graph::shape_str(x.shape)));
  }
  std::vector<Expr> shape(x.shape.begin(), x.shape.end() - 2);
  return {ctx.extern_call(ir::DetCall{}, x.dtype, shape, {ctx.as_view(x, true)})};
}

std::vector<TensorValue> lower_roi_align(LoweringContext& ctx, const graph::Node& node,
                                         const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  const TensorValue& rois = required_input(ctx, inputs, 1, "rois");
  const TensorValue& batch = required_input(ctx, inputs, 2, "batch_indices");
  require_dtype(ctx, x.dtype, kFloats, "input 'X'");
  if (x.rank() != 4 || rois.rank() != 2 || rois.shape[1] != Expr(4) || batch.rank() != 1) {
    ctx.fail(fmt::format(
        "expected X [N, C, H, W], rois [R, 4] and batch_indices [R], found {}, "
        "{} and {}",
        graph::shape_str(x.shape), graph::shape_str(rois.shape), graph::shape_str(batch.shape)));
  }
  if (rois.dtype != x.dtype) ctx.fail("rois must have the dtype of X");
  std::string mode = node.attr_string("mode", "avg");
  if (mode != "avg" && mode != "max")
    ctx.fail(fmt::format("mode must be avg or max, found '{}'", mode));
  // Opset 16 added coordinate_transformation_mode (default half_pixel); before, no offset.
  std::string transform = node.attr_string("coordinate_transformation_mode",
                                           node.opset() >= 16 ? "half_pixel" : "output_half_pixel");
  const int64_t oh = node.attr_int("output_height", 1), ow = node.attr_int("output_width", 1);
  std::vector<Expr> shape = {rois.shape[0], x.shape[1], Expr(oh), Expr(ow)};
  ir::RoiAlignCall call;
  call.sampling_ratio = node.attr_int("sampling_ratio", 0);
  call.spatial_scale = static_cast<double>(node.attr_float("spatial_scale", 1.0f));
  call.half_pixel = transform == "half_pixel";
  call.max_mode = mode == "max";
  return {
      ctx.extern_call(std::move(call), x.dtype, shape,
                      {ctx.as_view(x, true), ctx.as_view(rois, true), ctx.as_view(batch, true)})};
}

std::vector<TensorValue> lower_tfidf(LoweringContext& ctx, const graph::Node& node,
                                     const LowerInputs& inputs) {
  const TensorValue& x = required_input(ctx, inputs, 0, "X");
  if (x.dtype != DType::kInt32 && x.dtype != DType::kInt64) {
    ctx.fail(
        fmt::format("expected int32 or int64 input (string tensors are not supported), "
                    "found {}",
                    graph::dtype_name(x.dtype)));
  }
  if (x.rank() != 1 && x.rank() != 2) ctx.fail("expected an input [C] or [N, C]");
  std::vector<int64_t> indexes = node.attr_ints("ngram_indexes", {});
  std::vector<int64_t> counts = node.attr_ints("ngram_counts", {});
  std::vector<int64_t> pool = node.attr_ints("pool_int64s", {});
  if (indexes.empty() || counts.empty() || pool.empty()) {
    ctx.fail("attributes ngram_indexes, ngram_counts and pool_int64s are required");
  }
  const int64_t columns = *std::max_element(indexes.begin(), indexes.end()) + 1;
  std::string mode = node.attr_string("mode", "TF");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") {
    ctx.fail(fmt::format("mode must be TF, IDF or TFIDF, found '{}'", mode));
  }
  std::vector<double> weights;
  for (float w : node.attr_floats("weights", {})) weights.push_back(w);
  std::vector<Expr> shape = {Expr(columns)};
  if (x.rank() == 2) shape.insert(shape.begin(), x.shape[0]);
  ir::TfIdfCall call;
  call.min_gram = node.attr_int("min_gram_length", 1);
  call.max_gram = node.attr_int("max_gram_length", 1);
  call.max_skip = node.attr_int("max_skip_count", 0);
  call.mode = mode == "TF" ? 0 : mode == "IDF" ? 1 : 2;
  call.pool = pool;
  call.ngram_counts = counts;
  call.ngram_indexes = indexes;
  call.weights = weights;
  return {ctx.extern_call(std::move(call), DType::kFloat32, shape, {ctx.as_view(x, true)})};
}

}  // namespace

void register_library_ops(Registry& registry) {
  registry.add("", "TfIdfVectorizer", {lower_tfidf, 9, 17});
  registry.add("", "Det", {lower_det, 11, 17});
  registry.add("", "RoiAlign", {lower_roi_align, 10, 17});
}

}  // namespace kiln::lower
