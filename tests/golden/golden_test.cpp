// Golden tests of the generated code and the memory plan: small ONNX models (written by
// make_golden_models.py with Debian's python3) are compiled with a dump directory, and the test
// checks the lines that matter in the dumps (FileCheck style: kernel definitions, calls, plan
// lines), not every byte. Where a model is run, its values are checked against a C++ computation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "driver/compile.h"
#include "graph/graph.h"
#include "graph/tensor.h"
#include "ir/interpreter.h"
#include "lower/conv_select.h"
#include "lower/lowering.h"
#include "onnx/importer.h"
#include "support/files.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;

// Debian's python, which has onnx and numpy; the first python3 on PATH may not.
constexpr const char* kPython = "/usr/bin/python3";

/// A fresh scratch directory per test (ctest runs tests as separate, possibly parallel processes).
fs::path scratch(const std::string& name) {
  fs::path dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / ("golden-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// Writes the model `name` of make_golden_models.py into `dir` and imports it.
graph::Model make_model(const std::string& name, const fs::path& dir) {
  fs::path path = dir / (name + ".onnx");
  if (!fs::exists(path)) {
    std::string command = std::string(kPython) +
                          " " KILN_TESTS_DIR "/golden/make_golden_models.py " + name + " " +
                          path.string();
    int status = std::system(command.c_str());
    EXPECT_EQ(status, 0) << command;
  }
  return onnx::import_model(path);
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// What compile() wrote into a dump directory.
struct Dump {
  std::map<std::string, std::string> files;  // every file, by name
  std::string wrapper;                       // 5_wrapper.cpp
  std::string kernels;                       // 5_kernels*.cpp, concatenated in name order
  std::string plan;                          // 4_memory_plan.txt

  explicit Dump(const fs::path& dir) {
    std::vector<fs::path> paths;
    for (const auto& entry : fs::directory_iterator(dir)) paths.push_back(entry.path());
    std::sort(paths.begin(), paths.end());
    for (const fs::path& p : paths) {
      std::string name = p.filename().string();
      files[name] = files::read(p);
      if (starts_with(name, "5_kernels")) kernels += files[name];
    }
    wrapper = files.at("5_wrapper.cpp");
    plan = files.at("4_memory_plan.txt");
  }

  /// Names of the kernel functions defined in 5_kernels*.cpp, in order.
  std::vector<std::string> kernel_definitions() const {
    const std::string prefix = "extern \"C\" void ";
    std::vector<std::string> names;
    for (const std::string& line : split_lines(kernels)) {
      if (!starts_with(line, prefix)) continue;
      names.push_back(line.substr(prefix.size(), line.find('(') - prefix.size()));
    }
    return names;
  }

  /// How many times the wrapper's run code calls the function `name`.
  int wrapper_calls(const std::string& name) const {
    int count = 0;
    for (const std::string& line : split_lines(wrapper)) {
      size_t start = line.find_first_not_of(' ');
      count += start != std::string::npos && starts_with(line.substr(start), name + "(");
    }
    return count;
  }

  /// The `call X` lines of the memory plan: every schedule item, kernels and externs.
  std::vector<std::string> plan_calls() const {
    std::vector<std::string> calls;
    for (const std::string& line : split_lines(plan)) {
      if (starts_with(line, "call ")) calls.push_back(line.substr(5));
    }
    return calls;
  }

  /// Plan lines starting with `prefix` ("allocate ", "reuse ", "free ").
  std::vector<std::string> plan_lines(const std::string& prefix) const {
    std::vector<std::string> lines;
    for (const std::string& line : split_lines(plan)) {
      if (starts_with(line, prefix)) lines.push_back(line);
    }
    return lines;
  }

  /// N of the last plan line, `intermediate allocations: N`.
  int intermediate_allocations() const {
    std::vector<std::string> lines = split_lines(plan);
    const std::string prefix = "intermediate allocations: ";
    if (lines.empty() || !starts_with(lines.back(), prefix)) {
      ADD_FAILURE() << "the memory plan does not end with '" << prefix << "N':\n" << plan;
      return -1;
    }
    return std::stoi(lines.back().substr(prefix.size()));
  }
};

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& name : names) s += (s.empty() ? "" : ", ") + name;
  return s;
}

struct Compiled {
  driver::CompiledModel model;
  Dump dump;
};

/// Compiles with a dump directory `dir/<dump>` and the code cache `dir/cache`.
Compiled compile_dumped(const graph::Model& model, const fs::path& dir,
                        const std::string& dump = "dump") {
  driver::CompileOptions options;
  options.cache_dir = dir / "cache";
  options.dump_dir = dir / dump;
  fs::remove_all(options.dump_dir);
  driver::CompiledModel compiled = driver::compile(model, options);
  return {std::move(compiled), Dump(options.dump_dir)};
}

/// The single kernel of a compile: exactly one definition, called once, no extern calls.
std::string expect_one_kernel(const Compiled& c) {
  std::vector<std::string> defs = c.dump.kernel_definitions();
  EXPECT_EQ(defs.size(), 1u) << "kernels defined:\n" << c.dump.kernels;
  EXPECT_EQ(c.model.stats().kernels, 1);
  EXPECT_EQ(c.model.stats().extern_calls, 0);
  EXPECT_EQ(c.dump.plan_calls().size(), 1u) << c.dump.plan;
  if (defs.empty()) return "";
  EXPECT_TRUE(starts_with(defs[0], "cpp_fused_")) << defs[0];
  EXPECT_EQ(c.dump.wrapper_calls(defs[0]), 1) << c.dump.wrapper;
  return defs[0];
}

Tensor float_tensor(std::vector<int64_t> dims, const std::vector<float>& values) {
  Tensor t(DType::kFloat32, std::move(dims));
  std::span<float> v = t.mutable_values<float>();
  EXPECT_EQ(v.size(), values.size());
  std::copy(values.begin(), values.end(), v.begin());
  return t;
}

/// Deterministic test data in about [-2, 2).
std::vector<float> test_values(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t k = 0; k < n; ++k) v[k] = std::sin(0.7f * static_cast<float>(k) + seed) * 2.0f;
  return v;
}

