// `kiln run MODEL --input NAME=FILE ...`: compile (or hit the code cache), run once (or, with
// --repeat N, a warm-up run and N timed runs), write and summarize the outputs.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "autotune/select.h"
#include "cli/bench_model.h"
#include "cli/commands.h"
#include "cli/model_inputs.h"
#include "driver/compile.h"
#include "onnx/importer.h"
#include "onnx/tensor_file.h"
#include "support/error.h"
#include "support/files.h"
#include "support/identifier.h"

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
  std::string autotune;
  uint64_t seed = 0;
  int repeat = 0;  // timed runs after a warm-up; 0: run once
  bool print_kernels = false;
  std::string device = "cpu";
  std::string precision = "tf32";
};

/// A temporary directory removed when this goes out of scope (for --print-kernels without
/// --dump).
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "kiln-run-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) user_error("cannot create a temporary directory");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// Lists the generated kernels from the dumped wrapper (5_wrapper.cpp): it declares each
/// distinct kernel function once, `extern "C" void NAME(...);`, and opens each library call
/// with a comment `{  // KIND from NODE`.
/// A CUDA wrapper defines a launch function per kernel instead, `static void launch_NAME(...) {`,
/// and calls it: its kernels run on the GPU, its library calls on the host (the host-fallback
/// list), each with a line `// on the host: REASON` that is printed with it.
void print_kernels(const fs::path& dump_dir, ir::Device device) {
  fs::path wrapper = dump_dir / "5_wrapper.cpp";
  std::error_code ec;
  if (!fs::exists(wrapper, ec)) {
    fmt::print("kernels: no {} to read the names from\n", wrapper.string());
    return;
  }
  std::istringstream text(files::read(wrapper));
  const bool cuda = device == ir::Device::kCuda;
  const std::string declaration = cuda ? "static void launch_" : "extern \"C\" void ";
  const std::string call_prefix = cuda ? "launch_" : "";
  std::vector<std::string> names;
  std::map<std::string, int> calls;  // call sites per kernel
  std::map<std::string, int> library_calls;
  std::map<std::string, std::string> host_reasons;  // kind -> why it runs on the host
  std::map<std::string, int> gpu_calls;             // kinds of library calls on the GPU
  std::vector<std::string> forks;
  std::string last_kind;
  for (std::string line; std::getline(text, line);) {
    if (line.rfind(declaration, 0) == 0 && line.ends_with(cuda ? ") {" : ");")) {
      size_t open = line.find('(', declaration.size());
      names.push_back(line.substr(declaration.size(), open - declaration.size()));
      continue;
    }
    size_t first = line.find_first_not_of(' ');
    if (first == std::string::npos) continue;
    std::string_view rest = std::string_view(line).substr(first);
    if (rest.starts_with("{  // ")) {
      rest.remove_prefix(6);
      last_kind = std::string(rest.substr(0, rest.find(' ')));
      library_calls[last_kind]++;
      continue;
    }
    // The comments cuda_matmul.cpp and cuda_conv.cpp write: calls on the GPU.
    for (const char* library : {"cuBLASLt", "cuDNN"}) {
      if (cuda && rest.starts_with(std::string("// ") + library)) {
        library_calls[last_kind]--;
        gpu_calls[last_kind + " (" + library + ")"]++;
      }
    }
    // The CUDA wrapper's forks (codegen/wrapper/stream_plan.h): calls on the side stream.
    if (cuda && rest.starts_with("// fork ")) {
      forks.emplace_back(rest.substr(3));
      continue;
    }
    if (cuda && rest.starts_with("// on the host: ")) {
      host_reasons[last_kind] = std::string(rest.substr(16));
      continue;
    }
    for (const std::string& name : names) {
      const std::string called = call_prefix + name;
      if (rest.starts_with(called) && rest.size() > called.size() && rest[called.size()] == '(') {
        calls[name]++;
      }
    }
  }
  fmt::print("kernels ({}{}):\n", names.size(), cuda ? ", on the GPU" : "");
  for (const std::string& name : names) {
    int n = calls[name];
    fmt::print("  {}{}\n", name, n > 1 ? fmt::format(" (called {} times)", n) : "");
  }
  std::vector<std::string> library;
  for (const auto& [kind, n] : library_calls) {
    if (n > 0) library.push_back(fmt::format("{} {}", n, kind));
  }
  if (!cuda) {
    if (!library.empty()) fmt::print("library calls: {}\n", fmt::join(library, ", "));
    return;
  }
  std::vector<std::string> on_gpu;
  for (const auto& [kind, n] : gpu_calls) on_gpu.push_back(fmt::format("{} {}", n, kind));
  if (!on_gpu.empty()) fmt::print("library calls on the GPU: {}\n", fmt::join(on_gpu, ", "));
  if (!forks.empty()) {
    fmt::print("side stream ({} forks; KILN_CUDA_STREAMS=1 runs them on one stream):\n",
               forks.size());
    for (const std::string& fork : forks) fmt::print("  {}\n", fork);
  }
  if (library.empty()) return;
  fmt::print("library calls (on the host, with copies from and to the GPU):\n");
  for (const auto& [kind, n] : library_calls) {
    if (n == 0) continue;
    auto reason = host_reasons.find(kind);
    fmt::print("  {} {}{}\n", n, kind,
               reason == host_reasons.end() ? "" : fmt::format(" ({})", reason->second));
  }
}

