// Runs a model library built by `kiln compile` from tests/names/make_names_model.py through the
// public C++ API (include/kiln/kiln.h over the C ABI), finding every input and output by its
// original ONNX name and checking the outputs against the numpy references.
//
// Usage: kiln_names_capi LIBRARY MODEL_DIR true|false
// Exit status 0 when every input was found by name, the symbolic dim reports its original name
// and every output matches (float32: |got - want| <= 1e-5 + 1e-5 |want|).
#include <kiln/kiln.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "graph/tensor.h"
#include "onnx/tensor_file.h"

namespace {

/// The position of the value named `name` in `values`, or values.size().
size_t find_by_name(const std::vector<kiln::ValueInfo>& values, const std::string& name) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].name == name) return i;
  }
  return values.size();
}

int fail(const std::string& why) {
  std::cerr << "FAIL: " << why << "\n";
  return 1;
}

kiln::Tensor to_kiln(const kiln::graph::Tensor& t) {
  const std::vector<int64_t>& shape = t.dims();
  kiln_dtype dtype = t.dtype() == kiln::graph::DType::kBool ? KILN_BOOL : KILN_FLOAT32;
  kiln::Tensor out(dtype, shape);
  std::memcpy(out.data(), t.data(), out.bytes());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return fail("usage: kiln_names_capi LIBRARY MODEL_DIR true|false");
  const std::string dir = argv[2];
  const std::string cond = argv[3];
  nlohmann::json names;
  std::ifstream(dir + "/names.json") >> names;
  try {
    kiln::Model model = kiln::load(argv[1]);
    // Inputs: each one found by its original name; the files are in names.json's order.
    std::vector<kiln::Tensor> inputs(model.inputs().size());
    std::vector<std::string> files = {dir + "/inputs/0.npy", dir + "/inputs/1.npy",
                                      dir + "/inputs/c_" + cond + ".npy", dir + "/inputs/3.npy"};
    for (size_t k = 0; k < names["inputs"].size(); ++k) {
      const std::string name = names["inputs"][k];
      size_t found = find_by_name(model.inputs(), name);
      if (found == inputs.size()) return fail("the C API has no input named '" + name + "'");
      inputs[found] = to_kiln(kiln::onnx::read_tensor_file(files[k]));
    }
    // Symbolic dims report their original names: input 0's first, input 3's both.
    const std::vector<std::pair<size_t, size_t>> dims = {{0, 0}, {3, 0}, {3, 1}};
    for (size_t k = 0; k < dims.size(); ++k) {
      const std::string dim = names["dims"][k];
      const kiln::ValueInfo& info = model.inputs()[dims[k].first];
      size_t d = dims[k].second;
      if (info.dims.size() <= d || info.dims[d] != -1 || info.dim_names[d] != dim)
        return fail("input " + info.name + " dim " + std::to_string(d) +
                    " should be symbolic and named '" + dim + "'");
    }
    std::vector<kiln::Tensor> outputs = model.run(inputs);
    for (size_t k = 0; k < names["outputs"].size(); ++k) {
      const std::string name = names["outputs"][k];
      size_t found = find_by_name(model.outputs(), name);
      if (found == outputs.size()) return fail("the C API has no output named '" + name + "'");
      kiln::graph::Tensor want = kiln::onnx::read_tensor_file(dir + "/expected/" + cond + "/" +
                                                              std::to_string(k) + ".npy");
      const kiln::Tensor& got = outputs[found];
      if (got.numel() != want.numel()) return fail("output '" + name + "': element count differs");
      const float* g = got.data<float>();
      const float* w = want.values<float>().data();
      for (int64_t e = 0; e < want.numel(); ++e) {
        if (!(std::fabs(g[e] - w[e]) <= 1e-5f + 1e-5f * std::fabs(w[e])))
          return fail("output '" + name + "' element " + std::to_string(e) + ": " +
                      std::to_string(g[e]) + " vs numpy " + std::to_string(w[e]));
      }
    }
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::cout << "names through the C API (" << cond << "): ok\n";
  return 0;
}
