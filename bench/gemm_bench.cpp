// kiln_gemm_bench: the C++ GEMM template (src/autotune/gemm_template.h) against OpenBLAS and
// oneDNN at transformer and CNN shapes. For each shape (written M x K x N: C[M, N] = A[M, K] @
// B[K, N], float32, row-major) it times
//   - OpenBLAS cblas_sgemm (Debian's openblas-openmp),
//   - oneDNN matmul with B in plain row-major layout, and with B reordered once, outside the
//     timing, into the layout oneDNN picks (format_tag::any), the counterpart of our prepack,
//   - every config of gemm_configs() for the host ISA, compiled through the code cache with Kiln's
//     JIT flags (-O3 -march=native -fopenmp) and called on B prepacked outside the timing,
// each by the median of repetitions after warm-up, on all OpenMP threads. It prints GFLOP/s, each
// template's ratio to OpenBLAS and to oneDNN (the better of its two), the fraction of the
// machine's FMA peak, and whether each template's result matches OpenBLAS's. It never asserts.
//
// Peak: cores x clock x 2 FMA units x floats per vector x 2 flops. The clock is measured (a
// chain of dependent imul, 3 cycles each, by thread CPU time, best of 10 runs of ~20 ms);
// /proc/cpuinfo's "cpu MHz" is printed beside it (in a VM it is often the nominal TSC rate, not the
// running clock).
//
// Usage: kiln_gemm_bench [--quick] [--cpu-time] [--shape MxKxN]...
//   --quick: the default config only; --cpu-time: see g_cpu_time.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "autotune/gemm_template.h"
#include "autotune/runtime_headers.h"
#include "bench_util.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"
#include "support/error.h"

#ifndef KILN_BENCH_CACHE_DIR
#define KILN_BENCH_CACHE_DIR "bench-cache"
#endif

namespace {

namespace fs = std::filesystem;
using kiln::autotune::GemmConfig;
using kiln::autotune::GemmProblem;
using kiln::autotune::TemplateIsa;
using Clock = std::chrono::steady_clock;
using kiln::bench::cpu_model;
using kiln::bench::cpuinfo_mhz;
using kiln::bench::load_average;
using kiln::bench::measure_clock_ghz;
using GemmFn = void(int64_t, const float*, const float*, float*);
using GemmBiasFn = void(int64_t, const float*, const float*, float*, const float*);

struct Shape {
  int64_t m, k, n;
  std::string text() const { return fmt::format("{}x{}x{}", m, k, n); }
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// 64-byte aligned float storage (vectors would give 16-byte alignment only).
struct Buffer {
  explicit Buffer(size_t count)
      : data(static_cast<float*>(std::aligned_alloc(64, (count * 4 + 63) / 64 * 64))),
        size(count) {}
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data;
  size_t size;
};

void fill_random(Buffer& buffer, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (size_t i = 0; i < buffer.size; ++i) buffer.data[i] = dist(rng);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// --cpu-time: time by this process's CPU time instead of the wall clock. With OMP_NUM_THREADS=1
// on a shared machine it leaves out the time other processes ran (with more threads it would count
// OpenMP's spinning at barriers).
bool g_cpu_time = false;

double now_seconds() {
  if (!g_cpu_time) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// One thing to time, with its samples. Candidates are timed in interleaved rounds (every
// candidate a few calls per round, rounds repeated), so that a burst of load from other processes
// on a shared machine spreads over all of them instead of spoiling one.
struct Candidate {
  Candidate(std::string name, std::function<void()> run)
      : name(std::move(name)), run(std::move(run)) {}

  std::string name;
  std::function<void()> run;
  std::vector<double> samples;

  double median() const {
    std::vector<double> sorted = samples;
    std::sort(sorted.begin(), sorted.end());
    return sorted[sorted.size() / 2];
  }
  double best() const { return *std::min_element(samples.begin(), samples.end()); }
};

// Two warm-up calls per candidate, then `rounds` rounds (in a shuffled order each) of about
// `round_budget` seconds each (split evenly among the candidates, at least 2 calls each per round).
void time_interleaved(std::vector<Candidate>& candidates, int rounds = 7,
                      double round_budget = 0.25) {
  std::vector<int> calls(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto start = Clock::now();
    candidates[i].run();
    candidates[i].run();
    const double once = std::max(seconds_since(start) / 2, 1e-7);
    const double share = round_budget / double(candidates.size());
    calls[i] = static_cast<int>(std::clamp(share / once, 2.0, 100.0));
  }
  // Each round starts at another candidate (and the order is shuffled), so that no candidate is
  // always the one that runs after, say, oneDNN with its different data in the caches.
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(12345);
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      for (int call = 0; call < calls[i]; ++call) {
        const double start = now_seconds();
        candidates[i].run();
        candidates[i].samples.push_back(now_seconds() - start);
      }
    }
  }
}

// oneDNN matmul on one shape, with B plain (ab) or in the layout oneDNN prefers (reordered once).
class DnnlMatmul {
 public:
  DnnlMatmul(const Shape& s, const float* a, const float* b, float* c, bool packed_b)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc a_md({s.m, s.k}, dt::f32, tag::ab);
    const dnnl::memory::desc b_plain({s.k, s.n}, dt::f32, tag::ab);
    const dnnl::memory::desc b_md({s.k, s.n}, dt::f32, packed_b ? tag::any : tag::ab);
    const dnnl::memory::desc c_md({s.m, s.n}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine_);
    a_ = dnnl::memory(a_md, engine_, const_cast<float*>(a));
    c_ = dnnl::memory(c_md, engine_, c);
    dnnl::memory b_user(b_plain, engine_, const_cast<float*>(b));
    if (pd.weights_desc() != b_plain) {
      b_ = dnnl::memory(pd.weights_desc(), engine_);
      dnnl::reorder(b_user, b_).execute(stream_, b_user, b_);
      stream_.wait();
    } else {
      b_ = b_user;
    }
    matmul_ = dnnl::matmul(pd);
    impl_ = pd.impl_info_str();
  }

