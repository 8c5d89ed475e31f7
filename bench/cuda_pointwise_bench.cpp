// kiln_cuda_pointwise_bench: how close Kiln's generated CUDA kernels come to the GPU's copy
// bandwidth. It measures
//   1. a device-to-device copy of N floats (cuMemcpyDtoD through the driver API, which reads and
//      writes 2 x 4 x N bytes), best of several runs;
//   2. models compiled with driver::compile for --device cuda, each of which must become one
//      generated kernel that reads its input once and writes its output once (2 x 4 x N bytes,
//      plus a 3 KiB bias):
//        chain        y = Relu(x * 2 + 1) * 0.5 + Sigmoid(x)       (pointwise, x: [N])
//        cheap chain  y = Relu(x * 2 + 1) * 0.5 - x                (pointwise, x: [N])
//        bias Gelu    y = Gelu_erf(x + b)                           (x: [N / 768, 768], b: [768])
//        softmax 128  Softmax over rows of 128                      (a warp per row)
//        layernorm    LayerNormalization over rows of 768          (a warp per row, Welford)
//      Softmax and LayerNorm are compiled twice: with the heuristic's launch configuration
//      (--autotune off) and with --autotune max, whose first run times every configuration of
//      the kernel and keeps the fastest (codegen/cuda/cuda_kernel.h); the tuned line names the
//      configuration chosen, from the autotune cache;
//      each checked against a scalar reference on sampled elements, then run with a profile:
//      the kernel's time is the host clock around its launch and a wait for it
//      (kiln_rt::ProfileScope), and the copy is timed the same way, so the ratio compares like
//      with like (both include one launch and one wait, about 10 us, against 1-2 ms of work).
// It prints bandwidths and each kernel's fraction of the copy's; it asserts nothing. Without a
// GPU it prints "skipped: no CUDA device".
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "autotune/cache.h"
#include "autotune/cuda_choice.h"
#include "driver/compile.h"
#include "graph/graph.h"
#include "runtime/kiln_rt_profile.h"
#include "support/error.h"
#include "support/files.h"

#ifndef KILN_BENCH_CACHE_DIR
#define KILN_BENCH_CACHE_DIR "bench-cache"
#endif

namespace {

namespace fs = std::filesystem;
using kiln::graph::DType;
using kiln::graph::Tensor;
using kiln::graph::Type;
using kiln::graph::Value;

constexpr int64_t kN = int64_t{768} << 18;  // floats per array: 201M, 768 MiB
constexpr int kRuns = 8;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The few driver-API calls the copy needs, loaded at run time as Kiln's wrappers load them.
struct Driver {
  using Result = int;
  Result (*Init)(unsigned) = nullptr;
  Result (*DeviceGet)(int*, int) = nullptr;
  Result (*DeviceGetName)(char*, int, int) = nullptr;
  Result (*PrimaryCtxRetain)(void**, int) = nullptr;
  Result (*CtxSetCurrent)(void*) = nullptr;
  Result (*CtxSynchronize)() = nullptr;
  Result (*MemAlloc)(unsigned long long*, size_t) = nullptr;
  Result (*MemFree)(unsigned long long) = nullptr;
  Result (*MemsetD32)(unsigned long long, unsigned, size_t) = nullptr;
  Result (*MemcpyDtoD)(unsigned long long, unsigned long long, size_t) = nullptr;

  /// False without the driver or a device.
  bool load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return false;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    if (!(get(Init, "cuInit") && get(DeviceGet, "cuDeviceGet") &&
          get(DeviceGetName, "cuDeviceGetName") &&
          get(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
          get(CtxSetCurrent, "cuCtxSetCurrent") && get(CtxSynchronize, "cuCtxSynchronize") &&
          get(MemAlloc, "cuMemAlloc_v2") && get(MemFree, "cuMemFree_v2") &&
          get(MemsetD32, "cuMemsetD32_v2") && get(MemcpyDtoD, "cuMemcpyDtoD_v2"))) {
      return false;
    }
    int device = 0;
    void* context = nullptr;
    return Init(0) == 0 && DeviceGet(&device, 0) == 0 && PrimaryCtxRetain(&context, device) == 0 &&
           CtxSetCurrent(context) == 0;
  }
  void check(Result r, const char* what) const {
    if (r != 0) throw std::runtime_error(fmt::format("{} failed: CUDA error {}", what, r));
  }
};

/// Best seconds of the copy over kRuns runs, each timed from the call to the end of a wait.
double copy_seconds(const Driver& cu) {
  const size_t bytes = static_cast<size_t>(kN) * sizeof(float);
  unsigned long long a = 0, b = 0;
  cu.check(cu.MemAlloc(&a, bytes), "cuMemAlloc");
  cu.check(cu.MemAlloc(&b, bytes), "cuMemAlloc");
  cu.check(cu.MemsetD32(a, 0x3f800000u, static_cast<size_t>(kN)), "cuMemsetD32");
  cu.check(cu.MemcpyDtoD(b, a, bytes), "cuMemcpyDtoD");
  cu.check(cu.CtxSynchronize(), "cuCtxSynchronize");
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < kRuns; ++r) {
    auto start = std::chrono::steady_clock::now();
    cu.check(cu.MemcpyDtoD(b, a, bytes), "cuMemcpyDtoD");
    cu.check(cu.CtxSynchronize(), "cuCtxSynchronize");
    best = std::min(best, seconds_since(start));
  }
  cu.MemFree(a);
  cu.MemFree(b);
  return best;
}

