// CompiledModel::run: marshals tensors through the compiled model's C entry point.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "autotune/cuda_choice.h"
#include "codecache/loaded_library.h"
#include "driver/compile.h"
#include "runtime/kiln_rt_profile.h"
#include "support/error.h"

namespace kiln::driver {

std::vector<graph::Tensor> CompiledModel::run(const std::vector<graph::Tensor>& inputs,
                                              kiln_rt::Profile* profile) const {
  if (inputs.size() != inputs_.size()) {
    user_error("the model takes {} inputs, {} were given", inputs_.size(), inputs.size());
  }
  std::vector<kiln_rt::TensorArg> in(inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k) {
    const graph::Tensor& t = inputs[k];
    if (t.rank() > kiln_rt::kMaxRank) {
      user_error("input '{}': rank {} is above the supported {}", inputs_[k].onnx_name, t.rank(),
                 kiln_rt::kMaxRank);
    }
    in[k].data = const_cast<void*>(t.data());
    in[k].dtype = static_cast<int32_t>(t.dtype());
    in[k].rank = static_cast<int32_t>(t.rank());
    for (int64_t d = 0; d < t.rank(); ++d) in[k].dims[d] = t.dims()[d];
  }
  std::vector<kiln_rt::TensorArg> out(outputs_.size());
  char error[1024] = "";
  int status = run_(in.data(), out.data(), constant_ptrs_.data(), state_.get(), profile, error,
                    sizeof(error));
  if (!cuda_tune_report_.empty()) {
    // What this run timed (--autotune max on CUDA), into the autotune cache; the report is
    // consumed so that the next run stores only its own.
    autotune::store_cuda_tune_report(cuda_tune_report_, autotune::AutotuneCache(autotune_cache_));
    std::error_code ec;
    std::filesystem::remove(cuda_tune_report_, ec);
  }
  if (status == 2) throw UserError(error);
  if (status != 0) internal_error("the compiled model failed: {}", error);

  std::vector<graph::Tensor> results;
  for (size_t k = 0; k < out.size(); ++k) {
    std::vector<int64_t> dims(out[k].dims, out[k].dims + out[k].rank);
    auto dtype = static_cast<graph::DType>(out[k].dtype);
    int64_t numel = 1;
    for (int64_t d : dims) numel *= d;
    // Outputs come from the library's malloc-based workspace, the process's one heap: freeing
    // them needs no call into the library, which may be unloaded before they are.
    auto owner = std::shared_ptr<void>(out[k].data, std::free);
    results.emplace_back(dtype, std::move(dims), owner, out[k].data,
                         static_cast<size_t>(numel * graph::dtype_size(dtype)));
  }
  return results;
}

std::vector<graph::IoValue> CompiledModel::run_values(
    const std::vector<graph::IoValue>& inputs) const {
  if (inputs.size() != input_values_.size()) {
    user_error("the model takes {} inputs, {} were given", input_values_.size(), inputs.size());
  }
  std::vector<graph::Tensor> flat;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const ir::BoundaryValue& b = input_values_[k];
    const graph::IoValue& v = inputs[k];
    if (v.kind != b.kind || v.optional != b.optional) {
      user_error("input '{}': expected a {}{}, got {}", b.onnx_name, b.optional ? "optional " : "",
                 b.kind == graph::ValueKind::kSequence ? "sequence" : "tensor", v.str());
    }
    if (v.present != b.present) {
      user_error(
          "input '{}': the model was compiled for an optional that is {}; got one that is "
          "{}: compile again with this value",
          b.onnx_name, b.present ? "present" : "empty", v.present ? "present" : "empty");
    }
    if (v.present && v.tensors.size() != b.count) {
      user_error(
          "input '{}': the model was compiled for a sequence of {} tensors; got {}: "
          "compile again with this value",
          b.onnx_name, b.count, v.tensors.size());
    }
    if (v.present) flat.insert(flat.end(), v.tensors.begin(), v.tensors.end());
  }
  std::vector<graph::Tensor> results = run(flat);
  std::vector<graph::IoValue> values;
  for (const ir::BoundaryValue& b : output_values_) {
    graph::IoValue v;
    v.kind = b.kind;
    v.optional = b.optional;
    v.present = b.present;
    v.tensors.assign(results.begin() + static_cast<std::ptrdiff_t>(b.first),
                     results.begin() + static_cast<std::ptrdiff_t>(b.first + b.count));
    values.push_back(std::move(v));
  }
  return values;
}

}  // namespace kiln::driver

namespace kiln::driver {

std::pair<int64_t, int64_t> CompiledModel::cuda_graph_segments() const {
  int64_t captured = 0, launched = 0;
  if (library_->has_symbol("kiln_cuda_graph_stats")) {
    library_->symbol<void(void*, int64_t*, int64_t*)>("kiln_cuda_graph_stats")(
        state_.get(), &captured, &launched);
  }
  return {captured, launched};
}

}  // namespace kiln::driver
