// lower_graph: walks the model graph in order and applies each node's lowering, deciding where
// lazy values must be materialized; then tidies the Program (index simplification, unused
// constants). An If whose branches give different types to nodes that read them stops the walk;
// the graph is rewritten with those nodes in its branches and lowered again
// (branch_specialization.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lower/attention_fusion.h"
#include "lower/branch_specialization.h"
#include "lower/constant_fold.h"
#include "lower/graph_lowering.h"
#include "lower/op_util.h"
#include "support/error.h"
#include "support/identifier.h"
#include "support/log.h"

namespace kiln::lower {

using graph::DType;

namespace {

std::vector<sym::Expr> shape_of(const graph::Value& value) {
  const graph::Type& type = value.type();
  if (type.kind != graph::ValueKind::kTensor) {
    user_error("input '{}': {} inputs are not supported yet", value.name(), type.str());
  }
  if (type.dtype == DType::kString) {
    user_error("input '{}': string tensors are not supported", value.name());
  }
  if (!type.shape) user_error("input '{}': the model does not give its rank", value.name());
  return *type.shape;
}

/// How many times a value is consumed: by nodes (once per input slot) and as a graph output.
int use_count(const graph::Value& value, const graph::Graph& graph) {
  int uses = static_cast<int>(value.users().size());
  for (const graph::Value* out : graph.outputs()) uses += out == &value ? 1 : 0;
  return uses;
}

/// Simplifies every index of every computed body under the ranges of its loop variables, and
/// the known ranges of indirect symbols.
void simplify_indices(ir::Program& program) {
  for (auto& buffer : program.buffers) {
    if (buffer->kind != ir::BufferKind::kComputed) continue;
    sym::Analyzer analyzer = program.analyzer;
    ir::LoopBody& body = buffer->body;
    for (size_t k = 0; k < body.vars().size(); ++k)
      analyzer.bind_index(body.vars()[k], body.sizes()[k]);
    for (size_t k = 0; k < body.reduce_vars().size(); ++k) {
      analyzer.bind_index(body.reduce_vars()[k], body.reduce_sizes()[k]);
    }
    for (const ir::Op& op : body.ops()) {
      if (op.code == ir::OpCode::kIndirect) analyzer.bind_index(op.symbol, op.index);
    }
    body.map_indices([&](const sym::Expr& e) { return analyzer.simplify(e); });
  }
}

/// Drops constant buffers that no kernel or call reads.
void prune_unused_constants(ir::Program& program) {
  std::set<std::string> used;
  for (const auto& buffer : program.buffers) {
    for (const std::string& name : buffer->reads()) used.insert(name);
  }
  for (const ir::OutputSpec& out : program.outputs) used.insert(out.buffer);
  std::erase_if(program.buffers, [&](const std::unique_ptr<ir::Buffer>& b) {
    return b->kind == ir::BufferKind::kConstant && !used.count(b->name);
  });
}

}  // namespace

GraphLowering::GraphLowering(const graph::Graph& graph, const LoweringOptions& options)
    : graph_(graph), ctx_(program_, options) {
  ctx_.set_graph_lowering(this);
}

GraphLowering::GraphLowering(const graph::Graph& graph, const LoweringOptions& options,
                             GraphLowering* parent, std::string name)
    : graph_(graph), ctx_(program_, options), parent_(parent), name_(std::move(name)) {
  ctx_.set_graph_lowering(this);
}

ir::Program GraphLowering::run() {
  bind_inputs();
  finish();
  return std::move(program_);
}

void GraphLowering::finish() {
  for (const graph::Value* init : graph_.initializers()) {
    env_[init] = ctx_.from_constant(init->initializer_data());
  }
  for (const auto& node : graph_.nodes()) lower_node(*node);
  ctx_.set_node(nullptr);
  bind_outputs();
  simplify_indices(program_);
  finish_constant_folding(program_);
  prune_unused_constants(program_);
}

std::string GraphLowering::next_subgraph_name() {
  GraphLowering* root = this;
  while (root->parent_ != nullptr) root = root->parent_;
  return fmt::format("g{}", ++root->subgraph_count_);
}

LoweredSubgraph GraphLowering::lower_subgraph(const graph::Graph& graph,
                                              const std::vector<FormalInput>& formals) {
  if (formals.size() != graph.inputs().size()) {
    ctx_.fail(fmt::format("subgraph '{}' has {} inputs, expected {}", graph.name(),
                          graph.inputs().size(), formals.size()));
  }
  LoweringOptions options = ctx_.options();
  options.input_values.clear();  // a subgraph's inputs are not the model's
  // Control-flow subgraphs run on the host on every device (DeviceCodegen::subgraph_codegen):
  // they are lowered as for the CPU, whatever device runs the graph that calls them.
  options.device = ir::Device::kCpu;
  GraphLowering sub(graph, options, this, next_subgraph_name());
  const graph::Node& node = ctx_.node();
  sub.bind_formals(formals);
  sub.finish();
  ctx_.set_node(&node);
  for (const ir::BoundaryValue& out : sub.program_.output_values) {
    if (out.kind != graph::ValueKind::kTensor || out.optional) {
      ctx_.fail(
          fmt::format("subgraph output '{}' is a sequence or an optional; subgraphs that run "
                      "at run time return tensors only",
                      out.onnx_name));
    }
  }
  LoweredSubgraph lowered;
  lowered.subgraph = std::make_shared<ir::Subgraph>();
  lowered.subgraph->name = sub.name_;
  lowered.subgraph->formal_inputs = formals.size();
  lowered.subgraph->program = std::move(sub.program_);
  for (const graph::Value* captured : sub.captures_) lowered.captures.push_back(lookup(*captured));
  return lowered;
}

std::vector<TensorValue> GraphLowering::inline_graph(const graph::Graph& graph,
                                                     const std::vector<TensorValue>& formals) {
  const graph::Node& node = ctx_.node();
  if (formals.size() != graph.inputs().size()) {
    ctx_.fail(fmt::format("subgraph '{}' has {} inputs, expected {}", graph.name(),
                          graph.inputs().size(), formals.size()));
  }
  for (size_t k = 0; k < formals.size(); ++k) env_[graph.inputs()[k]] = formals[k];
  for (const graph::Value* init : graph.initializers()) {
    env_[init] = ctx_.from_constant(init->initializer_data());
  }
  for (const auto& inner : graph.nodes()) lower_node(*inner);
  ctx_.set_node(&node);
  std::vector<TensorValue> outputs;
  for (const graph::Value* out : graph.outputs()) outputs.push_back(lookup(*out));
  return outputs;
}

void GraphLowering::bind_formals(const std::vector<FormalInput>& formals) {
  for (size_t k = 0; k < formals.size(); ++k) {
    const graph::Value* input = graph_.inputs()[k];
    auto buffer = std::make_unique<ir::Buffer>();
    buffer->name = identifier(fmt::format("arg{}", k), input->name());
    buffer->kind = ir::BufferKind::kInput;
    buffer->dtype = formals[k].dtype;
    buffer->layout = ir::Layout::contiguous(formals[k].shape);
    program_.inputs.push_back({input->name(), buffer->name, buffer->dtype, buffer->layout.sizes});
    TensorValue value = ctx_.from_buffer(ctx_.add_buffer(std::move(buffer)));
    if (formals[k].iteration) {
      std::string symbol = "iter_" + name_;
      program_.dynamic_sizes.push_back({symbol, *ctx_.as_buffer(value)});
      value.known = std::vector<sym::Expr>{sym::Expr::symbol(symbol)};
    }
    env_[input] = std::move(value);
  }
}

const TensorValue& GraphLowering::lookup(const graph::Value& value) {
  auto it = env_.find(&value);
  if (it != env_.end()) return it->second;
  if (parent_ == nullptr) ctx_.fail(fmt::format("input '{}' has no value", value.name()));
  // A value of an enclosing graph: copied when known at compile time, else captured.
  const TensorValue& outer = parent_->lookup(value);
  if (outer.sequence) {
    ctx_.fail(
        fmt::format("the subgraph reads the sequence '{}' of an enclosing graph; Kiln "
                    "passes only tensors into subgraphs",
                    value.name()));
  }
  bool static_known = outer.known.has_value();
  for (const sym::Expr& e : outer.known.value_or(std::vector<sym::Expr>{}))
    static_known = static_known && e.is_integer();
  for (const sym::Expr& d : outer.shape) static_known = static_known && d.is_integer();
  if (static_known) return env_[&value] = ctx_.from_known(outer.dtype, outer.shape, *outer.known);
  if (std::optional<std::string> name = parent_->ctx_.as_buffer(outer)) {
    const ir::Buffer* buffer = parent_->program_.find(*name);
    if (buffer->kind == ir::BufferKind::kConstant)
      return env_[&value] = ctx_.from_constant(buffer->constant);
  }
  auto buffer = std::make_unique<ir::Buffer>();
  buffer->name = identifier(fmt::format("cap{}", captures_.size()), value.name());
  buffer->kind = ir::BufferKind::kInput;
  buffer->dtype = outer.dtype;
  buffer->layout = ir::Layout::contiguous(outer.shape);
  program_.inputs.push_back({value.name(), buffer->name, buffer->dtype, buffer->layout.sizes});
  captures_.push_back(&value);
  return env_[&value] = ctx_.from_buffer(ctx_.add_buffer(std::move(buffer)));
}

void GraphLowering::bind_inputs() {
  int k = 0;
  for (const graph::Value* input : graph_.inputs()) {
    const graph::Type& type = input->type();
    ir::BoundaryValue boundary{input->name(), type.kind, false, true, program_.inputs.size(), 1};
    auto add_input = [&](std::string onnx_name, DType dtype, std::vector<sym::Expr> shape) {
      auto buffer = std::make_unique<ir::Buffer>();
      buffer->name = identifier(fmt::format("arg{}", k++), onnx_name);
      buffer->kind = ir::BufferKind::kInput;
      buffer->dtype = dtype;
      buffer->layout = ir::Layout::contiguous(std::move(shape));
      program_.inputs.push_back({onnx_name, buffer->name, dtype, buffer->layout.sizes});
      return ctx_.from_buffer(ctx_.add_buffer(std::move(buffer)));
    };
    if (type.kind == graph::ValueKind::kTensor) {
      TensorValue value = add_input(input->name(), type.dtype, shape_of(*input));
      specialize(*input, value);
      env_[input] = std::move(value);
      program_.input_values.push_back(boundary);
      continue;
    }
    // A sequence or an optional: its structure comes from the value given when compiling.
    auto given = ctx_.options().structured_inputs.find(input->name());
    if (given == ctx_.options().structured_inputs.end()) {
      user_error(
          "input '{}' is a {}: Kiln fixes a sequence's length and an optional's presence when "
          "compiling, so give its value",
          input->name(), type.str());
    }
    const graph::IoValue& v = given->second;
    const graph::Type& content =
        type.kind == graph::ValueKind::kOptional && type.element ? *type.element : type;
    const graph::Type* element = content.kind == graph::ValueKind::kSequence && content.element
                                     ? content.element.get()
                                     : &content;
    boundary.kind = content.kind;
    boundary.optional = type.kind == graph::ValueKind::kOptional;
    boundary.present = v.present;
    boundary.count = v.present ? v.tensors.size() : 0;
    if (v.kind != content.kind || boundary.optional != v.optional) {
      user_error("input '{}': the model says {}, the value given is {}", input->name(), type.str(),
                 v.str());
    }
    TensorValue value;
    value.dtype = element->dtype;
    value.optional = boundary.optional;
    value.none = !v.present;
    std::vector<TensorValue> elements;
    for (size_t e = 0; e < boundary.count; ++e) {
      const graph::Tensor& t = v.tensors[e];
      // Static dims the model declares stay; the others are symbols of this element (the
      // elements of a sequence may differ in any dim the model leaves symbolic).
      bool declared = element->shape && element->shape->size() == static_cast<size_t>(t.rank());
      std::vector<sym::Expr> shape;
      for (int64_t d = 0; d < t.rank(); ++d) {
        const sym::Expr* dim = declared ? &(*element->shape)[static_cast<size_t>(d)] : nullptr;
        shape.push_back(dim && dim->is_integer()
                            ? *dim
                            : sym::Expr::symbol(fmt::format("{}[{}].d{}", input->name(), e, d)));
      }
      bool sequence = content.kind == graph::ValueKind::kSequence;
      elements.push_back(add_input(
          sequence ? fmt::format("{}[{}]", input->name(), e) : input->name(), t.dtype(), shape));
    }
    if (content.kind == graph::ValueKind::kSequence) {
      value.sequence = std::make_shared<const std::vector<TensorValue>>(std::move(elements));
    } else if (v.present) {
      elements[0].optional = true;
      value = std::move(elements[0]);
    }
    env_[input] = std::move(value);
    program_.input_values.push_back(boundary);
  }
}

/// True when a node reads `input` at an operand whose value its lowering needs when compiling
/// (Resize's roi and scales, Range's bounds, OneHot's depth, Dropout's ratio, ...): floating
/// inputs are specialized only then, since they are usually data.
bool GraphLowering::is_float_argument(const graph::Value& input) const {
  static const std::map<std::string, std::set<size_t>> kArguments = {{"Resize", {1, 2}},
                                                                     {"Upsample", {1}},
                                                                     {"Dropout", {1}},
                                                                     {"NonMaxSuppression", {3, 4}},
                                                                     {"MelWeightMatrix", {3, 4}},
                                                                     {"Pad", {2}},
                                                                     {"OneHot", {1}},
                                                                     {"Range", {0, 1, 2}}};
  for (const auto& node : graph_.nodes()) {
    auto it = kArguments.find(node->op_type());
    if (it == kArguments.end() || !node->domain().empty()) continue;
    for (size_t slot : it->second) {
      if (node->input(slot) == &input) return true;
    }
  }
  return false;
}

/// Gives a small input (rank <= 1, at most kMaxSpecializedElements values: a shape argument, a
/// flag, Dropout's ratio, Resize's scales) its compile-time values, guarded at run time.
void GraphLowering::specialize(const graph::Value& input, TensorValue& value) {
  auto it = ctx_.options().input_values.find(input.name());
  if (it == ctx_.options().input_values.end()) return;
  const graph::Tensor& t = *it->second;
  bool integer =
      t.dtype() == DType::kInt64 || t.dtype() == DType::kInt32 || t.dtype() == DType::kBool;
  bool floating =
      (t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat64) && is_float_argument(input);
  if (!(integer || floating) || t.dtype() != value.dtype || t.rank() > 1 ||
      t.numel() > kMaxSpecializedElements || static_cast<size_t>(t.rank()) != value.rank()) {
    return;
  }
  if (t.rank() == 1 && value.shape[0] != sym::Expr(t.numel())) return;
  ir::ValueGuard guard{*ctx_.as_buffer(value), input.name(), {}};
  if (floating) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = t.element_as_double(i);
      if (!std::isfinite(v)) return;
      guard.values.push_back(v);
    }
    value.known_float = guard.values;
  } else {
    std::vector<sym::Expr> known;
    for (int64_t i = 0; i < t.numel(); ++i) {
      known.emplace_back(t.element_as_int64(i));
      guard.values.push_back(static_cast<double>(t.element_as_int64(i)));
    }
    value.known = std::move(known);
  }
  program_.value_guards.push_back(std::move(guard));
}

