// `kiln bench MODEL`: load the model (compile it, or find it in the code cache), then warm-up runs
// and timed runs on seeded random inputs; prints latency percentiles and throughput as text or as
// one JSON object. With --against, a second model alternates with the first, round by round, and
// the report adds its latency and the per-round ratios of the two.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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
  std::string against;  // a second model, timed in alternation with the first
  bool json = false;
};

/// The smallest pause before each run when two models alternate: each library's pool threads
/// spin up to a fraction of a millisecond after a run (kiln_rt_pool.h), and must be asleep
/// before the other library's threads take the cores.
constexpr double kAlternatingPauseMs = 1.0;

/// Times `run_a` and `run_b` in alternation: `warmup` untimed rounds, then `iters` timed ones,
/// each running both, A first in even rounds and B first in odd ones, after a pause of
/// `pause_ms`. The machine's slow and fast phases (frequency, neighbours) then fall on both
/// alike, which back-to-back benchmarks of one model and then the other do not give.
template <typename RunA, typename RunB>
std::pair<std::vector<double>, std::vector<double>> time_alternating(int warmup, int iters,
                                                                     RunA&& run_a, RunB&& run_b,
                                                                     double pause_ms) {
  // One run after the pause, timed as kiln bench times each run (kiln.h's time_runs).
  auto timed = [&](auto& run) { return kiln::time_runs(0, 1, run, pause_ms).front(); };
  std::vector<double> a, b;
  for (int i = 0; i < warmup + iters; ++i) {
    double ta = 0, tb = 0;
    if (i % 2 == 0) {
      ta = timed(run_a);
      tb = timed(run_b);
    } else {
      tb = timed(run_b);
      ta = timed(run_a);
    }
    if (i < warmup) continue;
    a.push_back(ta);
    b.push_back(tb);
  }
  return {a, b};
}

/// The q-quantile (0..1) of `values` by nearest rank.
double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

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
  const BenchLoadOptions load_options{
      .cache_dir = args.cache_dir, .threads = args.threads, .inputs = args.inputs};
  BenchModel model = load_bench_model(args.model, load_options);
  std::optional<BenchModel> against;
  if (!args.against.empty()) {
    if (!args.profile.empty()) user_error("--profile profiles one model: drop it or --against");
    against = load_bench_model(args.against, load_options);
    // The same inputs feed both: the same names, in the same order, of the same dtypes.
    auto signature = [](const BenchModel& m) {
      std::vector<std::string> items;
      for (const BenchInput& input : m.inputs)
        items.push_back(input.name + " " + shape_text(input));
      return fmt::format("{}", fmt::join(items, ", "));
    };
    bool same = model.inputs.size() == against->inputs.size();
    for (size_t k = 0; same && k < model.inputs.size(); ++k) {
      same = model.inputs[k].name == against->inputs[k].name &&
             model.inputs[k].dtype == against->inputs[k].dtype;
    }
    if (!same) {
      user_error("--against {}: its inputs ({}) are not those of {} ({})", args.against,
                 signature(*against), args.model, signature(model));
    }
  }

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
  std::vector<double> ms, against_ms;
  if (against) {
    std::tie(ms, against_ms) = time_alternating(
        args.warmup, args.iters, [&] { return model.run(inputs); },
        [&] { return against->run(inputs); }, std::max(args.wait_ms, kAlternatingPauseMs));
  } else {
    ms = time_runs(
        args.warmup, args.iters, [&] { return model.run(inputs); }, args.wait_ms);
  }
  // Nearest-rank percentiles, as kiln::bench (include/kiln/kiln.h) computes them for the C++ and
  // Python APIs.
  const kiln::BenchResult latency = kiln::bench_figures(ms, args.warmup);
  // With --against: the other model's figures, and each round's ratio (its time over this one's).
  kiln::BenchResult against_latency;
  std::vector<double> ratios;
  if (against) {
    against_latency = kiln::bench_figures(against_ms, args.warmup);
    for (size_t i = 0; i < ms.size(); ++i) ratios.push_back(against_ms[i] / ms[i]);
  }
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
    if (against) {
      j["against"] = {{"model", args.against},
                      {"pause_ms", std::max(args.wait_ms, kAlternatingPauseMs)},
                      {"min_ms", against_latency.min_ms},
                      {"p50_ms", against_latency.p50_ms},
                      {"p90_ms", against_latency.p90_ms},
                      {"p99_ms", against_latency.p99_ms},
                      {"mean_ms", against_latency.mean_ms},
                      {"ratio_p25", quantile(ratios, 0.25)},
                      {"ratio_p50", quantile(ratios, 0.5)},
                      {"ratio_p75", quantile(ratios, 0.75)}};
    }
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("kiln bench {}: {} OpenMP threads\n", args.model, threads);
  // "loaded: ..." for a library, "compiled: ..." for an ONNX model.
  auto origin = [](const std::string& path, const BenchModel& m) {
    if (path.ends_with(".so"))
      return fmt::format("loaded: {} ({:.2f} s)", m.summary, m.compile_seconds);
    return fmt::format("compiled: {}, {} ({:.2f} s)", m.summary,
                       m.cache_hit ? "from the code cache" : "built", m.compile_seconds);
  };
  fmt::print("{}\n", origin(args.model, model));
  for (size_t k = 0; k < inputs.size(); ++k) {
    fmt::print("input {}: {} {} {}\n", model.inputs[k].name,
               model.given.tensors.count(model.inputs[k].name) ? "given" : "seeded random",
               graph::dtype_name(inputs[k].dtype()), dims_text(inputs[k].dims()));
  }
  auto latency_line = [](const kiln::BenchResult& l) {
    return fmt::format("min {:.3f} ms, p50 {:.3f} ms, p90 {:.3f} ms, p99 {:.3f} ms, mean {:.3f} ms",
                       l.min_ms, l.p50_ms, l.p90_ms, l.p99_ms, l.mean_ms);
  };
  if (against) {
    fmt::print("against {}: {}\n", args.against, origin(args.against, *against));
    fmt::print(
        "{} warm-up rounds, {} timed rounds, each running both models (in turn first), each run "
        "after a {} ms pause\n",
        args.warmup, args.iters, std::max(args.wait_ms, kAlternatingPauseMs));
    fmt::print("latency: {}\n", latency_line(latency));
    fmt::print("against: {}\n", latency_line(against_latency));
    fmt::print(
        "against / model, per round: median {:.3f} (quartiles {:.3f} - {:.3f}); ratio of p50s "
        "{:.3f}\n",
        quantile(ratios, 0.5), quantile(ratios, 0.25), quantile(ratios, 0.75),
        against_latency.p50_ms / latency.p50_ms);
    return 0;
  }
  fmt::print("{} warm-up runs, {} timed runs", args.warmup, args.iters);
  if (args.wait_ms > 0) fmt::print(", each after a {} ms wait", args.wait_ms);
  fmt::print("\n");
  fmt::print("latency: {}\n", latency_line(latency));
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
  cmd->add_option("--against", args->against,
                  "a second model (ONNX or library) with the same inputs, timed in alternation "
                  "with the first in one process: prints both models' latency and the median "
                  "of each round's ratio (its time over the first's), which the machine's slow "
                  "and fast phases affect far less than two separate benchmarks");
  cmd->add_flag("--json", args->json, "print one JSON object instead of text");
  cmd->callback([args, &chosen] { chosen = [args] { return bench_model(*args); }; });
}

}  // namespace kiln::cli
