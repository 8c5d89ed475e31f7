#include "onnx/inference_guard.h"

#include <fmt/format.h>
#include <onnx/defs/shape_inference.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "graph/op_versions.h"

namespace kiln::onnx {

namespace {

using ::onnx::InferenceContext;

thread_local std::optional<GuardFailure> t_failure;

/// Records the first refusal of this thread and stops the node's inference.
[[noreturn]] void refuse(const std::string& op_type, const std::string& problem) {
  if (!t_failure) t_failure = GuardFailure{op_type, problem};
  throw ::onnx::InferenceError(fmt::format("[ShapeInferenceError] {}: {}", op_type, problem));
}

/// The rank of input `index` as inference knows it so far; nullopt when unknown or absent.
std::optional<int> known_rank(InferenceContext& ctx, size_t index) {
  if (index >= ctx.getNumInputs()) return std::nullopt;
  const ::onnx::TypeProto* type = ctx.getInputType(index);
  if (type == nullptr || !type->has_tensor_type() || !type->tensor_type().has_shape()) {
    return std::nullopt;
  }
  return type->tensor_type().shape().dim_size();
}

void require_rank(InferenceContext& ctx, const std::string& op, size_t index, const char* name,
                  int rank) {
  std::optional<int> found = known_rank(ctx, index);
  if (found && *found != rank) {
    refuse(op, fmt::format("input {} ('{}') must have rank {}, found rank {}", index, name, rank,
                           *found));
  }
}

/// Convolution and pooling: kernel_shape, strides and dilations positive, pads non-negative,
/// each with one entry per spatial dim (two for pads); data of rank 3 or more and, for a
/// convolution, weights of the data's rank.
void check_conv_pool(InferenceContext& ctx, const std::string& op, size_t data_index,
                     std::optional<size_t> weight_index) {
  std::optional<int> rank = known_rank(ctx, data_index);
  if (rank && *rank < 3) {
    refuse(op, fmt::format("input {} (the data) must have rank 3 or more (N, C, spatial dims), "
                           "found rank {}",
                           data_index, *rank));
  }
  if (weight_index) {
    std::optional<int> weight_rank = known_rank(ctx, *weight_index);
    if (rank && weight_rank && *weight_rank != *rank) {
      refuse(op, fmt::format("input {} (the weights) must have the data's rank {}, found rank {}",
                             *weight_index, *rank, *weight_rank));
    }
  }
  for (const char* name : {"kernel_shape", "strides", "dilations", "pads"}) {
    const ::onnx::AttributeProto* attr = ctx.getAttribute(name);
    if (attr == nullptr) continue;
    bool pads = std::string_view(name) == "pads";
    for (int i = 0; i < attr->ints_size(); ++i) {
      if (pads ? attr->ints(i) < 0 : attr->ints(i) < 1) {
        refuse(op, fmt::format("attribute '{}' holds {} at position {}; it must be {}", name,
                               attr->ints(i), i, pads ? "non-negative" : "positive"));
      }
    }
    if (!rank) continue;
    int expected = pads ? 2 * (*rank - 2) : *rank - 2;
    if (attr->ints_size() != expected) {
      refuse(op, fmt::format("attribute '{}' has {} values; data of rank {} needs {}", name,
                             attr->ints_size(), *rank, expected));
    }
  }
}

/// Clears what a failed inference function wrote to the node's outputs. ONNX 1.12 keeps the
/// output types of a node whose inference threw (non-strict mode records the error and goes
/// on): If's function first copies the then branch's type to each output and throws when the
/// else branch's does not match, so the If's output would keep one branch's shape. The types
/// are unknown instead (Kiln's lowering infers them).
void forget_outputs(InferenceContext& ctx) {
  for (size_t i = 0; i < ctx.getNumOutputs(); ++i) {
    if (::onnx::TypeProto* type = ctx.getOutputType(i)) type->Clear();
  }
}

/// After ONNX 1.12's If inference: an output's shape holds only where both branches give one
/// of the same rank. 1.12's function copies the then branch's type to the output and merges the
/// else branch's into it, but keeps the then branch's shape when the else branch has none (a
/// value whose shape inference could not tell), so the If's output would claim a rank the
/// taken branch may not give. The branches' output types are those inference just wrote into
/// their graphs.
void forget_one_sided_shapes(InferenceContext& ctx) {
  const ::onnx::AttributeProto* then_attr = ctx.getAttribute("then_branch");
  const ::onnx::AttributeProto* else_attr = ctx.getAttribute("else_branch");
  if (then_attr == nullptr || else_attr == nullptr) return;
  const ::onnx::GraphProto& then_graph = then_attr->g();
  const ::onnx::GraphProto& else_graph = else_attr->g();
  for (size_t i = 0; i < ctx.getNumOutputs(); ++i) {
    if (static_cast<int>(i) >= then_graph.output_size() ||
        static_cast<int>(i) >= else_graph.output_size()) {
      return;
    }
    ::onnx::TypeProto* out = ctx.getOutputType(i);
    if (out == nullptr || !out->has_tensor_type() || !out->tensor_type().has_shape()) continue;
    auto shape_of = [](const ::onnx::TypeProto& t) -> const ::onnx::TensorShapeProto* {
      return t.has_tensor_type() && t.tensor_type().has_shape() ? &t.tensor_type().shape()
                                                                : nullptr;
    };
    const ::onnx::TensorShapeProto* a = shape_of(then_graph.output(static_cast<int>(i)).type());
    const ::onnx::TensorShapeProto* b = shape_of(else_graph.output(static_cast<int>(i)).type());
    if (a == nullptr || b == nullptr || a->dim_size() != b->dim_size()) {
      out->mutable_tensor_type()->clear_shape();
    }
  }
}

/// After ONNX 1.12's pooling inference with ceil_mode: a last window that would start in the end
/// padding is dropped, as later ONNX versions (and PyTorch) compute the output size; 1.12 keeps
/// it, and would then refuse a model that declares the output's size (MaxPool of a [2, 2] input
/// with kernel 1, stride 2: 1.12 infers 2, ONNX 1.23 and the model say 1).
void drop_windows_starting_in_padding(InferenceContext& ctx) {
  const ::onnx::AttributeProto* ceil_mode = ctx.getAttribute("ceil_mode");
  if (ceil_mode == nullptr || ceil_mode->i() == 0) return;
  const ::onnx::AttributeProto* auto_pad = ctx.getAttribute("auto_pad");
  if (auto_pad != nullptr && auto_pad->s() != "NOTSET" && auto_pad->s() != "VALID") return;
  const ::onnx::AttributeProto* strides = ctx.getAttribute("strides");
  const ::onnx::AttributeProto* pads = ctx.getAttribute("pads");
  const bool valid = auto_pad != nullptr && auto_pad->s() == "VALID";
  const ::onnx::TypeProto* in = ctx.getInputType(0);
  if (in == nullptr || !in->has_tensor_type() || !in->tensor_type().has_shape()) return;
  const ::onnx::TensorShapeProto& in_shape = in->tensor_type().shape();
  for (size_t k = 0; k < ctx.getNumOutputs(); ++k) {
    ::onnx::TypeProto* out = ctx.getOutputType(k);
    if (out == nullptr || !out->has_tensor_type() || !out->tensor_type().has_shape()) continue;
    ::onnx::TensorShapeProto* out_shape = out->mutable_tensor_type()->mutable_shape();
    if (out_shape->dim_size() != in_shape.dim_size()) continue;
    const int n = in_shape.dim_size() - 2;
    for (int j = 0; j < n; ++j) {
      const auto& size = in_shape.dim(j + 2);
      auto* dim = out_shape->mutable_dim(j + 2);
      if (!size.has_dim_value() || !dim->has_dim_value()) continue;
      int64_t stride = strides != nullptr && strides->ints_size() == n ? strides->ints(j) : 1;
      int64_t begin = !valid && pads != nullptr && pads->ints_size() == 2 * n ? pads->ints(j) : 0;
      if (stride > 0 && (dim->dim_value() - 1) * stride >= size.dim_value() + begin) {
        dim->set_dim_value(dim->dim_value() - 1);
      }
    }
  }
}

/// The guard of `op` in the default domain; null for ops it does not guard.
std::function<void(InferenceContext&)> guard_for(const std::string& op) {
  // The data input and, for convolutions, the weights input.
  static const std::map<std::string, std::pair<size_t, std::optional<size_t>>> kConvPool = {
      {"Conv", {0, 1}},        {"ConvInteger", {0, 1}}, {"ConvTranspose", {0, 1}},
      {"QLinearConv", {0, 3}}, {"MaxPool", {0, {}}},    {"AveragePool", {0, {}}},
      {"LpPool", {0, {}}},     {"MaxUnpool", {0, {}}},
  };
  if (auto it = kConvPool.find(op); it != kConvPool.end()) {
    size_t data = it->second.first;
    std::optional<size_t> weights = it->second.second;
    return [op, data, weights](InferenceContext& ctx) { check_conv_pool(ctx, op, data, weights); };
  }
  if (op == "Gemm") {
    return [op](InferenceContext& ctx) {
      require_rank(ctx, op, 0, "A", 2);
      require_rank(ctx, op, 1, "B", 2);
    };
  }
  if (op == "STFT") {
    return [op](InferenceContext& ctx) { require_rank(ctx, op, 0, "signal", 3); };
  }
  return nullptr;
}

class GuardedRegistry final : public ::onnx::ISchemaRegistry {
 public:
  const ::onnx::OpSchema* GetSchema(const std::string& key, const int max_inclusive_version,
                                    const std::string& domain) const override {
    // In a model newer than ONNX 1.12, an op changed since opset 17 is left to Kiln's own
    // inference (graph/op_versions.h): 1.12's function describes an older version.
    bool default_domain = domain.empty() || domain == "ai.onnx";
    bool newer = (default_domain && max_inclusive_version > graph::kOnnx112Opset &&
                  !graph::onnx112_inference_holds(key, max_inclusive_version)) ||
                 (domain == "ai.onnx.ml" && max_inclusive_version > 3);
    const ::onnx::OpSchema* schema =
        ::onnx::OpSchemaRegistry::Schema(key, max_inclusive_version, domain);
    if (newer) return nullptr;
    if (schema == nullptr || !schema->has_type_and_shape_inference_function()) return schema;
    if (!domain.empty() && domain != "ai.onnx") return schema;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = guarded_.find(schema);
    if (it != guarded_.end()) return it->second ? it->second.get() : schema;
    std::function<void(InferenceContext&)> guard = guard_for(key);
    std::unique_ptr<::onnx::OpSchema>& copy = guarded_[schema];
    bool shape_data = key == "Shape" || key == "Size";
    copy = std::make_unique<::onnx::OpSchema>(*schema);
    copy->TypeAndShapeInferenceFunction(
        [guard, is_if = key == "If",
         is_pool = key == "MaxPool" || key == "AveragePool" || key == "LpPool",
         infer = schema->GetTypeAndShapeInferenceFunction()](InferenceContext& ctx) {
          try {
            if (guard) guard(ctx);
            infer(ctx);
            if (is_if) forget_one_sided_shapes(ctx);
            if (is_pool) drop_windows_starting_in_padding(ctx);
          } catch (...) {
            forget_outputs(ctx);
            throw;
          }
        });
    if (shape_data && schema->has_data_propagation_function()) {
      // ONNX 1.12's data propagation of Shape and Size reads the input's shape without checking
      // there is one: an input whose type nothing inferred (the output of an op left to Kiln)
      // crashes it.
      copy->PartialDataPropagationFunction(
          [propagate = schema->GetDataPropagationFunction()](::onnx::DataPropagationContext& ctx) {
            const ::onnx::TypeProto* type = ctx.getInputType(0);
            if (type == nullptr || !type->has_tensor_type() || !type->tensor_type().has_shape()) {
              return;
            }
            propagate(ctx);
          });
    }
    return copy.get();
  }

 private:
  mutable std::mutex mutex_;
  // Each schema's guarded copy; null for schemas without a guard.
  mutable std::map<const ::onnx::OpSchema*, std::unique_ptr<::onnx::OpSchema>> guarded_;
};

}  // namespace

const ::onnx::ISchemaRegistry* guarded_schema_registry() {
  static const GuardedRegistry registry;
  return &registry;
}

std::optional<GuardFailure> take_guard_failure() {
  std::optional<GuardFailure> failure = std::move(t_failure);
  t_failure.reset();
  return failure;
}

}  // namespace kiln::onnx
