/// Control flow: If, Loop and Scan (Inductor's wrapper codegen_conditional / codegen_while_loop).
/// Each subgraph is lowered once into a Program of its own (ir::Subgraph) that the wrapper turns
/// into a function with its own memory plan; the node becomes one extern call ("if", "loop",
/// "scan") that runs them, and one "result" buffer per output, whose storage the subgraph
/// allocated. Result dims that differ between branches or iterations, or that depend on the
/// subgraph's own sizes, become size symbols bound from the results' run-time shapes.
///
/// An If whose condition is known when compiling lowers the chosen branch inline instead. An If
/// whose branches give an output of different ranks or dtypes has the nodes that read it moved
/// into its branches (branch_specialization.h); one that leaves the graph has its rank and dtype
/// known after a run, the result's own type handed over by the wrapper.
///
/// Tests: the ONNX node suite (test_if*, test_loop*, test_scan*, test_range_*_expanded) and
/// tests/unit/driver/control_flow_test.cpp.

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lower/branch_specialization.h"
#include "lower/graph_lowering.h"
#include "lower/lowering.h"
#include "lower/op_util.h"
#include "support/error.h"

namespace kiln::lower {

using graph::DType;
using sym::Expr;

namespace {

const graph::Graph& subgraph_attr(const LoweringContext& ctx, const graph::Node& node,
                                  const std::string& name) {
  std::shared_ptr<graph::Graph> g = node.attr_graph(name);
  if (!g) ctx.fail("attribute '" + name + "' (a graph) is missing");
  return *g;
}

/// True when every symbol of `e` is bound in `program`'s scope (by an input's shape or a
/// dynamic size), so the caller's code may use it.
bool in_scope(const ir::Program& program, const Expr& e) {
  std::set<std::string> bound;
  for (const ir::InputSpec& in : program.inputs) {
    for (const Expr& d : in.shape) {
      for (const Expr& s : sym::free_symbols(d)) bound.insert(s.name());
    }
  }
  for (const ir::DynamicSize& d : program.dynamic_sizes) bound.insert(d.symbol);
  for (const Expr& s : sym::free_symbols(e)) {
    if (!bound.count(s.name())) return false;
  }
  return true;
}

/// A result of a control-flow call as lowering decides it: dtype and shape, where a nullopt dim
/// is only known at run time.
struct ResultType {
  DType dtype = DType::kFloat32;
  std::vector<std::optional<Expr>> shape;
};

/// Adds the control-flow call (an ir::IfCall, LoopCall or ScanCall) and its result buffers;
/// returns the results.
template <typename Call>
std::vector<TensorValue> control_flow_call(LoweringContext& ctx, Call op,
                                           std::vector<std::optional<ir::View>> inputs,
                                           const std::vector<ResultType>& results,
                                           const std::vector<const LoweredSubgraph*>& subgraphs) {
  for (const LoweredSubgraph* g : subgraphs) {
    for (const TensorValue& c : g->captures) inputs.push_back(ctx.as_view(c, true));
    ctx.program().subgraphs.push_back(g->subgraph);
  }
  op.results = static_cast<int64_t>(results.size());
  TensorValue call = ctx.extern_call(std::move(op), DType::kUInt8, {Expr(0)}, std::move(inputs));
  ir::View parent = ctx.as_view(call);
  std::vector<TensorValue> values;
  for (size_t k = 0; k < results.size(); ++k) {
    std::vector<Expr> shape;
    for (size_t d = 0; d < results[k].shape.size(); ++d) {
      const std::optional<Expr>& dim = results[k].shape[d];
      shape.push_back(
          dim ? *dim
              : ctx.dynamic_size({"", parent.buffer, static_cast<int>(k), static_cast<int>(d)}));
    }
    values.push_back(ctx.extern_call(ir::ControlResultCall{static_cast<int64_t>(k)},
                                     results[k].dtype, std::move(shape), {parent}));
  }
  return values;
}

/// The caller's view of a subgraph output's shape: integer dims and dims in the caller's scope
/// stay, the others are known only at run time.
std::vector<std::optional<Expr>> outer_shape(LoweringContext& ctx, const std::vector<Expr>& shape) {
  std::vector<std::optional<Expr>> out;
  for (const Expr& d : shape) {
    if (d.is_integer() || in_scope(ctx.program(), d)) {
      out.emplace_back(d);
    } else {
      out.emplace_back();
    }
  }
  return out;
}

/// The types a branch output may have.
std::vector<ir::OutputAlternative> alternatives_of(const ir::OutputSpec& out) {
  if (out.type_known_after_run()) return out.alternatives;
  return {{out.dtype, graph::shape_str(out.shape)}};
}

/// If output `k`, whose branches give different ranks or dtypes (`a`, `b`). When nodes read it,
/// they must be specialized per branch (BranchMismatch); otherwise it leaves the graph with the
/// type of the branch taken, known after a run: a result of rank 0 stands for it when compiling.
ResultType run_time_typed_result(LoweringContext& ctx, const graph::Node& node, size_t k,
                                 const ir::OutputSpec& a, const ir::OutputSpec& b) {
  const graph::Value* out = node.output(k);
  if (out != nullptr && !out->users().empty()) throw BranchMismatch(node);
  std::vector<ir::OutputAlternative> alternatives = alternatives_of(a);
  for (const ir::OutputAlternative& alt : alternatives_of(b)) {
    if (std::find(alternatives.begin(), alternatives.end(), alt) == alternatives.end())
      alternatives.push_back(alt);
  }
  if (out != nullptr) ctx.graph_lowering().set_run_time_type(*out, std::move(alternatives));
  return {a.dtype, {}};
}

std::vector<TensorValue> lower_if(LoweringContext& ctx, const graph::Node& node,
                                  const LowerInputs& inputs) {
  const TensorValue& cond = required_input(ctx, inputs, 0, "cond");
  if (cond.dtype != DType::kBool) ctx.fail("the condition must be bool");
  const graph::Graph& then_graph = subgraph_attr(ctx, node, "then_branch");
  const graph::Graph& else_graph = subgraph_attr(ctx, node, "else_branch");
  if (cond.known && cond.known->size() == 1 && (*cond.known)[0].is_integer()) {
    bool taken = (*cond.known)[0] != Expr(0);
    return ctx.graph_lowering().inline_graph(taken ? then_graph : else_graph, {});
  }
  LoweredSubgraph then_branch = ctx.graph_lowering().lower_subgraph(then_graph, {});
  LoweredSubgraph else_branch = ctx.graph_lowering().lower_subgraph(else_graph, {});
  const auto& then_out = then_branch.subgraph->program.outputs;
  const auto& else_out = else_branch.subgraph->program.outputs;
  if (then_out.size() != else_out.size()) {
    ctx.fail(fmt::format("the then branch has {} outputs, the else branch {}", then_out.size(),
                         else_out.size()));
  }
  std::vector<ResultType> results;
  for (size_t k = 0; k < then_out.size(); ++k) {
    const ir::OutputSpec& a = then_out[k];
    const ir::OutputSpec& b = else_out[k];
    if (a.dtype != b.dtype || a.shape.size() != b.shape.size() || a.type_known_after_run() ||
        b.type_known_after_run()) {
      results.push_back(run_time_typed_result(ctx, node, k, a, b));
      continue;
    }
    ResultType r{a.dtype, outer_shape(ctx, a.shape)};
    for (size_t d = 0; d < a.shape.size(); ++d) {
      if (a.shape[d] != b.shape[d]) r.shape[d].reset();
    }
    results.push_back(std::move(r));
  }
  ir::IfCall call;
  call.then_branch = then_branch.subgraph;
  call.else_branch = else_branch.subgraph;
  return control_flow_call(ctx, std::move(call), {ctx.as_view(cond, true)}, results,
                           {&then_branch, &else_branch});
}

/// Lowers a Loop or Scan body whose inputs [first, first + n) are carried to its outputs
/// [out_first, out_first + n). When a carried output's shape differs from its input's, the body
/// is lowered again with symbolic sizes for the dims that change (they are then bound from each
/// iteration's inputs); `stable[k]` tells whether carried value k keeps its shape.
LoweredSubgraph lower_body(LoweringContext& ctx, const graph::Graph& body,
                           std::vector<FormalInput> formals, size_t first, size_t out_first,
                           size_t n, std::vector<bool>& stable) {
  LoweredSubgraph lowered = ctx.graph_lowering().lower_subgraph(body, formals);
  const auto& outputs = lowered.subgraph->program.outputs;
  if (outputs.size() < out_first + n) {
    ctx.fail(fmt::format("the body has {} outputs, expected at least {}", outputs.size(),
                         out_first + n));
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].type_known_after_run()) continue;
    std::vector<std::string> types;
    for (const ir::OutputAlternative& a : outputs[k].alternatives)
      types.push_back(std::string(graph::dtype_name(a.dtype)) + a.shape);
    ctx.fail(fmt::format(
        "body output {} ('{}') has a rank or dtype known only at run time ({}: an If in the "
        "body gives them in its branches); a body output needs one rank and dtype",
        k, outputs[k].onnx_name, fmt::join(types, " or ")));
  }
  stable.assign(n, true);
  for (size_t k = 0; k < n; ++k) {
    const ir::OutputSpec& out = outputs[out_first + k];
    FormalInput& in = formals[first + k];
    if (out.dtype != in.dtype || out.shape.size() != in.shape.size()) {
      ctx.fail(fmt::format("loop-carried value {} enters the body as {}{} and leaves it as {}{}", k,
                           graph::dtype_name(in.dtype), graph::shape_str(in.shape),
                           graph::dtype_name(out.dtype), graph::shape_str(out.shape)));
    }
    for (size_t d = 0; d < in.shape.size(); ++d) {
      if (out.shape[d] == in.shape[d]) continue;
      in.shape[d] = Expr::symbol(fmt::format("carried{}_{}", k, d));
      stable[k] = false;
    }
  }
  if (std::find(stable.begin(), stable.end(), false) == stable.end()) return lowered;
  return ctx.graph_lowering().lower_subgraph(body, formals);
}