void GraphLowering::lower_node(const graph::Node& node) {
  if (lowered_with_others_.count(&node)) return;  // its outputs are set already
  ctx_.set_node(&node);
  const OpLowering* lowering = Registry::instance().find(node.domain(), node.op_type());
  if (lowering == nullptr) {
    ctx_.fail(fmt::format("op {}{} is not supported by Kiln",
                          node.domain().empty() ? "" : node.domain() + ".", node.op_type()));
  }
  if (node.domain().empty() &&
      (node.opset() < lowering->min_opset || node.opset() > lowering->max_opset)) {
    ctx_.fail(fmt::format("opset {} of {} is not supported (Kiln supports opsets {} to {})",
                          node.opset(), node.op_type(), lowering->min_opset, lowering->max_opset));
  }
  // Attention written node by node, ending at this MatMul, as one fused kernel.
  if (node.domain().empty() && node.op_type() == "MatMul") {
    std::optional<TensorValue> fused = fuse_attention(
        ctx_, node, [&](const graph::Value& v) -> const TensorValue& { return lookup(v); },
        [&](const graph::Value& v) { return use_count(v, graph_); });
    if (fused) {
      log::write(log::Category::kFusion, "{}: attention fused into one kernel", node.describe());
      env_[node.outputs()[0]] = settle(std::move(*fused), *node.outputs()[0]);
      return;
    }
  }
  if (node.domain().empty() && node.op_type() == "MatMul" && lower_concatenated_projections(node)) {
    return;
  }
  std::vector<std::optional<TensorValue>> inputs;
  for (const graph::Value* in : node.inputs()) {
    if (in == nullptr) {
      inputs.emplace_back();
      continue;
    }
    inputs.emplace_back(lookup(*in));
  }
  std::vector<TensorValue> outputs = lowering->fn(ctx_, node, inputs);
  // Lazy outputs remember every node folded into them: this one and its lazy inputs'. A view
  // of a buffer (a channels-last one read as NCHW included) folds no node.
  auto stored = [&](const TensorValue& v) {
    if (ctx_.as_buffer(v)) return true;
    return ctx_.reads_channels_last(v) && ctx_.as_buffer(ctx_.to_channels_last(v)).has_value();
  };
  std::vector<ir::Origin> origins = {{node.name(), node.op_type()}};
  for (const auto& in : inputs) {
    if (in && !stored(*in)) origins.insert(origins.end(), in->origins.begin(), in->origins.end());
  }
  std::sort(origins.begin(), origins.end());
  origins.erase(std::unique(origins.begin(), origins.end()), origins.end());
  for (TensorValue& out : outputs) {
    if (!stored(out)) out.origins = origins;
  }
  for (size_t k = 0; k < node.outputs().size(); ++k) {
    const graph::Value* out = node.outputs()[k];
    if (out == nullptr) continue;
    if (k >= outputs.size())
      ctx_.fail(fmt::format("output {} ('{}') is not supported", k, out->name()));
    env_[out] = settle(std::move(outputs[k]), *out);
  }
}