float bias_at(int64_t i) { return 0.001f * static_cast<float>(i % 97) - 0.05f; }
float scale_at(int64_t i) { return 1.0f + 0.0005f * static_cast<float>(i % 31); }

/// Adds constants and nodes to a benchmark model's graph.
class Builder {
 public:
  explicit Builder(kiln::graph::Graph& g) : g_(g) {}
  Value* scalar(float value) {
    auto t = std::make_shared<Tensor>(DType::kFloat32, std::vector<int64_t>{});
    t->mutable_values<float>()[0] = value;
    return constant(std::move(t));
  }
  /// [n] with element i = f(i).
  Value* vector(int64_t n, float (*f)(int64_t)) {
    auto t = std::make_shared<Tensor>(DType::kFloat32, std::vector<int64_t>{n});
    for (int64_t i = 0; i < n; ++i) t->mutable_values<float>()[i] = f(i);
    return constant(std::move(t));
  }
  Value* op(const std::string& type, std::vector<Value*> inputs,
            std::map<std::string, kiln::graph::AttributeValue> attrs = {}) {
    Value* out = g_.add_value(fmt::format("v{}", next_++), Type());
    g_.add_node(fmt::format("n{}_{}", next_++, type), type, "", 17, std::move(inputs), {out},
                std::move(attrs));
    return out;
  }

 private:
  Value* constant(std::shared_ptr<Tensor> t) {
    Value* v = g_.add_value(fmt::format("c{}", next_++), Type::tensor(t->dtype(), std::nullopt));
    g_.set_initializer(v, std::move(t));
    return v;
  }
  kiln::graph::Graph& g_;
  int next_ = 0;
};

/// One benchmarked model: its graph over x ([kN / cols, cols]) and a reference for one row.
struct Case {
  std::string name;
  std::string formula;
  int64_t cols;
  std::function<Value*(Builder&, Value* x, int64_t cols)> build;
  std::function<void(const float* x, float* y, int64_t cols)> reference;
};

