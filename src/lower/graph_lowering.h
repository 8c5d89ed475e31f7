#pragma once
/// GraphLowering walks one graph's nodes in order and applies their lowerings (lower_graph.cpp).
/// Control-flow lowerings (control_flow.cpp) reach it through LoweringContext::graph_lowering()
/// to lower their subgraphs: into a Program of their own (an If branch or Loop body that runs at
/// run time), or inline into the current one (a branch chosen when compiling).
///
/// A subgraph reads values of enclosing graphs by name; the first read of such a value makes it
/// a capture: an input of the subgraph's Program, passed by the control-flow call. Captured
/// values known when compiling (constants, shapes) are copied into the subgraph instead.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "lower/lowering.h"

namespace kiln::lower {

/// A formal input of a subgraph: its dtype and shape (sizes of the caller's scope or symbols of
/// the subgraph's own). `iteration` marks a Loop body's iteration number, whose value becomes a
/// size symbol the body's shapes may use (Slice(x, i, i + 1)).
struct FormalInput {
  graph::DType dtype = graph::DType::kFloat32;
  std::vector<sym::Expr> shape;
  bool iteration = false;
};

struct LoweredSubgraph {
  std::shared_ptr<ir::Subgraph> subgraph;
  /// The caller's values for the subgraph's captures, in input order after the formal inputs.
  std::vector<TensorValue> captures;
};

class GraphLowering {
 public:
  /// Lowers a model's main graph (inputs may be specialized by options.input_values).
  GraphLowering(const graph::Graph& graph, const LoweringOptions& options);
  ir::Program run();

  /// Lowers `graph` (a subgraph of the node being lowered) into a Program of its own.
  LoweredSubgraph lower_subgraph(const graph::Graph& graph,
                                 const std::vector<FormalInput>& formals);
  /// Lowers `graph`'s nodes into this program with its inputs bound to `formals`; returns its
  /// outputs.
  std::vector<TensorValue> inline_graph(const graph::Graph& graph,
                                        const std::vector<TensorValue>& formals);
  /// Marks `value` (an If's result that no node reads) as having a rank or dtype known only
  /// after a run, one of `alternatives`; as a graph output the run's type is handed over.
  void set_run_time_type(const graph::Value& value,
                         std::vector<ir::OutputAlternative> alternatives);

 private:
  GraphLowering(const graph::Graph& graph, const LoweringOptions& options, GraphLowering* parent,
                std::string name);
  void bind_inputs();
  void bind_formals(const std::vector<FormalInput>& formals);
  bool is_float_argument(const graph::Value& input) const;
  void specialize(const graph::Value& input, TensorValue& value);
  void lower_node(const graph::Node& node);
  /// Lowers `matmul` and the other MatMul + Add(bias) projections of its input (a transformer's
  /// Q, K and V) as one product against their weights concatenated along N, with the biases
  /// concatenated likewise (one GEMM with the bias in its epilogue: on CUDA a cuBLASLt call, on
  /// the CPU a GEMM choice); each Add's value is a column slice of it, a view. False (nothing
  /// lowered) unless `matmul` is the first of at least two such projections. On the CPU, one
  /// 128 x 256 x 768 product read through views, instead of three 256-column ones each followed
  /// by a kernel adding its bias while splitting the heads, took a transformer encoder layer's Q,
  /// K and V from about 0.40 to 0.29 ms (profiles; AMD EPYC, 2 threads).
  bool lower_concatenated_projections(const graph::Node& matmul);
  /// The value of `value`: from this graph, or captured from an enclosing one.
  const TensorValue& lookup(const graph::Value& value);
  TensorValue settle(TensorValue value, const graph::Value& out);
  void check_type(const TensorValue& value, const graph::Value& out);
  void bind_outputs();
  ir::OutputSpec run_time_typed_output(const graph::Value& out, const TensorValue& value,
                                       const std::vector<ir::OutputAlternative>& alternatives,
                                       std::set<std::string>& taken);
  void finish();
  std::string next_subgraph_name();

  const graph::Graph& graph_;
  ir::Program program_;
  LoweringContext ctx_;
  std::unordered_map<const graph::Value*, TensorValue> env_;
  /// Nodes already lowered with an earlier one (lower_concatenated_projections).
  std::set<const graph::Node*> lowered_with_others_;
  GraphLowering* parent_ = nullptr;  // set for a subgraph
  std::string name_;                 // "" for the main graph, "g<N>" for subgraphs
  std::vector<const graph::Value*> captures_;
  std::map<const graph::Value*, std::vector<ir::OutputAlternative>> run_time_types_;
  int subgraph_count_ = 0;  // main graph only: names handed out
};

}  // namespace kiln::lower