bool GraphLowering::lower_concatenated_projections(const graph::Node& matmul) {
  // A projection: MatMul(x, W) with W a float32 [K, N] initializer, read only by an Add of a
  // float32 [N] initializer (the bias).
  struct Projection {
    const graph::Node* matmul;
    const graph::Node* add;
    const graph::Tensor* weight;
    const graph::Tensor* bias;
  };
  auto projection = [&](const graph::Node& mm) -> std::optional<Projection> {
    if (!mm.domain().empty() || mm.op_type() != "MatMul" || mm.inputs().size() != 2 ||
        mm.outputs().size() != 1 || mm.inputs()[0] != matmul.inputs()[0] ||
        mm.inputs()[1] == nullptr) {
      return std::nullopt;
    }
    const graph::Tensor* w = mm.inputs()[1]->initializer();
    if (w == nullptr || w->dtype() != DType::kFloat32 || w->dims().size() != 2) return std::nullopt;
    const graph::Value* y = mm.outputs()[0];
    if (y == nullptr || y->users().size() != 1 || use_count(*y, graph_) != 1) return std::nullopt;
    const graph::Node* add = y->users()[0];
    if (!add->domain().empty() || add->op_type() != "Add" || add->inputs().size() != 2 ||
        add->outputs().size() != 1) {
      return std::nullopt;
    }
    const graph::Value* b = add->inputs()[0] == y ? add->inputs()[1] : add->inputs()[0];
    if (b == nullptr || b == y) return std::nullopt;
    const graph::Tensor* bias = b->initializer();
    if (bias == nullptr || bias->dtype() != DType::kFloat32 ||
        bias->dims() != std::vector<int64_t>{w->dims()[1]}) {
      return std::nullopt;
    }
    return Projection{&mm, add, w, bias};
  };
  const graph::Value* x = matmul.inputs().empty() ? nullptr : matmul.inputs()[0];
  if (x == nullptr || !projection(matmul)) return false;
  std::vector<Projection> group;
  for (const graph::Node* user : x->users()) {
    const std::optional<Projection> p = projection(*user);
    if (!p || p->weight->dims()[0] != projection(matmul)->weight->dims()[0]) continue;
    if (std::any_of(group.begin(), group.end(),
                    [&](const Projection& q) { return q.matmul == user; }))
      continue;  // x read twice by one node
    group.push_back(*p);
  }
  // Only from the first of them (node order), and only when there is more than one.
  if (group.size() < 2 || group[0].matmul != &matmul) return false;
  const int64_t k = group[0].weight->dims()[0];
  int64_t n = 0;
  for (const Projection& p : group) n += p.weight->dims()[1];
  auto weight = std::make_shared<graph::Tensor>(DType::kFloat32, std::vector<int64_t>{k, n});
  auto bias = std::make_shared<graph::Tensor>(DType::kFloat32, std::vector<int64_t>{n});
  {
    auto w = weight->mutable_values<float>();
    auto b = bias->mutable_values<float>();
    int64_t column = 0;
    for (const Projection& p : group) {
      const int64_t width = p.weight->dims()[1];
      const auto from = p.weight->values<float>();
      for (int64_t r = 0; r < k; ++r)
        std::copy_n(from.begin() + r * width, width, w.begin() + r * n + column);
      std::copy_n(p.bias->values<float>().begin(), width, b.begin() + column);
      column += width;
    }
  }
  const Registry& registry = Registry::instance();
  std::vector<std::optional<TensorValue>> product_inputs = {lookup(*x), ctx_.from_constant(weight)};
  std::vector<TensorValue> product = registry.find("", "MatMul")->fn(ctx_, matmul, product_inputs);
  ctx_.set_node(group[0].add);
  std::vector<std::optional<TensorValue>> sum_inputs = {product.at(0), ctx_.from_constant(bias)};
  std::vector<TensorValue> sum = registry.find("", "Add")->fn(ctx_, *group[0].add, sum_inputs);
  // One buffer (the product with its bias: an epilogue), read through column slices.
  const TensorValue all = ctx_.realize(sum.at(0), "concatenated projections");
  log::write(log::Category::kFusion, "{}: {} projections of one input as one product (N = {})",
             matmul.describe(), group.size(), n);
  int64_t column = 0;
  for (const Projection& p : group) {
    ctx_.set_node(p.add);
    std::vector<sym::Expr> shape = all.shape;
    shape.back() = sym::Expr(p.weight->dims()[1]);
    const sym::Expr offset(column);
    TensorValue slice = make_view(ctx_, all, shape, [offset](const std::vector<sym::Expr>& index) {
      std::vector<sym::Expr> at = index;
      at.back() = at.back() + offset;
      return at;
    });
    env_[p.add->outputs()[0]] = settle(std::move(slice), *p.add->outputs()[0]);
    lowered_with_others_.insert(p.matmul);
    lowered_with_others_.insert(p.add);
    column += p.weight->dims()[1];
  }
  ctx_.set_node(&matmul);
  return true;
}

