// Launch configurations of Kiln's own CUDA reduction kernels through the autotune cache (issue
// 18 item 2; codegen/cuda/cuda_kernel.h, autotune/cuda_choice.h library "kiln").
// Without a GPU: `--autotune max` emits every configuration of a reduction kernel (NVRTC
// compiles them all for sm_80 and sm_90) and a launch that times them; a cached choice is
// built alone, the kernel differing from the heuristic's only by its configuration and the
// wrapper only by that kernel's launch; --autotune off takes nothing from the cache; a cached
// index past the kernel's configurations is ignored with a warning. With a GPU: every
// configuration of LayerNormalization, Softmax, ReduceSum and a ReduceMean variance over rows
// of awkward lengths matches a double reference, and an `--autotune max` run stores choices
// that the next compile bakes, byte for byte the same on a third compile.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "autotune/cuda_choice.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "cuda_test_util.h"
#include "driver/compile.h"
#include "model_builder.h"
#include "support/files.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;
using graph::Value;
using test_models::ModelBuilder;

using namespace cuda_test;  // NOLINT: the shared fixtures

/// Element i of the test inputs: values in [-2, 2) with an offset of 3 (a LayerNorm's variance
/// then needs its centering).
float input_at(int64_t i, int64_t salt) {
  return 3.0f + 4.0f * static_cast<float>(std::sin(0.731 * static_cast<double>(i) + salt) * 0.5);
}

Tensor input(int64_t rows, int64_t cols, int64_t salt) {
  Tensor t(DType::kFloat32, {rows, cols});
  auto v = t.mutable_values<float>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = input_at(static_cast<int64_t>(i), salt);
  return t;
}

float scale_at(int64_t i) { return 0.5f + 0.01f * static_cast<float>(i % 53); }
float bias_at(int64_t i) { return -0.25f + 0.02f * static_cast<float>(i % 29); }

/// The ops each row length is reduced by; one input each, so that each is a kernel of its own.
const char* const kOps[] = {"layernorm", "softmax", "sum", "variance"};

/// y = op(x) over the last axis of x [rows, cols] (rows symbolic "rows" when `rows` < 0).
Value* reduce_op(ModelBuilder& m, const std::string& op, Value* x, int64_t cols) {
  if (op == "layernorm") {
    Tensor s(DType::kFloat32, {cols}), b(DType::kFloat32, {cols});
    for (int64_t i = 0; i < cols; ++i) {
      s.mutable_values<float>()[static_cast<size_t>(i)] = scale_at(i);
      b.mutable_values<float>()[static_cast<size_t>(i)] = bias_at(i);
    }
    return m.op("LayerNormalization", {x, m.constant(std::move(s)), m.constant(std::move(b))},
                {{"axis", int64_t{-1}}, {"epsilon", 1e-5f}});
  }
  if (op == "softmax") return m.op("Softmax", {x}, {{"axis", int64_t{-1}}});
  Value* axes = m.ints({-1}, {1});
  if (op == "sum") return m.op("ReduceSum", {x, axes}, {{"keepdims", int64_t{1}}});
  Value* mean = m.op("ReduceMean", {x, axes}, {{"keepdims", int64_t{1}}});
  Value* d = m.op("Sub", {x, mean});
  return m.op("ReduceMean", {m.op("Mul", {d, d}), axes}, {{"keepdims", int64_t{1}}});
}

/// The double reference of `op` over one row of `n` elements.
std::vector<double> reference(const std::string& op, const float* x, int64_t n) {
  double mean = 0, top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  if (op == "sum") return {mean};
  mean /= static_cast<double>(n);
  double var = 0, sum = 0;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<double>(n);
  if (op == "variance") return {var};
  for (int64_t i = 0; i < n; ++i) top = std::max<double>(top, x[i]);
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - top);
  std::vector<double> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    y[static_cast<size_t>(i)] =
        op == "softmax" ? std::exp(x[i] - top) / sum
                        : (x[i] - mean) / std::sqrt(var + 1e-5) * scale_at(i) + bias_at(i);
  }
  return y;
}

