// The thread pool of generated code (src/runtime/kiln_rt_pool.h): every index of every loop runs
// exactly once, whatever the thread count, loop size, order of loops of different widths (a
// worker woken for a wide loop may arrive during a narrower one, where it has no range of its
// own), and with loops started from two threads at once (one of them then runs alone). Each
// participant has a home range of chunks and takes the others' leftover chunks from the back;
// the counts here check that no chunk is run twice or lost, under stealing too (a chunk that
// sleeps makes the other threads take its owner's remaining chunks). Not timed.

#include <omp.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "runtime/kiln_rt_pool.h"

namespace {

// Runs parallel_for over [0, n) and checks that each index ran once.
void expect_each_index_once(int64_t n, bool slow_first_chunk = false) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
  kiln_rt::parallel_for(true, n, [&](int64_t lo, int64_t hi) {
    if (slow_first_chunk && lo == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    for (int64_t i = lo; i < hi; ++i) runs[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "index " << i << " of " << n;
  }
}

TEST(Pool, EveryIndexRunsOnceAtEveryThreadCountAndSize) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3, 4, 7}) {
    omp_set_num_threads(threads);
    for (int64_t n : {1, 2, 3, 5, 8, 13, 64, 1000, 100003}) expect_each_index_once(n);
  }
  omp_set_num_threads(saved);
}

TEST(Pool, LoopsOfChangingWidthAndStolenChunks) {
  const int saved = omp_get_max_threads();
  // Wide and narrow loops alternate, so workers of the wide one can arrive in the narrow one;
  // a sleeping first chunk leaves its owner's other chunks to the other threads.
  for (int round = 0; round < 300; ++round) {
    omp_set_num_threads(round % 2 == 0 ? 6 : 2);
    expect_each_index_once(round % 3 == 0 ? 3 : 97, round % 10 == 0);
  }
  omp_set_num_threads(saved);
}

TEST(Pool, LoopsFromTwoThreadsAtOnce) {
  std::atomic<bool> failed{false};
  auto caller = [&] {
    omp_set_num_threads(3);
    for (int round = 0; round < 200; ++round) {
      const int64_t n = 50 + round;
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      kiln_rt::parallel_for(true, n, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) runs[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& r : runs) {
        if (r.load() != 1) failed = true;
      }
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_FALSE(failed.load());
}

}  // namespace