ir::Device parse_device(const std::string& name) {
  std::optional<ir::Device> device = ir::device_from_name(name);
  if (!device) user_error("--device {}: expected cpu or cuda", name);
  return *device;
}

/// Runs a model once (or, with --repeat, a warm-up run and N timed runs) on the given inputs and
/// seeded random ones for the others, prints the timings and `notes`, and writes the outputs.
int run_and_write(
    const RunArgs& args, const std::vector<BenchInput>& specs,
    std::map<std::string, std::shared_ptr<const graph::Tensor>>& given,
    const std::function<std::vector<graph::Tensor>(const std::vector<graph::Tensor>&)>& run,
    const std::vector<std::string>& output_names, int threads,
    const std::vector<std::string>& notes) {
  sym::Binding binding;
  for (const std::string& item : args.dims) {
    auto [name, value] = split_assignment(item, "--dim");
    binding[name] = std::stoll(value);
  }
  std::vector<graph::Tensor> inputs;
  for (const BenchInput& spec : specs) {
    auto it = given.find(spec.name);
    if (it != given.end()) {
      inputs.push_back(*it->second);
      given.erase(it);
      continue;
    }
    std::vector<int64_t> dims = concrete_dims(spec.shape, binding);
    std::mt19937_64 rng(args.seed + inputs.size());
    inputs.push_back(random_tensor(spec.dtype, dims,
                                   random_integer_bound(spec.indexed_axis_size, binding), rng));
    fmt::print("input {}: not given, using seeded random {} {}\n", spec.name,
               graph::dtype_name(spec.dtype), dims_text(dims));
  }

  // Each timed run starts with the previous outputs released, so only the run is timed.
  auto timed_run = [&](std::vector<graph::Tensor>& outputs) {
    outputs.clear();
    auto start = std::chrono::steady_clock::now();
    outputs = run(inputs);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  std::vector<graph::Tensor> outputs;
  double first_ms = timed_run(outputs);
  if (args.repeat == 0) {
    fmt::print("ran in {:.3f} ms\n", first_ms);
  } else {
    std::vector<double> ms(static_cast<size_t>(args.repeat));
    for (double& t : ms) t = timed_run(outputs);
    std::sort(ms.begin(), ms.end());
    size_t n = ms.size();
    double median = n % 2 == 1 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    fmt::print(
        "first run (warm-up) {:.3f} ms; {} timed runs: min {:.3f} ms, median {:.3f} ms ({} "
        "OpenMP threads)\n",
        first_ms, n, ms.front(), median, threads);
  }
  for (const std::string& note : notes) fmt::print("{}\n", note);
  for (size_t k = 0; k < outputs.size(); ++k) {
    const std::string& name = output_names.at(k);
    // numpy has no bfloat16, float8, float4 or 4- and 2-bit types: those go to a TensorProto.
    graph::DType dtype = outputs[k].dtype();
    bool numpy_lacks = dtype == graph::DType::kBFloat16 || graph::is_small_float(dtype) ||
                       graph::is_small_integer(dtype);
    fs::path path = fs::path(args.output_dir) / (file_name(name) + (numpy_lacks ? ".pb" : ".npy"));
    onnx::write_tensor_file(outputs[k], path, name);
    fmt::print("output {}: {} -> {}\n", name, onnx::tensor_summary(outputs[k]), path.string());
  }
  return 0;
}

/// `kiln run model.so`: a library built by `kiln compile`, loaded through its C API (its
/// weights mapped, embedded or beside it) and run as run_model runs an ONNX model.
int run_library(const RunArgs& args) {
  // What only a compile uses has no meaning for a library already built.
  for (auto [given, option] : {std::pair{!args.dump_dir.empty(), "--dump"},
                               {!args.autotune.empty(), "--autotune"},
                               {args.print_kernels, "--print-kernels"},
                               {args.device != "cpu", "--device"}}) {
    if (given) {
      user_error("{}: {} applies to compiling an ONNX model; {} is a compiled library", args.model,
                 option, args.model);
    }
  }
  BenchLoadOptions options;
  options.cache_dir = args.cache_dir;
  options.inputs = args.inputs;
  BenchModel model = load_bench_model(args.model, options);
  fmt::print("loaded {} ({:.2f} s)\n", model.summary, model.compile_seconds);
  return run_and_write(args, model.inputs, model.given.tensors, model.run, model.output_names,
                       omp_get_max_threads(), {});
}

int run_model(const RunArgs& args) {
  if (args.model.ends_with(".so")) return run_library(args);
  graph::Model model = onnx::import_model(args.model);
  driver::CompileOptions options;
  options.dump_dir = args.dump_dir;
  std::unique_ptr<TempDir> temp_dump;
  if (args.print_kernels && options.dump_dir.empty()) {
    temp_dump = std::make_unique<TempDir>();
    options.dump_dir = temp_dump->path();
  }
  options.cache_dir = args.cache_dir;
  options.device = parse_device(args.device);
  std::optional<ir::Precision> precision = ir::precision_from_name(args.precision);
  if (!precision) user_error("--precision {}: expected fp32, tf32, fp16 or bf16", args.precision);
  options.precision = *precision;
  if (!args.autotune.empty())
    options.autotune = autotune::parse_autotune_mode(args.autotune, "--autotune");
  // Given inputs are read before compiling: the compile specializes on them (see
  // GivenInputs::specialize). A sequence's tensors are given by flat name ("x[0]", "x[1]", ...).
  GivenInputs given_inputs = read_given_inputs(args.inputs, declared_inputs(model), "--input");
  given_inputs.specialize(options.lowering);
  std::map<std::string, std::shared_ptr<const graph::Tensor>>& given = given_inputs.tensors;
  driver::CompiledModel compiled = driver::compile(model, options);
  const driver::CompileStats& stats = compiled.stats();
  fmt::print("compiled {}: {} kernels, {} library calls, {} ({:.2f} s)\n", args.model,
             stats.kernels, stats.extern_calls, stats.cache_hit ? "from the code cache" : "built",
             stats.seconds);
  if (args.print_kernels) print_kernels(options.dump_dir, options.device);
  temp_dump.reset();

  std::vector<BenchInput> specs;
  for (const ir::InputSpec& spec : compiled.inputs()) {
    specs.push_back({spec.onnx_name, spec.dtype, spec.shape, indexed_axis_size(compiled, spec)});
  }
  std::vector<std::string> output_names;
  for (const ir::OutputSpec& spec : compiled.outputs()) output_names.push_back(spec.onnx_name);
  std::vector<std::string> notes;
  for (const ir::BoundaryValue& b : compiled.output_values()) {
    if (!b.present) notes.push_back(fmt::format("output {}: an empty optional", b.onnx_name));
  }
  return run_and_write(
      args, specs, given,
      [&](const std::vector<graph::Tensor>& inputs) { return compiled.run(inputs); }, output_names,
      stats.threads, notes);
}

}  // namespace

