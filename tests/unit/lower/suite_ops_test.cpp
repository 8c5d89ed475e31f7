// ONNX node-suite cases lowered to the loop IR and run by the reference interpreter: each case
// listed in interpreter_cases.txt is imported (onnx/importer.h), lowered (lower::lower_graph),
// interpreted (ir::interpret) on test_data_set_0's inputs and compared with its outputs.
//
// Tolerances: float32 and float64 |got - want| <= 1e-5 + 1e-4 * |want|; float16 and bfloat16
// |got - want| <= 1e-3 + 1e-3 * |want|; NaN matches NaN, infinities match exactly; integers and
// bool exactly.

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "graph/tensor.h"
#include "ir/interpreter.h"
#include "lower/lowering.h"
#include "onnx/importer.h"
#include "onnx/tensor_file.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> read_cases() {
  std::vector<std::string> cases;
  std::ifstream in(fs::path(KILN_TESTS_DIR) / "unit/lower/interpreter_cases.txt");
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    line.erase(0, line.find_first_not_of(" \t"));
    if (!line.empty()) cases.push_back(line);
  }
  return cases;
}

/// The tensors test_data_set_0/<prefix>_<k>.pb, k = 0, 1, ...
std::vector<graph::Tensor> read_set(const fs::path& dir, const std::string& prefix) {
  std::vector<graph::Tensor> tensors;
  for (int k = 0;; ++k) {
    fs::path path = dir / "test_data_set_0" / (prefix + "_" + std::to_string(k) + ".pb");
    if (!fs::exists(path)) return tensors;
    tensors.push_back(onnx::read_tensor_file(path));
  }
}

bool close(double got, double want, double atol, double rtol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

/// Empty when equal within tolerance; otherwise a description of the first mismatch.
std::string compare(const graph::Tensor& got, const graph::Tensor& want) {
  if (got.dtype() != want.dtype()) {
    return "dtype " + std::string(graph::dtype_name(got.dtype())) + ", expected " +
           std::string(graph::dtype_name(want.dtype()));
  }
  if (got.dims() != want.dims()) return "shape differs";
  bool half = want.dtype() == graph::DType::kFloat16 || want.dtype() == graph::DType::kBFloat16;
  double atol = half ? 1e-3 : 1e-5;
  double rtol = half ? 1e-3 : 1e-4;
  for (int64_t i = 0; i < want.numel(); ++i) {
    bool ok =
        graph::is_floating(want.dtype())
            ? close(got.element_as_double(i), want.element_as_double(i), atol, rtol)
            : std::memcmp(static_cast<const char*>(got.data()) + i * dtype_size(got.dtype()),
                          static_cast<const char*>(want.data()) + i * dtype_size(want.dtype()),
                          static_cast<size_t>(dtype_size(want.dtype()))) == 0;
    if (!ok) {
      return "element " + std::to_string(i) + " is " + std::to_string(got.element_as_double(i)) +
             ", expected " + std::to_string(want.element_as_double(i));
    }
  }
  return "";
}

/// The suite stores bfloat16 test data as uint16 arrays: reinterpret them as the model says.
graph::Tensor as_dtype(const graph::Tensor& t, graph::DType dtype) {
  if (t.dtype() != graph::DType::kUInt16 || dtype != graph::DType::kBFloat16) return t;
  graph::Tensor out(dtype, t.dims());
  std::memcpy(out.mutable_data(), t.data(), t.nbytes());
  return out;
}

class SuiteOpsTest : public testing::TestWithParam<std::string> {};

TEST_P(SuiteOpsTest, MatchesExpectedOutputs) {
  fs::path dir = fs::path(KILN_TEST_DATA_DIR) / "node" / GetParam();
  graph::Model model = onnx::import_model(dir / "model.onnx");
  ir::Program program = lower::lower_graph(*model.graph);
  std::vector<graph::Tensor> inputs = read_set(dir, "input");
  std::vector<graph::Tensor> expected = read_set(dir, "output");
  const auto& graph_inputs = model.graph->inputs();
  ASSERT_EQ(inputs.size(), graph_inputs.size());
  std::map<std::string, graph::Tensor> by_name;
  for (size_t k = 0; k < inputs.size(); ++k) {
    by_name[graph_inputs[k]->name()] = as_dtype(inputs[k], graph_inputs[k]->type().dtype);
  }
  std::map<std::string, graph::Tensor> outputs = ir::interpret(program, by_name);
  const auto& graph_outputs = model.graph->outputs();
  ASSERT_EQ(expected.size(), graph_outputs.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    const std::string& name = graph_outputs[k]->name();
    ASSERT_TRUE(outputs.count(name)) << "missing output " << name;
    graph::Tensor want = as_dtype(expected[k], graph_outputs[k]->type().dtype);
    EXPECT_EQ(compare(outputs.at(name), want), "") << "output " << name << "\n" << program.str();
  }
}

std::string case_name(const testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Node, SuiteOpsTest, testing::ValuesIn(read_cases()), case_name);

}  // namespace
}  // namespace kiln
