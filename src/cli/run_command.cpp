// `kiln run MODEL --input NAME=FILE ...`: compile (or hit the code cache), run once, write and
// summarize the outputs.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>

#include "cli/commands.h"
#include "driver/compile.h"
#include "onnx/importer.h"
#include "onnx/tensor_file.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

struct RunArgs {
  std::string model;
  std::vector<std::string> inputs;  // NAME=FILE
  std::vector<std::string> dims;    // SYMBOL=VALUE for random inputs
  std::string output_dir = ".";
  std::string dump_dir;
  std::string cache_dir;
  uint64_t seed = 0;
};

std::pair<std::string, std::string> split_assignment(const std::string& text, const char* what) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    user_error("{} '{}' is not of the form NAME=VALUE", what, text);
  return {text.substr(0, eq), text.substr(eq + 1)};
}

/// Seeded random values in the input's valid range: floats in [-1, 1), booleans, integers in
/// [0, 10) or, for index inputs, within the axis they index.
graph::Tensor random_input(graph::DType dtype, std::vector<int64_t> dims, int64_t bound,
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

std::string dims_text(const std::vector<int64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

int run_model(const RunArgs& args) {
  graph::Model model = onnx::import_model(args.model);
  driver::CompileOptions options;
  options.dump_dir = args.dump_dir;
  options.cache_dir = args.cache_dir;
  // Given inputs are read before compiling: small integer ones (shape arguments passed as
  // inputs) are specialized on their values, which the compiled model checks at run time.
  std::map<std::string, std::shared_ptr<const graph::Tensor>> given;
  for (const std::string& item : args.inputs) {
    auto [name, file] = split_assignment(item, "--input");
    given[name] = std::make_shared<graph::Tensor>(onnx::read_tensor_file(file));
  }
  for (const auto& [name, tensor] : given) {
    const auto& inputs = model.graph->inputs();
    bool known = std::any_of(inputs.begin(), inputs.end(),
                             [&](const graph::Value* v) { return v->name() == name; });
    if (known) continue;
    std::string names;
    for (const graph::Value* v : inputs) names += (names.empty() ? "" : ", ") + v->name();
    user_error("--input {}: the model has no input of that name (its inputs: {})", name, names);
  }
  options.lowering.input_values = given;
  driver::CompiledModel compiled = driver::compile(model, options);
  const driver::CompileStats& stats = compiled.stats();
  fmt::print("compiled {}: {} kernels, {} library calls, {} ({:.2f} s)\n", args.model,
             stats.kernels, stats.extern_calls, stats.cache_hit ? "from the code cache" : "built",
             stats.seconds);

  sym::Binding binding;
  for (const std::string& item : args.dims) {
    auto [name, value] = split_assignment(item, "--dim");
    binding[name] = std::stoll(value);
  }
  std::vector<graph::Tensor> inputs;
  for (const ir::InputSpec& spec : compiled.inputs()) {
    auto it = given.find(spec.onnx_name);
    if (it != given.end()) {
      inputs.push_back(*it->second);
      given.erase(it);
      continue;
    }
    std::vector<int64_t> dims;
    for (const sym::Expr& d : spec.shape) {
      for (const sym::Expr& s : sym::free_symbols(d)) binding.try_emplace(s.name(), 1);
      dims.push_back(sym::evaluate(d, binding));
    }
    int64_t bound = 10;
    for (const ir::IndexCheck& check : compiled.index_checks()) {
      if (check.buffer == spec.buffer) bound = sym::evaluate(check.size, binding);
    }
    std::mt19937_64 rng(args.seed + inputs.size());
    inputs.push_back(random_input(spec.dtype, dims, bound, rng));
    fmt::print("input {}: not given, using seeded random {} {}\n", spec.onnx_name,
               graph::dtype_name(spec.dtype), dims_text(dims));
  }

  auto start = std::chrono::steady_clock::now();
  std::vector<graph::Tensor> outputs = compiled.run(inputs);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  fmt::print("ran in {:.3f} ms\n", ms);
  for (size_t k = 0; k < outputs.size(); ++k) {
    const std::string& name = compiled.outputs()[k].onnx_name;
    fs::path path = fs::path(args.output_dir) / (files::safe_file_name(name) + ".npy");
    onnx::write_tensor_file(outputs[k], path, name);
    fmt::print("output {}: {} -> {}\n", name, onnx::tensor_summary(outputs[k]), path.string());
  }
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, CommandAction& chosen) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd =
      app.add_subcommand("run", "Compile a model (or find it in the code cache) and run it once");
  cmd->add_option("model", args->model, "the ONNX model")->required();
  cmd->add_option("--input", args->inputs, "NAME=FILE (.npy or .pb); inputs not given are random");
  cmd->add_option("--dim", args->dims, "SYMBOL=VALUE for the shapes of random inputs (default 1)");
  cmd->add_option("--output-dir", args->output_dir, "where outputs are written as .npy");
  cmd->add_option("--dump", args->dump_dir,
                  "write the IR, schedule, fusion decisions, memory plan and sources here");
  cmd->add_option("--cache-dir", args->cache_dir,
                  "the code cache (default: KILN_CACHE_DIR or ~/.cache/kiln)");
  cmd->add_option("--seed", args->seed, "seed of random inputs");
  cmd->callback([args, &chosen] { chosen = [args] { return run_model(*args); }; });
}

}  // namespace kiln::cli
