#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "graph/op_versions.h"
#include "lower/lowering.h"

namespace kiln::lower {

void Registry::add(std::string domain, std::string op_type, OpLowering lowering) {
  // A lowering of the version current at opset 17 or later holds until the op next changes
  // meaning; versions that only add element types do not end it (graph/op_versions.h).
  if ((domain.empty() || domain == "ai.onnx") && lowering.max_opset >= graph::kOnnx112Opset) {
    lowering.max_opset = graph::last_opset_with_meaning_of(op_type, lowering.max_opset);
  }
  table_[{std::move(domain), std::move(op_type)}] = std::move(lowering);
}

const OpLowering* Registry::find(std::string_view domain, std::string_view op_type) const {
  // ONNX spells the default domain "" or "ai.onnx".
  std::string d = domain == "ai.onnx" ? "" : std::string(domain);
  auto it = table_.find(std::pair<std::string, std::string>{d, std::string(op_type)});
  return it == table_.end() ? nullptr : &it->second;
}

std::vector<std::string> Registry::ops() const {
  std::vector<std::string> names;
  for (const auto& [key, lowering] : table_) {
    names.push_back(key.first.empty() ? key.second : key.first + ":" + key.second);
  }
  return names;  // std::map order is sorted
}

const Registry& Registry::instance() {
  static const Registry registry = [] {
    Registry r;
    register_elementwise_ops(r);
    register_reduce_ops(r);
    register_norm_ops(r);
    register_shape_ops(r);
    register_index_ops(r);
    register_nn_ops(r);
    register_training_ops(r);
    register_movement_ops(r);
    register_contraction_ops(r);
    register_resize_ops(r);
    register_quantize_ops(r);
    register_conv_transpose_ops(r);
    register_grid_sample_ops(r);
    register_recurrent_ops(r);
    register_library_ops(r);
    register_signal_ops(r);
    register_dynamic_ops(r);
    register_sequence_ops(r);
    register_control_flow_ops(r);
    register_attention_ops(r);
    register_newer_ops(r);
    return r;
  }();
  return registry;
}

}  // namespace kiln::lower
