// `kiln bench MODEL`: load the model (compile it, or find it in the code cache), then warm-up runs
// and timed runs on seeded random inputs; prints latency percentiles and throughput as text or as
// one JSON object.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/bench_model.h"
#include "cli/commands.h"
#include "cli/model_inputs.h"
#include "kiln/kiln.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::cli {
namespace {

struct BenchArgs {
  std::string model;
  int threads = 0;  // 0: OpenMP's default (OMP_NUM_THREADS, else the hardware threads)
  int iters = 100;
  int warmup = 10;
  double wait_ms = 0;  // untimed sleep before each run (a server's gap between requests)
  std::vector<std::string> shapes;  // NAME=DIMS
  std::vector<std::string> inputs;  // NAME=FILE
  std::string cache_dir;
  std::string profile;  // Chrome trace of one run
  bool json = false;
};

/// Writes `events` as a Chrome trace (Trace Event Format: one complete event per kernel or
/// library call, microseconds), loadable in chrome://tracing or Perfetto.
void write_trace(const std::string& path, const std::string& model,
                 const std::vector<TraceEvent>& events) {
  nlohmann::ordered_json trace_events = nlohmann::ordered_json::array();
  for (const TraceEvent& e : events) {
    trace_events.push_back({{"name", e.name},
                            {"cat", e.kind},
                            {"ph", "X"},
                            {"ts", e.start_us},
                            {"dur", e.duration_us},
                            {"pid", 1},
                            {"tid", e.thread}});
  }
  nlohmann::ordered_json trace{
      {"traceEvents", trace_events}, {"displayTimeUnit", "ms"}, {"otherData", {{"model", model}}}};
  files::write_atomic(path, trace.dump(1) + "\n");
}

std::string shape_text(const BenchInput& input) {
  std::vector<std::string> dims;
  for (const sym::Expr& d : input.shape) dims.push_back(d.str());
  return fmt::format("{}[{}]", graph::dtype_name(input.dtype), fmt::join(dims, ", "));
}

/// "8x3x224x224" -> {8, 3, 224, 224}; "" is a scalar.
std::vector<int64_t> parse_dims(const std::string& item, const std::string& text) {
  std::vector<int64_t> dims;
  if (text.empty()) return dims;
  size_t start = 0;
  while (true) {
    size_t end = text.find('x', start);
    std::string part = text.substr(start, end == std::string::npos ? end : end - start);
    size_t used = 0;
    int64_t value = -1;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || value < 0 || part[0] == '+' || part[0] == '-')
      user_error("--shape {}: '{}' is not a dim (expected dims like 8x3x224x224)", item, part);
    dims.push_back(value);
    if (end == std::string::npos) return dims;
    start = end + 1;
  }
}

/// An input's dims as the command line fixes them: by --shape, or by the tensor an --input file
/// holds. `item` is the argument, for errors.
struct FixedShape {
  const BenchInput* input = nullptr;
  std::vector<int64_t> dims;
  std::string item;
};

/// The shapes --shape and --input fix, by input name; checks that each names an input of the
/// model, with its rank, once.
std::map<std::string, FixedShape> fixed_shapes(const std::vector<BenchInput>& inputs,
                                               const std::vector<std::string>& shapes,
                                               const GivenInputs& given) {
  std::map<std::string, FixedShape> fixed;
  auto find_input = [&](const std::string& item, const std::string& name) {
    auto input = std::find_if(inputs.begin(), inputs.end(),
                              [&](const BenchInput& in) { return in.name == name; });
    if (input == inputs.end()) {
      std::vector<std::string> names;
      for (const BenchInput& in : inputs) names.push_back(in.name);
      user_error("{}: the model has no input '{}' (its inputs: {})", item, name,
                 fmt::join(names, ", "));
    }
    return &*input;
  };
  for (const auto& [name, tensor] : given.tensors) {
    const BenchInput* input = find_input("--input " + name, name);
    std::string item = fmt::format("--input {} ({})", name, dims_text(tensor->dims()));
    if (static_cast<size_t>(tensor->rank()) != input->shape.size()) {
      user_error("{}: input '{}' is {} of rank {}, the file holds rank {}", item, name,
                 shape_text(*input), input->shape.size(), tensor->rank());
    }
    fixed.emplace(name, FixedShape{input, tensor->dims(), item});
  }
  for (const std::string& item : shapes) {
    auto [name, text] = split_assignment(item, "--shape");
    const BenchInput* input = find_input("--shape " + item, name);
    std::vector<int64_t> dims = parse_dims(item, text);
    if (dims.size() != input->shape.size()) {
      user_error("--shape {}: input '{}' is {} of rank {}, got {} dims", item, name,
                 shape_text(*input), input->shape.size(), dims.size());
    }
    auto [it, added] = fixed.try_emplace(name, FixedShape{input, dims, "--shape " + item});
    if (!added && it->second.item.starts_with("--input"))
      user_error("--shape {}: input '{}' is given by {}", item, name, it->second.item);
    if (!added) user_error("--shape {}: input '{}' is given a shape twice", item, name);
  }
  return fixed;
}