std::vector<float> initializer(const graph::Model& model, const std::string& name) {
  const graph::Value* value = model.graph->find_value(name);
  EXPECT_TRUE(value != nullptr && value->initializer() != nullptr) << name;
  std::span<const float> v = value->initializer()->values<float>();
  return {v.begin(), v.end()};
}

void expect_close(std::span<const float> got, const std::vector<float>& want, float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_NEAR(got[k], want[k], tol * (1 + std::abs(want[k]))) << "at " << k;
  }
}

// c[m, n] = a[m, k] * b[k, n]
std::vector<float> matmul(const std::vector<float>& a, const std::vector<float>& b, int m, int k,
                          int n) {
  std::vector<float> c(static_cast<size_t>(m) * n, 0.0f);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int p = 0; p < k; ++p) sum += double(a[i * k + p]) * b[p * n + j];
      c[i * n + j] = static_cast<float>(sum);
    }
  }
  return c;
}

std::vector<float> relu(std::vector<float> v) {
  for (float& x : v) x = std::max(x, 0.0f);
  return v;
}

// 1. Relu(Add(x, y)) * 2 is one kernel named after its ops, with no library call, and computes
// the right values.
TEST(Golden, AddReluMulIsOneKernel) {
  fs::path dir = scratch("add-relu-mul");
  graph::Model model = make_model("add_relu_mul", dir);
  Compiled c = compile_dumped(model, dir);
  std::string name = expect_one_kernel(c);
  EXPECT_TRUE(contains(name, "add")) << name;
  EXPECT_TRUE(contains(name, "relu")) << name;
  EXPECT_TRUE(contains(name, "mul")) << name;
  EXPECT_FALSE(contains(c.dump.wrapper, "kiln_rt::matmul")) << c.dump.wrapper;
  EXPECT_EQ(c.dump.intermediate_allocations(), 0) << c.dump.plan;

  std::vector<float> x = test_values(800, 1), y = test_values(800, 2);
  std::vector<Tensor> out = c.model.run({float_tensor({8, 100}, x), float_tensor({8, 100}, y)});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].dims(), (std::vector<int64_t>{8, 100}));
  std::span<const float> got = out[0].values<float>();
  for (size_t k = 0; k < x.size(); ++k) {
    EXPECT_FLOAT_EQ(got[k], std::max(x[k] + y[k], 0.0f) * 2.0f) << "at " << k;
  }
}

