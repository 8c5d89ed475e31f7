// kiln_stream_bench: how close a Kiln-compiled fused pointwise chain comes to this machine's
// memory bandwidth. It measures
//   1. the STREAM triad a[i] = b[i] + s * c[i] over N = 64M floats per array (OpenMP, best of
//      several runs, 3 arrays x 4 bytes x N per run), and the same triad writing into a freshly
//      allocated `a` each run (what a run that allocates its output pays in page faults);
//   2. models compiled with driver::compile, whose ops must fuse into one kernel that reads x
//      once and writes y once (2 arrays x 4 bytes x N per run):
//        chain:       y = Relu(x * 2 + 1) * 0.5 + Sigmoid(x)   (the one compared with the triad)
//        cheap chain: y = Relu(x * 2 + 1) * 0.5 - x            (no exp: memory bound on any CPU)
//      each timed three ways: through CompiledModel::run (which allocates y every run), the
//      generated kernel alone on a preallocated y (found by name in the loaded model library),
//      and run() again after mallopt() asks glibc to keep freed memory (no fresh pages per run).
// It prints bandwidths, page faults per run and ratios to the triad; it asserts nothing.
#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>
#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "driver/compile.h"
#include "graph/graph.h"
#include "support/error.h"

#ifndef KILN_BENCH_CACHE_DIR
#define KILN_BENCH_CACHE_DIR "bench-cache"
#endif
#ifndef KILN_BENCH_DUMP_DIR
#define KILN_BENCH_DUMP_DIR "bench-dump"
#endif

namespace {

namespace fs = std::filesystem;
using kiln::graph::DType;
using kiln::graph::Tensor;
using kiln::graph::Type;
using kiln::graph::Value;

constexpr int64_t kN = int64_t{64} << 20;  // floats per array
constexpr int kRuns = 10;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

/// Best (minimum) time of `runs` calls of `f`, and the page faults per call.
template <typename F>
std::pair<double, double> best_of(int runs, F&& f) {
  double best = std::numeric_limits<double>::infinity();
  long faults = minor_faults();
  for (int r = 0; r < runs; ++r) {
    auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, seconds_since(start));
  }
  return {best, static_cast<double>(minor_faults() - faults) / runs};
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer allocate(int64_t n) {
  void* p = std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float));
  if (p == nullptr) throw std::bad_alloc();
  return Buffer(static_cast<float*>(p));
}

void triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < kN; ++i) a[i] = b[i] + s * c[i];
}

double gbps(double bytes, double seconds) { return bytes / seconds / 1e9; }

/// A chain of ai.onnx opset-17 ops over x: float32[kN] with one output y.
struct Chain {
  std::string name;
  std::string formula;
  bool with_sigmoid;
  double reference(double x) const {
    double left = std::max(0.0, x * 2.0 + 1.0) * 0.5;
    return with_sigmoid ? left + 1.0 / (1.0 + std::exp(-x)) : left - x;
  }
};

kiln::graph::Model chain_model(const Chain& chain) {
  kiln::graph::Model model;
  model.ir_version = 8;
  model.producer_name = "kiln_stream_bench";
  model.opsets[""] = 17;
  model.graph = std::make_unique<kiln::graph::Graph>(chain.name);
  kiln::graph::Graph& g = *model.graph;
  int next = 0;
  auto scalar = [&](float value) {
    auto t = std::make_shared<Tensor>(DType::kFloat32, std::vector<int64_t>{});
    t->mutable_values<float>()[0] = value;
    Value* v = g.add_value(fmt::format("c{}", next++),
                           Type::tensor(DType::kFloat32, kiln::graph::Shape{}));
    g.set_initializer(v, std::move(t));
    return v;
  };
  auto op = [&](const std::string& type, std::vector<Value*> inputs) {
    Value* out = g.add_value(fmt::format("v{}", next++), Type());
    g.add_node(fmt::format("n{}_{}", next++, type), type, "", 17, std::move(inputs), {out}, {});
    return out;
  };
  Value* x = g.add_value("x", Type::tensor(DType::kFloat32, kiln::graph::Shape{kN}));
  g.add_input(x);
  Value* left =
      op("Mul", {op("Relu", {op("Add", {op("Mul", {x, scalar(2)}), scalar(1)})}), scalar(0.5f)});
  Value* y = chain.with_sigmoid ? op("Add", {left, op("Sigmoid", {x})}) : op("Sub", {left, x});
  g.add_output(y);
  kiln::graph::verify(g, chain.name);
  return model;
}