/// Decides whether a freshly lowered value stays lazy (inlined into its users), is folded into
/// a constant (it depends only on constants), or is materialized now.
TensorValue GraphLowering::settle(TensorValue value, const graph::Value& out) {
  if (value.sequence || value.none) return value;  // a sequence's tensors settled when made
  check_type(value, out);
  // Values with known contents stay lazy, but for a transposed float constant (see
  // is_small_transposing_view), which is folded.
  const bool transposed =
      value.known_float && value.body && is_small_transposing_view(program_, *value.body);
  if ((value.known || value.known_float) && !transposed) return value;
  if (std::optional<TensorValue> folded = fold_constant(ctx_, value)) return *folded;
  int uses = use_count(out, graph_);
  int ops = value.body->compute_op_count();
  // A value over channels-last buffers is stored channels-last too (lower/nn.cpp).
  const bool last = ctx_.reads_channels_last(value);
  if (uses > 1 && ops > 0) {
    const std::string reason = fmt::format("{} users", uses);
    return last ? ctx_.realize_channels_last(value, reason) : ctx_.realize(value, reason);
  }
  if (ops > ctx_.options().max_inline_ops) {
    return last ? ctx_.realize_channels_last(value, "large body")
                : ctx_.realize(value, "large body");
  }
  return value;
}

