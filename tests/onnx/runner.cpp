// The ONNX backend-suite runner: compiles and runs every case of the suite (node/,
// pytorch-converted/, pytorch-operator/, simple/ under DATA_DIR), or those of a list, through the
// same path as `kiln run` (import -> driver::compile -> CompiledModel::run_values) and compares
// with the suite's expected outputs. Compiles run in parallel (--jobs, default: the cores) into
// CACHE_DIR. Prints a table per op, the failures, the wall time, and last the line
// `N passed, M failed, K skipped`. Exit status 1 when any case fails.
//
// With `--node-suite DIR`, the node/ cases are those of DIR/node (the ONNX 1.23 node suite, a
// folder beside the ONNX 1.12 one of DATA_DIR) instead of DATA_DIR/node: every case list, the
// exclusions and the --core list then name the 1.23 cases node/... . When DIR/node is absent the
// runner says so and leaves out every node/ case (the other folders still run).
//
// `--shard K/N` runs every N-th case of the sorted selection, starting at the K-th (1-based), so
// that N processes (ctest tests) share one suite.
//
// With an exclusions file (one case per line, `case  # class: reason`, classes below), the
// excluded cases run too and must still fail: one that passes fails the run, so the list can only
// shrink. They count as skipped.
//   string        string tensors
//   random        values drawn at random that cannot match (Bernoulli, Dropout training with
//                 ratio)
//   gradient      the Gradient op (training)
//   suite-bug     expected outputs that contradict the case's own model (recomputed with the
//                 suite's generator, onnx/backend/test/case/node/*.py; the reason says how)
//   image-decoder the ImageDecoder op (the reason says why)
//
// Tolerances (|actual - expected| <= atol + rtol * |expected|, NaN matches NaN):
//   float32, float64           -> rtol 1e-4, atol 1e-5 for the cases of the --core list (the
//                                 compiler core's own check); rtol 1e-3 (the ONNX backend test's
//                                 own rtol: several suite outputs are written out with 4
//                                 significant digits), atol 1e-5 for the others
//   bfloat16                   -> rtol 1e-2, atol 1e-2
//   float16                    -> rtol 1e-3, atol 1e-3
//   float8, float4e2m1         -> exact: the same code (any NaN matches NaN)
//   integers and bool          -> exact (int4, uint4, int2, uint2 included)
//
// Usage: kiln_onnx_runner DATA_DIR CACHE_DIR [--cases LIST] [--core LIST] [--jobs N]
//                         [--exclusions FILE] [--by-opset yes] [--device cpu|cuda]
//                         [--refusals FILE] [--compile-only yes] [--node-suite DIR] [--shard K/N]
// (--device cuda: matrix products in float32, --precision fp32, as the tolerances below assume)
//
// --refusals FILE: cases the device refuses by name (tests/onnx/cuda_refusals.txt, each with its
// reason); like exclusions they must still fail, and count as skipped, but they are not added to
// a --cases list.
// --compile-only yes: each case is lowered, scheduled and generated (driver::generate_sources)
// but not built, loaded or run; with --device cuda that includes NVRTC compiling the case's
// kernels for the architectures of KILN_CUDA_ARCHS, so a machine without a GPU checks that they
// compile. A case passes when it generates; excluded cases are skipped unrun (their reasons are
// about values, not kernels).
//
// With `--by-opset yes` the table counts each op per opset of the cases using it (the ONNX
// 1.23 node suite writes each case at its op's newest version), then the cases per opset; a
// case whose model does not import counts under the op "(not imported)".
//
// ONNX 1.12's suite stores bfloat16 tensors with data type uint16 (same bits); the runner reads
// such a file as bfloat16 where the model declares bfloat16.
#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "driver/compile.h"
#include "onnx/importer.h"
#include "onnx/tensor_file.h"
#include "support/error.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

struct Tolerance {
  double rtol;
  double atol;
};