kiln::graph::Model case_model(const Case& c) {
  kiln::graph::Model model;
  model.ir_version = 8;
  model.producer_name = "kiln_cuda_pointwise_bench";
  model.opsets[""] = 17;
  model.graph = std::make_unique<kiln::graph::Graph>(c.name);
  kiln::graph::Graph& g = *model.graph;
  Value* x =
      g.add_value("x", Type::tensor(DType::kFloat32, kiln::graph::Shape{kN / c.cols, c.cols}));
  g.add_input(x);
  Builder b(g);
  g.add_output(c.build(b, x, c.cols));
  kiln::graph::verify(g, c.name);
  return model;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back(
      {"chain", "y = Relu(x * 2 + 1) * 0.5 + Sigmoid(x)", 1024,
       [](Builder& b, Value* x, int64_t) {
         Value* left =
             b.op("Mul", {b.op("Relu", {b.op("Add", {b.op("Mul", {x, b.scalar(2)}), b.scalar(1)})}),
                          b.scalar(0.5f)});
         return b.op("Add", {left, b.op("Sigmoid", {x})});
       },
       [](const float* x, float* y, int64_t n) {
         for (int64_t i = 0; i < n; ++i) {
           y[i] = static_cast<float>(std::max(0.0, x[i] * 2.0 + 1.0) * 0.5 +
                                     1.0 / (1.0 + std::exp(-double{x[i]})));
         }
       }});
  c.push_back(
      {"cheap_chain", "y = Relu(x * 2 + 1) * 0.5 - x", 1024,
       [](Builder& b, Value* x, int64_t) {
         Value* left =
             b.op("Mul", {b.op("Relu", {b.op("Add", {b.op("Mul", {x, b.scalar(2)}), b.scalar(1)})}),
                          b.scalar(0.5f)});
         return b.op("Sub", {left, x});
       },
       [](const float* x, float* y, int64_t n) {
         for (int64_t i = 0; i < n; ++i)
           y[i] = static_cast<float>(std::max(0.0, x[i] * 2.0 + 1.0) * 0.5 - x[i]);
       }});
  c.push_back(
      {"bias_gelu", "y = Gelu_erf(x + b), b: [768]", 768,
       [](Builder& b, Value* x, int64_t cols) {
         Value* h = b.op("Add", {x, b.vector(cols, bias_at)});
         Value* erf = b.op("Erf", {b.op("Div", {h, b.scalar(1.41421356f)})});
         return b.op("Mul", {b.op("Mul", {h, b.op("Add", {erf, b.scalar(1)})}), b.scalar(0.5f)});
       },
       [](const float* x, float* y, int64_t n) {
         for (int64_t i = 0; i < n; ++i) {
           const double h = double{x[i]} + bias_at(i);
           y[i] = static_cast<float>(0.5 * h * (1 + std::erf(h / std::sqrt(2.0))));
         }
       }});
  c.push_back({"softmax_128", "Softmax over rows of 128", 128,
               [](Builder& b, Value* x, int64_t) {
                 return b.op("Softmax", {x}, {{"axis", int64_t{-1}}});
               },
               [](const float* x, float* y, int64_t n) {
                 double top = -INFINITY, sum = 0;
                 for (int64_t i = 0; i < n; ++i) top = std::max<double>(top, x[i]);
                 for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - top);
                 for (int64_t i = 0; i < n; ++i)
                   y[i] = static_cast<float>(std::exp(x[i] - top) / sum);
               }});
  c.push_back({"layernorm_768", "LayerNormalization over rows of 768", 768,
               [](Builder& b, Value* x, int64_t cols) {
                 return b.op("LayerNormalization",
                             {x, b.vector(cols, scale_at), b.vector(cols, bias_at)},
                             {{"axis", int64_t{-1}}});
               },
               [](const float* x, float* y, int64_t n) {
                 double mean = 0, var = 0;
                 for (int64_t i = 0; i < n; ++i) mean += x[i];
                 mean /= static_cast<double>(n);
                 for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
                 var /= static_cast<double>(n);
                 for (int64_t i = 0; i < n; ++i) {
                   y[i] = static_cast<float>((x[i] - mean) / std::sqrt(var + 1e-5) * scale_at(i) +
                                             bias_at(i));
                 }
               }});
  return c;
}

/// The launch configuration the tuned compile's first run chose, from its dump (the kernel's
/// problem text in the wrapper, its configurations in the kernels' comments) and the autotune
/// cache, or "" when none was stored.
std::string tuned_choice(const fs::path& dump, const fs::path& cache) {
  const std::string wrapper = kiln::files::read(dump / "5_wrapper.cpp");
  const std::string kernels = kiln::files::read(dump / "5_kernels.cu");
  const std::string head = "cuda.launch_tuned(\"";
  const size_t at = wrapper.find(head);
  if (at == std::string::npos) return "";
  const size_t problem_at = wrapper.find("\", \"", at) + 4;
  const std::string problem =
      wrapper.substr(problem_at, wrapper.find('"', problem_at) - problem_at);
  const std::optional<kiln::autotune::CudaLibraryChoice> choice =
      kiln::autotune::lookup_cuda_library_choice(kiln::autotune::AutotuneCache(cache), "kiln",
                                                 problem, kiln::autotune::cuda_autotune_gpu());
  if (!choice) return "";
  const size_t line = kernels.find(fmt::format("launch configuration #{} of", choice->index));
  const std::string text =
      line == std::string::npos
          ? ""
          : kernels.substr(kernels.find(": ", line) + 2,
                           kernels.find('\n', line) - kernels.find(": ", line) - 2);
  return fmt::format("#{} ({}), timed {:.3f} ms", choice->index, text, choice->ms);
}

