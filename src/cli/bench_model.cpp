#include "cli/bench_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/model_inputs.h"
#include "driver/compile.h"
#include "kiln/runtime.h"
#include "onnx/importer.h"
#include "runtime/kiln_rt_profile.h"
#include "support/error.h"

namespace kiln::cli {
namespace {

BenchModel load_onnx_model(const std::string& path, const BenchLoadOptions& options) {
  graph::Model model = onnx::import_model(path);
  driver::CompileOptions compile_options;
  compile_options.cache_dir = options.cache_dir;
  GivenInputs given = read_given_inputs(options.inputs, declared_inputs(model), "--input");
  given.specialize(compile_options.lowering);
  auto compiled = std::make_shared<driver::CompiledModel>(driver::compile(model, compile_options));
  BenchModel bench;
  bench.given = std::move(given);
  for (const ir::InputSpec& spec : compiled->inputs()) {
    bench.inputs.push_back(
        {spec.onnx_name, spec.dtype, spec.shape, indexed_axis_size(*compiled, spec)});
  }
  for (const ir::OutputSpec& spec : compiled->outputs())
    bench.output_names.push_back(spec.onnx_name);
  bench.run = [compiled](const std::vector<graph::Tensor>& inputs) {
    return compiled->run(inputs);
  };
  bench.profiled_run = [compiled](const std::vector<graph::Tensor>& inputs) {
    kiln_rt::Profile profile;
    profile.origin = std::chrono::steady_clock::now();
    compiled->run(inputs, &profile);
    std::vector<TraceEvent> events;
    for (const kiln_rt::ProfileEvent& e : profile.events) {
      events.push_back({e.name, e.kind, e.start_ns / 1e3, e.duration_ns / 1e3, 0});
    }
    return events;
  };
  const driver::CompileStats& stats = compiled->stats();
  bench.compile_seconds = stats.seconds;
  bench.cache_hit = stats.cache_hit;
  bench.summary = fmt::format("{} kernels, {} library calls", stats.kernels, stats.extern_calls);
  return bench;
}

/// Throws the status as a UserError naming the library (and frees it).
void check(kiln_status* status, const std::string& path) {
  if (status == nullptr) return;
  std::string message = kiln_status_message(status);
  kiln_status_free(status);
  user_error("{}", message.find(path) == std::string::npos ? path + ": " + message : message);
}

/// A library from `kiln compile -o model.so`, through the C API alone.
BenchModel load_library_model(const std::string& path, const BenchLoadOptions& options) {
  auto start = std::chrono::steady_clock::now();
  kiln_options o = kiln_default_options();
  o.threads = options.threads;
  kiln_model* raw = nullptr;
  check(kiln_model_load(path.c_str(), &o, &raw), path);
  std::shared_ptr<kiln_model> model(raw, kiln_model_free);
  BenchModel bench;
  for (size_t k = 0; k < kiln_model_input_count(raw); ++k) {
    kiln_value_info info;
    check(kiln_model_input_info(raw, k, &info), path);
    BenchInput input{info.name, static_cast<graph::DType>(info.dtype), {}, std::nullopt};
    for (int32_t d = 0; d < info.rank; ++d) {
      input.shape.push_back(info.dims[d] >= 0 ? sym::Expr(info.dims[d])
                                              : sym::Expr::symbol(info.dim_names[d]));
    }
    bench.inputs.push_back(std::move(input));
  }
  std::vector<DeclaredInput> declared;
  for (const BenchInput& input : bench.inputs)
    declared.push_back({input.name, graph::Type::tensor(input.dtype, input.shape)});
  bench.given = read_given_inputs(options.inputs, declared, "--input");
  const size_t outputs = kiln_model_output_count(raw);
  for (size_t k = 0; k < outputs; ++k) {
    kiln_value_info info;
    check(kiln_model_output_info(raw, k, &info), path);
    bench.output_names.push_back(info.name);
  }
  bench.run = [model, path, outputs](const std::vector<graph::Tensor>& inputs) {
    std::vector<kiln_tensor> in(inputs.size()), out(outputs);
    for (size_t k = 0; k < inputs.size(); ++k) {
      in[k] = kiln_tensor{};
      in[k].data = const_cast<void*>(inputs[k].data());
      in[k].dtype = static_cast<int32_t>(inputs[k].dtype());
      in[k].rank = static_cast<int32_t>(inputs[k].rank());
      std::copy(inputs[k].dims().begin(), inputs[k].dims().end(), in[k].dims);
    }
    for (kiln_tensor& t : out) t = kiln_tensor{};
    check(kiln_model_run(model.get(), in.data(), in.size(), out.data(), out.size()), path);
    std::vector<graph::Tensor> results;
    for (const kiln_tensor& t : out) {
      auto dtype = static_cast<graph::DType>(t.dtype);
      std::vector<int64_t> dims(t.dims, t.dims + t.rank);
      size_t bytes = graph::dtype_size(dtype);
      for (int64_t d : dims) bytes *= static_cast<size_t>(d);
      results.emplace_back(dtype, std::move(dims), std::shared_ptr<void>(t.data, kiln_free), t.data,
                           bytes);
    }
    return results;
  };
  bench.profiled_run = [model, run = bench.run](const std::vector<graph::Tensor>& inputs) {
    kiln_model_clear_profile(model.get());
    kiln_status_free(kiln_model_set_profiling(model.get(), 1));
    run(inputs);
    kiln_status_free(kiln_model_set_profiling(model.get(), 0));
    const kiln_profile_event* events = nullptr;
    const size_t count = kiln_model_profile_events(model.get(), &events);
    std::vector<TraceEvent> trace;
    for (size_t k = 0; k < count; ++k) {
      trace.push_back({events[k].name, events[k].kind, events[k].start_ns / 1e3,
                       events[k].duration_ns / 1e3, events[k].thread});
    }
    return trace;
  };
  bench.compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bench.cache_hit = true;
  bench.summary = fmt::format("the library {} (target {}, variant {})", path,
                              kiln_model_target(raw), kiln_model_variant(raw));
  return bench;
}

}  // namespace

BenchModel load_bench_model(const std::string& path, const BenchLoadOptions& options) {
  if (path.ends_with(".so")) return load_library_model(path, options);
  return load_onnx_model(path, options);
}

}  // namespace kiln::cli