void GraphLowering::check_type(const TensorValue& value, const graph::Value& out) {
  if (run_time_types_.count(&out)) return;  // its lowered type is a placeholder
  const graph::Type& type = out.type();
  if (type.kind != graph::ValueKind::kTensor || type.dtype == DType::kUndefined) return;
  KILN_CHECK(type.dtype == value.dtype, "{}: output '{}' lowered as {}, model says {}",
             ctx_.node().describe(), out.name(), graph::dtype_name(value.dtype),
             graph::dtype_name(type.dtype));
  if (type.shape) {
    KILN_CHECK(type.shape->size() == value.rank(),
               "{}: output '{}' lowered with rank {}, model says {}", ctx_.node().describe(),
               out.name(), value.rank(), type.shape->size());
  }
}

void GraphLowering::set_run_time_type(const graph::Value& value,
                                      std::vector<ir::OutputAlternative> alternatives) {
  run_time_types_[&value] = std::move(alternatives);
}

/// An output whose rank or dtype only a run tells: the If's result itself, whose run-time type
/// the wrapper hands over.
ir::OutputSpec GraphLowering::run_time_typed_output(
    const graph::Value& out, const TensorValue& value,
    const std::vector<ir::OutputAlternative>& alternatives, std::set<std::string>& taken) {
  std::optional<std::string> buffer = ctx_.as_buffer(value);
  KILN_CHECK(buffer && ir::is_control_flow_result(*program_.find(*buffer)),
             "output '{}' of a run-time type is not an If's result", out.name());
  if (!taken.insert(*buffer).second) {
    user_error("output '{}': the same value of a rank known only after a run is returned twice",
               out.name());
  }
  DType dtype = alternatives.at(0).dtype;
  for (const ir::OutputAlternative& a : alternatives) {
    if (a.dtype != dtype) dtype = DType::kUndefined;
  }
  return {out.name(), *buffer, dtype, {}, alternatives};
}

