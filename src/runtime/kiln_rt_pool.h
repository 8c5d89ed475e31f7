#pragma once
// Kiln runtime: the thread pool that runs the parallel loops of generated kernels, templates and
// runtime calls (in place of OpenMP teams). Self-contained (standard headers, Linux futexes,
// omp.h only to read the requested thread count), so every generated file can include it.
//
// Why not OpenMP: an OpenMP team of N threads has every thread check in at the end of each
// region, and libgomp's idle threads spin for milliseconds before they sleep. With other
// processes on the cores, a region waits for a descheduled teammate (a whole time slice) and
// spinning teammates take the cores from the threads doing the work (issue 14: a 7-node MLP went
// from 0.017 ms to 12 ms). Here:
//   - a loop is cut into more chunks than threads, and each participant (the calling thread is
//     participant 0) has a home range of them, the same in every loop: it runs its own chunks
//     from the front, then takes unclaimed chunks from the back of the others' ranges. A worker
//     that is not running when the loop starts finds nothing left, and the caller never waits
//     for a thread to arrive, only for chunks claimed. The fixed home ranges keep the data a
//     thread wrote in one kernel in its own cache for the next: a chain of 1x1 convolutions
//     (ResNet-50's 28 x 28 stage) ran 0.46-0.49 ms a layer so, 0.54-0.56 with every chunk going
//     to whichever thread claimed first (AMD EPYC, 2 threads);
//   - a worker spins a bounded time (spin_nanos()) for its next loop, then sleeps on a futex;
//   - a loop whose work does not pay for waking threads runs on the caller (the grain check is
//     the caller's: parallel_for's `parallel` argument);
//   - a run asking for N threads wakes at most N - 1 workers, so with the caller at most N of
//     Kiln's threads are runnable; OpenBLAS and oneDNN are called single-threaded from chunks
//     (SingleThreadedCall), so they add none.
// The requested count is OpenMP's (omp_get_max_threads() of the calling thread): `kiln bench
// --threads`, the C API's thread option and the autotuner set it with omp_set_num_threads.
// One loop runs on the pool at a time; a loop started while the pool is busy (a concurrent run
// of the model, or a loop inside a chunk) runs on its caller alone.

#include <linux/futex.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kiln_rt {
namespace pool_detail {

/// How long an idle worker polls for the next loop before it sleeps, and how long a caller polls
/// for chunks still running before it sleeps. Kernels of one run follow each other within
/// microseconds; the spin also spans the gap between the runs of a server answering requests of
/// a small model back to back: a worker that slept since the last run must be woken, and with
/// other processes on the cores that wake-up can come a scheduler tick late, when the caller has
/// done the loop alone (or the worker then holds a chunk the caller waits for). bench-load's
/// tiny MLP, paced (0.12 ms between runs) with 1.5 busy processes per core on 2 cores: p50
/// 0.21-0.22 ms and p99 2.1 ms with a 50 us spin, 0.06-0.12 ms and 0.15-0.17 ms with 300 us;
/// idle and with one busy process per core alike, ResNet-18's ratios unchanged. An idle worker
/// thus burns at most 0.3 ms of CPU after a run.
inline constexpr int64_t kSpinNanos = 300'000;

/// kSpinNanos, or KILN_POOL_SPIN_US microseconds when set (read once; for measuring the trade).
/// Hidden, as pool(): a static of default visibility would be a GNU unique symbol, bound across
/// libraries, also to one since unloaded.
__attribute__((visibility("hidden"))) inline int64_t spin_nanos() {
  static const int64_t nanos = [] {
    const char* env = std::getenv("KILN_POOL_SPIN_US");
    return env != nullptr && *env != '\0' ? std::max<int64_t>(std::atoll(env), 0) * 1000
                                          : kSpinNanos;
  }();
  return nanos;
}

/// Chunks per participating thread: a thread that stalls holds at most this fraction of its share.
inline constexpr int64_t kChunksPerThread = 4;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

inline void futex_wake(std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr,
          0);
}