/// The declarations `extern "C" void NAME(ARGS);` of the generated kernels in the dumped wrapper.
std::vector<std::pair<std::string, std::string>> kernel_declarations(const fs::path& dump_dir) {
  std::ifstream in(dump_dir / "5_wrapper.cpp");
  const std::string prefix = "extern \"C\" void ";
  std::vector<std::pair<std::string, std::string>> result;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) != 0 || !line.ends_with(");")) continue;
    size_t open = line.find('(', prefix.size());
    result.emplace_back(line.substr(prefix.size(), open - prefix.size()),
                        line.substr(open + 1, line.size() - open - 3));
  }
  return result;
}

/// Finds `symbol` in a loaded shared object whose path lies under `dir` (the model library that
/// driver::compile loaded from the code cache).
void* find_loaded_symbol(const fs::path& dir, const std::string& symbol) {
  struct Search {
    std::string dir;
    std::vector<std::string> paths;
  } search{fs::absolute(dir).lexically_normal().string(), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (name.rfind(s->dir, 0) == 0) s->paths.push_back(name);
        return 0;
      },
      &search);
  for (const std::string& path : search.paths) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    void* p = dlsym(handle, symbol.c_str());
    dlclose(handle);  // drops the reference RTLD_NOLOAD took; the model still holds one
    if (p != nullptr) return p;
  }
  return nullptr;
}