void GraphLowering::bind_outputs() {
  std::set<std::string> taken;
  // A graph output that aliases an input, a constant or another output gets its own copy.
  auto output_buffer = [&](const TensorValue& value) {
    std::optional<std::string> existing = ctx_.as_buffer(value);
    const ir::Buffer* buffer = existing ? program_.find(*existing) : nullptr;
    bool own =
        buffer != nullptr && !taken.count(buffer->name) &&
        (buffer->kind == ir::BufferKind::kComputed || buffer->kind == ir::BufferKind::kExtern);
    std::string name;
    if (own) {
      name = buffer->name;
    } else {
      TensorValue copy = value;
      copy.known.reset();
      copy.known_float.reset();
      if (buffer != nullptr && value.origins.empty()) copy.origins = buffer->origins;
      name = *ctx_.as_buffer(ctx_.realize(copy, "graph output", /*copy=*/true));
    }
    taken.insert(name);
    return name;
  };
  for (const graph::Value* out : graph_.outputs()) {
    const TensorValue& value = lookup(*out);
    ir::BoundaryValue boundary{out->name(), graph::ValueKind::kTensor, value.optional,
                               !value.none, program_.outputs.size(),   1};
    auto run_time = run_time_types_.find(out);
    if (run_time != run_time_types_.end()) {
      program_.outputs.push_back(run_time_typed_output(*out, value, run_time->second, taken));
    } else if (value.sequence) {
      boundary.kind = graph::ValueKind::kSequence;
      boundary.count = value.none ? 0 : value.sequence->size();
      for (size_t e = 0; e < boundary.count; ++e) {
        const TensorValue& element = (*value.sequence)[e];
        program_.outputs.push_back({fmt::format("{}[{}]", out->name(), e), output_buffer(element),
                                    element.dtype, element.shape});
      }
    } else if (value.none) {
      boundary.count = 0;
    } else {
      program_.outputs.push_back({out->name(), output_buffer(value), value.dtype, value.shape});
    }
    program_.output_values.push_back(boundary);
  }
}