/// `strict`: a case of the --core list.
Tolerance tolerance_for(graph::DType dtype, bool strict) {
  switch (dtype) {
    case graph::DType::kFloat16:
      return {1e-3, 1e-3};
    case graph::DType::kBFloat16:
      return {1e-2, 1e-2};
    default:
      return {strict ? 1e-4 : 1e-3, 1e-5};
  }
}

std::string dims_text(const std::vector<int64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

/// Empty when equal within tolerance; else what differs.
std::string compare(const graph::Tensor& actual, const graph::Tensor& expected, bool strict) {
  if (actual.dtype() != expected.dtype()) {
    return fmt::format("dtype {} but expected {}", graph::dtype_name(actual.dtype()),
                       graph::dtype_name(expected.dtype()));
  }
  if (actual.dims() != expected.dims()) {
    return fmt::format("shape {} but expected {}", dims_text(actual.dims()),
                       dims_text(expected.dims()));
  }
  const bool floating = graph::is_floating(expected.dtype());
  Tolerance tol = tolerance_for(expected.dtype(), strict);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    bool ok;
    if (graph::is_small_float(expected.dtype())) {
      double a = actual.element_as_double(i), e = expected.element_as_double(i);
      ok = (std::isnan(a) && std::isnan(e)) ||
           actual.values<uint8_t>()[i] == expected.values<uint8_t>()[i];
    } else if (floating) {
      double a = actual.element_as_double(i), e = expected.element_as_double(i);
      ok = (std::isnan(a) && std::isnan(e)) || a == e ||
           std::abs(a - e) <= tol.atol + tol.rtol * std::abs(e);
    } else {
      ok = actual.element_as_int64(i) == expected.element_as_int64(i);
    }
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return "";
  return fmt::format("{} of {} elements differ; first at flat index {}: {} vs expected {}", bad,
                     expected.numel(), first, actual.element_as_double(first),
                     expected.element_as_double(first));
}

/// Reads a suite value (a tensor, or a SequenceProto / OptionalProto) of the model's type;
/// uint16 data stands for bfloat16 where the model expects bfloat16.
graph::IoValue read_suite_value(const fs::path& path, const graph::Type& type) {
  graph::IoValue v = kiln::onnx::read_value_file(path, type);
  for (graph::Tensor& t : v.tensors) {
    if (t.dtype() != graph::DType::kUInt16) continue;
    const graph::Type* element = &type;
    while (element->element) element = element->element.get();
    if (element->dtype != graph::DType::kBFloat16) continue;
    auto storage = std::make_shared<graph::Tensor>(std::move(t));
    t = graph::Tensor(graph::DType::kBFloat16, storage->dims(), storage, storage->data(),
                      storage->nbytes());
  }
  return v;
}

/// Compares an output value with the expected one: its structure, then each tensor.
std::string compare_values(const graph::IoValue& actual, const graph::IoValue& expected,
                           bool strict) {
  if (actual.present != expected.present || actual.kind != expected.kind ||
      actual.tensors.size() != expected.tensors.size()) {
    return fmt::format("got {}, expected {}", actual.str(), expected.str());
  }
  for (size_t k = 0; k < actual.tensors.size(); ++k) {
    std::string diff = compare(actual.tensors[k], expected.tensors[k], strict);
    if (diff.empty()) continue;
    return expected.kind == graph::ValueKind::kSequence ? fmt::format("element {}: {}", k, diff)
                                                        : diff;
  }
  return "";
}

struct CaseResult {
  std::string name;
  std::vector<std::string> ops;
  int64_t opset = 0;  // the model's ai.onnx opset
  bool passed = false;
  bool excluded = false;
  bool unrun = false;  // an excluded case --compile-only skips
  std::string message;
  std::map<std::string, int> nodes_per_device;  // CompileStats::nodes_per_device
};

std::vector<std::string> model_ops(const graph::Graph& g) {
  std::set<std::string> ops;
  for (const auto& node : g.nodes()) ops.insert(node->op_type());
  return {ops.begin(), ops.end()};
}

/// The ai.onnx opset a model file imports (0 when it cannot be read), also for models Kiln
/// refuses.
int64_t model_opset(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  ::onnx::ModelProto proto;
  if (!in || !proto.ParseFromIstream(&in)) return 0;
  for (const auto& import : proto.opset_import()) {
    if (import.domain().empty() || import.domain() == "ai.onnx") return import.version();
  }
  return 0;
}

/// Where the kernels run (--device cpu|cuda).
ir::Device g_device = ir::Device::kCpu;
/// --compile-only yes: generate (and, on CUDA, NVRTC-compile) without building or running.
bool g_compile_only = false;

/// `dir`: the case's folder (model.onnx and test_data_set_N/).
CaseResult run_case(const fs::path& dir, const std::string& name, const fs::path& cache_dir,
                    bool strict) {
  CaseResult result;
  result.name = name;
  result.opset = model_opset(dir / "model.onnx");
  try {
    graph::Model model = kiln::onnx::import_model(dir / "model.onnx");
    result.ops = model_ops(*model.graph);
    std::vector<fs::path> sets;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_directory() &&
          entry.path().filename().string().rfind("test_data_set_", 0) == 0) {
        sets.push_back(entry.path());
      }
    }
    std::sort(sets.begin(), sets.end());
    // As `kiln run` does, the compile sees the given inputs' values, so shape arguments passed
    // as inputs are specialized (and guarded at run time), and sequences and optionals get
    // their lengths and presence.
    driver::CompileOptions options;
    options.cache_dir = cache_dir;
    options.device = g_device;
    // The suite's tolerances are float32's: matrix products on the GPU compute in float32, not
    // TF32 (ir/device.h).
    options.precision = ir::Precision::kFp32;
    const auto& graph_inputs = model.graph->inputs();
    const auto& graph_outputs = model.graph->outputs();
    auto read_inputs = [&](const fs::path& set) {
      std::vector<graph::IoValue> values;
      for (size_t k = 0; k < graph_inputs.size(); ++k) {
        values.push_back(
            read_suite_value(set / fmt::format("input_{}.pb", k), graph_inputs[k]->type()));
      }
      return values;
    };
    if (!sets.empty()) {
      std::vector<graph::IoValue> first = read_inputs(sets[0]);
      for (size_t k = 0; k < first.size(); ++k) {
        const std::string& name = graph_inputs[k]->name();
        if (graph_inputs[k]->type().kind == graph::ValueKind::kTensor) {
          options.lowering.input_values[name] =
              std::make_shared<graph::Tensor>(first[k].tensors.at(0));
        } else {
          options.lowering.structured_inputs[name] = first[k];
        }
      }
    }
    if (g_compile_only) {
      driver::GeneratedSources sources = driver::generate_sources(model, options);
      result.nodes_per_device = sources.stats.nodes_per_device;
      result.passed = true;
      return result;
    }
    driver::CompiledModel compiled = driver::compile(model, options);
    result.nodes_per_device = compiled.stats().nodes_per_device;
    for (const fs::path& set : sets) {
      std::vector<graph::IoValue> outputs = compiled.run_values(read_inputs(set));
      for (size_t k = 0; k < outputs.size(); ++k) {
        fs::path expected_path = set / fmt::format("output_{}.pb", k);
        if (!fs::exists(expected_path)) continue;
        std::string diff = compare_values(
            outputs[k], read_suite_value(expected_path, graph_outputs[k]->type()), strict);
        if (!diff.empty()) {
          result.message = fmt::format("{} output {} ('{}'): {}", set.filename().string(), k,
                                       graph_outputs[k]->name(), diff);
          return result;
        }
      }
    }
    result.passed = true;
  } catch (const std::exception& e) {
    result.message = e.what();
  }
  return result;
}