/// Polls `done()` for spin_nanos(), then sleeps on `word` (its value `current()` re-read each
/// time) with `sleeping` set, so that whoever changes `word` knows to wake it.
template <typename Done, typename Current>
inline void spin_then_sleep(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleeping, Done done,
                            Current current) {
  const int64_t start = now_ns(), spin = spin_nanos();
  for (int i = 0; !done(); ++i) {
    cpu_relax();
    if ((i & 63) != 63 || now_ns() - start < spin) continue;
    while (true) {
      const uint32_t seen = current();
      sleeping->store(1, std::memory_order_seq_cst);
      if (done()) break;
      futex_wait(word, seen);
      sleeping->store(0, std::memory_order_seq_cst);
      if (done()) return;
    }
    sleeping->store(0, std::memory_order_seq_cst);
    return;
  }
}

/// The loop a pool runs: body(ctx, begin, end) over chunks of [0, n). Participant p's chunks
/// are claimed through claims[p], which packs the loop's generation (high 32 bits) and the
/// unclaimed part of p's range, [next, end) (16 bits each): p takes chunks from the front, the
/// others from the back. The generation makes a claim fail when the worker that tries it woke
/// for an earlier loop and holds an older view of this one.
/// The fields are atomics (relaxed) because a late worker may read them while the next loop's
/// caller writes them; it then fails its claim and drops what it read.
inline constexpr int kMaxParticipants = 256;
inline constexpr int64_t kMaxChunks = 0xffff;

struct alignas(64) Claim {
  std::atomic<uint64_t> word{0};
};

inline uint64_t pack_claim(uint64_t generation, uint64_t next, uint64_t end) {
  return (generation << 32) | (next << 16) | end;
}

struct Loop {
  using Body = void (*)(void* ctx, int64_t begin, int64_t end);
  std::atomic<Body> body{nullptr};
  std::atomic<void*> ctx{nullptr};
  std::atomic<int64_t> n{0};
  std::atomic<int64_t> chunks{0};
  std::atomic<int> participants{0};
  std::atomic<uint64_t> generation{0};
  std::atomic<uint32_t> done{0};
  std::atomic<uint32_t> caller_sleeping{0};
  Claim claims[kMaxParticipants];
};