// 2. LayerNormalization followed by an Erf-based Gelu is one kernel.
TEST(Golden, LayerNormGeluIsOneKernel) {
  fs::path dir = scratch("layernorm-gelu");
  graph::Model model = make_model("layernorm_gelu", dir);
  Compiled c = compile_dumped(model, dir);
  std::string name = expect_one_kernel(c);
  EXPECT_TRUE(contains(name, "layer_normalization")) << name;
  EXPECT_TRUE(contains(name, "erf")) << name;
  EXPECT_EQ(c.dump.intermediate_allocations(), 0) << c.dump.plan;

  const int rows = 4, cols = 64;
  std::vector<float> x = test_values(rows * cols, 3);
  std::vector<float> gamma = initializer(model, "gamma"), beta = initializer(model, "beta");
  std::vector<float> want(x.size());
  for (int r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int k = 0; k < cols; ++k) mean += x[r * cols + k];
    mean /= cols;
    for (int k = 0; k < cols; ++k) var += (x[r * cols + k] - mean) * (x[r * cols + k] - mean);
    var /= cols;
    for (int k = 0; k < cols; ++k) {
      double ln = (x[r * cols + k] - mean) / std::sqrt(var + 1e-5) * gamma[k] + beta[k];
      want[r * cols + k] = static_cast<float>(ln * 0.5 * (1 + std::erf(ln / std::sqrt(2.0))));
    }
  }
  std::vector<Tensor> out = c.model.run({float_tensor({rows, cols}, x)});
  ASSERT_EQ(out.size(), 1u);
  expect_close(out[0].values<float>(), want, 1e-4f);
}

// 3. Softmax written out (ReduceMax, Sub, Exp, ReduceSum, Div; opset 13 with ReduceMax's axes an
// attribute and ReduceSum's an initializer input) is one kernel.
TEST(Golden, DecomposedSoftmaxIsOneKernel) {
  fs::path dir = scratch("softmax");
  graph::Model model = make_model("softmax_decomposed", dir);
  Compiled c = compile_dumped(model, dir);
  std::string name = expect_one_kernel(c);
  EXPECT_TRUE(contains(name, "reduce_max")) << name;
  EXPECT_TRUE(contains(name, "reduce_sum")) << name;
  EXPECT_EQ(c.dump.intermediate_allocations(), 0) << c.dump.plan;

  const int rows = 4, cols = 32;
  std::vector<float> x = test_values(rows * cols, 4);
  std::vector<float> want(x.size());
  for (int r = 0; r < rows; ++r) {
    float max = *std::max_element(x.begin() + r * cols, x.begin() + (r + 1) * cols);
    double sum = 0;
    for (int k = 0; k < cols; ++k) sum += std::exp(double(x[r * cols + k]) - max);
    for (int k = 0; k < cols; ++k) {
      want[r * cols + k] = static_cast<float>(std::exp(double(x[r * cols + k]) - max) / sum);
    }
  }
  std::vector<Tensor> out = c.model.run({float_tensor({rows, cols}, x)});
  ASSERT_EQ(out.size(), 1u);
  expect_close(out[0].values<float>(), want, 1e-5f);
}