/// The row lengths of the tests: one, under a warp, one short of a warp multiple, BERT's
/// hidden size, not a multiple of 4, and one past a power of two.
const int64_t kLengths[] = {1, 31, 127, 768, 1000, 4097};
constexpr int64_t kRows = 7;  // not a multiple of the rows a block or a warp takes

/// Every op over rows of each of `lengths` (all of kLengths when empty): inputs x_<op>_<n>
/// [kRows, n] (the rows symbolic when `symbolic`), in kOps x lengths order.
graph::Model all_reductions(bool symbolic, std::vector<int64_t> lengths = {}) {
  if (lengths.empty()) lengths.assign(std::begin(kLengths), std::end(kLengths));
  ModelBuilder m(18);
  for (const char* op : kOps) {
    for (int64_t n : lengths) {
      Value* x = m.input(fmt::format("x_{}_{}", op, n), DType::kFloat32,
                         symbolic ? graph::Shape{sym::Expr::symbol("rows"), sym::Expr(n)}
                                  : graph::Shape{sym::Expr(kRows), sym::Expr(n)});
      m.output(reduce_op(m, op, x, n));
    }
  }
  return std::move(m.model);
}

/// LayerNormalization over rows of 768 alone: the bench's kernel.
graph::Model layer_norm_768() {
  ModelBuilder m(17);
  Value* x = m.input("x", DType::kFloat32, graph::Shape{sym::Expr(64), sym::Expr(768)});
  m.output(reduce_op(m, "layernorm", x, 768));
  return std::move(m.model);
}

struct Sources {
  std::string kernels, wrapper;
};

Sources compile_sources(const graph::Model& model, const fs::path& dir,
                        std::optional<autotune::AutotuneMode> mode = std::nullopt,
                        const std::string& archs = "90") {
  Compiled c = compile_cuda_dumped(model, dir, ir::Precision::kTf32, mode, archs);
  return {std::move(c.kernels), std::move(c.wrapper)};
}

/// The tuned launches of a wrapper compiled with --autotune max: kernel name -> (problem text,
/// number of configurations), from its `cuda.launch_tuned("name", "problem", version, {sizes},
/// count, ...` lines.
std::map<std::string, std::pair<std::string, int>> tuned_launches(const std::string& wrapper) {
  std::map<std::string, std::pair<std::string, int>> launches;
  std::istringstream in(wrapper);
  const std::string head = "cuda.launch_tuned(\"";
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(head);
    if (at == std::string::npos) continue;
    const size_t name_end = line.find('"', at + head.size());
    const size_t problem_at = line.find('"', name_end + 1) + 1;
    const size_t problem_end = line.find('"', problem_at);
    const size_t count_at = line.find("}, ", problem_end) + 3;
    launches[line.substr(at + head.size(), name_end - at - head.size())] = {
        line.substr(problem_at, problem_end - problem_at), std::stoi(line.substr(count_at))};
  }
  return launches;
}

/// Stores a tuning report choosing configuration `choice(problem, count)` of each launch.
template <typename Choice>
void store_choices(const fs::path& dir,
                   const std::map<std::string, std::pair<std::string, int>>& launches,
                   Choice choice) {
  std::string report;
  for (const auto& [name, launch] : launches) {
    const int chosen = choice(launch.first, launch.second);
    std::string times;
    for (int c = 0; c < launch.second; ++c)
      times += fmt::format("{}{}", c ? "," : "", c == chosen ? 0.1 : 0.2 + 0.01 * c);
    report += fmt::format("kiln\t{}\tTest GPU\t90\t13000\t{}\t{}\n", launch.first, chosen, times);
  }
  files::write_atomic(dir / "report.txt", report);
  autotune::AutotuneCache cache(dir / "autotune.json");
  ASSERT_EQ(autotune::store_cuda_tune_report(dir / "report.txt", cache), launches.size());
}