/// Compiles case `c` (tuned: with --autotune max), checks it on sampled rows and prints its
/// bandwidth against the copy's.
void bench_case(const Case& c, bool tuned, double copy_gbps, double bytes) {
  kiln::driver::CompileOptions options;
  // KILN_CACHE_DIR when set (a GPU machine running the bundle), else the build tree's.
  const char* cache = std::getenv("KILN_CACHE_DIR");
  options.cache_dir = cache != nullptr && *cache != '\0' ? cache : KILN_BENCH_CACHE_DIR;
  options.device = kiln::ir::Device::kCuda;
  options.autotune =
      tuned ? kiln::autotune::AutotuneMode::kMax : kiln::autotune::AutotuneMode::kOff;
  const fs::path dump = options.cache_dir / fmt::format("pointwise-bench-{}-tuned", c.name);
  if (tuned) options.dump_dir = dump;
  kiln::driver::CompiledModel model = kiln::driver::compile(case_model(c), options);
  const kiln::driver::CompileStats& stats = model.stats();
  Tensor x(DType::kFloat32, {kN / c.cols, c.cols});
  {
    float* p = x.mutable_values<float>().data();
    for (int64_t i = 0; i < kN; ++i) p[i] = static_cast<float>((i * 7919) % 2001) * 0.002f - 2.0f;
  }
  std::vector<Tensor> inputs;
  inputs.push_back(std::move(x));
  std::vector<Tensor> y = model.run(inputs);
  // The error on every 997th row against the scalar reference, relative to the row's largest
  // |value|.
  double worst = 0;
  std::vector<float> want(static_cast<size_t>(c.cols));
  const float* in = inputs[0].values<float>().data();
  const float* out = y[0].values<float>().data();
  for (int64_t r = 0; r < kN / c.cols; r += 997) {
    c.reference(in + r * c.cols, want.data(), c.cols);
    double top = 1e-30;
    for (float v : want) top = std::max<double>(top, std::abs(v));
    for (int64_t i = 0; i < c.cols; ++i)
      worst = std::max(worst, std::abs(out[r * c.cols + i] - want[static_cast<size_t>(i)]) / top);
  }
  y.clear();
  double best = std::numeric_limits<double>::infinity();
  int kernels_per_run = 0;
  for (int r = 0; r < kRuns; ++r) {
    kiln_rt::Profile profile;
    profile.origin = std::chrono::steady_clock::now();
    (void)model.run(inputs, &profile);
    double run_kernels = 0;
    kernels_per_run = 0;
    for (const kiln_rt::ProfileEvent& e : profile.events) {
      if (std::string(e.kind) != "kernel") continue;
      run_kernels += static_cast<double>(e.duration_ns) * 1e-9;
      ++kernels_per_run;
    }
    best = std::min(best, run_kernels);
  }
  const double g = bytes / best / 1e9;
  fmt::print(
      "{:<14} {:<40} {} kernel(s) {:8.1f} GB/s  ({:.3f} ms) = {:5.1f}% of copy;"
      "  max rel. error {:.1e}\n",
      tuned ? c.name + " tuned" : c.name, tuned ? "  (--autotune max)" : c.formula, kernels_per_run,
      g, best * 1e3, 100 * g / copy_gbps, worst);
  if (tuned) {
    const fs::path autotune_cache = kiln::autotune::default_autotune_cache_path(options.cache_dir);
    const std::string choice = tuned_choice(dump, autotune_cache);
    fmt::print("  launch configuration: {}\n", choice.empty() ? "none stored" : choice);
  }
  if (stats.kernels != 1 || stats.extern_calls != 0) {
    fmt::print("  NOTE: {} kernels and {} library calls, not one kernel\n", stats.kernels,
               stats.extern_calls);
  }
}

int bench() {
  Driver cu;
  if (!cu.load()) {
    fmt::print("kiln_cuda_pointwise_bench: skipped: no CUDA device\n");
    return 0;
  }
  char gpu[256] = {};
  cu.DeviceGetName(gpu, sizeof gpu, 0);
  const double bytes = 2.0 * sizeof(float) * static_cast<double>(kN);
  fmt::print("kiln_cuda_pointwise_bench on {}: N = {} floats ({:.0f} MiB) per array, best of {}\n",
             gpu, kN, static_cast<double>(kN) * 4 / (1 << 20), kRuns);
  const double copy = copy_seconds(cu);
  const double copy_gbps = bytes / copy / 1e9;
  fmt::print("device-to-device copy            {:8.1f} GB/s  ({:.3f} ms)\n", copy_gbps, copy * 1e3);

  for (const Case& c : cases()) {
    // Softmax and LayerNorm run twice: with the heuristic's launch configuration (--autotune
    // off, so that a cached choice does not apply), then tuned (--autotune max: the first run
    // times every configuration and keeps the fastest; cuda_kernel.h).
    const bool tunable = c.name == "softmax_128" || c.name == "layernorm_768";
    for (bool tuned : {false, true}) {
      if (tuned && !tunable) continue;
      bench_case(c, tuned, copy_gbps, bytes);
    }
  }
  return 0;
}

}  // namespace

int main() {
  try {
    return bench();
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln_cuda_pointwise_bench: error: {}\n", e.what());
    return 1;
  }
}