/// Binds the size symbols of the inputs from the shapes --shape and --input fix, and checks that
/// each is a shape the input can take. Symbols none binds stay unbound (1 later).
sym::Binding bind_shapes(const std::map<std::string, FixedShape>& fixed) {
  // Plain symbols first, so that a dim such as `2*n` is checked against the bound `n`.
  sym::Binding binding;
  std::map<std::string, std::string> bound_by;  // symbol -> the argument that bound it
  for (const auto& [name, shape] : fixed) {
    for (size_t i = 0; i < shape.dims.size(); ++i) {
      if (!shape.input->shape[i].is_symbol()) continue;
      const std::string& symbol = shape.input->shape[i].name();
      auto [it, added] = binding.try_emplace(symbol, shape.dims[i]);
      if (!added && it->second != shape.dims[i]) {
        user_error("{}: dim '{}' of input '{}' is {} here but {} by {}", shape.item, symbol, name,
                   shape.dims[i], it->second, bound_by[symbol]);
      }
      bound_by.try_emplace(symbol, shape.item);
    }
  }
  for (const auto& [name, shape] : fixed) {
    sym::Binding defaults = binding;
    if (concrete_dims(shape.input->shape, defaults) != shape.dims) {
      user_error("{}: input '{}' is {}, which does not match {}", shape.item, name,
                 shape_text(*shape.input), dims_text(shape.dims));
    }
  }
  return binding;
}