TEST(CudaLaunchTune, AutotuneMaxEmitsEveryConfigurationForSm80AndSm90) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const Sources plain = compile_sources(layer_norm_768(), dir.path / "plain");
  EXPECT_EQ(plain.wrapper.find("launch_tuned"), std::string::npos) << plain.wrapper;
  EXPECT_EQ(plain.kernels.find("launch configuration"), std::string::npos) << plain.kernels;
  // NVRTC compiles every configuration for both architectures, or the compile fails.
  const Sources max =
      compile_sources(layer_norm_768(), dir.path / "max", autotune::AutotuneMode::kMax, "80,90");
  const auto launches = tuned_launches(max.wrapper);
  ASSERT_EQ(launches.size(), 1u) << max.wrapper;
  const auto& [name, launch] = *launches.begin();
  // The heuristic (a warp per row), 2 rows a warp, 8 warps a block, and blocks of 192 (a float4
  // each), 128 and 256 per row.
  EXPECT_EQ(launch.second, 6) << max.kernels;
  EXPECT_EQ(launch.first.rfind("reduction ", 0), 0u) << launch.first;
  EXPECT_NE(launch.first.find(" rows 64 row 768 configs 6"), std::string::npos) << launch.first;
  for (int c = 1; c < launch.second; ++c) {
    EXPECT_NE(max.kernels.find(fmt::format("{}_c{}(", name, c)), std::string::npos) << c;
    EXPECT_NE(max.wrapper.find(fmt::format("\"{}_c{}\",", name, c)), std::string::npos) << c;
    EXPECT_NE(max.wrapper.find(fmt::format("case {}: cuda.launch(", c)), std::string::npos) << c;
  }
  EXPECT_NE(max.kernels.find("a block of 192 per row, 4 elements a thread in registers in "
                             "16-byte vectors"),
            std::string::npos)
      << max.kernels;
  EXPECT_NE(max.kernels.find("a warp per row, 4 warps a block, 2 rows a warp"), std::string::npos)
      << max.kernels;
}

TEST(CudaLaunchTune, EveryConfigurationOfEveryShapeCompilesForSm80AndSm90) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  // A sample, to keep the test short: rows of under a warp, of under kWarpRowMax and not a
  // multiple of 4, and past it; symbolic rows of 768 (a static count of rows of 768:
  // AutotuneMaxEmitsEveryConfigurationForSm80AndSm90). The GPU tests below take every length.
  for (bool symbolic : {false, true}) {
    const Sources max = compile_sources(
        all_reductions(symbolic,
                       symbolic ? std::vector<int64_t>{768} : std::vector<int64_t>{31, 1000, 4097}),
        dir.path / (symbolic ? "symbolic" : "static"), autotune::AutotuneMode::kMax, "80,90");
    const auto launches = tuned_launches(max.wrapper);
    // Every reduction kernel has several configurations.
    EXPECT_GE(launches.size(), symbolic ? 4u : 12u) << max.wrapper;
    for (const auto& [name, launch] : launches) {
      EXPECT_GE(launch.second, 2) << name;
      EXPECT_EQ(launch.first.find("rows dynamic") != std::string::npos, symbolic) << launch.first;
      // Symbolic kernels are timed at each run's sizes (their size arguments).
      const size_t at = max.wrapper.find(fmt::format("cuda.launch_tuned(\"{}\",", name));
      const std::string line = max.wrapper.substr(at, max.wrapper.find('\n', at) - at);
      EXPECT_EQ(line.find(", {}, ") != std::string::npos, !symbolic) << line;
      EXPECT_EQ(launch.first.find("x_"), std::string::npos) << "no names: " << launch.first;
    }
  }
}