/// The compile-time facts of a scan output for the drivers: dtype, rank, then its element shape
/// (0 for dims known only at run time).
std::vector<int64_t> scan_output_spec(const ir::OutputSpec& out) {
  std::vector<int64_t> spec = {static_cast<int64_t>(out.dtype),
                               static_cast<int64_t>(out.shape.size())};
  for (const Expr& d : out.shape) spec.push_back(d.as_integer().value_or(0));
  return spec;
}

/// The most iterations of a Loop run when compiling.
constexpr int64_t kMaxUnrolledIterations = 1024;

/// A scalar's value known when compiling, or nullopt.
std::optional<int64_t> known_scalar_int(const TensorValue* v) {
  if (v == nullptr || !v->known || v->known->size() != 1) return std::nullopt;
  return (*v->known)[0].as_integer();
}

/// A Loop carrying sequences or optionals (whose lengths and presence Kiln fixes when compiling)
/// runs when compiling: its trip count and condition must be known then, and each iteration's
/// body is lowered inline.
std::vector<TensorValue> unroll_loop(LoweringContext& ctx, const graph::Graph& body,
                                     const LowerInputs& inputs) {
  const TensorValue* max_trip = optional_input(inputs, 0);
  const TensorValue* cond = optional_input(inputs, 1);
  std::optional<int64_t> trips = known_scalar_int(max_trip);
  std::optional<int64_t> keep = known_scalar_int(cond);
  if ((max_trip && !trips) || (cond && !keep) || (!max_trip && !cond)) {
    ctx.fail(
        "a Loop that carries sequences or optionals runs when compiling, so its trip count "
        "and condition must be known then");
  }
  std::vector<TensorValue> carried;
  for (size_t k = 2; k < inputs.size(); ++k)
    carried.push_back(required_input(ctx, inputs, k, "v_initial"));
  std::vector<std::vector<TensorValue>> scans;
  int64_t i = 0;
  for (; (!trips || i < *trips) && (!keep || *keep != 0); ++i) {
    if (i == kMaxUnrolledIterations) {
      ctx.fail(fmt::format("the Loop runs more than {} iterations when compiling",
                           kMaxUnrolledIterations));
    }
    std::vector<TensorValue> formals = {ctx.from_known(DType::kInt64, {}, {Expr(i)}),
                                        ctx.from_known(DType::kBool, {}, {Expr(keep.value_or(1))})};
    formals.insert(formals.end(), carried.begin(), carried.end());
    std::vector<TensorValue> outs = ctx.graph_lowering().inline_graph(body, formals);
    if (outs.size() < 1 + carried.size())
      ctx.fail(fmt::format("the body has {} outputs, expected at least {}", outs.size(),
                           1 + carried.size()));
    if (cond) {
      keep = known_scalar_int(&outs[0]);
      if (!keep) ctx.fail("the body's condition is not known when compiling");
    }
    std::copy(outs.begin() + 1, outs.begin() + 1 + static_cast<std::ptrdiff_t>(carried.size()),
              carried.begin());
    scans.resize(outs.size() - 1 - carried.size());
    for (size_t k = 0; k < scans.size(); ++k) scans[k].push_back(outs[1 + carried.size() + k]);
  }
  for (std::vector<TensorValue>& scan : scans) {
    std::vector<TensorValue> parts;
    for (const TensorValue& t : scan) {
      std::vector<Expr> shape = t.shape;
      shape.insert(shape.begin(), Expr(1));
      parts.push_back(make_view(ctx, t, shape, [](const std::vector<Expr>& o) {
        return std::vector<Expr>(o.begin() + 1, o.end());
      }));
    }
    std::vector<const TensorValue*> pointers;
    for (const TensorValue& p : parts) pointers.push_back(&p);
    carried.push_back(concat_values(ctx, pointers, 0));
  }
  return carried;
}