void add_run_command(CLI::App& app, CommandAction& chosen) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* cmd =
      app.add_subcommand("run",
                         "Compile a model (or find it in the code cache), or load a library "
                         "built by kiln compile, and run it");
  cmd->add_option("model", args->model,
                  "the ONNX model, or a library built by kiln compile (model.so)")
      ->required();
  cmd->add_option("--input", args->inputs, "NAME=FILE (.npy or .pb); inputs not given are random");
  cmd->add_option("--dim", args->dims, "SYMBOL=VALUE for the shapes of random inputs (default 1)");
  cmd->add_option("--output-dir", args->output_dir,
                  "where outputs are written as .npy (as .pb for the types numpy lacks)");
  cmd->add_option("--dump", args->dump_dir,
                  "write the IR, schedule, fusion decisions, memory plan and sources here");
  cmd->add_option("--cache-dir", args->cache_dir,
                  "the code cache (default: KILN_CACHE_DIR or ~/.cache/kiln)");
  cmd->add_option("--seed", args->seed, "seed of random inputs");
  cmd->add_option("--autotune", args->autotune,
                  "GEMM algorithm selection: off (heuristic), default (heuristic plus the "
                  "autotune cache), max (benchmark every choice not in the cache); default: "
                  "KILN_AUTOTUNE, else default");
  cmd->add_option("--repeat", args->repeat,
                  "after a warm-up run, run N more times and print the min and median latency")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--device", args->device,
                  "where the kernels run: cpu (default) or cuda (matrix products on cuBLASLt, "
                  "the other library calls on the host)");
  cmd->add_option("--precision", args->precision,
                  "matrix products on the GPU: tf32 (default: inputs rounded to TF32 on the "
                  "tensor cores, about 1e-3 relative error) or fp32 (about 1e-6); the CPU "
                  "computes float32 either way; fp16 and bf16 (cuda only) store activations and "
                  "weights in that type, with float32 accumulation and statistics");
  cmd->add_flag("--print-kernels", args->print_kernels,
                "list the generated kernels (read from the dumped wrapper) and library calls");
  cmd->callback([args, &chosen] { chosen = [args] { return run_model(*args); }; });
}

}  // namespace kiln::cli