TEST(CudaLaunchTune, CachedChoiceIsBuiltAloneAndABogusOneIsIgnoredWithAWarning) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const Env gpu_env("KILN_AUTOTUNE_GPU", "Test GPU");
  const graph::Model model = layer_norm_768();
  const Sources plain = compile_sources(model, dir.path / "plain");
  const Sources max = compile_sources(model, dir.path / "max", autotune::AutotuneMode::kMax);
  const auto launches = tuned_launches(max.wrapper);
  ASSERT_EQ(launches.size(), 1u);
  const std::string name = launches.begin()->first;
  // Configuration 3 (a block of 192 per row) is the fastest.
  store_choices(dir.path, launches, [](const std::string&, int) { return 3; });

  const Sources tuned = compile_sources(model, dir.path / "tuned");
  EXPECT_NE(tuned.kernels.find("//   launch configuration #3 of 6: a block of 192 per row"),
            std::string::npos)
      << tuned.kernels;
  EXPECT_NE(tuned.kernels.find("(the autotune cache's choice on sm_90: 0.1 ms)"), std::string::npos)
      << tuned.kernels;
  // The kernel is the --autotune max compile's candidate #3 under the heuristic's name.
  const auto definition = [](const std::string& text, const std::string& kernel) {
    const size_t at = text.rfind("extern \"C\" __global__ void", text.find(kernel));
    return text.substr(at, text.find("\n}\n", at) - at);
  };
  std::string candidate = definition(max.kernels, name + "_c3(");
  candidate.replace(candidate.find(name + "_c3("), name.size() + 3, name);
  EXPECT_EQ(definition(tuned.kernels, name + "("), candidate);
  EXPECT_NE(definition(plain.kernels, name + "("), candidate);
  // The wrapper differs only in that kernel's launch (a block of 192 threads per row).
  EXPECT_NE(tuned.wrapper.find(fmt::format("cuda.launch(0, \"{}\", 64, 1, 1, 192, 1, 1, 0", name)),
            std::string::npos)
      << tuned.wrapper;
  EXPECT_EQ(without_lines(tuned.wrapper, "cuda.launch(", false),
            without_lines(plain.wrapper, "cuda.launch(", false));
  EXPECT_NE(tuned.wrapper, plain.wrapper);
  // Everything but the kernel's definition and comment is the same.
  EXPECT_EQ(tuned.kernels.substr(0, tuned.kernels.find("// " + name)),
            plain.kernels.substr(0, plain.kernels.find("// " + name)));

  // Deterministic for a given cache; --autotune off takes nothing from it.
  EXPECT_EQ(compile_sources(model, dir.path / "again").kernels, tuned.kernels);
  const Sources off = compile_sources(model, dir.path / "off", autotune::AutotuneMode::kOff);
  EXPECT_EQ(off.kernels, plain.kernels);
  EXPECT_EQ(off.wrapper, plain.wrapper);

  // A cache entry of 10 configurations, the last one fastest: this kernel has 6, so the entry
  // is ignored with a warning.
  fs::remove(dir.path / "autotune.json");
  autotune::CachedResults results;
  for (int c = 0; c < 10; ++c)
    results[fmt::format("config {}", c)] = autotune::CachedResult{"kiln 13000", 1.0 - 0.05 * c, ""};
  autotune::AutotuneCache(dir.path / "autotune.json")
      .store(autotune::cuda_library_cache_key("kiln", launches.begin()->second.first, "Test GPU",
                                              90, 13000),
             results);
  testing::internal::CaptureStderr();
  const Sources bogus = compile_sources(model, dir.path / "bogus");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("launch configuration #9 of kernel " + name +
                     " is not one of its 6; the heuristic's is used"),
            std::string::npos)
      << err;
  EXPECT_EQ(bogus.kernels, plain.kernels);
  EXPECT_EQ(bogus.wrapper, plain.wrapper);
}

/// Runs `model` on the test inputs (rows `rows`) and checks each output against the double
/// reference: float32 over rows of up to 4,097 terms, 2e-5 of the row's largest magnitude (of
/// its inputs for sums and variances) plus 1e-6. Returns the outputs.
std::vector<Tensor> run_and_check(CompiledModel& model, int64_t rows, const std::string& what) {
  std::vector<Tensor> inputs;
  int64_t salt = 0;
  for (const char* op : kOps) {
    (void)op;
    for (int64_t n : kLengths) inputs.push_back(input(rows, n, salt++));
  }
  const std::vector<Tensor> out = model.run(inputs);
  EXPECT_EQ(out.size(), inputs.size());
  size_t k = 0;
  for (const char* op : kOps) {
    for (int64_t n : kLengths) {
      if (k >= out.size()) return out;
      const float* x = inputs[k].values<float>().data();
      const auto y = out[k].values<float>();
      const int64_t width = static_cast<int64_t>(y.size()) / rows;
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<double> want = reference(op, x + r * n, n);
        double scale = 0;
        for (int64_t i = 0; i < n; ++i) scale = std::max<double>(scale, std::abs(x[r * n + i]));
        if (std::string(op) == "sum") scale *= static_cast<double>(n);
        if (std::string(op) == "variance") scale *= scale;
        if (std::string(op) == "softmax" || std::string(op) == "layernorm") scale = 4;
        for (int64_t i = 0; i < width; ++i) {
          EXPECT_NEAR(y[static_cast<size_t>(r * width + i)], want[static_cast<size_t>(i)],
                      2e-5 * scale + 1e-6)
              << what << ": " << op << " over " << n << ", row " << r << ", element " << i;
        }
      }
      ++k;
    }
  }
  return out;
}

