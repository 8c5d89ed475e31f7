// `kiln info MODEL`: imports a model and prints what it holds: metadata, opsets, the inputs and
// outputs with their symbolic shapes, node counts by op, parameters, and the ops Kiln cannot
// compile yet.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "graph/graph.h"
#include "lower/lowering.h"
#include "lower/supported_ops.h"
#include "onnx/importer.h"
#include "support/identifier.h"

namespace kiln::cli {
namespace {

struct InfoOptions {
  std::string model;
  bool dump_graph = false;
};

/// "Op" for ai.onnx, "domain:Op" otherwise.
std::string op_label(const graph::Node& node) {
  return node.domain().empty() ? node.op_type() : node.domain() + ":" + node.op_type();
}

struct OpCounts {
  std::map<std::string, int64_t> by_op;  // sorted by label
  std::map<std::string, const graph::Node*> example;
  int64_t total = 0;
  int64_t in_subgraphs = 0;
};

void count_ops(const graph::Graph& graph, bool nested, OpCounts& counts) {
  for (const auto& node : graph.nodes()) {
    std::string label = op_label(*node);
    ++counts.by_op[label];
    counts.example.emplace(label, node.get());
    ++counts.total;
    if (nested) ++counts.in_subgraphs;
    for (const auto& subgraph : node->subgraphs()) {
      if (subgraph != nullptr) count_ops(*subgraph, true, counts);
    }
  }
}

struct Parameters {
  int64_t count = 0;
  int64_t elements = 0;
  int64_t bytes = 0;
};

void count_parameters(const graph::Graph& graph, Parameters& params) {
  for (const graph::Value* value : graph.initializers()) {
    ++params.count;
    params.elements += value->initializer()->numel();
    params.bytes += static_cast<int64_t>(value->initializer()->nbytes());
  }
  for (const auto& node : graph.nodes()) {
    for (const auto& subgraph : node->subgraphs()) {
      if (subgraph != nullptr) count_parameters(*subgraph, params);
    }
  }
}

std::string human_bytes(int64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  if (bytes < 1024LL * 1024 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024));
}

/// Thousands separated by commas, for counts people compare by eye.
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') out += ',';
    out += digits[i];
  }
  return out;
}

/// Output name -> the types it may have, for outputs whose rank or dtype is known only after a
/// run (an If whose branches give different ones): what lowering the model finds. None when the
/// model cannot be lowered as it stands (inputs whose values it needs); the rest of the report
/// does not need it.
using RunTimeTypes = std::map<std::string, std::vector<ir::OutputAlternative>>;

bool holds_if(const graph::Graph& graph) {
  for (const auto& node : graph.nodes()) {
    if (node->op_type() == "If" && node->domain().empty()) return true;
    for (const auto& subgraph : node->subgraphs()) {
      if (subgraph != nullptr && holds_if(*subgraph)) return true;
    }
  }
  return false;
}

/// Lowers only models with an If (the others' output types are the declared ones), without
/// algorithm selection, so that info stays quick.
RunTimeTypes run_time_typed_outputs(const graph::Model& model) {
  RunTimeTypes types;
  if (!holds_if(*model.graph)) return types;
  try {
    lower::LoweringOptions options;
    options.autotune = autotune::AutotuneMode::kOff;
    ir::Program program = lower::lower_graph(*model.graph, options);
    for (const ir::OutputSpec& out : program.outputs) {
      if (out.type_known_after_run()) types[out.onnx_name] = out.alternatives;
    }
  } catch (const std::exception&) {
    types.clear();
  }
  return types;
}

void print_values(const char* title, const std::vector<graph::Value*>& values,
                  const RunTimeTypes& run_time = {}) {
  fmt::print("{}:\n", title);
  if (values.empty()) fmt::print("  (none)\n");
  size_t width = 0;
  for (const graph::Value* value : values)
    width = std::max(width, terminal_text(value->name()).size());
  for (const graph::Value* value : values) {
    const std::string name = terminal_text(value->name());
    auto found = run_time.find(value->name());
    if (found == run_time.end()) {
      fmt::print("  {:<{}}  {}\n", name, width, terminal_text(value->type().str()));
      continue;
    }
    std::vector<std::string> types;
    for (const ir::OutputAlternative& a : found->second)
      types.push_back(std::string(graph::dtype_name(a.dtype)) + terminal_text(a.shape));
    fmt::print("  {:<{}}  {} (known after a run)\n", name, width, fmt::join(types, " or "));
  }
}

void print_info(const graph::Model& model) {
  fmt::print("file:        {}\n", model.path);
  fmt::print("ir version:  {}\n", model.ir_version);
  fmt::print("producer:    {}\n",
             model.producer_name.empty() ? "(none)" : terminal_text(model.producer_name));
  std::vector<std::string> opsets;
  for (const auto& [domain, version] : model.opsets) {
    opsets.push_back(
        fmt::format("{} {}", domain.empty() ? "ai.onnx" : terminal_text(domain), version));
  }
  fmt::print("opsets:      {}\n", fmt::join(opsets, ", "));
  print_values("inputs", model.graph->inputs());
  print_values("outputs", model.graph->outputs(), run_time_typed_outputs(model));

  OpCounts ops;
  count_ops(*model.graph, false, ops);
  std::string nested =
      ops.in_subgraphs == 0 ? "" : fmt::format(" ({} in subgraphs)", ops.in_subgraphs);
  fmt::print("nodes:       {}{}\n", ops.total, nested);
  size_t width = 0;
  for (const auto& [label, count] : ops.by_op) width = std::max(width, terminal_text(label).size());
  for (const auto& [label, count] : ops.by_op)
    fmt::print("  {:<{}}  {}\n", terminal_text(label), width, count);

  Parameters params;
  count_parameters(*model.graph, params);
  fmt::print("parameters:  {} in {} initializers, {} ({} bytes)\n", grouped(params.elements),
             params.count, human_bytes(params.bytes), grouped(params.bytes));

  std::vector<std::string> unsupported;
  for (const auto& [label, node] : ops.example) {
    if (!lower::is_supported_op(node->domain(), node->op_type()))
      unsupported.push_back(terminal_text(label));
  }
  if (unsupported.empty()) {
    fmt::print("compilable:  every op is supported\n");
  } else {
    fmt::print("not compilable yet ({} of {} op types): {}\n", unsupported.size(), ops.by_op.size(),
               fmt::join(unsupported, ", "));
  }
}

}  // namespace

void add_info_command(CLI::App& app, CommandAction& chosen) {
  auto options = std::make_shared<InfoOptions>();
  CLI::App* info = app.add_subcommand("info",
                                      "Show what an ONNX model holds and what Kiln "
                                      "can compile of it");
  info->add_option("model", options->model, "the .onnx file")->required();
  info->add_flag("--dump-graph", options->dump_graph, "also print the imported graph as text");
  info->callback([options, &chosen]() {
    chosen = [options]() {
      graph::Model model = onnx::import_model(options->model);
      print_info(model);
      if (options->dump_graph) fmt::print("\n{}", graph::dump(*model.graph));
      return 0;
    };
  });
}

}  // namespace kiln::cli
