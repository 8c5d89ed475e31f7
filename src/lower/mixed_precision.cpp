// The mixed-precision pass (mixed_precision.h): a copy of the model's graph, node by node, with
// each value held in the type its consumers need and Cast nodes where that changes.
#include "lower/mixed_precision.h"

#include <map>
#include <set>
#include <utility>

#include "graph/tensor.h"
#include "support/error.h"

namespace kiln::lower {

namespace {

using graph::DType;

/// How an op takes float32 inputs under the pass.
enum class OpClass {
  kHalf,     // always in the half type: matrix products and convolutions
  kFollow,   // in the half type when its float inputs (weights aside) are, else float32
  kFloat32,  // always in float32
};

OpClass op_class(const graph::Node& node) {
  if (!node.domain().empty() && node.domain() != "ai.onnx") return OpClass::kFloat32;
  static const std::set<std::string, std::less<>> half = {"MatMul", "Gemm", "Conv",
                                                          "ConvTranspose"};
  // Ops whose result in the half type is the exact rounding of their float32 result (data
  // movement, comparisons-free selections, Relu, Max) or within a rounding or two of it (one
  // add, multiply or bounded activation per element); none sums many elements or grows the
  // range of its input as exp does.
  static const std::set<std::string, std::less<>> follow = {
      "Relu",        "LeakyRelu", "Add",    "Sub",          "Mul",          "Div",      "Neg",
      "Abs",         "Max",       "Min",    "Clip",         "Sigmoid",      "Tanh",     "Gelu",
      "HardSigmoid", "HardSwish", "Where",  "Reshape",      "Transpose",    "Flatten",  "Squeeze",
      "Unsqueeze",   "Slice",     "Gather", "Concat",       "Split",        "Identity", "Expand",
      "MaxPool",     "Pad",       "Tile",   "DepthToSpace", "SpaceToDepth", "Dropout",  "PRelu"};
  if (half.count(node.op_type())) return OpClass::kHalf;
  if (follow.count(node.op_type())) return OpClass::kFollow;
  return OpClass::kFloat32;
}

/// Whether input `i` of a kFollow or kHalf node is data that follows the node's type (Where's
/// condition and every non-float input are left alone by the dtype check already; Dropout's
/// ratio is a float that stays float32).
bool follows(const graph::Node& node, size_t i) {
  if (node.op_type() == "Dropout") return i == 0;
  return true;
}

/// Float32 ops whose first output has the type of their first input (for models without
/// inferred types: the pass derives the dtypes of untyped values through these and the kHalf
/// and kFollow ops).
bool keeps_input_type(const graph::Node& node) {
  static const std::set<std::string, std::less<>> ops = {"Softmax",
                                                         "LogSoftmax",
                                                         "LayerNormalization",
                                                         "BatchNormalization",
                                                         "ReduceMean",
                                                         "ReduceSum",
                                                         "ReduceMax",
                                                         "ReduceMin",
                                                         "ReduceL2",
                                                         "ReduceProd",
                                                         "Exp",
                                                         "Log",
                                                         "Sqrt",
                                                         "Pow",
                                                         "Erf",
                                                         "Reciprocal",
                                                         "AveragePool",
                                                         "GlobalAveragePool",
                                                         "GlobalMaxPool",
                                                         "InstanceNormalization",
                                                         "Sin",
                                                         "Cos",
                                                         "GroupNormalization",
                                                         "Elu",
                                                         "Softplus",
                                                         "CumSum",
                                                         "Mish",
                                                         "Selu"};
  return ops.count(node.op_type()) != 0;
}

/// Ops that read a float input of either type as it is: Cast (its output type is its "to"),
/// Shape and Size (only the dims).
bool reads_any_type(const graph::Node& node) {
  const std::string& op = node.op_type();
  return op == "Cast" || op == "Shape" || op == "Size";
}

class Pass {
 public:
  Pass(const graph::Model& model, DType half, MixedPrecisionReport& report)
      : source_(*model.graph), half_(half), report_(report) {
    out_.path = model.path;
    out_.ir_version = model.ir_version;
    out_.producer_name = model.producer_name;
    out_.opsets = model.opsets;
    out_.graph = std::make_unique<graph::Graph>(source_.name());
    for (const auto& v : source_.values()) taken_.insert(v->name());
  }

