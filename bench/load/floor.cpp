// bench-load's "floor" engine: one thread running an arithmetic loop of a fixed length, timed as
// `kiln bench` times a model (kiln::time_runs and kiln::bench_figures from include/kiln/kiln.h:
// the same clock, the same untimed wait before each run, the same nearest-rank percentiles). The
// loop touches no memory, starts no threads and makes no system calls, so the spread of its
// times is the machine's alone: preemption by the busy processes, interrupts, the hypervisor.
// Its p99/p50 at a model's idle p50 is what no engine's run of that length can beat there.
//   floor --calibrate MS
//       prints the number of steps that take MS milliseconds here (the fastest of 5 tries)
//   floor --steps N [--iters I] [--warmup W] [--wait-ms MS]
//       times I runs of N steps after W untimed ones; prints one JSON line of kiln bench's fields
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace {

// One step is a dependent multiply-add, so the loop's length is its latency chain: the compiler
// can neither vectorize it nor fold it, and the empty asm keeps the value in a register it must
// update each step.
double steps_of(int64_t steps) {
  double x = 1.0;
  for (int64_t i = 0; i < steps; ++i) {
    x = x * 0.9999999 + 1e-7;
    asm volatile("" : "+x"(x));
  }
  return x;
}

volatile double sink;

// Milliseconds of one run of `steps` steps.
double time_steps(int64_t steps) {
  const auto start = std::chrono::steady_clock::now();
  sink = steps_of(steps);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: floor --calibrate MS | floor --steps N [--iters I] [--warmup W] "
               "[--wait-ms MS]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  double calibrate_ms = 0, wait_ms = 0;
  int64_t steps = 0;
  int iters = 400, warmup = 82;
  for (int i = 1; i < argc; ++i) {
    if (i + 1 >= argc) usage();
    const char* value = argv[++i];
    if (!std::strcmp(argv[i - 1], "--calibrate")) {
      calibrate_ms = std::atof(value);
    } else if (!std::strcmp(argv[i - 1], "--steps")) {
      steps = std::atoll(value);
    } else if (!std::strcmp(argv[i - 1], "--iters")) {
      iters = std::atoi(value);
    } else if (!std::strcmp(argv[i - 1], "--warmup")) {
      warmup = std::atoi(value);
    } else if (!std::strcmp(argv[i - 1], "--wait-ms")) {
      wait_ms = std::atof(value);
    } else {
      usage();
    }
  }
  if (calibrate_ms > 0) {
    constexpr int64_t kProbe = 1 << 22;
    double fastest = time_steps(kProbe);
    for (int k = 0; k < 4; ++k) fastest = std::min(fastest, time_steps(kProbe));
    std::printf("%lld\n", static_cast<long long>(calibrate_ms / fastest * kProbe));
    return 0;
  }
  if (steps <= 0 || iters < 1 || warmup < 0 || wait_ms < 0) usage();
  struct None {};
  const std::vector<double> ms = kiln::time_runs(
      warmup, iters,
      [&] {
        sink = steps_of(steps);
        return None{};
      },
      wait_ms);
  const kiln::BenchResult r = kiln::bench_figures(ms, warmup);
  std::printf(
      "{\"steps\": %lld, \"threads\": 1, \"iters\": %d, \"warmup\": %d, \"wait_ms\": %g, "
      "\"min_ms\": %.6f, \"p50_ms\": %.6f, \"p90_ms\": %.6f, \"p99_ms\": %.6f, \"mean_ms\": "
      "%.6f}\n",
      static_cast<long long>(steps), r.iters, r.warmup, wait_ms, r.min_ms, r.p50_ms, r.p90_ms,
      r.p99_ms, r.mean_ms);
  return 0;
}
