// kiln_conv_block_bench: Conv -> BatchNormalization -> Relu, and the same followed by a
// residual Add (a ResNet block's tail), compiled four ways at the 3x3 convolution shapes of
// ResNet-50's four stages (batch 1); BatchNormalization is folded into the convolution's weight
// and bias when lowering in every one:
//   template fused:  the C++ convolution template (its default config, what --autotune off
//                    picks) with Relu and Add fused as its epilogue: one call;
//   oneDNN + kernel: oneDNN's convolution with the Relu as its post-op, the Add a separate
//                    generated kernel (what Kiln compiled before the template);
//   oneDNN unfused:  oneDNN's convolution, then Relu (and Add) as one separate kernel;
//   template unfused: the template's convolution, then the same separate kernel
//                    (CompileOptions::fuse_epilogues = false).
// The choice is forced through LoweringOptions::conv_choice. Each is run through
// CompiledModel::run, interleaved over rounds (so all see the same machine load), and timed by
// its median; it prints the times, oneDNN + kernel over template fused, and the fused call's
// GFLOP/s. It asserts nothing (it reports when an output differs from the first's).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "driver/compile.h"
#include "graph/graph.h"

#ifndef KILN_BENCH_CACHE_DIR
#define KILN_BENCH_CACHE_DIR "bench-cache"
#endif

namespace {

using kiln::graph::DType;
using kiln::graph::Tensor;
using kiln::graph::Type;
using kiln::graph::Value;

std::shared_ptr<Tensor> filled(std::vector<int64_t> dims, float scale, float offset, int seed) {
  auto t = std::make_shared<Tensor>(DType::kFloat32, std::move(dims));
  std::span<float> v = t->mutable_values<float>();
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = offset + scale * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
  return t;
}

/// Conv -> BatchNormalization -> Relu, then Add(x) when `residual`.
kiln::graph::Model block_model(int64_t channels, int64_t size, bool residual) {
  kiln::graph::Model model;
  model.ir_version = 8;
  model.producer_name = "kiln_conv_block_bench";
  model.opsets[""] = 17;
  model.graph = std::make_unique<kiln::graph::Graph>("conv_block");
  kiln::graph::Graph& g = *model.graph;
  auto constant = [&](const std::string& name, std::shared_ptr<Tensor> data) {
    Value* v = g.add_value(name, Type::tensor(DType::kFloat32, std::nullopt));
    g.set_initializer(v, std::move(data));
    return v;
  };
  const float fan_in = static_cast<float>(channels * 9);
  Value* x =
      g.add_value("x", Type::tensor(DType::kFloat32, kiln::graph::Shape{1, channels, size, size}));
  g.add_input(x);
  Value* w = constant("w", filled({channels, channels, 3, 3}, 1.0f / std::sqrt(fan_in), 0, 1));
  Value* conv = g.add_value("conv", Type());
  g.add_node("conv", "Conv", "", 17, {x, w}, {conv}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  Value* bn = g.add_value("bn", Type());
  g.add_node("bn", "BatchNormalization", "", 17,
             {conv, constant("gamma", filled({channels}, 0.2f, 1.0f, 2)),
              constant("beta", filled({channels}, 0.1f, 0.0f, 3)),
              constant("mean", filled({channels}, 0.1f, 0.0f, 4)),
              constant("var", filled({channels}, 0.2f, 1.0f, 5))},
             {bn}, {});
  Value* relu = g.add_value("relu", Type());
  g.add_node("relu", "Relu", "", 17, {bn}, {relu}, {});
  if (residual) {
    Value* y = g.add_value("y", Type());
    g.add_node("add", "Add", "", 17, {relu, x}, {y}, {});
    g.add_output(y);
  } else {
    g.add_output(relu);
  }
  kiln::graph::verify(g, "conv_block");
  return model;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_shape(int64_t channels, int64_t size, bool residual) {
  kiln::graph::Model model = block_model(channels, size, residual);
  struct Variant {
    const char* choice;
    bool fuse;
  };
  const std::vector<Variant> ways = {
      {"template", true}, {"onednn", true}, {"onednn", false}, {"template", false}};
  std::vector<kiln::driver::CompiledModel> variants;
  for (const Variant& way : ways) {
    kiln::driver::CompileOptions options;
    options.cache_dir = KILN_BENCH_CACHE_DIR;
    options.fuse_epilogues = way.fuse;
    options.lowering.conv_choice = way.choice;
    variants.push_back(kiln::driver::compile(model, options));
  }
  std::vector<Tensor> inputs = {*filled({1, channels, size, size}, 1.0f, 0.0f, 9)};
  const std::vector<Tensor> first = variants[0].run(inputs);
  double worst = 0;
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<Tensor> other = variants[v].run(inputs);
    std::span<const float> av = first[0].values<float>(), bv = other[0].values<float>();
    for (size_t i = 0; i < av.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::abs(av[i] - bv[i])));
  }
  std::vector<std::vector<double>> ms(variants.size());
  const int rounds = 200;
  for (int r = 0; r < rounds; ++r) {
    for (size_t v = 0; v < variants.size(); ++v) {
      auto start = std::chrono::steady_clock::now();
      std::vector<Tensor> out = variants[v].run(inputs);
      ms[v].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
  }
  std::vector<double> med;
  for (auto& m : ms) med.push_back(median(m));
  const double flops = 2.0 * static_cast<double>(channels * channels * 9 * size * size);
  fmt::print("{:>12} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>9.2f}x {:>9.1f}{}\n",
             fmt::format("{}x{}x{}", channels, size, size), med[0], med[1], med[2], med[3],
             med[1] / med[0], flops / (med[0] * 1e6),
             worst > 1e-3 ? fmt::format("  (outputs differ by {:.2g})", worst) : "");
}

}  // namespace

int main() {
  struct Shape {
    int64_t channels, size;
  };
  const std::vector<Shape> shapes = {{64, 56}, {128, 28}, {256, 14}, {512, 7}};
  for (bool residual : {false, true}) {
    fmt::print(
        "Conv 3x3 -> BatchNormalization -> Relu{}, batch 1 (ms, median of interleaved runs)\n",
        residual ? " -> Add" : "");
    fmt::print("{:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9}\n", "shape", "tmpl fused",
               "dnnl+kern", "dnnl unfus", "tmpl unfus", "dnnl+k/tf", "GFLOP/s");
    for (const Shape& s : shapes) {
      run_shape(s.channels, s.size, residual);
    }
  }
  return 0;
}