// 4. Graph outputs own their storage: each is allocated as `(output)` and never handed to another
// buffer, though the models' intermediates all have the outputs' size. In the first model an
// output computed by a kernel is read later by a MatMul (its last use); in the second an output
// computed by a MatMul is read by a pointwise kernel (an in-place candidate).
TEST(Golden, OutputBuffersAreNeverReused) {
  for (std::string name : {"outputs_kernel_then_extern", "outputs_extern_then_kernel"}) {
    SCOPED_TRACE(name);
    fs::path dir = scratch("outputs-" + name);
    graph::Model model = make_model(name, dir);
    Compiled c = compile_dumped(model, dir);
    ASSERT_EQ(c.model.outputs().size(), 2u);
    std::set<std::string> outputs;
    for (const ir::OutputSpec& out : c.model.outputs()) outputs.insert(out.buffer);
    ASSERT_EQ(outputs.size(), 2u) << "two graph outputs share a buffer";

    for (const std::string& out : outputs) {
      int allocations = 0;
      for (const std::string& line : c.dump.plan_lines("allocate ")) {
        if (!starts_with(line, "allocate " + out + " ")) continue;
        ++allocations;
        EXPECT_TRUE(line.ends_with(" (output)")) << line;
      }
      EXPECT_EQ(allocations, 1) << out << " is not allocated once:\n" << c.dump.plan;
    }
    for (const std::string& line : c.dump.plan_lines("reuse ")) {
      // "reuse A <- B[ (in place)]"
      std::istringstream words(line);
      std::string reuse, taker, arrow, from;
      words >> reuse >> taker >> arrow >> from;
      EXPECT_FALSE(outputs.count(from)) << "output storage handed on: " << line << "\n"
                                        << c.dump.plan;
      EXPECT_FALSE(outputs.count(taker)) << "output without its own storage: " << line;
    }
    for (const std::string& line : c.dump.plan_lines("free ")) {
      EXPECT_FALSE(outputs.count(line.substr(5))) << "output freed: " << line;
    }
    // The models are built so that intermediates do get reused; without that the test says
    // nothing.
    EXPECT_FALSE(c.dump.plan_lines("reuse ").empty()) << c.dump.plan;

    // out_a = [Relu](x @ w0), then three more MatMul/Relu steps to out_b.
    const bool relu_first = name == "outputs_kernel_then_extern";
    std::vector<float> x = test_values(256, 5);
    std::vector<float> a = matmul(x, initializer(model, "w0"), 16, 16, 16);
    if (relu_first) a = relu(a);
    std::vector<float> h = relu_first ? a : relu(a);
    for (const char* w : {"w1", "w2", "w3", "w4", "w5"}) {
      h = matmul(h, initializer(model, w), 16, 16, 16);
      if (relu_first || std::string(w) != "w5") h = relu(h);
    }
    std::vector<Tensor> out = c.model.run({float_tensor({16, 16}, x)});
    ASSERT_EQ(out.size(), 2u);
    expect_close(out[0].values<float>(), a, 1e-4f);
    expect_close(out[1].values<float>(), h, 1e-4f);
  }
}

// 5. Reuse keeps long chains in two intermediate buffers: 10 blocks MatMul -> Add -> Relu, and 10
// blocks x * ReduceSum(x, last axis, keepdims) whose shapes stay the same.
TEST(Golden, ChainsNeedAtMostTwoIntermediates) {
  for (std::string name : {"matmul_chain", "reduce_mul_chain"}) {
    SCOPED_TRACE(name);
    fs::path dir = scratch("chain-" + name);
    Compiled c = compile_dumped(make_model(name, dir), dir);
    int n = c.dump.intermediate_allocations();
    EXPECT_LE(n, 2) << c.dump.plan;
    EXPECT_EQ(n, c.model.stats().intermediate_allocations);
    int fresh = 0;
    for (const std::string& line : c.dump.plan_lines("allocate ")) {
      fresh += !line.ends_with(" (output)");
    }
    EXPECT_EQ(fresh, n) << c.dump.plan;
    ASSERT_EQ(c.model.outputs().size(), 1u);
    EXPECT_EQ(c.dump.plan_lines("allocate " + c.model.outputs()[0].buffer + " ").size(), 1u)
        << c.dump.plan;
  }
}

