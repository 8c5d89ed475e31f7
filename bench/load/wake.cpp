// bench-load's wake probe: what waking a sleeping thread on another CPU costs on this machine,
// the cost that decides whether a pool's idle workers can sleep between a server's requests or
// must poll (README, "Runs under load"). One thread sleeps on a futex on CPU B; the other, on CPU
// A, sleeps a gap (as a paced server waits between requests, so both CPUs go idle), then wakes
// it. Printed, as medians and 90th percentiles over the wakes: how long the waker's futex call
// took, and how long after the call began the woken thread ran.
//   wake A B [--wakes N] [--gap-us US]   (US at least 10; default 100)
//       prints one JSON line: {"waker_us_p50": ..., "waker_us_p90": ..., "woken_us_p50": ..., ...}
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kiln/kiln.h"
#include "pin.h"

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void usage() {
  std::fprintf(stderr, "usage: wake CPU_A CPU_B [--wakes N] [--gap-us US]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) usage();
  const int waker_cpu = std::atoi(argv[1]), sleeper_cpu = std::atoi(argv[2]);
  int wakes = 2000;
  int64_t gap_us = 100;
  for (int i = 3; i < argc; ++i) {
    if (i + 1 >= argc) usage();
    const char* value = argv[++i];
    if (!std::strcmp(argv[i - 1], "--wakes")) {
      wakes = std::atoi(value);
    } else if (!std::strcmp(argv[i - 1], "--gap-us")) {
      gap_us = std::atoll(value);
    } else {
      usage();
    }
  }
  if (wakes < 1 || gap_us < 10) usage();

  std::atomic<uint32_t> word{0};    // bumped by each wake
  std::atomic<bool> asleep{false};  // the sleeper is about to wait or waiting
  std::atomic<int64_t> woke_at{0};  // when the sleeper last ran after a wake
  std::atomic<bool> pinned_ok{true};
  std::thread sleeper([&] {
    if (!pin_to(sleeper_cpu)) pinned_ok = false;
    for (uint32_t seen = 0;;) {
      asleep.store(true);
      while (word.load() == seen) {
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, seen, nullptr,
                nullptr, 0);
      }
      woke_at.store(now_ns());
      asleep.store(false);
      seen = word.load();
      if (seen == 0xffffffffu) return;
    }
  });
  const bool waker_pinned = pin_to(waker_cpu);
  std::vector<double> waker_ms, woken_ms;
  for (int i = 0; i < wakes && waker_pinned && pinned_ok; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    // The gap lets the sleeper reach its futex wait (it sets `asleep` just before).
    while (!asleep.load()) std::this_thread::yield();
    const int64_t start = now_ns();
    word.fetch_add(1);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
            0);
    waker_ms.push_back(static_cast<double>(now_ns() - start) / 1e6);
    while (woke_at.load() < start) std::this_thread::yield();
    woken_ms.push_back(static_cast<double>(woke_at.load() - start) / 1e6);
  }
  word.store(0xffffffffu);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
  sleeper.join();
  if (!waker_pinned || !pinned_ok) {
    std::fprintf(stderr, "wake: cannot pin threads to CPUs %d and %d\n", waker_cpu, sleeper_cpu);
    return 1;
  }
  // Percentiles as `kiln bench` reports them (nearest rank).
  const kiln::BenchResult waker = kiln::bench_figures(waker_ms, 0);
  const kiln::BenchResult woken = kiln::bench_figures(woken_ms, 0);
  std::printf(
      "{\"wakes\": %d, \"gap_us\": %lld, \"waker_us_p50\": %.1f, \"waker_us_p90\": %.1f, "
      "\"woken_us_p50\": %.1f, \"woken_us_p90\": %.1f}\n",
      wakes, static_cast<long long>(gap_us), waker.p50_ms * 1000, waker.p90_ms * 1000,
      woken.p50_ms * 1000, woken.p90_ms * 1000);
  return 0;
}