int bench() {
  const int threads = omp_get_max_threads();
  const double mib = static_cast<double>(kN) * sizeof(float) / (1 << 20);
  fmt::print(
      "kiln_stream_bench: N = {} floats ({:.0f} MiB) per array, {} OpenMP threads, best of "
      "{} runs\n",
      kN, mib, threads, kRuns);

  // 1. STREAM triad on buffers touched once beforehand (first touch by the same threads).
  const double triad_bytes = 3.0 * sizeof(float) * static_cast<double>(kN);
  double triad_gbps = 0;
  {
    Buffer a = allocate(kN), b = allocate(kN), c = allocate(kN);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < kN; ++i) {
      a[i] = 0.0f;
      b[i] = 1.0f;
      c[i] = 2.0f;
    }
    triad(a.get(), b.get(), c.get(), 3.0f);  // warm-up
    auto [t, faults] = best_of(kRuns, [&] { triad(a.get(), b.get(), c.get(), 3.0f); });
    triad_gbps = gbps(triad_bytes, t);
    fmt::print(
        "STREAM triad                          {:8.2f} GB/s  ({:.2f} ms, {:.0f} page "
        "faults/run)\n",
        triad_gbps, t * 1e3, faults);

    // 2. The triad into a fresh output buffer each run (allocated and freed inside the timing).
    auto [tf, faults_fresh] = best_of(kRuns, [&] {
      Buffer fresh = allocate(kN);
      triad(fresh.get(), b.get(), c.get(), 3.0f);
    });
    fmt::print(
        "STREAM triad, fresh output each run   {:8.2f} GB/s  ({:.2f} ms, {:.0f} page "
        "faults/run)\n",
        gbps(triad_bytes, tf), tf * 1e3, faults_fresh);
  }

  // 2. The compiled chains.
  std::vector<Tensor> inputs;
  inputs.emplace_back(DType::kFloat32, std::vector<int64_t>{kN});
  {
    float* x = inputs[0].mutable_values<float>().data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < kN; ++i) x[i] = static_cast<float>(i % 1000) * 0.002f - 1.0f;
  }
  const double chain_bytes = 2.0 * sizeof(float) * static_cast<double>(kN);
  auto report = [&](const std::string& what, double seconds, double faults) {
    double g = gbps(chain_bytes, seconds);
    fmt::print("  {:<34} {:8.2f} GB/s  ({:.2f} ms, {:.0f} page faults/run)  = {:.0f}% of triad\n",
               what, g, seconds * 1e3, faults, 100 * g / triad_gbps);
  };

  const std::vector<Chain> chains = {
      {"chain", "y = Relu(x * 2 + 1) * 0.5 + Sigmoid(x)", true},
      {"cheap_chain", "y = Relu(x * 2 + 1) * 0.5 - x", false},
  };
  std::vector<kiln::driver::CompiledModel> compiled;
  for (const Chain& chain : chains) {
    kiln::driver::CompileOptions options;
    options.cache_dir = KILN_BENCH_CACHE_DIR;
    options.dump_dir = fs::path(KILN_BENCH_DUMP_DIR) / chain.name;
    compiled.push_back(kiln::driver::compile(chain_model(chain), options));
    const kiln::driver::CompiledModel& model = compiled.back();
    const kiln::driver::CompileStats& stats = model.stats();
    auto kernels = kernel_declarations(options.dump_dir);
    std::string names;
    for (const auto& [name, args] : kernels) names += (names.empty() ? "" : ", ") + name;
    fmt::print(
        "{}: {} kernel(s) [{}], {} library calls, {} intermediate allocations, {} "
        "({:.2f} s); sources in {}\n",
        chain.formula, stats.kernels, names, stats.extern_calls, stats.intermediate_allocations,
        stats.cache_hit ? "from the code cache" : "built", stats.seconds,
        fs::absolute(options.dump_dir).string());
    if (stats.kernels != 1 || stats.extern_calls != 0 || stats.intermediate_allocations != 0) {
      fmt::print("  NOTE: the chain did not become exactly one kernel\n");
    }

    std::vector<Tensor> check = model.run(inputs);
    const float* x = inputs[0].values<float>().data();
    const float* y = check[0].values<float>().data();
    double worst = 0;
    for (int64_t i = 0; i < kN; i += 4099) {
      worst = std::max(worst, std::abs(chain.reference(x[i]) - y[i]));
    }
    check.clear();
    fmt::print("  max |error| against a scalar reference (sampled): {:.2e}\n", worst);

    auto [t_run, faults_run] = best_of(kRuns, [&] { (void)model.run(inputs); });
    report("via CompiledModel::run", t_run, faults_run);

    if (kernels.size() == 1 && kernels[0].second == "const float*, float*") {
      using Kernel = void(const float*, float*);
      auto* kernel =
          reinterpret_cast<Kernel*>(find_loaded_symbol(options.cache_dir, kernels[0].first));
      if (kernel != nullptr) {
        Buffer out = allocate(kN);
        kernel(x, out.get());  // first touch of the output
        auto [t, faults] = best_of(kRuns, [&] { kernel(x, out.get()); });
        report("kernel alone, preallocated y", t, faults);
      } else {
        fmt::print("  kernel alone: symbol {} not found in a loaded library\n", kernels[0].first);
      }
    } else {
      fmt::print("  kernel alone: skipped (not one kernel taking (const float*, float*))\n");
    }
  }

  // 3. run() with glibc keeping freed memory: large blocks come from the heap, not fresh mmaps.
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  fmt::print("with mallopt(M_MMAP_THRESHOLD = 512 MiB, M_TRIM_THRESHOLD = max):\n");
  for (size_t k = 0; k < chains.size(); ++k) {
    (void)compiled[k].run(inputs);
    auto [t, faults] = best_of(kRuns, [&] { (void)compiled[k].run(inputs); });
    report(chains[k].name + " via run(), memory kept", t, faults);
  }
  return 0;
}

}  // namespace

int main() {
  try {
    return bench();
  } catch (const std::exception& e) {
    fmt::print(stderr, "kiln_stream_bench: error: {}\n", e.what());
    return 1;
  }
}