// With a GPU: the cache chooses configuration c (or the kernel's last) of every kernel, for c
// from 0 to 5, and each compile's outputs match the references.
TEST(CudaLaunchTune, EveryConfigurationMatchesADoubleReference) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  const Env gpu_env("KILN_AUTOTUNE_GPU", "Test GPU");
  const graph::Model model = all_reductions(false);
  const auto launches = tuned_launches(
      compile_sources(model, dir.path / "max", autotune::AutotuneMode::kMax).wrapper);
  ASSERT_GE(launches.size(), 16u);
  int most = 0;
  for (const auto& [name, launch] : launches) most = std::max(most, launch.second);
  for (int c = 0; c < most; ++c) {
    fs::remove(dir.path / "autotune.json");
    store_choices(dir.path, launches,
                  [c](const std::string&, int n) { return std::min(c, n - 1); });
    CompileOptions options;
    options.device = ir::Device::kCuda;
    options.cache_dir = dir.path / "cache";
    options.dump_dir = dir.path / fmt::format("config{}", c);
    CompiledModel compiled = compile(model, options);
    if (c > 0) {
      EXPECT_NE(files::read(dir.path / fmt::format("config{}", c) / "5_kernels.cu")
                    .find(fmt::format("launch configuration #{} of", c)),
                std::string::npos);
    }
    run_and_check(compiled, kRows, fmt::format("configuration {}", c));
  }
}

// With a GPU: --autotune max times the configurations at the first run (static and symbolic
// rows), the outputs of that run and of the next are right, the static problems' choices are in
// the cache, and the next compile bakes them, byte-identical on a third compile.
TEST(CudaLaunchTune, AutotuneMaxStoresChoicesThatTheNextCompileBakes) {
  if (!codegen::nvrtc_available()) GTEST_SKIP() << "skipped: Kiln was built without CUDA";
  if (!has_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device";
  TempDir dir;
  const Env cache_env("KILN_AUTOTUNE_CACHE", (dir.path / "autotune.json").string());
  for (bool symbolic : {false, true}) {
    const graph::Model model = all_reductions(symbolic);
    CompileOptions options;
    options.device = ir::Device::kCuda;
    options.autotune = autotune::AutotuneMode::kMax;
    options.cache_dir = dir.path / "cache";
    options.dump_dir = dir.path / (symbolic ? "max_symbolic" : "max");
    CompiledModel tuned = compile(model, options);
    run_and_check(tuned, symbolic ? 5 : kRows, "first --autotune max run");
    run_and_check(tuned, symbolic ? 9 : kRows, "second --autotune max run");
    if (symbolic) continue;  // timed per run's sizes; nothing to bake
    const auto launches = tuned_launches(files::read(dir.path / "max" / "5_wrapper.cpp"));
    autotune::AutotuneCache cache(dir.path / "autotune.json");
    const std::string gpu = autotune::cuda_autotune_gpu();
    for (const auto& [name, launch] : launches) {
      EXPECT_TRUE(autotune::lookup_cuda_library_choice(cache, "kiln", launch.first, gpu))
          << name << ": " << files::read(dir.path / "autotune.json");
    }
    options.autotune = autotune::AutotuneMode::kDefault;
    options.dump_dir = dir.path / "second";
    CompiledModel baked = compile(model, options);
    run_and_check(baked, kRows, "baked choices");
    options.dump_dir = dir.path / "third";
    compile(model, options);
    EXPECT_EQ(files::read(dir.path / "third" / "5_kernels.cu"),
              files::read(dir.path / "second" / "5_kernels.cu"));
    EXPECT_EQ(files::read(dir.path / "third" / "5_wrapper.cpp"),
              files::read(dir.path / "second" / "5_wrapper.cpp"));
  }
}

}  // namespace
}  // namespace kiln::driver