// MatMul -> Add -> Gelu with a constant weight is one call of the GEMM template with the bias and
// the Gelu fused as its epilogue: no other kernel, no library GEMM, no intermediate buffer.
TEST(Golden, MatMulAddGeluIsOneTemplateCall) {
  fs::path dir = scratch("matmul-add-gelu");
  graph::Model model = make_model("matmul_add_gelu", dir);
  Compiled c = compile_dumped(model, dir);
  EXPECT_EQ(c.dump.wrapper_calls("gemm_0"), 1) << c.dump.wrapper;
  EXPECT_TRUE(c.dump.kernel_definitions().empty()) << c.dump.kernels;
  EXPECT_FALSE(contains(c.dump.wrapper, "kiln_rt::matmul")) << c.dump.wrapper;
  EXPECT_EQ(c.dump.intermediate_allocations(), 0) << c.dump.plan;
  ASSERT_TRUE(c.dump.files.count("5_gemm0.cpp"));
  EXPECT_TRUE(contains(c.dump.files.at("5_gemm0.cpp"), "erf")) << "the Gelu is not fused";

  const int64_t m = 13, k = 70, n = 45;
  std::vector<float> x = test_values(static_cast<size_t>(m * k), 3);
  std::vector<Tensor> out = c.model.run({float_tensor({m, k}, x)});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].dims(), (std::vector<int64_t>{m, n}));
  const std::vector<float> w = initializer(model, "w"), b = initializer(model, "b");
  std::span<const float> got = out[0].values<float>();
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double y = b[static_cast<size_t>(j)];
      for (int64_t p = 0; p < k; ++p) {
        y += static_cast<double>(x[static_cast<size_t>(r * k + p)]) *
             w[static_cast<size_t>(p * n + j)];
      }
      double gelu = y * 0.5 * (1.0 + std::erf(y / std::sqrt(2.0)));
      EXPECT_NEAR(got[static_cast<size_t>(r * n + j)], gelu, 1e-4 + 1e-4 * std::abs(gelu))
          << "at " << r << ", " << j;
    }
  }
}