std::vector<TensorValue> lower_loop(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& inputs) {
  const graph::Graph& body = subgraph_attr(ctx, node, "body");
  const TensorValue* max_trip = optional_input(inputs, 0);
  const TensorValue* cond = optional_input(inputs, 1);
  if (max_trip && (max_trip->dtype != DType::kInt64 || max_trip->rank() > 1))
    ctx.fail("the trip count M must be an int64 scalar");
  if (cond && (cond->dtype != DType::kBool || cond->rank() > 1))
    ctx.fail("the condition must be a bool scalar");
  const size_t carried = inputs.size() > 2 ? inputs.size() - 2 : 0;
  for (size_t k = 2; k < inputs.size(); ++k) {
    if (inputs[k] && (inputs[k]->sequence || inputs[k]->optional))
      return unroll_loop(ctx, body, inputs);
  }
  std::vector<FormalInput> formals = {{DType::kInt64, {}, true}, {DType::kBool, {}, false}};
  for (size_t k = 0; k < carried; ++k) {
    const TensorValue& v = required_input(ctx, inputs, 2 + k, "v_initial");
    formals.push_back({v.dtype, v.shape, false});
  }
  std::vector<bool> stable;
  LoweredSubgraph lowered = lower_body(ctx, body, formals, 2, 1, carried, stable);
  const auto& outputs = lowered.subgraph->program.outputs;
  const ir::OutputSpec& cond_out = outputs[0];
  if (cond_out.dtype != DType::kBool || !cond_out.shape.empty())
    ctx.fail("the body's first output (the condition) must be a bool scalar");
  std::vector<ResultType> results;
  for (size_t k = 0; k < carried; ++k) {
    const ir::OutputSpec& out = outputs[1 + k];
    ResultType r{out.dtype, {}};
    const TensorValue& initial = *inputs[2 + k];
    for (size_t d = 0; d < out.shape.size(); ++d) {
      r.shape.push_back(stable[k] ? std::optional<Expr>(initial.shape[d]) : std::nullopt);
    }
    results.push_back(std::move(r));
  }
  std::vector<int64_t> scan_specs;
  for (size_t k = 1 + carried; k < outputs.size(); ++k) {
    ResultType r{outputs[k].dtype, outer_shape(ctx, outputs[k].shape)};
    r.shape.insert(r.shape.begin(), std::nullopt);  // the iteration count
    results.push_back(std::move(r));
    std::vector<int64_t> spec = scan_output_spec(outputs[k]);
    scan_specs.insert(scan_specs.end(), spec.begin(), spec.end());
  }
  std::vector<std::optional<ir::View>> views = {
      max_trip ? std::optional<ir::View>(ctx.as_view(*max_trip, true)) : std::nullopt,
      cond ? std::optional<ir::View>(ctx.as_view(*cond, true)) : std::nullopt};
  for (size_t k = 0; k < carried; ++k) views.push_back(ctx.as_view(*inputs[2 + k], true));
  ir::LoopCall call;
  call.body = lowered.subgraph;
  call.carried = static_cast<int64_t>(carried);
  call.scan_specs = scan_specs;
  return control_flow_call(ctx, std::move(call), std::move(views), results, {&lowered});
}

