#include "cli/bench_model.h"

#include <fmt/format.h>

#include <memory>

#include "cli/model_inputs.h"
#include "driver/compile.h"
#include "onnx/importer.h"
#include "support/error.h"

namespace kiln::cli {
namespace {

BenchModel load_onnx_model(const std::string& path, const BenchLoadOptions& options) {
  graph::Model model = onnx::import_model(path);
  driver::CompileOptions compile_options;
  compile_options.cache_dir = options.cache_dir;
  auto compiled = std::make_shared<driver::CompiledModel>(driver::compile(model, compile_options));
  BenchModel bench;
  for (const ir::InputSpec& spec : compiled->inputs()) {
    bench.inputs.push_back(
        {spec.onnx_name, spec.dtype, spec.shape, indexed_axis_size(*compiled, spec)});
  }
  bench.run = [compiled](const std::vector<graph::Tensor>& inputs) {
    return compiled->run(inputs);
  };
  const driver::CompileStats& stats = compiled->stats();
  bench.compile_seconds = stats.seconds;
  bench.cache_hit = stats.cache_hit;
  bench.summary = fmt::format("{} kernels, {} library calls", stats.kernels, stats.extern_calls);
  return bench;
}

/// A library from `kiln compile -o model.so` (include/kiln/runtime.h); not loadable yet.
BenchModel load_library_model(const std::string& path, const BenchLoadOptions&) {
  user_error("kiln bench: loading a compiled .so is not supported by this build: {}", path);
}

}  // namespace

BenchModel load_bench_model(const std::string& path, const BenchLoadOptions& options) {
  if (path.ends_with(".so")) return load_library_model(path, options);
  return load_onnx_model(path, options);
}

}  // namespace kiln::cli