// Conv -> BatchNormalization -> Relu (-> Add -> Relu) is one call of the C++ convolution
// template (the heuristic choice, lower/conv_select.h): the normalization is folded into the
// weight and bias when compiling, and the Relu, the residual Add (reading x) and the last Relu
// are its epilogue, applied to each output row while it is in L1: no kernel, no intermediate
// buffer, no pass over the output after the call.
TEST(Golden, ConvBnReluIsOneCall) {
  for (int tail : {0, 1, 2}) {  // none, Add, Add -> Relu
    const bool residual = tail > 0;
    const std::string name = tail == 0   ? "conv_bn_relu"
                             : tail == 1 ? "conv_bn_relu_add"
                                         : "conv_bn_relu_add_relu";
    SCOPED_TRACE(name);
    fs::path dir = scratch(name);
    graph::Model model = make_model(name, dir);
    Compiled c = compile_dumped(model, dir);
    EXPECT_EQ(c.model.stats().extern_calls, 1) << c.dump.wrapper;
    EXPECT_EQ(c.model.stats().kernels, 0) << c.dump.kernels;
    EXPECT_TRUE(c.dump.kernel_definitions().empty()) << c.dump.kernels;
    EXPECT_TRUE(contains(c.dump.wrapper, "conv_0(")) << c.dump.wrapper;
    EXPECT_TRUE(contains(c.dump.wrapper, ", template ")) << c.dump.wrapper;
    EXPECT_TRUE(contains(c.dump.wrapper, "epilogue fused")) << c.dump.wrapper;
    EXPECT_FALSE(contains(c.dump.wrapper, "state.conv[")) << c.dump.wrapper;
    EXPECT_EQ(c.dump.intermediate_allocations(), 0) << c.dump.plan;

    const int64_t ch = 8, hw = 12;
    std::vector<float> x = test_values(static_cast<size_t>(ch * hw * hw), 4);
    std::vector<Tensor> out = c.model.run({float_tensor({1, ch, hw, hw}, x)});
    ASSERT_EQ(out.size(), 1u);
    const std::vector<float> w = initializer(model, "w"), cb = initializer(model, "cb"),
                             gamma = initializer(model, "gamma"), beta = initializer(model, "beta"),
                             mean = initializer(model, "mean"), var = initializer(model, "var");
    std::span<const float> got = out[0].values<float>();
    for (int64_t m = 0; m < ch; ++m) {
      for (int64_t i = 0; i < hw; ++i) {
        for (int64_t j = 0; j < hw; ++j) {
          double acc = cb[static_cast<size_t>(m)];
          for (int64_t c2 = 0; c2 < ch; ++c2) {
            for (int64_t ki = 0; ki < 3; ++ki) {
              for (int64_t kj = 0; kj < 3; ++kj) {
                int64_t ii = i + ki - 1, jj = j + kj - 1;
                if (ii < 0 || ii >= hw || jj < 0 || jj >= hw) continue;
                acc += static_cast<double>(x[static_cast<size_t>((c2 * hw + ii) * hw + jj)]) *
                       w[static_cast<size_t>(((m * ch + c2) * 3 + ki) * 3 + kj)];
              }
            }
          }
          const size_t k = static_cast<size_t>(m);
          double n =
              (acc - mean[k]) / std::sqrt(static_cast<double>(var[k]) + 1e-5) * gamma[k] + beta[k];
          const size_t at = static_cast<size_t>((m * hw + i) * hw + j);
          double want = std::max(n, 0.0) + (residual ? x[at] : 0.0f);
          if (tail == 2) want = std::max(want, 0.0);
          EXPECT_NEAR(got[at], want, 1e-4 + 1e-4 * std::abs(want)) << m << "," << i << "," << j;
        }
      }
    }
  }
}

// Two convolutions at awkward sizes (strides (2, 1), asymmetric pads, dilations (1, 2), 13 and 7
// output channels, batch 2): BatchNormalization -> Relu fuse into the first template call, the
// residual Add (of a model input) -> Sigmoid into the second; the result matches the IR
// interpreter run on the lowered program (its reference convolution, before any choice).
TEST(Golden, ConvTemplateMatchesTheInterpreterAtAwkwardSizes) {
  fs::path dir = scratch("conv_awkward");
  graph::Model model = make_model("conv_awkward", dir);
  Compiled c = compile_dumped(model, dir);
  EXPECT_EQ(c.model.stats().extern_calls, 2) << c.dump.wrapper;
  EXPECT_TRUE(c.dump.kernel_definitions().empty()) << c.dump.kernels;
  EXPECT_TRUE(contains(c.dump.wrapper, "conv(2x5x9x11, 13x5x3x3, s2x1, p1.0.2.1, d1x2)"))
      << c.dump.wrapper;
  EXPECT_TRUE(contains(c.dump.wrapper, "conv(2x13x5x8, 7x13x1x1, s1)")) << c.dump.wrapper;
  const Tensor x = float_tensor({2, 5, 9, 11}, test_values(2 * 5 * 9 * 11, 5));
  const Tensor r = float_tensor({2, 7, 5, 8}, test_values(2 * 7 * 5 * 8, 6));
  std::vector<Tensor> out = c.model.run({x, r});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].dims(), (std::vector<int64_t>{2, 7, 5, 8}));
  const ir::Program program = lower::lower_graph(*model.graph);
  const std::map<std::string, Tensor> ref = ir::interpret(program, {{"x", x}, {"r", r}});
  std::span<const float> got = out[0].values<float>(), want = ref.at("out").values<float>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::abs(want[i])) << "at " << i;
  }
  // The interpreter reads the prepared weights of the selected program too (the template's
  // channel panels, the libraries' plain weight and bias).
  for (const char* choice : {"template", "im2col-openblas"}) {
    SCOPED_TRACE(choice);
    ir::Program selected = lower::lower_graph(*model.graph);
    lower::LoweringOptions options;
    options.threads = 2;
    options.conv_choice = choice;
    EXPECT_EQ(lower::select_conv_choices(selected, options), 2);
    const std::map<std::string, Tensor> again = ir::interpret(selected, {{"x", x}, {"r", r}});
    std::span<const float> v = again.at("out").values<float>();
    ASSERT_EQ(v.size(), want.size());
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_NEAR(v[i], want[i], 1e-6 + 1e-6 * std::abs(want[i])) << "at " << i;
    }
  }
}

