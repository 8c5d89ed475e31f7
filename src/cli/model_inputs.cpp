#include "cli/model_inputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "onnx/tensor_file.h"
#include "support/error.h"

namespace kiln::cli {

std::pair<std::string, std::string> split_assignment(const std::string& text, const char* what,
                                                     const std::vector<std::string>& names) {
  size_t eq = names.empty() ? text.rfind('=') : text.find('=');
  for (size_t p = eq; !names.empty() && p != std::string::npos; p = text.find('=', p + 1)) {
    if (std::find(names.begin(), names.end(), text.substr(0, p)) != names.end()) {
      eq = p;
      break;
    }
  }
  if (eq == std::string::npos || eq == 0)
    user_error("{} '{}' is not of the form NAME=VALUE", what, text);
  return {text.substr(0, eq), text.substr(eq + 1)};
}

void GivenInputs::specialize(lower::LoweringOptions& options) const {
  for (const auto& [name, value] : structured) options.structured_inputs[name] = value;
  for (const auto& [name, tensor] : tensors) {
    if (name.find('[') == std::string::npos) options.input_values[name] = tensor;
  }
}

GivenInputs read_given_inputs(const std::vector<std::string>& items,
                              const std::vector<DeclaredInput>& inputs, const char* option) {
  GivenInputs given;
  std::set<std::string> seen;
  std::vector<std::string> names;
  for (const DeclaredInput& in : inputs) names.push_back(in.name);
  for (const std::string& item : items) {
    auto [name, file] = split_assignment(item, option, names);
    auto input = std::find_if(inputs.begin(), inputs.end(),
                              [&](const DeclaredInput& in) { return in.name == name; });
    if (input == inputs.end()) {
      user_error("{} {}: the model has no input of that name (its inputs: {})", option, name,
                 fmt::join(names, ", "));
    }
    if (!seen.insert(name).second)
      user_error("{} {}: input '{}' is given twice", option, item, name);
    graph::IoValue value = onnx::read_value_file(file, input->type);
    if (value.kind == graph::ValueKind::kTensor && !value.optional) {
      given.tensors[name] = std::make_shared<graph::Tensor>(value.tensors.at(0));
      continue;
    }
    for (size_t e = 0; e < value.tensors.size(); ++e) {
      std::string flat =
          value.kind == graph::ValueKind::kSequence ? fmt::format("{}[{}]", name, e) : name;
      given.tensors[flat] = std::make_shared<graph::Tensor>(value.tensors[e]);
    }
    given.structured[name] = std::move(value);
  }
  return given;
}

std::vector<DeclaredInput> declared_inputs(const graph::Model& model) {
  std::vector<DeclaredInput> inputs;
  for (const graph::Value* v : model.graph->inputs()) inputs.push_back({v->name(), v->type()});
  return inputs;
}

graph::Tensor random_tensor(graph::DType dtype, const std::vector<int64_t>& dims, int64_t bound,
                            std::mt19937_64& rng) {
  graph::Tensor t(dtype, dims);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int64_t> integer(0, std::max<int64_t>(bound, 1) - 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (dtype) {
      case graph::DType::kFloat32:
        t.mutable_values<float>()[i] = static_cast<float>(real(rng));
        break;
      case graph::DType::kFloat64:
        t.mutable_values<double>()[i] = real(rng);
        break;
      case graph::DType::kFloat16:
        t.mutable_values<uint16_t>()[i] = graph::float_to_half(static_cast<float>(real(rng)));
        break;
      case graph::DType::kBFloat16:
        t.mutable_values<uint16_t>()[i] = graph::float_to_bfloat16(static_cast<float>(real(rng)));
        break;
      case graph::DType::kFloat8E4M3FN:
      case graph::DType::kFloat8E4M3FNUZ:
      case graph::DType::kFloat8E5M2:
      case graph::DType::kFloat8E5M2FNUZ:
      case graph::DType::kFloat4E2M1:
      case graph::DType::kFloat8E8M0:
        t.mutable_values<uint8_t>()[i] =
            graph::float_to_small_float(dtype, static_cast<float>(real(rng)));
        break;
      case graph::DType::kUInt4:
      case graph::DType::kUInt2:
      case graph::DType::kInt4:
      case graph::DType::kInt2:
        t.mutable_values<uint8_t>()[i] =
            static_cast<uint8_t>(graph::wrap_small_integer(dtype, integer(rng)) & 0xFF);
        break;
      case graph::DType::kBool:
        t.mutable_values<bool>()[i] = (rng() & 1) != 0;
        break;
      case graph::DType::kInt64:
        t.mutable_values<int64_t>()[i] = integer(rng);
        break;
      case graph::DType::kInt32:
        t.mutable_values<int32_t>()[i] = static_cast<int32_t>(integer(rng));
        break;
      case graph::DType::kInt8:
        t.mutable_values<int8_t>()[i] = static_cast<int8_t>(integer(rng));
        break;
      case graph::DType::kUInt8:
        t.mutable_values<uint8_t>()[i] = static_cast<uint8_t>(integer(rng));
        break;
      case graph::DType::kInt16:
        t.mutable_values<int16_t>()[i] = static_cast<int16_t>(integer(rng));
        break;
      case graph::DType::kUInt16:
        t.mutable_values<uint16_t>()[i] = static_cast<uint16_t>(integer(rng));
        break;
      case graph::DType::kUInt32:
        t.mutable_values<uint32_t>()[i] = static_cast<uint32_t>(integer(rng));
        break;
      case graph::DType::kUInt64:
        t.mutable_values<uint64_t>()[i] = static_cast<uint64_t>(integer(rng));
        break;
      default:
        user_error("cannot make random values of dtype {}", graph::dtype_name(dtype));
    }
  }
  return t;
}

std::optional<sym::Expr> indexed_axis_size(const driver::CompiledModel& model,
                                           const ir::InputSpec& spec) {
  std::optional<sym::Expr> size;
  for (const ir::IndexCheck& check : model.index_checks()) {
    if (check.buffer == spec.buffer) size = check.size;
  }
  return size;
}

int64_t random_integer_bound(const std::optional<sym::Expr>& indexed_axis,
                             const sym::Binding& binding) {
  return indexed_axis ? sym::evaluate(*indexed_axis, binding) : 10;
}

std::vector<int64_t> concrete_dims(const std::vector<sym::Expr>& shape, sym::Binding& binding) {
  std::vector<int64_t> dims;
  for (const sym::Expr& d : shape) {
    for (const sym::Expr& s : sym::free_symbols(d)) binding.try_emplace(s.name(), 1);
    dims.push_back(sym::evaluate(d, binding));
  }
  return dims;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

}  // namespace kiln::cli
