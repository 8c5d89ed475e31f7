// Kiln runtime: the thread pool behind kiln_rt_pool.h's parallel loops (the design is described
// there). Compiled once per compiler and flags into an object of the code cache and linked into
// every generated library (codegen::CppCodegen::build_config), so that each library has a pool of
// its own, and generated units include only the pool's two declarations: the pool's threads,
// atomics and futexes were most of what a small model's units compiled (a one-kernel suite case:
// 0.65 s of g++ per unit with them, 0.26 s without, AMD EPYC).

#include "kiln_rt_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln_rt {
namespace pool_detail {
namespace {

/// How long an idle worker polls for its next loop before it sleeps. Kernels of one run follow
/// each other within microseconds; the spin also spans the gap between the runs of a server
/// answering a small model's requests back to back, because waking a sleeping worker can cost
/// more than the run: on a 2-core KVM guest (AMD EPYC, Zen 5) a futex wake of a thread on the
/// other CPU took the waker 33-45 us, and bench-load's tiny MLP (0.035 ms), paced with two or
/// three busy processes, ran at p50 0.092-0.094 ms with a worker spin of 20 us against
/// 0.059-0.061 with 300 us (idle: 0.093 against 0.038). Where a wake is cheap (0.8 us on a Xeon
/// host) a short spin trades the other way: there the MLP's paced p99 with busy processes was
/// 0.12-0.46 ms in all 24 rounds with spins of 0-50 us, and a time slice (4.1 ms) in 1 of 8 with
/// 300 us, for an idle p50 of 0.093-0.100 ms against 0.076. KILN_POOL_SPIN_US sets the spin. An
/// idle worker burns at most 0.3 ms of CPU after a run.
inline constexpr int64_t kSpinNanos = 300'000;

/// How long a caller polls for chunks that other threads still run before it sleeps, whatever
/// the workers' spin: a caller that slept waits for its wake-up, which under load can come a
/// scheduler tick late. The MLP above with both spins at 20 us: p99 2.0-3.8 ms; with the
/// caller's at 300 us: 0.17-0.25 ms (both at 300 us: 0.14-0.17).
inline constexpr int64_t kWaitSpinNanos = 300'000;

/// kSpinNanos, or KILN_POOL_SPIN_US microseconds when set (read once).
int64_t spin_nanos() {
  static const int64_t nanos = [] {
    const char* env = std::getenv("KILN_POOL_SPIN_US");
    return env != nullptr && *env != '\0' ? std::max<int64_t>(std::atoll(env), 0) * 1000
                                          : kSpinNanos;
  }();
  return nanos;
}

/// Chunks per participating thread: a thread that stalls holds at most this fraction of its share.
inline constexpr int64_t kChunksPerThread = 4;

/// The least time between two moves of one worker off a CPU another participant is on (see
/// Pool::keep_apart), so that a scheduler that keeps putting it back costs at most two system
/// calls per this much time.
inline constexpr int64_t kMoveIntervalNanos = 2'000'000;

// The pause instruction through the compiler's builtin: immintrin.h for _mm_pause alone doubled
// this file's compile time (1.9 -> 0.9 s at -march=native, g++ 12), paid once per flags in each
// code cache.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
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

/// Polls `done()` for `spin` nanoseconds, then sleeps on `word` (its value `current()` re-read each
/// time) with `sleeping` set, so that whoever changes `word` knows to wake it.
template <typename Done, typename Current>
inline void spin_then_sleep(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleeping, Done done,
                            Current current, int64_t spin) {
  const int64_t start = now_ns();
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
  Pool() {
    for (auto& cpu : cpus_) cpu.store(-1, std::memory_order_relaxed);
  }
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
  bool run(int threads, int64_t n, Body body, void* ctx) {
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
    cpus_[0].store(sched_getcpu(), std::memory_order_relaxed);
    for (int w = 0; w + 1 < participants; ++w) {
      Worker& worker = *workers_[w];
      worker.wake.fetch_add(1, std::memory_order_seq_cst);
      if (worker.sleeping.load(std::memory_order_seq_cst)) futex_wake(&worker.wake, 1);
    }
    work(0, generation);
    const uint32_t all = static_cast<uint32_t>(chunks);
    spin_then_sleep(
        &loop_.done, &loop_.caller_sleeping, [&] { return loop_.done.load() == all; },
        [&] { return loop_.done.load(); }, kWaitSpinNanos);
    return true;
  }

 private:
  struct Worker {
    std::atomic<uint32_t> wake{0};
    std::atomic<uint32_t> sleeping{0};
    int64_t last_move = 0;  // when keep_apart last moved it (its own thread's field)
    std::thread thread;
  };

  /// Moves worker `w` (the calling thread) off its CPU when the loop's caller or another worker
  /// is on it: two threads of one loop on one CPU take turns, and the turns cost more than
  /// they save. With as many busy processes as cores, the scheduler often puts the caller and
  /// the worker on one core and the busy processes on the other (it balances counts of
  /// runnable threads): bench-load's tiny MLP, 2 threads, one busy process per core, AMD EPYC:
  /// p50 0.063 ms and p90 0.37 ms so, 0.033 and 0.040 with the two on different cores (0.036
  /// idle). The move narrows the worker's allowed CPUs to those no other participant is on,
  /// which makes the kernel migrate it at once, and then gives the whole set back, so nothing
  /// stays pinned and the scheduler balances as before. Nothing moves when every allowed CPU is
  /// taken (more threads than CPUs); at most one move per kMoveIntervalNanos.
  void keep_apart(Worker& w, int self) {
    const int cpu = sched_getcpu();
    cpus_[self].store(cpu, std::memory_order_relaxed);
    if (cpu < 0 || cpu >= CPU_SETSIZE) return;
    const int participants = loop_.participants.load(std::memory_order_relaxed);
    if (participants <= 0 || participants > kMaxParticipants) return;
    bool shared = false;
    for (int p = 0; p < participants && !shared; ++p) {
      shared = p != self && cpus_[p].load(std::memory_order_relaxed) == cpu;
    }
    if (!shared) return;
    const int64_t now = now_ns();
    if (now - w.last_move < kMoveIntervalNanos) return;
    w.last_move = now;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
    cpu_set_t elsewhere = allowed;
    for (int p = 0; p < participants; ++p) {
      const int taken = cpus_[p].load(std::memory_order_relaxed);
      if (taken >= 0 && taken < CPU_SETSIZE) CPU_CLR(taken, &elsewhere);
    }
    if (CPU_COUNT(&elsewhere) == 0) return;
    if (sched_setaffinity(0, sizeof(elsewhere), &elsewhere) != 0) return;
    sched_setaffinity(0, sizeof(allowed), &allowed);
    cpus_[self].store(sched_getcpu(), std::memory_order_relaxed);
  }

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
    // A name for top -H, perf and debuggers; a thread this one starts (none is expected) would
    // inherit it.
    char name[16];
    std::snprintf(name, sizeof name, "kiln-pool-%d", self);
    pthread_setname_np(pthread_self(), name);
    // OpenBLAS and oneDNN (OpenMP builds) called from a chunk run on this thread alone.
    omp_set_num_threads(1);
    uint32_t seen = 0;
    while (true) {
      spin_then_sleep(
          &w.wake, &w.sleeping, [&] { return w.wake.load() != seen || stopping_.load(); },
          [&] { return w.wake.load(); }, spin_nanos());
      if (stopping_.load()) return;
      seen = w.wake.load();
      keep_apart(w, self);
      work(self, loop_.generation.load());
    }
  }

  std::mutex busy_;
  Loop loop_;
  // Where each participant (0: the caller) was when it last took up a loop, -1 unknown.
  std::atomic<int> cpus_[kMaxParticipants];
  int opened_ = 0;  // ranges opened by any loop so far (run() closes them all)
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stopping_{false};
};

/// The pool of this library (one per loaded model library; its workers are joined when the
/// library is unloaded).
Pool& pool() {
  static Pool instance;
  return instance;
}

}  // namespace

bool run_on_pool(int threads, int64_t n, Body body, void* ctx) {
  return pool().run(threads, n, body, ctx);
}

int pool_workers() { return pool().workers(); }

}  // namespace pool_detail
}  // namespace kiln_rt