class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() {
    stopping_.store(true);
    for (auto& w : workers_) {
      w->wake.fetch_add(1);
      futex_wake(&w->wake, 1);
    }
    for (auto& w : workers_) w->thread.join();
  }

  /// Threads created so far (the test of issue 14 reads it).
  int workers() const { return static_cast<int>(workers_.size()); }

  /// Runs body over [0, n) on up to `threads` threads (the caller one of them). False when the
  /// pool is running another loop: the caller then runs it alone.
  bool run(int threads, int64_t n, void (*body)(void*, int64_t, int64_t), void* ctx) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    const int64_t chunks = std::min({n, int64_t{threads} * kChunksPerThread, kMaxChunks});
    const int participants =
        static_cast<int>(std::min<int64_t>({threads, chunks, int64_t{kMaxParticipants}}));
    grow(participants - 1);
    // Close every range a late worker of an earlier loop could claim from before the fields
    // change (see Loop).
    const uint64_t generation = (loop_.generation.load() + 1) & 0xffffffffu;
    for (int p = 0; p < opened_; ++p) loop_.claims[p].word.store(pack_claim(generation, 0, 0));
    loop_.generation.store(generation);
    loop_.body.store(body, std::memory_order_relaxed);
    loop_.ctx.store(ctx, std::memory_order_relaxed);
    loop_.n.store(n, std::memory_order_relaxed);
    loop_.chunks.store(chunks, std::memory_order_relaxed);
    loop_.participants.store(participants, std::memory_order_relaxed);
    loop_.done.store(0);
    for (int p = 0; p < participants; ++p) {
      const uint64_t begin = static_cast<uint64_t>(chunks * p / participants);
      const uint64_t end = static_cast<uint64_t>(chunks * (p + 1) / participants);
      loop_.claims[p].word.store(pack_claim(generation, begin, end));
    }
    opened_ = std::max(opened_, participants);
    for (int w = 0; w + 1 < participants; ++w) {
      Worker& worker = *workers_[w];
      worker.wake.fetch_add(1, std::memory_order_seq_cst);
      if (worker.sleeping.load(std::memory_order_seq_cst)) futex_wake(&worker.wake, 1);
    }
    work(0, generation);
    const uint32_t all = static_cast<uint32_t>(chunks);
    spin_then_sleep(
        &loop_.done, &loop_.caller_sleeping, [&] { return loop_.done.load() == all; },
        [&] { return loop_.done.load(); });
    return true;
  }

 private:
  struct Worker {
    std::atomic<uint32_t> wake{0};
    std::atomic<uint32_t> sleeping{0};
    std::thread thread;
  };

  void grow(int helpers) {
    while (static_cast<int>(workers_.size()) < helpers) {
      workers_.push_back(std::make_unique<Worker>());
      Worker* w = workers_.back().get();
      const int self = static_cast<int>(workers_.size());  // the caller is participant 0
      w->thread = std::thread([this, w, self] { worker_main(*w, self); });
    }
  }

  /// Claims one chunk of participant `owner`'s range within loop `generation`, from the front
  /// (`front`: the owner's own claims) or the back: the chunk, or -1 when the range is empty or
  /// the loop is no longer `generation`.
  int64_t claim(int owner, bool front, uint64_t generation) {
    std::atomic<uint64_t>& word = loop_.claims[owner].word;
    uint64_t seen = word.load(std::memory_order_acquire);
    while (true) {
      const uint64_t next = (seen >> 16) & 0xffff, end = seen & 0xffff;
      if ((seen >> 32) != generation || next >= end) return -1;
      const uint64_t taken =
          front ? pack_claim(generation, next + 1, end) : pack_claim(generation, next, end - 1);
      if (word.compare_exchange_weak(seen, taken, std::memory_order_acq_rel)) {
        return static_cast<int64_t>(front ? next : end - 1);
      }
    }
  }

  /// Runs participant `self`'s chunks of loop `generation`, then the chunks still unclaimed in
  /// the others' ranges.
  void work(int self, uint64_t generation) {
    const int participants = loop_.participants.load(std::memory_order_relaxed);
    if (participants <= 0 || participants > kMaxParticipants) return;
    // A worker past this loop's participants (woken for an earlier, wider loop) only helps.
    const bool member = self < participants;
    for (int k = 0; k < participants; ++k) {
      const int owner = member ? (self + k) % participants : k;
      for (int64_t chunk; (chunk = claim(owner, member && k == 0, generation)) >= 0;) {
        // The claim succeeded within `generation`, so the loop's fields are that loop's until
        // this chunk is counted done.
        const int64_t n = loop_.n.load(std::memory_order_relaxed);
        const int64_t chunks = loop_.chunks.load(std::memory_order_relaxed);
        loop_.body.load(std::memory_order_relaxed)(loop_.ctx.load(std::memory_order_relaxed),
                                                   n * chunk / chunks, n * (chunk + 1) / chunks);
        if (loop_.done.fetch_add(1, std::memory_order_seq_cst) + 1 == chunks &&
            loop_.caller_sleeping.load(std::memory_order_seq_cst)) {
          futex_wake(&loop_.done, 1);
        }
      }
      if (loop_.generation.load(std::memory_order_relaxed) != generation) return;
    }
  }

  void worker_main(Worker& w, int self) {
    // OpenBLAS and oneDNN (OpenMP builds) called from a chunk run on this thread alone.
    omp_set_num_threads(1);
    uint32_t seen = 0;
    while (true) {
      spin_then_sleep(
          &w.wake, &w.sleeping, [&] { return w.wake.load() != seen || stopping_.load(); },
          [&] { return w.wake.load(); });
      if (stopping_.load()) return;
      seen = w.wake.load();
      work(self, loop_.generation.load());
    }
  }

  std::mutex busy_;
  Loop loop_;
  int opened_ = 0;  // ranges opened by any loop so far (run() closes them all)
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stopping_{false};
};

/// The pool of this library (one per loaded model library; its workers are joined when the
/// library is unloaded). Hidden: with default visibility the static would be a GNU unique symbol,
/// which the dynamic linker binds across libraries, so a library loaded after another was
/// unloaded would find the unloaded one's pool.
__attribute__((visibility("hidden"))) inline Pool& pool() {
  static Pool instance;
  return instance;
}

template <typename F>
void call_body(void* ctx, int64_t begin, int64_t end) {
  (*static_cast<F*>(ctx))(begin, end);
}

}  // namespace pool_detail

/// The thread count a run asked for (OpenMP's setting of the calling thread).
inline int requested_threads() { return std::max(omp_get_max_threads(), 1); }