  void run() {
    matmul_.execute(stream_, {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, b_}, {DNNL_ARG_DST, c_}});
    stream_.wait();
  }

  const std::string& impl() const { return impl_; }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::memory a_, b_, c_;
  dnnl::matmul matmul_;
  std::string impl_;
};

// max |x - y| / max |y|: how far a result is from OpenBLAS's.
double relative_error(const float* x, const float* y, size_t count) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < count; ++i) {
    diff = std::max(diff, double(std::abs(x[i] - y[i])));
    scale = std::max(scale, double(std::abs(y[i])));
  }
  return diff / std::max(scale, 1e-30);
}

struct Summary {
  Shape shape;
  double openblas = 0, onednn = 0, onednn_packed = 0, default_template = 0, best_template = 0;
  std::string best_name;
};

Summary bench_shape(const Shape& s, bool quick, double peak, kiln::codecache::CodeCache& cache) {
  const int threads = omp_get_max_threads();
  const GemmProblem problem{.n = s.n, .k = s.k};
  std::vector<GemmConfig> configs =
      kiln::autotune::gemm_configs(s.m, problem, threads, kiln::autotune::host_template_isa());
  if (quick) configs.resize(1);

  Buffer a(s.m * s.k), b(s.k * s.n), c(s.m * s.n), ref(s.m * s.n);
  fill_random(a, 1);
  fill_random(b, 2);
  auto gflops = [&](double seconds) { return s.flops() / seconds / 1e9; };

  fmt::print("\n== {} (M x K x N), {:.3f} GFLOP, {} threads\n", s.text(), s.flops() / 1e9, threads);
  Summary summary;
  summary.shape = s;

  // The templates include the runtime's kiln_rt_pool.h.
  kiln::codecache::CompilerConfig with_runtime;
  kiln::autotune::add_runtime(with_runtime);
  // Compile every config at once (the code cache runs compilers in parallel).
  std::vector<kiln::codecache::LibrarySpec> specs;
  for (const GemmConfig& config : configs) {
    specs.push_back(
        {{{"gemm.cpp", kiln::autotune::render_gemm(config, problem, "gemm")}}, with_runtime});
  }
  // The default once more with a fused bias + Relu epilogue: what the epilogue costs.
  const kiln::autotune::TemplateEpilogue bias_relu{
      .expr = "std::max(v + bias[n], 0.0f)",
      .args = {"bias"},
      .vector_expr = "kv_max(kv_add(v, kv_load(bias + n0)), kv_set1(0.0f))"};
  specs.push_back(
      {{{"gemm.cpp", kiln::autotune::render_gemm(configs[0], problem, "gemm", bias_relu)}},
       with_runtime});
  const auto compile_start = Clock::now();
  const std::vector<fs::path> paths = cache.compile_many(specs);
  fmt::print(
      "  ({} template configs and the default with an epilogue compiled or found in the "
      "cache in {:.1f} s)\n",
      configs.size(), seconds_since(compile_start));

  // The candidates: OpenBLAS (its result is the reference), oneDNN both ways, every template.
  std::vector<Candidate> candidates;
  candidates.emplace_back("openblas sgemm", [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data, s.k, b.data,
                s.n, 0.0f, ref.data, s.n);
  });
  std::vector<std::unique_ptr<DnnlMatmul>> dnnl;
  for (bool packed : {false, true}) {
    dnnl.push_back(std::make_unique<DnnlMatmul>(s, a.data, b.data, c.data, packed));
    candidates.emplace_back(fmt::format("onednn matmul, B {} [{}]",
                                        packed ? "reordered once" : "plain", dnnl.back()->impl()),
                            [d = dnnl.back().get()] { d->run(); });
  }
  constexpr size_t kFirstTemplate = 3;
  std::vector<kiln::codecache::LoadedLibrary> libraries;
  std::vector<std::unique_ptr<Buffer>> packed_b;
  for (size_t i = 0; i < configs.size(); ++i) {
    libraries.emplace_back(paths[i]);
    auto* gemm = libraries.back().symbol<GemmFn>("gemm");
    const std::vector<float> packed = kiln::autotune::prepack_b(configs[i], problem, b.data);
    packed_b.push_back(std::make_unique<Buffer>(packed.size()));
    std::copy(packed.begin(), packed.end(), packed_b.back()->data);
    candidates.emplace_back(
        configs[i].name() + (i == 0 ? " *" : ""),
        [&, gemm, bp = packed_b.back()->data] { gemm(s.m, a.data, bp, c.data); });
  }
  const size_t epilogue_index = candidates.size();
  Buffer bias(s.n);
  fill_random(bias, 3);
  libraries.emplace_back(paths.back());
  auto* gemm_bias_relu = libraries.back().symbol<GemmBiasFn>("gemm");
  candidates.emplace_back("default + fused bias + relu epilogue", [&, bp = packed_b[0]->data] {
    gemm_bias_relu(s.m, a.data, bp, c.data, bias.data);
  });

  // Correctness against OpenBLAS (one call each, before timing).
  candidates[0].run();
  std::vector<double> errors(candidates.size(), 0.0);
  Buffer ref_bias_relu(ref.size);
  for (size_t i = 0; i < ref.size; ++i) {
    ref_bias_relu.data[i] = std::max(ref.data[i] + bias.data[i % s.n], 0.0f);
  }
  for (size_t i = 1; i < candidates.size(); ++i) {
    std::fill_n(c.data, c.size, std::nanf(""));
    candidates[i].run();
    errors[i] = relative_error(c.data, (i == epilogue_index ? ref_bias_relu : ref).data, c.size);
  }

  time_interleaved(candidates);

  summary.openblas = gflops(candidates[0].median());
  summary.onednn = gflops(candidates[1].median());
  summary.onednn_packed = gflops(candidates[2].median());
  summary.default_template = gflops(candidates[kFirstTemplate].median());
  const double best_dnnl = std::max(summary.onednn, summary.onednn_packed);
  std::vector<size_t> order;
  for (size_t i = 0; i < candidates.size(); ++i) order.push_back(i);
  std::stable_sort(
      order.begin() + kFirstTemplate, order.begin() + epilogue_index,
      [&](size_t x, size_t y) { return candidates[x].median() < candidates[y].median(); });
  summary.best_template = gflops(candidates[order[kFirstTemplate]].median());
  summary.best_name = candidates[order[kFirstTemplate]].name;

  fmt::print("  {:<54} {:>9} {:>9} {:>8} {:>6} {:>6} {:>6}\n", "median of samples:", "ms",
             "best ms", "GFLOP/s", "%peak", "/blas", "/dnnl");
  for (size_t rank = 0; rank < order.size(); ++rank) {
    const Candidate& candidate = candidates[order[rank]];
    if (rank == kFirstTemplate) {
      fmt::print("  templates (* = heuristic default), fastest first:\n");
    }
    if (rank == epilogue_index) {
      fmt::print("  fused epilogue ({:+.1f}% time over the default without it):\n",
                 100 * (candidate.median() / candidates[kFirstTemplate].median() - 1));
    }
    const double g = gflops(candidate.median());
    const double error = errors[order[rank]];
    fmt::print("  {:<54} {:9.3f} {:9.3f} {:8.1f} {:6.1f} {:6.2f} {:6.2f}{}\n", candidate.name,
               candidate.median() * 1e3, candidate.best() * 1e3, g, 100 * g / peak,
               g / summary.openblas, g / best_dnnl,
               error > 1e-4 ? fmt::format("  MISMATCH (max err {:.1e})", error) : "");
  }
  return summary;
}