/// The cases of a list file, each with the comment after it ("" when none).
std::vector<std::pair<std::string, std::string>> read_cases(const fs::path& list) {
  std::ifstream in(list);
  if (!in) throw UserError(fmt::format("{}: cannot read the case list", list.string()));
  auto trim = [](std::string text) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    size_t start = 0;
    while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
    return text.substr(start);
  };
  std::vector<std::pair<std::string, std::string>> cases;
  for (std::string line; std::getline(in, line);) {
    size_t hash = line.find('#');
    std::string comment = hash == std::string::npos ? "" : trim(line.substr(hash + 1));
    std::string name = trim(line.substr(0, hash));
    if (!name.empty()) cases.emplace_back(name, comment);
  }
  return cases;
}

/// Exclusions must name an allowed class: `case  # class: reason`.
void check_exclusion_class(const std::string& name, const std::string& comment) {
  static const std::set<std::string> kClasses = {"string", "random", "gradient", "suite-bug",
                                                 "image-decoder"};
  std::string cls = comment.substr(0, comment.find(':'));
  if (!kClasses.count(cls) || comment.find(':') == std::string::npos) {
    throw UserError(
        fmt::format("exclusion '{}' must read `# CLASS: reason` with CLASS one of "
                    "string, random, gradient, suite-bug, image-decoder; found '# {}'",
                    name, comment));
  }
}