/// Runs body(begin, end) over chunks covering [0, n): on the pool's threads when `parallel` (the
/// caller's test that the work pays for it) and more than one thread is requested, else on the
/// calling thread in one chunk. Chunks may run in any order and concurrently.
template <typename F>
inline void parallel_for(bool parallel, int64_t n, F&& body) {
  if (n <= 0) return;
  const int threads = parallel && n > 1 ? requested_threads() : 1;
  using Body = std::remove_reference_t<F>;
  if (threads > 1 && pool_detail::pool().run(threads, n, &pool_detail::call_body<Body>,
                                             const_cast<void*>(static_cast<const void*>(&body)))) {
    return;
  }
  body(int64_t{0}, n);
}

/// Runs body(thread, threads) once on each of the requested threads (the calling thread is 0):
/// the shape of an OpenMP parallel region whose threads share work by a static split.
template <typename F>
inline void parallel_threads(bool parallel, F&& body) {
  const int threads = parallel ? requested_threads() : 1;
  parallel_for(threads > 1, threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) body(t, int64_t{threads});
  });
}

/// parallel_for over the index pairs of [0, n0) x [0, n1) (the second fastest): body(i0, i1).
template <typename F>
inline void parallel_for_2d(bool parallel, int64_t n0, int64_t n1, F&& body) {
  if (n0 <= 0 || n1 <= 0) return;
  parallel_for(parallel, n0 * n1, [&](int64_t lo, int64_t hi) {
    int64_t i0 = lo / n1, i1 = lo % n1;
    for (int64_t i = lo; i < hi; ++i) {
      body(i0, i1);
      if (++i1 == n1) i1 = 0, ++i0;
    }
  });
}

/// parallel_for over the index triples of [0, n0) x [0, n1) x [0, n2): body(i0, i1, i2).
template <typename F>
inline void parallel_for_3d(bool parallel, int64_t n0, int64_t n1, int64_t n2, F&& body) {
  if (n0 <= 0 || n1 <= 0 || n2 <= 0) return;
  parallel_for(parallel, n0 * n1 * n2, [&](int64_t lo, int64_t hi) {
    int64_t i0 = lo / (n1 * n2), i1 = lo / n2 % n1, i2 = lo % n2;
    for (int64_t i = lo; i < hi; ++i) {
      body(i0, i1, i2);
      if (++i2 < n2) continue;
      i2 = 0;
      if (++i1 == n1) i1 = 0, ++i0;
    }
  });
}

/// Makes OpenBLAS and oneDNN (OpenMP builds: they read omp_get_max_threads() of the calling
/// thread) run a call on the calling thread alone, restoring the setting after.
class SingleThreadedCall {
 public:
  SingleThreadedCall() : previous_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThreadedCall() { omp_set_num_threads(previous_); }
  SingleThreadedCall(const SingleThreadedCall&) = delete;
  SingleThreadedCall& operator=(const SingleThreadedCall&) = delete;

 private:
  int previous_;
};

/// Whether parallel_gemm cuts C[m, n] into blocks of rows (else of columns). Each block is a
/// library call of its own, which packs the whole of the operand it does not cut (B[k, n] for a
/// block of rows, A[m, k] for a block of columns): cutting along the larger of M and N repacks
/// the smaller operand. A 128 x 768 x 768 product (BERT's projections) cut by rows packed all of
/// B's 768 x 768 in each of its 8 blocks, about as many element moves as the block's products.
/// The other axis is taken when the larger one has fewer than two units (8 rows, 16 columns).
inline bool gemm_by_rows(int64_t m, int64_t n) {
  const bool rows_split = m >= 16, columns_split = n >= 32;
  return m >= n ? rows_split || !columns_split : rows_split && !columns_split;
}

/// A row-major product C[m, n] = A[m, k] @ B[k, n] by a library (OpenBLAS) on the pool: C is cut
/// into blocks of rows or of columns (gemm_by_rows) and block(by_rows, first, last) computes
/// rows (columns) [first, last) with one single-threaded library call. A product too small to
/// pay for more threads is one block on the caller.
template <typename F>
inline void parallel_gemm(int64_t m, int64_t n, int64_t k, F&& block) {
  const int threads = requested_threads();
  const bool parallel = threads > 1 && m * n * k > (int64_t{1} << 18);
  const bool by_rows = gemm_by_rows(m, n);
  const int64_t unit = by_rows ? 8 : 16, extent = by_rows ? m : n;
  const int64_t units = (extent + unit - 1) / unit;
  parallel_for(parallel && units > 1, units, [&](int64_t lo, int64_t hi) {
    SingleThreadedCall single;
    block(by_rows, lo * unit, std::min(hi * unit, extent));
  });
}

}  // namespace kiln_rt