  graph::Model run() {
    graph::Graph& g = *out_.graph;
    // Model inputs and initializers keep their names and types.
    for (const graph::Value* v : source_.inputs()) {
      graph::Value* copy = define(*v, v->type());
      g.add_input(copy);
    }
    for (const graph::Value* v : source_.initializers()) {
      graph::Value* copy = g.find_local_value(v->name());
      if (copy == nullptr) copy = define(*v, v->type());
      g.set_initializer(copy, v->initializer_data());
    }
    for (const auto& node : source_.nodes()) copy_node(*node);
    for (const graph::Value* v : source_.outputs()) {
      graph::Value* now = current_.at(v->name());
      if (now->name() != v->name()) {
        // The producer wrote a renamed half value: the output under its own name, float32.
        graph::Value* named =
            g.add_value(v->name(), graph::Type::tensor(DType::kFloat32, v->type().shape));
        cast(now, named);
        now = named;
      }
      g.add_output(now);
    }
    return std::move(out_);
  }

 private:
  /// The value `v` of the source graph, copied into the new one with `type` under its name.
  graph::Value* define(const graph::Value& v, graph::Type type) {
    graph::Value* copy = out_.graph->add_value(v.name(), std::move(type));
    current_[v.name()] = copy;
    return copy;
  }

  std::string fresh(const std::string& stem) {
    for (;;) {
      std::string name = stem + "_" + std::to_string(next_++);
      if (taken_.insert(name).second) return name;
    }
  }

  /// The original dtype of `v`: its declared one, else what the pass derived.
  DType dtype_of(const graph::Value& v) const {
    if (v.type().kind != graph::ValueKind::kTensor) return DType::kUndefined;
    if (v.type().dtype != DType::kUndefined) return v.type().dtype;
    auto it = derived_.find(v.name());
    return it == derived_.end() ? DType::kUndefined : it->second;
  }

  bool is_constant(const graph::Value& v) const {
    return v.initializer() != nullptr ||
           (v.producer() != nullptr && v.producer()->op_type() == "Constant");
  }

  /// Inserts `to` = Cast(`from`) to `to`'s dtype.
  void cast(graph::Value* from, graph::Value* to) {
    out_.graph->add_node(fresh("kiln_autocast"), "Cast", "", 13, {from}, {to},
                         {{"to", static_cast<int64_t>(to->type().dtype)}});
    ++report_.casts;
  }

  /// The new graph's value holding source value `v` in `dtype` (float32 or the half type).
  graph::Value* as(const graph::Value& v, DType dtype) {
    graph::Value* now = current_.at(v.name());
    if (now->type().dtype == dtype ||
        (now->type().dtype == DType::kUndefined && dtype_of(v) == dtype))
      return now;
    auto key = std::make_pair(v.name(), dtype);
    if (auto it = converted_.find(key); it != converted_.end()) return it->second;
    graph::Value* result =
        out_.graph->add_value(fresh(dtype == DType::kFloat32 ? "kiln_fp32" : "kiln_half"),
                              graph::Type::tensor(dtype, v.type().shape));
    if (v.initializer() != nullptr && now->initializer() != nullptr &&
        v.initializer()->dtype() == DType::kFloat32 && dtype == half_) {
      // A weight: converted now, once.
      const graph::Tensor& w = *v.initializer();
      auto t = std::make_shared<graph::Tensor>(half_, w.dims());
      auto from = w.values<float>();
      auto to = t->mutable_values<uint16_t>();
      for (size_t k = 0; k < from.size(); ++k) {
        to[k] = half_ == DType::kFloat16 ? graph::float_to_half(from[k])
                                         : graph::float_to_bfloat16(from[k]);
      }
      out_.graph->set_initializer(result, std::move(t));
      ++report_.converted_weights;
    } else {
      cast(now, result);
    }
    converted_[key] = result;
    return result;
  }

