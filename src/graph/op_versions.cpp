#include "graph/op_versions.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::graph {

namespace {

using Table = std::map<std::string, std::vector<OpVersion>, std::less<>>;

void add(Table& table, std::string_view op, int64_t version, bool types_only,
         std::string_view attributes = "") {
  table[std::string(op)].push_back({version, types_only, attributes});
}

/// Ops that only gained element types in `version` (ONNX 1.17's bfloat16 of opset 22; the int4,
/// float4, float8e8m0 and int2 types of opsets 21, 23, 24 and 25 on the ops that move data).
void add_types_only(Table& table, int64_t version, std::initializer_list<std::string_view> ops) {
  for (std::string_view op : ops) add(table, op, version, true);
}

// Where the meaning of a version could not be confirmed it is listed as changing semantics:
// Kiln then refuses the op at that opset rather than guess.
Table build_table() {
  Table t;
  // Opset 18 (ONNX 1.13).
  for (std::string_view op : {"BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor"}) {
    add(t, op, 18, false);
  }
  add(t, "CenterCropPad", 18, false, "axes");
  add(t, "Col2Im", 18, false, "dilations,pads,strides");
  add(t, "GroupNormalization", 18, false, "epsilon,num_groups");
  add(t, "LpPool", 18, false, "ceil_mode,dilations");
  add(t, "Mish", 18, false);
  add(t, "OptionalGetElement", 18, false);
  add(t, "OptionalHasElement", 18, false);
  add(t, "Pad", 18, false);  // axes input
  for (std::string_view op :
       {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSumSquare"}) {
    add(t, op, 18, false, "noop_with_empty_axes");  // axes becomes an input
  }
  add(t, "Resize", 18, false, "antialias,axes,keep_aspect_ratio_policy");
  add(t, "ScatterElements", 18, false);  // reduction max and min
  add(t, "ScatterND", 18, false);        // reduction max and min
  add(t, "Split", 18, false, "num_outputs");
  // Opset 19 (ONNX 1.14): float8 types; Cast's saturate applies to float8 only.
  add(t, "AveragePool", 19, false, "dilations");
  add(t, "Cast", 19, true, "saturate");
  add(t, "CastLike", 19, true, "saturate");
  add(t, "DeformConv", 19, false, "dilations,group,kernel_shape,offset_group,pads,strides");
  add(t, "DequantizeLinear", 19, true);
  add(t, "QuantizeLinear", 19, true, "saturate");
  add(t, "Pad", 19, false);     // mode 'wrap'
  add(t, "Resize", 19, false);  // coordinate_transformation_mode 'half_pixel_symmetric'
  add_types_only(
      t, 19, {"Constant", "Equal", "Identity", "If", "Loop", "Reshape", "Scan", "Shape", "Size"});
  // Opset 20 (ONNX 1.15).
  add(t, "AffineGrid", 20, false, "align_corners");
  add(t, "DFT", 20, false);  // axis becomes an input
  add(t, "Gelu", 20, false, "approximate");
  add(t, "GridSample", 20, false);  // N-d, modes renamed 'linear' and 'cubic'
  add(t, "ImageDecoder", 20, false, "pixel_format");
  add(t, "RegexFullMatch", 20, false, "pattern");
  add(t, "StringConcat", 20, false);
  add(t, "StringSplit", 20, false, "delimiter,maxsplit");
  add_types_only(t, 20, {"ConstantOfShape", "IsInf", "IsNaN", "ReduceMax", "ReduceMin"});
  // Opset 21 (ONNX 1.16): int4 and uint4; blocked quantization.
  add(t, "DequantizeLinear", 21, false, "block_size");
  add(t, "QuantizeLinear", 21, false, "block_size,output_dtype");
  add(t, "GroupNormalization", 21, false, "stash_type");  // scale and bias per channel
  add_types_only(t, 21,
                 {"Cast", "CastLike", "Constant", "ConstantOfShape", "Flatten", "Identity", "If",
                  "Loop", "Pad", "QLinearMatMul", "Reshape", "Scan", "Shape", "Size", "Squeeze",
                  "Transpose", "Unsqueeze"});
  // Opset 22 (ONNX 1.17): bfloat16.
  add_types_only(t, 22,
                 {"Acos",
                  "Acosh",
                  "Asin",
                  "Asinh",
                  "Atan",
                  "Atanh",
                  "AveragePool",
                  "Bernoulli",
                  "Conv",
                  "ConvTranspose",
                  "Cos",
                  "Cosh",
                  "DeformConv",
                  "Det",
                  "Dropout",
                  "Elu",
                  "EyeLike",
                  "GRU",
                  "GlobalAveragePool",
                  "GlobalLpPool",
                  "GlobalMaxPool",
                  "GridSample",
                  "HardSigmoid",
                  "HardSwish",
                  "InstanceNormalization",
                  "LSTM",
                  "LpNormalization",
                  "LpPool",
                  "MaxPool",
                  "MaxRoiPool",
                  "MaxUnpool",
                  "Mish",
                  "Multinomial",
                  "NegativeLogLikelihoodLoss",
                  "RNN",
                  "RandomNormal",
                  "RandomNormalLike",
                  "RandomUniform",
                  "RandomUniformLike",
                  "RoiAlign",
                  "Round",
                  "Selu",
                  "Sin",
                  "Sinh",
                  "Softplus",
                  "Softsign",
                  "Tan",
                  "ThresholdedRelu"});
  // The ops that move data gained float4e2m1 (23), float8e8m0 (24) and int2/uint2 (25).
  for (int64_t version : {23, 24, 25}) {
    add_types_only(
        t, version,
        {"Cast", "CastLike", "Constant", "ConstantOfShape", "Flatten", "Identity", "If", "Loop",
         "Pad", "Reshape", "Scan", "Shape", "Size", "Squeeze", "Transpose", "Unsqueeze"});
    add(t, "DequantizeLinear", version, false);
    add(t, "QuantizeLinear", version, false);
    if (version == 24) {
      // round_mode concerns conversions to float8e8m0 only.
      t["Cast"].back().new_attributes = "round_mode";
      t["CastLike"].back().new_attributes = "round_mode";
    }
  }
  // Opset 23 (ONNX 1.18).
  add(t, "Attention", 23, false,
      "is_causal,kv_num_heads,q_num_heads,qk_matmul_output_mode,scale,softcap,"
      "softmax_precision");
  add(t, "RMSNormalization", 23, false, "axis,epsilon,stash_type");
  add(t, "RotaryEmbedding", 23, false, "interleaved,num_heads,rotary_embedding_dim");
  // Opset 24 (ONNX 1.19).
  add(t, "Attention", 24, false);
  add(t, "SplitToSequence", 24, true);  // bfloat16 (onnx/onnx#7158)
  add(t, "Swish", 24, false, "alpha");
  add(t, "TensorScatter", 24, false, "axis,mode");
  add(t, "TopK", 24, true);  // bfloat16 (onnx/onnx#7158)
  // Opsets 26-28 (ONNX 1.21-1.23).
  add(t, "BitCast", 26, false, "to");
  add(t, "CumProd", 26, false, "exclusive,reverse");
  add(t, "CausalConvWithState", 27, false, "activation");
  add(t, "LinearAttention", 27, false, "chunk_size,kv_num_heads,q_num_heads,scale,update_rule");
  add(t, "Range", 27, false, "stash_type");  // float16, bfloat16, computed in stash_type
  add(t, "Celu", 28, true);                  // float16, bfloat16, double (onnx/onnx#8107)
  add(t, "SwiGLU", 28, false, "alpha");
  for (auto& [op, versions] : t) {
    std::sort(versions.begin(), versions.end(),
              [](const OpVersion& a, const OpVersion& b) { return a.version < b.version; });
  }
  return t;
}

const Table& table() {
  static const Table t = build_table();
  return t;
}

}  // namespace

const std::vector<OpVersion>& op_versions_after_17(std::string_view op_type) {
  static const std::vector<OpVersion> kNone;
  auto it = table().find(op_type);
  return it == table().end() ? kNone : it->second;
}

bool onnx112_schema_is_current(std::string_view op_type, int64_t opset) {
  for (const OpVersion& v : op_versions_after_17(op_type)) {
    if (v.version <= opset) return false;
  }
  return true;
}

bool onnx112_inference_holds(std::string_view op_type, int64_t opset) {
  for (const OpVersion& v : op_versions_after_17(op_type)) {
    if (v.version <= opset && !v.types_only) return false;
  }
  return true;
}

int64_t last_opset_with_meaning_of(std::string_view op_type, int64_t implemented) {
  for (const OpVersion& v : op_versions_after_17(op_type)) {
    if (v.version > implemented && !v.types_only) return v.version - 1;
  }
  return kMaxOpset;
}

std::vector<std::string_view> attributes_added_after_17(std::string_view op_type, int64_t opset) {
  std::vector<std::string_view> names;
  for (const OpVersion& v : op_versions_after_17(op_type)) {
    if (v.version > opset) break;
    std::string_view rest = v.new_attributes;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      names.push_back(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
    }
  }
  return names;
}

}  // namespace kiln::graph
