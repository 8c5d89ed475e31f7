// kiln_resnet_conv_bench: the convolution choices (src/autotune/conv_choice.h) at the distinct
// Conv layers of a ResNet-50 (v1.5: stride 2 on the 3x3 convolutions; batch 1, 224 x 224,
// float32 NCHW), built here as ConvProblems. For each layer it runs algorithm selection in max
// mode (autotune/select.h, with a fresh autotune cache, so every choice is compiled and timed in
// this run by the isolated `kiln autotune-bench` helper: the median of repetitions after warm-up
// on all OpenMP threads, weight and bias prepared outside the timing) and prints
//   - the chosen choice (the fastest) and its GFLOP/s,
//   - the heuristic choice's GFLOP/s (what --autotune off compiles: the template's default
//     config),
//   - the best template config's GFLOP/s,
//   - oneDNN's and im2col + OpenBLAS's GFLOP/s, measured in the same run,
//   - the Winograd F(4x4, 3x3) template's (3x3 stride-1 layers; GFLOP/s of the direct
//     convolution's FLOPs, so that the columns compare times),
//   - the chosen choice's and the best template's ratios to each library and fraction of the FMA
//     peak (cores x clock x 2 FMA units x floats per vector x 2),
// then the time of all of ResNet-50's convolutions (each layer times its count) per way. It
// never asserts.
//
// Usage: kiln_resnet_conv_bench [--quick] [--verbose] [--avx2]
//   --quick: the first 6 layers only; --verbose: the AUTOTUNE table of every layer too; --avx2:
//   the templates' AVX2 configs on an AVX-512 host (what a library's x86-64-v3 variant runs).
#include <fmt/format.h>
#include <omp.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "autotune/select.h"
#include "bench_util.h"

#ifndef KILN_BENCH_CACHE_DIR
#define KILN_BENCH_CACHE_DIR "bench-cache"
#endif

namespace {

using kiln::autotune::ConvProblem;
using kiln::autotune::TemplateIsa;

struct Layer {
  std::string name;
  ConvProblem problem;
  int count;  // how many convolutions of ResNet-50 have this shape
};

ConvProblem conv(int64_t c, int64_t size, int64_t m, int64_t k, int64_t stride) {
  const int64_t pad = k / 2;
  return {.n = 1,
          .c = c,
          .h = size,
          .w = size,
          .m = m,
          .kh = k,
          .kw = k,
          .stride_h = stride,
          .stride_w = stride,
          .pad_top = pad,
          .pad_left = pad,
          .pad_bottom = pad,
          .pad_right = pad};
}

// The 23 distinct convolutions of ResNet-50 with their counts (53 convolutions in all).
std::vector<Layer> resnet50_layers() {
  return {
      {"conv1", conv(3, 224, 64, 7, 2), 1},
      {"l1 1x1 64-64", conv(64, 56, 64, 1, 1), 1},
      {"l1 3x3 64", conv(64, 56, 64, 3, 1), 3},
      {"l1 1x1 64-256", conv(64, 56, 256, 1, 1), 4},  // 3 + the downsample
      {"l1 1x1 256-64", conv(256, 56, 64, 1, 1), 2},
      {"l2 1x1 256-128", conv(256, 56, 128, 1, 1), 1},
      {"l2 3x3 128 s2", conv(128, 56, 128, 3, 2), 1},
      {"l2 1x1 128-512", conv(128, 28, 512, 1, 1), 4},
      {"l2 ds 256-512 s2", conv(256, 56, 512, 1, 2), 1},
      {"l2 1x1 512-128", conv(512, 28, 128, 1, 1), 3},
      {"l2 3x3 128", conv(128, 28, 128, 3, 1), 3},
      {"l3 1x1 512-256", conv(512, 28, 256, 1, 1), 1},
      {"l3 3x3 256 s2", conv(256, 28, 256, 3, 2), 1},
      {"l3 1x1 256-1024", conv(256, 14, 1024, 1, 1), 6},
      {"l3 ds 512-1024 s2", conv(512, 28, 1024, 1, 2), 1},
      {"l3 1x1 1024-256", conv(1024, 14, 256, 1, 1), 5},
      {"l3 3x3 256", conv(256, 14, 256, 3, 1), 5},
      {"l4 1x1 1024-512", conv(1024, 14, 512, 1, 1), 1},
      {"l4 3x3 512 s2", conv(512, 14, 512, 3, 2), 1},
      {"l4 1x1 512-2048", conv(512, 7, 2048, 1, 1), 3},
      {"l4 ds 1024-2048 s2", conv(1024, 14, 2048, 1, 2), 1},
      {"l4 1x1 2048-512", conv(2048, 7, 512, 1, 1), 2},
      {"l4 3x3 512", conv(512, 7, 512, 3, 1), 2},
  };
}

constexpr double kMissing = std::numeric_limits<double>::infinity();

// ms of the named choice, or of the fastest whose name starts with `prefix`.
double ms_of(const std::map<std::string, double>& times, const std::string& name) {
  auto it = times.find(name);
  return it == times.end() ? kMissing : it->second;
}

double best_with_prefix(const std::map<std::string, double>& times, const std::string& prefix,
                        std::string* which = nullptr) {
  double best = kMissing;
  for (const auto& [name, ms] : times) {
    if (name.rfind(prefix, 0) == 0 && ms < best) {
      best = ms;
      if (which) *which = name;
    }
  }
  return best;
}

std::string short_name(const std::string& name) {
  if (name.rfind("template ", 0) == 0) return "t:" + name.substr(9);
  if (name.rfind("winograd ", 0) == 0) return "w:" + name.substr(9);
  return name;
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false, verbose = false, avx2 = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--verbose") == 0) {
      verbose = true;
    } else if (std::strcmp(argv[i], "--avx2") == 0) {
      avx2 = true;
    } else {
      fmt::print(stderr, "usage: kiln_resnet_conv_bench [--quick] [--verbose] [--avx2]\n");
      return 2;
    }
  }
