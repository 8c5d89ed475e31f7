// bench-load's "floor" engines: an arithmetic loop of a fixed length, timed as `kiln bench` times
// a model (kiln::time_runs and kiln::bench_figures from include/kiln/kiln.h: the same clock, the
// same untimed wait before each run, the same nearest-rank percentiles). The loop touches no
// memory and makes no system calls, so the spread of its times is the machine's alone: preemption
// by the busy processes, interrupts, the hypervisor.
//   - One thread ("floor"): its p99/p50 at a model's idle p50 is what no engine's run of that
//     length can beat there.
//   - T threads ("floor-par", --threads T): each run is T times the steps, cut into 4 chunks per
//     thread that the threads take from one counter, as Kiln's pool shares a loop (the caller
//     takes chunks too, a thread that is done takes what is left). Each thread is pinned to its
//     own CPU, which is where Kiln's workers move (keep_apart), and the helpers poll between
//     runs, as Kiln's do through gaps under 0.3 ms. Idle, a run is as long as one thread's; a run
//     whose helper is off its CPU takes up to T times as long, with nothing else to blame: its
//     p99/p50 under load is what no engine whose runs need T threads at once can beat.
//   floor --calibrate MS
//       prints the number of steps that take one thread MS milliseconds here (the fastest of 5)
//   floor --steps N [--threads T] [--iters I] [--warmup W] [--wait-ms MS]
//       times I runs of N steps per thread after W untimed ones; prints one JSON line of kiln
//       bench's fields. With T > 1, the threads are pinned to the first T CPUs this process may
//       use (the caller to the first).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.h"
#include "pin.h"

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
               "usage: floor --calibrate MS | floor --steps N [--threads T] [--iters I] "
               "[--warmup W] [--wait-ms MS]\n");
  std::exit(2);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The runs of the parallel floor: the caller opens a run by bumping `generation`; every thread
// (the caller too) takes chunks from `next` until none is left; the run ends when `done` counts
// them all. Helpers poll `generation` between runs.
class ParallelFloor {
 public:
  // `threads` threads, pinned to `cpus` (the caller to the first), each run `steps` per thread.
  ParallelFloor(int threads, const std::vector<int>& cpus, int64_t steps)
      : chunks_(4 * threads), chunk_steps_(steps * threads / chunks_) {
    for (int t = 1; t < threads; ++t) {
      helpers_.emplace_back([this, cpu = cpus[t]] {
        pin_to(cpu);
        for (uint64_t seen = 0; !stopping_.load();) {
          const uint64_t now = generation_.load();
          if (now == seen) {
            cpu_relax();
            continue;
          }
          seen = now;
          take_chunks();
        }
      });
    }
    pin_to(cpus[0]);
  }
  ~ParallelFloor() {
    stopping_.store(true);
    for (std::thread& t : helpers_) t.join();
  }

  void run() {
    done_.store(0);
    next_.store(0);
    generation_.fetch_add(1);
    take_chunks();
    while (done_.load() < chunks_) cpu_relax();
  }

 private:
  void take_chunks() {
    while (next_.fetch_add(1) < chunks_) {
      sink = steps_of(chunk_steps_);
      done_.fetch_add(1);
    }
  }

  const int64_t chunks_, chunk_steps_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_{0}, done_{0};
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> helpers_;
};

}  // namespace

int main(int argc, char** argv) {
  double calibrate_ms = 0, wait_ms = 0;
  int64_t steps = 0;
  int iters = 400, warmup = 82, threads = 1;
  for (int i = 1; i < argc; ++i) {
    if (i + 1 >= argc) usage();
    const char* value = argv[++i];
    if (!std::strcmp(argv[i - 1], "--calibrate")) {
      calibrate_ms = std::atof(value);
    } else if (!std::strcmp(argv[i - 1], "--steps")) {
      steps = std::atoll(value);
    } else if (!std::strcmp(argv[i - 1], "--threads")) {
      threads = std::atoi(value);
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
  if (steps <= 0 || threads < 1 || iters < 1 || warmup < 0 || wait_ms < 0) usage();
  std::unique_ptr<ParallelFloor> parallel;
  if (threads > 1) {
    cpu_set_t allowed;
    std::vector<int> cpus;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
      }
    }
    if (static_cast<int>(cpus.size()) < threads) {
      std::fprintf(stderr, "floor: %d threads need %d CPUs, this process may use %zu\n", threads,
                   threads, cpus.size());
      return 1;
    }
    parallel = std::make_unique<ParallelFloor>(threads, cpus, steps);
  }
  struct None {};
  const std::vector<double> ms = kiln::time_runs(
      warmup, iters,
      [&] {
        if (parallel) {
          parallel->run();
        } else {
          sink = steps_of(steps);
        }
        return None{};
      },
      wait_ms);
  parallel.reset();
  const kiln::BenchResult r = kiln::bench_figures(ms, warmup);
  std::printf(
      "{\"steps\": %lld, \"threads\": %d, \"iters\": %d, \"warmup\": %d, \"wait_ms\": %g, "
      "\"min_ms\": %.6f, \"p50_ms\": %.6f, \"p90_ms\": %.6f, \"p99_ms\": %.6f, \"mean_ms\": "
      "%.6f}\n",
      static_cast<long long>(steps), threads, r.iters, r.warmup, wait_ms, r.min_ms, r.p50_ms,
      r.p90_ms, r.p99_ms, r.mean_ms);
  return 0;
}