/// The opset a case is written at ("?" when its file cannot be read).
std::string opset_label(const CaseResult& r) {
  return r.opset == 0 ? std::string("?") : std::to_string(r.opset);
}

/// Passed, failed and skipped cases (skipped: excluded or refused, and still failing as they
/// must), as print_report() counts them per op and per opset.
struct CaseCounts {
  int passed = 0, failed = 0, skipped = 0;
  void add(const CaseResult& r) {
    if (r.excluded && !r.passed) {
      ++skipped;
    } else if (r.passed && !r.excluded) {
      ++passed;
    } else {
      ++failed;
    }
  }
};

void print_report(const std::vector<CaseResult>& results, double seconds, bool by_opset) {
  std::map<std::pair<std::string, std::string>, CaseCounts> per_op;  // (op, opset)
  std::map<std::string, CaseCounts> per_opset;
  for (const CaseResult& r : results) {
    if (r.unrun) continue;
    std::string opset = by_opset ? opset_label(r) : "";
    for (const std::string& op : r.ops) per_op[{op, opset}].add(r);
    if (r.ops.empty()) per_op[{"(not imported)", opset}].add(r);
    per_opset[opset_label(r)].add(r);
  }
  const auto row = [&](const std::string& name, const std::string& opset, const std::string& passed,
                       const std::string& failed, const std::string& skipped) {
    if (by_opset) {
      fmt::print("{:<28} {:>6} {:>7} {:>7} {:>7}\n", name, opset, passed, failed, skipped);
    } else {
      fmt::print("{:<28} {:>7} {:>7} {:>7}\n", name, passed, failed, skipped);
    }
  };
  const auto counts_row = [&](const std::string& name, const std::string& opset,
                              const CaseCounts& c) {
    row(name, opset, std::to_string(c.passed), std::to_string(c.failed), std::to_string(c.skipped));
  };
  row("op", "opset", "passed", "failed", "skipped");
  for (const auto& [key, counts] : per_op) counts_row(key.first, key.second, counts);
  if (by_opset) {
    row("cases by opset", "opset", "passed", "failed", "skipped");
    for (const auto& [opset, counts] : per_opset) counts_row("", opset, counts);
  }
  // Off the CPU, where each case's ONNX nodes ran, and the totals over the passing cases.
  std::map<std::string, int> nodes_total;
  for (const CaseResult& r : results) {
    if (g_device == ir::Device::kCpu || r.nodes_per_device.empty()) continue;
    std::vector<std::string> parts;
    for (const auto& [device, n] : r.nodes_per_device) {
      parts.push_back(fmt::format("{} on {}", n, device));
      if (r.passed && !r.excluded) nodes_total[device] += n;
    }
    fmt::print("nodes {}: {}\n", r.name, fmt::join(parts, ", "));
  }
  CaseCounts total;
  for (const CaseResult& r : results) {
    total.add(r);
    if (r.excluded && r.passed) {
      fmt::print("FAIL {}: passes while excluded; remove it from the exclusions or refusals\n",
                 r.name);
    } else if (!r.excluded && !r.passed) {
      fmt::print("FAIL {}: {}\n", r.name, r.message);
    }
  }
  if (!nodes_total.empty()) {
    std::vector<std::string> parts;
    for (const auto& [device, n] : nodes_total) parts.push_back(fmt::format("{} on {}", n, device));
    fmt::print(
        "ONNX nodes of the passing cases: {} (a node split between devices counts on each)\n",
        fmt::join(parts, ", "));
  }
  fmt::print("wall time {:.1f} s\n", seconds);
  fmt::print("{} passed, {} failed, {} skipped\n", total.passed, total.failed, total.skipped);
}

