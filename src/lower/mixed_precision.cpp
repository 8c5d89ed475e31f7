// The mixed-precision pass (mixed_precision.h): a copy of the model's graph, node by node, with
// each value held in the type its consumers need and Cast nodes where that changes.
#include "lower/mixed_precision.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
    find_batch_norm_folds();
    for (const auto& node : source_.nodes()) {
      if (!folded_away_.count(node.get())) copy_node(*node);
    }
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

  /// A tensor of `dims` holding `values`, in `dtype` (float32 or the half type).
  std::shared_ptr<graph::Tensor> tensor_in(const std::vector<int64_t>& dims,
                                           const std::vector<float>& values, DType dtype) const {
    auto t = std::make_shared<graph::Tensor>(dtype, dims);
    if (dtype == DType::kFloat32) {
      std::copy(values.begin(), values.end(), t->mutable_values<float>().begin());
      return t;
    }
    auto to = t->mutable_values<uint16_t>();
    for (size_t k = 0; k < values.size(); ++k) {
      to[k] = dtype == DType::kFloat16 ? graph::float_to_half(values[k])
                                       : graph::float_to_bfloat16(values[k]);
    }
    return t;
  }

  /// Conv -> BatchNormalization pairs (the convolution's output read by nothing else, every
  /// weight a float32 initializer): the normalization folds into the convolution's weight and
  /// bias, in float32 before either is rounded to the half type, so that the convolution's
  /// output goes on in the half type (a float32 BatchNormalization between two half
  /// convolutions would cost two casts and a kernel).
  void find_batch_norm_folds() {
    auto weight = [](const graph::Value* v) -> const graph::Tensor* {
      return v != nullptr && v->initializer() != nullptr &&
                     v->initializer()->dtype() == DType::kFloat32
                 ? v->initializer()
                 : nullptr;
    };
    for (const auto& node : source_.nodes()) {
      const graph::Node& bn = *node;
      if (bn.op_type() != "BatchNormalization" || !bn.domain().empty() || bn.inputs().size() != 5)
        continue;
      bool extra_outputs = false;
      for (size_t k = 1; k < bn.outputs().size(); ++k) extra_outputs |= bn.output(k) != nullptr;
      if (extra_outputs || bn.attr_int("training_mode", 0) != 0) continue;
      const graph::Value* y = bn.input(0);
      graph::Node* conv = y != nullptr ? y->producer() : nullptr;
      if (conv == nullptr || conv->op_type() != "Conv" || !conv->domain().empty() ||
          y->users().size() != 1)
        continue;
      bool model_output = false;
      for (const graph::Value* o : source_.outputs()) model_output |= o == y;
      const graph::Tensor* w = weight(conv->input(1));
      const graph::Tensor* b = conv->input(2) != nullptr ? weight(conv->input(2)) : nullptr;
      if (model_output || w == nullptr || w->rank() < 3 ||
          (conv->input(2) != nullptr && b == nullptr))
        continue;
      const int64_t m = w->dims()[0];
      const graph::Tensor* p[4];
      bool ok = true;
      for (int k = 0; k < 4; ++k) {
        p[k] = weight(bn.input(static_cast<size_t>(k) + 1));
        ok = ok && p[k] != nullptr && p[k]->numel() == m;
      }
      if (!ok || (b != nullptr && b->numel() != m)) continue;
      const double eps = bn.attr_float("epsilon", 1e-5f);
      Fold f;
      f.bn_output = bn.output(0);
      f.weight_dims = w->dims();
      f.weight.resize(static_cast<size_t>(w->numel()));
      f.bias.resize(static_cast<size_t>(m));
      const int64_t per_channel = w->numel() / m;
      for (int64_t c = 0; c < m; ++c) {
        const auto k = static_cast<size_t>(c);
        const double scale =
            double{p[0]->values<float>()[k]} / std::sqrt(double{p[3]->values<float>()[k]} + eps);
        const double bias = b != nullptr ? b->values<float>()[k] : 0.0;
        f.bias[k] = static_cast<float>((bias - p[2]->values<float>()[k]) * scale +
                                       p[1]->values<float>()[k]);
        for (int64_t e = 0; e < per_channel; ++e) {
          const auto at = static_cast<size_t>(c * per_channel + e);
          f.weight[at] = static_cast<float>(w->values<float>()[at] * scale);
        }
      }
      folds_[conv] = std::move(f);
      folded_away_.insert(&bn);
      ++report_.folded_batch_norms;
    }
  }

  void copy_node(const graph::Node& node) {
    OpClass cls = op_class(node);
    const auto fold = folds_.find(&node);
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
    for (size_t i = 0; i < node.inputs().size() || (fold != folds_.end() && i < 3); ++i) {
      if (fold != folds_.end() && i > 0) {
        // The folded weight and bias, new initializers in the type the convolution runs in.
        const Fold& f = fold->second;
        const DType t = in_half ? half_ : DType::kFloat32;
        const bool is_weight = i == 1;
        graph::Value* v =
            out_.graph->add_value(fresh(is_weight ? "kiln_folded_weight" : "kiln_folded_bias"),
                                  graph::Type::tensor(t, std::nullopt));
        out_.graph->set_initializer(
            v, is_weight ? tensor_in(f.weight_dims, f.weight, t)
                         : tensor_in({static_cast<int64_t>(f.bias.size())}, f.bias, t));
        inputs.push_back(v);
        continue;
      }
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
      // A folded convolution writes the normalization's output.
      const graph::Value* out = fold != folds_.end() ? fold->second.bn_output : node.output(k);
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
  struct Fold {
    const graph::Value* bn_output = nullptr;
    std::vector<int64_t> weight_dims;
    std::vector<float> weight, bias;  // float32, folded
  };
  std::map<const graph::Node*, Fold> folds_;  // Conv nodes taking a BatchNormalization in
  std::set<const graph::Node*> folded_away_;  // the BatchNormalizations folded
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