std::vector<Shape> parse_shapes(int argc, char** argv, bool& quick) {
  std::vector<Shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--cpu-time") {
      g_cpu_time = true;
    } else if (arg == "--shape" && i + 1 < argc) {
      Shape s{};
      if (std::sscanf(argv[++i], "%ldx%ldx%ld", &s.m, &s.k, &s.n) != 3) {
        kiln::user_error("--shape: expected MxKxN, found '{}'", argv[i]);
      }
      shapes.push_back(s);
    } else {
      kiln::user_error("unknown argument '{}' (expected --quick, --cpu-time or --shape MxKxN)",
                       arg);
    }
  }
  if (shapes.empty()) {
    // 3136x64x576 as the issue lists it, and 3136x576x64 (ResNet-50's 3x3 convolution with 64
    // channels on 56x56 as im2col + GEMM: K = 64 * 9, N = 64).
    shapes = {{128, 768, 768}, {128, 768, 3072}, {128, 3072, 768},   {1, 2048, 1000},
              {3136, 64, 576}, {3136, 576, 64},  {1024, 1024, 1024}, {2048, 2048, 2048}};
  }
  return shapes;
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  const std::vector<Shape> shapes = parse_shapes(argc, argv, quick);
  const int threads = omp_get_max_threads();
  const double ghz = measure_clock_ghz();
  const TemplateIsa isa = kiln::autotune::host_template_isa();
  const int width = kiln::autotune::vector_width(isa);
  const double peak = threads * ghz * 2 * width * 2;
  const double peak_avx2 = threads * ghz * 2 * 8 * 2;
  fmt::print("kiln_gemm_bench: {}, {} OpenMP threads, OpenBLAS {}\n", cpu_model(), threads,
             OPENBLAS_VERSION);
  fmt::print(
      "clock {:.2f} GHz measured (dependent imul chain; /proc/cpuinfo says {:.0f} MHz)\n"
      "FMA peak = {} cores x {:.2f} GHz x 2 units x {} floats x 2 = {:.0f} GFLOP/s ({}); "
      "with 256-bit vectors {:.0f} GFLOP/s\n",
      ghz, cpuinfo_mhz(), threads, ghz, width, peak,
      isa == TemplateIsa::kAvx512 ? "AVX-512" : "AVX2", peak_avx2);
  fmt::print(
      "the machine may be shared: timings are medians ({}) and still noisy; load average {}\n",
      g_cpu_time ? "process CPU time" : "wall clock", load_average());

  kiln::codecache::CodeCache cache(KILN_BENCH_CACHE_DIR);
  std::vector<Summary> summaries;
  for (const Shape& s : shapes) summaries.push_back(bench_shape(s, quick, peak, cache));

  fmt::print("\n== summary (GFLOP/s; ratios of the best template; load average now {})\n",
             load_average());
  fmt::print("{:<16} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>6}  {}\n", "MxKxN", "openblas",
             "dnnl", "dnnl-pk", "default", "best", "/blas", "/dnnl", "%peak", "best config");
  for (const Summary& r : summaries) {
    fmt::print("{:<16} {:9.1f} {:9.1f} {:9.1f} {:9.1f} {:9.1f} {:7.2f} {:7.2f} {:6.1f}  {}\n",
               r.shape.text(), r.openblas, r.onednn, r.onednn_packed, r.default_template,
               r.best_template, r.best_template / r.openblas,
               r.best_template / std::max(r.onednn, r.onednn_packed), 100 * r.best_template / peak,
               r.best_name);
  }
  // Every column is a GEMM choice (OpenBLAS, oneDNN on B plain and packed, the template configs),
  // so `--autotune max`, which times them all, picks the fastest: here, its GFLOP/s against the
  // best extern library's.
  fmt::print("\n== with --autotune max (the fastest choice, timed here)\n");
  fmt::print("{:<16} {:>9} {:>9} {:>7} {:>7} {:>6}\n", "MxKxN", "chosen", "extern", "/blas",
             "/extern", "%peak");
  for (const Summary& r : summaries) {
    const double best_extern = std::max({r.openblas, r.onednn, r.onednn_packed});
    const double chosen = std::max(best_extern, r.best_template);
    fmt::print("{:<16} {:9.1f} {:9.1f} {:7.2f} {:7.2f} {:6.1f}\n", r.shape.text(), chosen,
               best_extern, chosen / r.openblas, chosen / best_extern, 100 * chosen / peak);
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "kiln_gemm_bench: error: {}\n", e.what());
  return 1;
}