/// Scan 9 and later; Scan 8 (`batched`) has a leading batch axis on every state and scan
/// input, scans along axis 1, and takes the optional sequence_lens first.
std::vector<TensorValue> lower_scan(LoweringContext& ctx, const graph::Node& node,
                                    const LowerInputs& all_inputs) {
  const graph::Graph& body = subgraph_attr(ctx, node, "body");
  const bool batched = node.opset() < 9;
  LowerInputs inputs = all_inputs;
  if (batched) {
    if (optional_input(inputs, 0)) ctx.fail("sequence_lens is not supported; omit it");
    inputs.erase(inputs.begin());
  }
  const int64_t num_scan = node.attr_int("num_scan_inputs", -1);
  if (num_scan < 1 || static_cast<size_t>(num_scan) > inputs.size())
    ctx.fail(fmt::format("num_scan_inputs must be in [1, {}]", inputs.size()));
  const size_t states = inputs.size() - static_cast<size_t>(num_scan);
  const size_t scans = static_cast<size_t>(num_scan);
  std::vector<int64_t> in_axes = node.attr_ints("scan_input_axes", {});
  std::vector<int64_t> in_dirs =
      node.attr_ints(batched ? "directions" : "scan_input_directions", {});
  in_axes.resize(scans, 0);
  in_dirs.resize(scans, 0);
  const size_t skip = batched ? 1 : 0;  // the batch axis
  std::vector<FormalInput> formals;
  std::vector<TensorValue> values;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorValue& v = required_input(ctx, inputs, k, k < states ? "initial state" : "scan");
    if (v.sequence) ctx.fail("sequence inputs are not supported by Scan");
    if (v.rank() < skip + (k < states ? 0 : 1))
      ctx.fail(fmt::format("input {} has too low a rank", k));
    values.push_back(v);
  }
  Expr length;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const TensorValue& v = values[k];
    std::vector<Expr> shape(v.shape.begin() + static_cast<std::ptrdiff_t>(skip), v.shape.end());
    if (k >= states) {
      size_t s = k - states;
      int64_t axis = ctx.normalize_axis(in_axes[s], static_cast<int64_t>(shape.size()));
      in_axes[s] = axis;
      if (s == 0) length = shape[static_cast<size_t>(axis)];
      shape.erase(shape.begin() + axis);
    }
    formals.push_back({v.dtype, std::move(shape), false});
  }
  std::vector<bool> stable;
  LoweredSubgraph lowered = lower_body(ctx, body, formals, 0, 0, states, stable);
  const auto& outputs = lowered.subgraph->program.outputs;
  const size_t scan_outputs = outputs.size() - states;
  std::vector<int64_t> out_axes = node.attr_ints("scan_output_axes", {});
  std::vector<int64_t> out_dirs = node.attr_ints("scan_output_directions", {});
  out_axes.resize(scan_outputs, 0);
  out_dirs.resize(scan_outputs, 0);
  std::vector<ResultType> results;
  for (size_t k = 0; k < states; ++k) {
    ResultType r{outputs[k].dtype, {}};
    for (size_t d = 0; d < values[k].rank(); ++d) {
      bool keep = stable[k] || d < skip;
      r.shape.push_back(keep ? std::optional<Expr>(values[k].shape[d]) : std::nullopt);
    }
    results.push_back(std::move(r));
  }
  std::vector<int64_t> scan_specs;
  for (size_t k = 0; k < scan_outputs; ++k) {
    const ir::OutputSpec& out = outputs[states + k];
    int64_t axis = ctx.normalize_axis(out_axes[k], static_cast<int64_t>(out.shape.size()) + 1);
    out_axes[k] = axis;
    ResultType r{out.dtype, outer_shape(ctx, out.shape)};
    r.shape.insert(r.shape.begin() + axis, length);
    if (batched) r.shape.insert(r.shape.begin(), values[0].shape[0]);
    results.push_back(std::move(r));
    std::vector<int64_t> spec = scan_output_spec(out);
    scan_specs.insert(scan_specs.end(), spec.begin(), spec.end());
  }
  std::vector<std::optional<ir::View>> views;
  for (const TensorValue& v : values) views.push_back(ctx.as_view(v, true));
  ir::ScanCall call;
  call.body = lowered.subgraph;
  call.states = static_cast<int64_t>(states);
  call.batched = batched;
  call.scan_input_axes = in_axes;
  call.scan_input_directions = in_dirs;
  call.scan_output_axes = out_axes;
  call.scan_output_directions = out_dirs;
  call.scan_specs = scan_specs;
  return control_flow_call(ctx, std::move(call), std::move(views), results, {&lowered});
}

}  // namespace

void register_control_flow_ops(Registry& registry) {
  registry.add("", "If", {lower_if, 1, 17});
  registry.add("", "Loop", {lower_loop, 1, 17});
  registry.add("", "Scan", {lower_scan, 8, 17});
}

}  // namespace kiln::lower