  void copy_node(const graph::Node& node) {
    OpClass cls = op_class(node);
    // Float inputs: which are float32 (or already half), which come from outside the weights.
    bool any_float = false, unknown = false, half_data = false, float_data = false;
    for (size_t i = 0; i < node.inputs().size(); ++i) {
      const graph::Value* in = node.input(i);
      if (in == nullptr || !follows(node, i)) continue;
      DType t = dtype_of(*in);
      if (t == DType::kUndefined) {
        unknown = true;
        continue;
      }
      if (t != DType::kFloat32) continue;
      any_float = true;
      if (is_constant(*in)) continue;
      (current_.at(in->name())->type().dtype == half_ ? half_data : float_data) = true;
    }
    bool in_half = false;
    if (cls == OpClass::kHalf) in_half = any_float && !unknown;
    if (cls == OpClass::kFollow) in_half = any_float && !unknown && half_data && !float_data;

    std::vector<graph::Value*> inputs;
    for (size_t i = 0; i < node.inputs().size(); ++i) {
      const graph::Value* in = node.input(i);
      if (in == nullptr) {
        inputs.push_back(nullptr);
        continue;
      }
      const bool is_float = dtype_of(*in) == DType::kFloat32;
      if (reads_any_type(node)) {
        // As it is stored: the op converts it, or reads only its dims.
        inputs.push_back(current_.at(in->name()));
      } else if (is_float && in_half && follows(node, i)) {
        inputs.push_back(as(*in, half_));
      } else if (is_float) {
        inputs.push_back(as(*in, DType::kFloat32));
      } else {
        inputs.push_back(current_.at(in->name()));
      }
    }
    std::vector<graph::Value*> outputs;
    for (size_t k = 0; k < node.outputs().size(); ++k) {
      const graph::Value* out = node.output(k);
      if (out == nullptr) {
        outputs.push_back(nullptr);
        continue;
      }
      DType t = dtype_of(*out);
      const bool typed_like_input = cls != OpClass::kFloat32
                                        ? !(node.op_type() == "MaxPool" && k == 1)
                                        : k == 0 && keeps_input_type(node);
      if (t == DType::kUndefined && typed_like_input) {
        // Outputs of these ops have their data input's type (Where: its X).
        const graph::Value* data = node.input(node.op_type() == "Where" ? 1 : 0);
        if (data != nullptr) t = dtype_of(*data);
      }
      if (t != DType::kUndefined) derived_[out->name()] = t;
      if (t == DType::kFloat32 && in_half) {
        graph::Type type = graph::Type::tensor(half_, out->type().shape);
        bool model_output = false;
        for (const graph::Value* o : source_.outputs()) model_output |= o == out;
        graph::Value* v = model_output ? out_.graph->add_value(fresh("kiln_half"), std::move(type))
                                       : out_.graph->add_value(out->name(), std::move(type));
        current_[out->name()] = v;
        report_.half_values.push_back(out->name());
        outputs.push_back(v);
      } else {
        outputs.push_back(define(*out, out->type()));
      }
    }
    out_.graph->add_node(node.name(), node.op_type(), node.domain(), node.opset(),
                         std::move(inputs), std::move(outputs), node.attributes());
  }

  const graph::Graph& source_;
  DType half_;
  MixedPrecisionReport& report_;
  graph::Model out_;
  std::map<std::string, graph::Value*> current_;  // source value -> its value in out_
  std::map<std::string, DType> derived_;          // dtypes of untyped values, found on the way
  std::map<std::pair<std::string, DType>, graph::Value*> converted_;
  std::set<std::string> taken_;
  int next_ = 0;
};

}  // namespace

std::optional<graph::Model> to_mixed_precision(const graph::Model& model, DType half,
                                               MixedPrecisionReport* report) {
  KILN_CHECK(half == DType::kFloat16 || half == DType::kBFloat16,
             "mixed precision into {}: expected float16 or bfloat16", graph::dtype_name(half));
  MixedPrecisionReport local;
  MixedPrecisionReport& r = report != nullptr ? *report : local;
  r = {};
  for (const auto& node : model.graph->nodes()) {
    if (!node->subgraphs().empty()) {
      r.skipped = node->describe() + " has subgraphs; the model stays float32";
      break;
    }
  }
  if (!r.skipped.empty()) return std::nullopt;
  return Pass(model, half, r).run();
}

}  // namespace kiln::lower