bool all_good(const std::vector<CaseResult>& results) {
  return std::all_of(results.begin(), results.end(),
                     [](const CaseResult& r) { return r.passed != r.excluded; });
}

}  // namespace

/// Where the cases live: DATA_DIR, and the node suite that replaces DATA_DIR/node.
struct SuiteDirs {
  fs::path data_dir;
  std::optional<fs::path> node_suite;  // --node-suite: a folder holding node/
  bool node_suite_missing = false;     // --node-suite given but its node/ is not there

  /// The folder of case `name` ("node/test_abs").
  fs::path case_dir(const std::string& name) const {
    bool node = name.rfind("node/", 0) == 0;
    return (node && node_suite ? *node_suite : data_dir) / name;
  }
  /// Whether the case is left out because the node suite is missing.
  bool left_out(const std::string& name) const {
    return node_suite_missing && name.rfind("node/", 0) == 0;
  }
};

/// Every case of the suite: the folders holding a model.onnx, as "node/test_abs".
std::vector<std::string> all_cases(const SuiteDirs& dirs) {
  std::vector<std::string> cases;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    const std::string prefix = std::string(suite) + "/";
    fs::path root = dirs.case_dir(prefix);
    if (dirs.left_out(prefix) || !fs::is_directory(root)) continue;
    for (const auto& entry : fs::directory_iterator(root)) {
      if (fs::exists(entry.path() / "model.onnx"))
        cases.push_back(std::string(suite) + "/" + entry.path().filename().string());
    }
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

/// `--shard K/N` -> {K - 1, N}.
std::pair<size_t, size_t> parse_shard(const std::string& text) {
  size_t slash = text.find('/');
  int k = 0, n = 0;
  if (slash != std::string::npos) {
    try {
      k = std::stoi(text.substr(0, slash));
      n = std::stoi(text.substr(slash + 1));
    } catch (const std::exception&) {
      k = n = 0;
    }
  }
  if (n < 1 || k < 1 || k > n) {
    throw UserError(fmt::format("--shard must read K/N with 1 <= K <= N, found '{}'", text));
  }
  return {static_cast<size_t>(k - 1), static_cast<size_t>(n)};
}

int main(int argc, char** argv) {
  const char* usage =
      "usage: kiln_onnx_runner DATA_DIR CACHE_DIR [--cases LIST] [--core LIST] [--jobs N] "
      "[--exclusions FILE] [--by-opset yes] [--device cpu|cuda] [--refusals FILE] "
      "[--compile-only yes] [--node-suite DIR] [--shard K/N]\n";
  if (argc < 3 || argc % 2 != 1) {
    fmt::print(stderr, "{}", usage);
    return 2;
  }
  try {
    SuiteDirs dirs;
    dirs.data_dir = argv[1];
    fs::path cache_dir = argv[2];
    unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
    std::string exclusions, list, core_list, refusals;
    bool by_opset = false;
    std::pair<size_t, size_t> shard = {0, 1};
    for (int k = 3; k + 1 < argc; k += 2) {
      std::string option = argv[k], value = argv[k + 1];
      if (option == "--jobs") {
        jobs = static_cast<unsigned>(std::max(1, std::stoi(value)));
      } else if (option == "--exclusions") {
        exclusions = value;
      } else if (option == "--cases") {
        list = value;
      } else if (option == "--core") {
        core_list = value;
      } else if (option == "--by-opset") {
        by_opset = value == "yes";
      } else if (option == "--refusals") {
        refusals = value;
      } else if (option == "--compile-only") {
        g_compile_only = value == "yes";
      } else if (option == "--device" && ir::device_from_name(value)) {
        g_device = *ir::device_from_name(value);
      } else if (option == "--node-suite") {
        dirs.node_suite = value;
      } else if (option == "--shard") {
        shard = parse_shard(value);
      } else {
        fmt::print(stderr, "{}", usage);
        return 2;
      }
    }
    if (dirs.node_suite && !fs::is_directory(*dirs.node_suite / "node")) {
      dirs.node_suite_missing = true;
      fmt::print("the node suite {} is not there: its cases are skipped\n",
                 (*dirs.node_suite / "node").string());
    }
    std::vector<std::string> cases;
    if (list.empty()) {
      cases = all_cases(dirs);
    } else {
      for (const auto& [name, comment] : read_cases(list)) cases.push_back(name);
    }
    std::set<std::string> excluded, refused, core;
    if (!exclusions.empty()) {
      for (const auto& [name, comment] : read_cases(exclusions)) {
        check_exclusion_class(name, comment);
        if (dirs.left_out(name)) continue;
        // A stale name would count as an excluded case that fails. The exclusions name the 1.23
        // node suite's cases: without --node-suite, those that 1.12's node/ lacks are left out.
        if (!fs::exists(dirs.case_dir(name) / "model.onnx")) {
          if (!dirs.node_suite && name.rfind("node/", 0) == 0) continue;
          throw UserError(fmt::format("exclusion '{}': no such case under {}", name,
                                      dirs.case_dir(name).parent_path().string()));
        }
        excluded.insert(name);
        if (!list.empty()) cases.push_back(name);
      }
    }
    if (!refusals.empty()) {
      for (const auto& [name, comment] : read_cases(refusals)) {
        if (comment.empty())
          throw UserError(fmt::format("refusal '{}' must give its reason after '#'", name));
        refused.insert(name);
      }
    }
    if (!core_list.empty()) {
      for (const auto& [name, comment] : read_cases(core_list)) core.insert(name);
    }
    // One run per case, in a fixed order, so that shards split the same selection.
    std::sort(cases.begin(), cases.end());
    cases.erase(std::unique(cases.begin(), cases.end()), cases.end());
    cases.erase(std::remove_if(cases.begin(), cases.end(),
                               [&](const std::string& name) { return dirs.left_out(name); }),
                cases.end());
    std::vector<std::string> selected;
    for (size_t i = shard.first; i < cases.size(); i += shard.second) selected.push_back(cases[i]);
    cases = std::move(selected);
    auto start = std::chrono::steady_clock::now();
    std::vector<CaseResult> results(cases.size());
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < jobs; ++w) {
      workers.emplace_back([&] {
        for (size_t i; (i = next++) < cases.size();) {
          const bool is_refused = refused.count(cases[i]) > 0;
          const bool is_excluded = excluded.count(cases[i]) > 0 || is_refused;
          if (g_compile_only && is_excluded && !is_refused) {
            results[i].name = cases[i];
            results[i].unrun = true;
          } else {
            results[i] =
                run_case(dirs.case_dir(cases[i]), cases[i], cache_dir, core.count(cases[i]) > 0);
          }
          results[i].excluded = is_excluded;
        }
      });
    }
    for (auto& t : workers) t.join();
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    print_report(results, seconds, by_opset);
    return all_good(results) ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln_onnx_runner: {}\n", e.what());
    return 2;
  }
}