#ifdef KILN_BENCH_HELPER
  ::setenv("KILN_AUTOTUNE_HELPER", KILN_BENCH_HELPER, 0);
#endif
  const int threads = omp_get_max_threads();
  const double ghz = kiln::bench::measure_clock_ghz();
  const TemplateIsa isa = avx2 ? TemplateIsa::kAvx2 : kiln::autotune::host_template_isa();
  const int width = kiln::autotune::vector_width(isa);
  const double peak = threads * ghz * 2 * width * 2;
  fmt::print("kiln_resnet_conv_bench: {}, {} OpenMP threads\n", kiln::bench::cpu_model(), threads);
  fmt::print(
      "clock {:.2f} GHz measured (/proc/cpuinfo says {:.0f} MHz); FMA peak = {} x {:.2f} GHz x 2 "
      "x {} x 2 = {:.0f} GFLOP/s ({})\n",
      ghz, kiln::bench::cpuinfo_mhz(), threads, ghz, width, peak,
      isa == TemplateIsa::kAvx512 ? "AVX-512" : "AVX2");
  fmt::print("timings: medians in the autotune helper; the machine may be shared (load {})\n\n",
             kiln::bench::load_average());

  const std::filesystem::path cache_path =
      std::filesystem::path(KILN_BENCH_CACHE_DIR) / "resnet-conv-autotune.json";
  std::filesystem::remove(cache_path);
  std::vector<Layer> layers = resnet50_layers();
  if (quick) layers.resize(6);

  fmt::print(
      "{:<19} {:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>6} {:>6} {:>6} {:>6} | {:>5} {:>5}  "
      "{}\n",
      "layer (GFLOP/s)", "cnt", "chosen", "heur", "tmpl", "onednn", "im2col", "wino", "ch/dnn",
      "ch/bla", "tm/dnn", "tm/bla", "%pk", "%pkT", "chosen; best template");
  struct Totals {
    double chosen = 0, heuristic = 0, tmpl = 0, onednn = 0, im2col = 0, no_winograd = 0;
  } total;
  int within = 0, measured = 0;
  for (const Layer& layer : layers) {
    kiln::autotune::ConvSelectRequest request;
    request.problem = layer.problem;
    request.threads = threads;
    request.mode = kiln::autotune::AutotuneMode::kMax;
    request.cache_path = cache_path;
    request.code_cache_dir = KILN_BENCH_CACHE_DIR;
    request.print_results = verbose;
    request.isa = isa;
    const kiln::autotune::ConvSelection s = kiln::autotune::select_conv(request);
    std::map<std::string, double> times;
    for (const auto& t : s.timings) times[t.name] = t.ms;
    const std::string heuristic_name =
        kiln::autotune::conv_choices(layer.problem, threads, isa).front()->name();
    std::string best_template;
    const double chosen = ms_of(times, s.choice->name()), heuristic = ms_of(times, heuristic_name),
                 tmpl = best_with_prefix(times, "template ", &best_template),
                 onednn = ms_of(times, "onednn"), im2col = ms_of(times, "im2col-openblas"),
                 winograd = best_with_prefix(times, "winograd ");
    const double gflop = layer.problem.flops() / 1e9;
    auto rate = [&](double ms) { return ms == kMissing ? 0.0 : gflop / (ms * 1e-3); };
    fmt::print(
        "{:<19} {:>4} {:8.1f} {:8.1f} {:8.1f} {:8.1f} {:8.1f} {:8.1f} | {:6.2f} {:6.2f} {:6.2f} "
        "{:6.2f} | {:5.1f} {:5.1f}  {}; {}\n",
        layer.name, layer.count, rate(chosen), rate(heuristic), rate(tmpl), rate(onednn),
        rate(im2col), rate(winograd), onednn / chosen, im2col / chosen, onednn / tmpl,
        im2col / tmpl, 100 * rate(chosen) / peak, 100 * rate(tmpl) / peak,
        short_name(s.choice->name()), short_name(best_template));
    for (const auto& [name, why] : s.dropped) fmt::print("    dropped {}: {}\n", name, why);
    total.chosen += layer.count * chosen;
    total.heuristic += layer.count * heuristic;
    total.tmpl += layer.count * tmpl;
    total.onednn += layer.count * onednn;
    total.im2col += layer.count * im2col;
    total.no_winograd += layer.count * std::min({tmpl, onednn, im2col});
    ++measured;
    within += chosen <= 1.03 * std::min(onednn, im2col);
  }
  fmt::print(
      "\nall {} ResNet-50 convolutions of these layers, ms: chosen {:.2f}, heuristic {:.2f}, best "
      "template {:.2f}, oneDNN {:.2f}, im2col + OpenBLAS {:.2f}; the best without Winograd "
      "{:.2f}\n",
      [&] {
        int n = 0;
        for (const Layer& l : layers) n += l.count;
        return n;
      }(),
      total.chosen, total.heuristic, total.tmpl, total.onednn, total.im2col, total.no_winograd);
  fmt::print("chosen within 3% of the best library on {} of {} layers\n", within, measured);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "kiln_resnet_conv_bench: {}\n", e.what());
  return 1;
}
