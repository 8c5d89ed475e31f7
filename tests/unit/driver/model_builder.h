#pragma once
// Builds small ai.onnx models node by node for the driver tests.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace kiln::driver::test_models {

class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset = 13) : opset_(opset) {
    model.graph = std::make_unique<graph::Graph>("main");
    model.ir_version = 8;
    model.opsets[""] = opset;
  }

  graph::Value* input(const std::string& name, graph::DType dtype, graph::Shape shape) {
    graph::Value* v = model.graph->add_value(name, graph::Type::tensor(dtype, std::move(shape)));
    model.graph->add_input(v);
    return v;
  }
  graph::Value* constant(graph::Tensor t) {
    graph::Value* v =
        model.graph->add_value(fresh("c"), graph::Type::tensor(t.dtype(), std::nullopt));
    model.graph->set_initializer(v, std::make_shared<graph::Tensor>(std::move(t)));
    return v;
  }
  graph::Value* ints(std::vector<int64_t> values, std::vector<int64_t> dims) {
    graph::Tensor t(graph::DType::kInt64, std::move(dims));
    std::copy(values.begin(), values.end(), t.mutable_values<int64_t>().begin());
    return constant(std::move(t));
  }
  graph::Value* op(const std::string& op, std::vector<graph::Value*> inputs,
                   std::map<std::string, graph::AttributeValue> attrs = {}, std::string name = "") {
    graph::Value* out = model.graph->add_value(fresh("v"), graph::Type());
    model.graph->add_node(name.empty() ? fresh(op) : name, op, "", opset_, std::move(inputs), {out},
                          std::move(attrs));
    return out;
  }
  void output(graph::Value* v) { model.graph->add_output(v); }

  graph::Model model;

 private:
  std::string fresh(const std::string& prefix) { return prefix + std::to_string(next_++); }
  int64_t opset_;
  int next_ = 0;
};

}  // namespace kiln::driver::test_models
