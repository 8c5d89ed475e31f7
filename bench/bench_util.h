#pragma once
// What the benches print about the machine: the running clock (for the FMA peak), the CPU model
// and the load average. Shared by bench/gemm_bench.cpp and bench/resnet_conv_bench.cpp.
#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace kiln::bench {

// The running clock in GHz: a chain of dependent imul (3 cycles each on every x86-64 core since
// Nehalem), 1000 per iteration, timed by this thread's CPU time (so that time the thread spent
// descheduled on a shared machine does not count); the best of several runs. (A chain of
// add-immediates is no good: Golden Cove's renamer folds them.)
inline double measure_clock_ghz() {
  auto thread_seconds = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  auto run = [&](int64_t iterations) {
    const double start = thread_seconds();
    uint64_t x = 1;
    for (int64_t i = 0; i < iterations; ++i) {
      asm volatile(
          ".rept 1000\n\t"
          "imulq %0, %0\n\t"
          ".endr"
          : "+r"(x));
    }
    return thread_seconds() - start;
  };
  run(2000);
  double best = 1e9;
  for (int i = 0; i < 10; ++i) best = std::min(best, run(20000));
  return 20000.0 * 1000.0 * 3 / best / 1e9;
}

inline double cpuinfo_mhz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0) return std::atof(line.substr(line.find(':') + 1).c_str());
  }
  return 0;
}

// The first three fields of /proc/loadavg: how busy the machine was (other processes compete
// with the timed threads on a shared machine).
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return fmt::format("{} {} {}", one, five, fifteen);
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

}  // namespace kiln::bench