int bench_model(const BenchArgs& args) {
  // Before compiling: the compile reads the thread count (GEMM choices are made for it) and the
  // runs use the same OpenMP pool.
  if (args.threads > 0) omp_set_num_threads(args.threads);
  int threads = omp_get_max_threads();
  BenchModel model = load_bench_model(
      args.model, {.cache_dir = args.cache_dir, .threads = args.threads, .inputs = args.inputs});

  sym::Binding binding = bind_shapes(fixed_shapes(model.inputs, args.shapes, model.given));
  std::vector<graph::Tensor> inputs;
  for (const BenchInput& input : model.inputs) {
    if (auto given = model.given.tensors.find(input.name); given != model.given.tensors.end()) {
      inputs.push_back(*given->second);
      continue;
    }
    std::vector<int64_t> dims = concrete_dims(input.shape, binding);
    std::mt19937_64 rng(inputs.size());
    inputs.push_back(random_tensor(input.dtype, dims,
                                   random_integer_bound(input.indexed_axis_size, binding), rng));
  }
  // The batch, for samples per second: the leading dim of the first input.
  std::optional<int64_t> batch;
  if (!inputs.empty() && inputs[0].rank() > 0) batch = inputs[0].dims()[0];

  // Each run starts with the previous outputs released, so only the run is timed.
  std::vector<double> ms = time_runs(
      args.warmup, args.iters, [&] { return model.run(inputs); }, args.wait_ms);
  // Nearest-rank percentiles, as kiln::bench (include/kiln/kiln.h) computes them for the C++ and
  // Python APIs.
  const kiln::BenchResult latency = kiln::bench_figures(ms, args.warmup);
  const double per_second = latency.throughput_per_s;
  std::string profiled;
  if (!args.profile.empty()) {
    const std::vector<TraceEvent> events = model.profiled_run(inputs);
    write_trace(args.profile, args.model, events);
    const auto calls = std::count_if(events.begin(), events.end(),
                                     [](const TraceEvent& e) { return e.kind == "call"; });
    profiled =
        fmt::format("profile: one run, {} events ({} kernel calls, {} library calls) in {}",
                    events.size(), events.size() - static_cast<size_t>(calls), calls, args.profile);
  }

  if (args.json) {
    nlohmann::ordered_json j{{"model", args.model},
                             {"threads", threads},
                             {"iters", args.iters},
                             {"warmup", args.warmup},
                             {"compile_s", model.compile_seconds},
                             {"cache_hit", model.cache_hit},
                             {"min_ms", latency.min_ms},
                             {"p50_ms", latency.p50_ms},
                             {"p90_ms", latency.p90_ms},
                             {"p99_ms", latency.p99_ms},
                             {"mean_ms", latency.mean_ms},
                             {"throughput_per_s", per_second}};
    j["wait_ms"] = args.wait_ms;
    if (batch) {
      j["batch"] = *batch;
      j["samples_per_s"] = per_second * static_cast<double>(*batch);
    }
    if (!args.profile.empty()) j["profile"] = args.profile;
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("kiln bench {}: {} OpenMP threads\n", args.model, threads);
  if (args.model.ends_with(".so")) {
    fmt::print("loaded: {} ({:.2f} s)\n", model.summary, model.compile_seconds);
  } else {
    fmt::print("compiled: {}, {} ({:.2f} s)\n", model.summary,
               model.cache_hit ? "from the code cache" : "built", model.compile_seconds);
  }
  for (size_t k = 0; k < inputs.size(); ++k) {
    fmt::print("input {}: {} {} {}\n", model.inputs[k].name,
               model.given.tensors.count(model.inputs[k].name) ? "given" : "seeded random",
               graph::dtype_name(inputs[k].dtype()), dims_text(inputs[k].dims()));
  }
  fmt::print("{} warm-up runs, {} timed runs", args.warmup, args.iters);
  if (args.wait_ms > 0) fmt::print(", each after a {} ms wait", args.wait_ms);
  fmt::print("\n");
  fmt::print(
      "latency: min {:.3f} ms, p50 {:.3f} ms, p90 {:.3f} ms, p99 {:.3f} ms, mean {:.3f} ms\n",
      latency.min_ms, latency.p50_ms, latency.p90_ms, latency.p99_ms, latency.mean_ms);
  if (batch) {
    fmt::print(
        "throughput: {:.2f} runs/s, {:.2f} samples/s (batch {}: the leading dim of input "
        "'{}')\n",
        per_second, per_second * static_cast<double>(*batch), *batch, model.inputs[0].name);
  } else {
    fmt::print("throughput: {:.2f} runs/s\n", per_second);
  }
  if (!profiled.empty()) fmt::print("{}\n", profiled);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, CommandAction& chosen) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time a model: warm-up runs, then latency percentiles and throughput");
  cmd->add_option("model", args->model,
                  "the ONNX model, or a library built by kiln compile (model.so)")
      ->required();
  cmd->add_option("--threads", args->threads,
                  "OpenMP threads of the compile and the runs (default: OMP_NUM_THREADS, else "
                  "the hardware threads)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--iters", args->iters, "timed runs (default 100)")
      ->check(CLI::Range(1, 100000000));
  cmd->add_option("--warmup", args->warmup, "untimed runs before them (default 10)")
      ->check(CLI::Range(0, 100000000));
  cmd->add_option("--wait-ms", args->wait_ms,
                  "sleep this long before each run, untimed, as a server waits between "
                  "requests (default 0: runs back to back)")
      ->check(CLI::Range(0.0, 60000.0));
  cmd->add_option("--shape", args->shapes,
                  "NAME=DIMS, an input's shape such as input=8x3x224x224; repeatable; symbolic "
                  "dims not given are 1");
  cmd->add_option("--input", args->inputs,
                  "NAME=FILE (.npy or .pb): an input's value, used in every run (as kiln run "
                  "--input: the compile specializes on small integer inputs); repeatable; inputs "
                  "not given are seeded random");
  cmd->add_option("--cache-dir", args->cache_dir,
                  "the code cache (default: KILN_CACHE_DIR or ~/.cache/kiln)");
  cmd->add_option("--profile", args->profile,
                  "after the timed runs, profile one run and write a Chrome trace (Trace Event "
                  "Format) with one event per kernel or library call to this file");
  cmd->add_flag("--json", args->json, "print one JSON object instead of text");
  cmd->callback([args, &chosen] { chosen = [args] { return bench_model(*args); }; });
}

}  // namespace kiln::cli