namespace {

// Whether ConvLayout::kAuto runs `graph` channels-last: it has a depthwise convolution (W
// [M, 1, ...] with group > 1) or kChannelsLastMinConvs float32 2-D convolutions (on CUDA also
// float16 and bfloat16 ones: cuDNN runs them channels-last on the tensor cores).
bool is_convolution_network(const graph::Graph& graph, ir::Device device) {
  int convs = 0;
  for (const auto& node : graph.nodes()) {
    if (node->op_type() != "Conv" || !node->domain().empty()) continue;
    const graph::Value* w = node->input(1);
    if (w == nullptr || !w->type().shape || w->type().shape->size() != 4) continue;
    if (node->attr_int("group", 1) > 1 && (*w->type().shape)[1] == sym::Expr(1)) return true;
    const graph::DType dtype = w->type().dtype;
    if (dtype == graph::DType::kFloat32 ||
        (device == ir::Device::kCuda &&
         (dtype == graph::DType::kFloat16 || dtype == graph::DType::kBFloat16))) {
      ++convs;
    }
  }
  return convs >= kChannelsLastMinConvs;
}

}  // namespace

ir::Program lower_graph(const graph::Graph& graph, const LoweringOptions& given) {
  LoweringOptions options = given;
  if (options.conv_layout == ConvLayout::kAuto) {
    options.conv_layout = is_convolution_network(graph, options.device) ? ConvLayout::kChannelsLast
                                                                        : ConvLayout::kNchw;
  }
  BranchSpecializer specializer(graph);
  for (;;) {
    try {
      return GraphLowering(specializer.graph(), options).run();
    } catch (const BranchMismatch& mismatch) {
      specializer.specialize(mismatch);
    }
  }
}

}  // namespace kiln::lower