// 6. Compiling the same model twice gives the same sources and plan; the second compile with the
// same code cache is a cache hit.
TEST(Golden, CompilesAreDeterministicAndCached) {
  for (std::string name : {"matmul_chain", "layernorm_gelu", "conv_awkward"}) {
    SCOPED_TRACE(name);
    fs::path dir = scratch("determinism-" + name);
    // Two separate imports: nothing may depend on addresses of the first graph.
    Compiled first = compile_dumped(make_model(name, dir), dir, "dump1");
    Compiled second = compile_dumped(make_model(name, dir), dir, "dump2");
    EXPECT_FALSE(first.model.stats().cache_hit) << "the cache directory was fresh";
    EXPECT_TRUE(second.model.stats().cache_hit);

    std::set<std::string> names1, names2;
    for (const auto& [file, text] : first.dump.files) names1.insert(file);
    for (const auto& [file, text] : second.dump.files) names2.insert(file);
    EXPECT_EQ(names1, names2);
    EXPECT_TRUE(names1.count("5_kernels0.cpp") || names1.count("5_gemm0.cpp") ||
                names1.count("5_conv0.cpp"))
        << "no kernel sources dumped";
    for (const auto& [file, text] : first.dump.files) {
      auto other = second.dump.files.find(file);
      if (other == second.dump.files.end()) continue;
      // Every dump is compared, the generated sources and the memory plan above all.
      EXPECT_TRUE(text == other->second) << file << " differs between two compiles";
    }
  }
}

// 7. Identical kernels are emitted once. Two identical, independent pointwise chains on two
// inputs of the same shape: either the scheduler fuses them horizontally into one kernel, or the
// wrapper calls one kernel function twice and 5_kernels*.cpp defines it once. In the 10-block
// MatMul chain, each block is a GEMM template with its Add+Relu as epilogue, and the ten are one
// template function called ten times.
TEST(Golden, IdenticalKernelsAreEmittedOnce) {
  fs::path dir = scratch("identical-kernels");
  Compiled c = compile_dumped(make_model("twin_chains", dir), dir);
  std::vector<std::string> defs = c.dump.kernel_definitions();
  EXPECT_EQ(defs.size(), 1u) << "kernels defined: " << joined(defs);
  EXPECT_EQ(c.model.stats().kernels, 1);
  if (defs.size() == 1 && c.dump.plan_calls().size() == 1) {
    EXPECT_EQ(c.dump.wrapper_calls(defs[0]), 1) << "fused horizontally:\n" << c.dump.wrapper;
  } else if (defs.size() == 1) {
    EXPECT_EQ(c.dump.plan_calls().size(), 2u) << c.dump.plan;
    EXPECT_EQ(c.dump.wrapper_calls(defs[0]), 2) << c.dump.wrapper;
  }

  Compiled chain = compile_dumped(make_model("matmul_chain", dir), dir, "dump-chain");
  EXPECT_TRUE(chain.dump.kernel_definitions().empty()) << chain.dump.kernels;
  EXPECT_EQ(chain.dump.wrapper_calls("gemm_0"), 10) << chain.dump.wrapper;
  EXPECT_TRUE(chain.dump.files.count("5_gemm0.cpp"));
  EXPECT_FALSE(chain.dump.files.count("5_gemm1.cpp")) << "identical templates emitted twice";
}
}  // namespace
}  // namespace kiln
