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
#include <cstdint>
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
/// 0.059-0.061 with 300 us (idle: 0.093 against 0.038). An idle worker burns at most 0.3 ms of
/// CPU after a run.
inline constexpr int64_t kSpinNanos = 300'000;

/// The spin of a worker on contended CPUs where woken workers start promptly (see
/// Pool::worker_spin). On a Xeon KVM host (a wake 0.8-2 us) bench-load's paced MLP with two or
/// three busy processes had a p99 of 0.09-0.46 ms in all 56 rounds with spins of 0-50 us, and a
/// time slice (4.1 or 8.1 ms) in 9 rounds of 40 with 300 us: a worker that polls through the
/// gaps spends its share of the CPUs on polling, and the scheduler then preempts it while it
/// holds a chunk. Idle, the short spin cost the same MLP its p50 (0.093-0.100 ms against 0.076),
/// so it is kept to contended CPUs.
inline constexpr int64_t kContendedSpinNanos = 20'000;

/// A polling thread that sees this long pass between two reads of the clock lost its CPU to
/// another thread: with busy processes on a 2-core VM (AMD EPYC), such gaps came about 120 times
/// a second and nearly all were over 1 ms, while idle the longest in 10 s was 0.44 ms
/// (interrupts and the hypervisor).
inline constexpr int64_t kPreemptedNanos = 500'000;

/// How long the CPUs count as contended after a thread of the pool was preempted while polling.
inline constexpr int64_t kContendedNanos = 2'000'000'000;

/// A woken worker is prompt when it starts within this long of the wake. Only then does a short
/// spin pay: where a woken worker comes later than the run takes without it, it only adds the
/// wake's cost. How late workers start is measured (Pool::probe_wakes, Pool::note_wake): on the
/// Zen 5 VM above, 66-80 us idle and 30-50 us under load; on the Xeon host, 5-12 us, but 30-40
/// us for a worker woken while three busy processes share its two CPUs.
inline constexpr int64_t kPromptWakeNanos = 20'000;

/// The pool measures wakes when it creates its first worker: 1 + kProbeWakes wakes (the first
/// finds the new thread wherever it started), each after the worker has slept kProbeSleepNanos.
/// It costs the first parallel loop of a library 0.5 ms (0.9 where wakes take 0.1 ms).
inline constexpr int kProbeWakes = 4;
inline constexpr int64_t kProbeSleepNanos = 100'000;
inline constexpr int64_t kProbeWaitNanos = 2'000'000;  // the longest wait for the worker

/// How long a caller polls for chunks that other threads still run before it sleeps, whatever
/// the workers' spin: a caller that slept waits for its wake-up, which under load can come a
/// scheduler tick late. The MLP above with both spins at 20 us: p99 2.0-3.8 ms; with the
/// caller's at 300 us: 0.17-0.25 ms (both at 300 us: 0.14-0.17).
inline constexpr int64_t kWaitSpinNanos = 300'000;

/// KILN_POOL_SPIN_US in nanoseconds, read once: a fixed spin for the workers; -1 when unset.
int64_t fixed_spin_nanos() {
  static const int64_t nanos = [] {
    const char* env = std::getenv("KILN_POOL_SPIN_US");
    return env != nullptr && *env != '\0' ? std::max<int64_t>(std::atoll(env), 0) * 1000
                                          : int64_t{-1};
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
/// time) with `sleeping` set, so that whoever changes `word` knows to wake it. When the thread
/// finds it lost its CPU while polling (kPreemptedNanos between two reads of the clock), it calls
/// `preempted()`, and sleeps at once if that returns true. Returns whether it slept.
template <typename Done, typename Current, typename Preempted>
inline bool spin_then_sleep(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleeping, Done done,
                            Current current, Preempted preempted, int64_t spin) {
  const int64_t start = now_ns();
  int64_t last = start;
  for (int i = 0; !done(); ++i) {
    cpu_relax();
    if ((i & 63) != 63) continue;
    const int64_t now = now_ns();
    const bool lost_cpu = now - last >= kPreemptedNanos;
    last = now;
    if (!(lost_cpu && preempted()) && now - start < spin) continue;
    while (true) {
      const uint32_t seen = current();
      sleeping->store(1, std::memory_order_seq_cst);
      if (done()) break;
      futex_wait(word, seen);
      sleeping->store(0, std::memory_order_seq_cst);
      if (done()) return true;
    }
    sleeping->store(0, std::memory_order_seq_cst);
    return false;
  }
  return false;
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
    for (int w = 0; w + 1 < participants; ++w) signal(*workers_[w]);
    work(0, generation);
    const uint32_t all = static_cast<uint32_t>(chunks);
    spin_then_sleep(
        &loop_.done, &loop_.caller_sleeping, [&] { return loop_.done.load() == all; },
        [&] { return loop_.done.load(); },
        [&] {
          note_contention(now_ns());
          return false;
        },
        kWaitSpinNanos);
    return true;
  }

 private:
  struct Worker {
    std::atomic<uint32_t> wake{0};
    std::atomic<uint32_t> sleeping{0};
    int64_t last_move = 0;  // when keep_apart last moved it (its own thread's field)
    // When a caller first woke it from its sleep (now_ns; 0 while it is not being woken).
    std::atomic<int64_t> woken_at{0};
    std::thread thread;
  };

  /// Tells worker `w` that a loop is open, and wakes it if it sleeps, noting when (note_wake).
  void signal(Worker& w) {
    w.wake.fetch_add(1, std::memory_order_seq_cst);
    if (!w.sleeping.load(std::memory_order_seq_cst)) return;
    int64_t unset = 0;
    w.woken_at.compare_exchange_strong(unset, now_ns(), std::memory_order_relaxed);
    futex_wake(&w.wake, 1);
  }

  /// Records that a thread of the pool lost its CPU while polling at `now`: the CPUs are
  /// contended, which matters when wakes are prompt. Returns whether workers now take the short
  /// spin.
  bool note_contention(int64_t now) {
    if (!wakes_prompt()) return false;
    contended_until_.store(now + kContendedNanos, std::memory_order_relaxed);
    return true;
  }

  bool wakes_prompt() const {
    const int64_t late = wake_late_.load(std::memory_order_relaxed);
    return late >= 0 && late < kPromptWakeNanos;
  }

  /// Records how long after a caller woke it a worker that slept started on the loop, in a
  /// moving average (an eighth of each figure, each at most twice kPromptWakeNanos), so that a
  /// few late wakes among prompt ones do not change the verdict: the first wake of a worker
  /// that polled through a stretch of contention comes late even where wakes are prompt (0.1 ms
  /// on the Xeon host with three busy processes: the worker has spent its share of the CPUs).
  void note_wake(int64_t late) {
    if (probing_.load()) {
      const int k = probe_count_.load(std::memory_order_relaxed);
      if (k <= kProbeWakes) probe_late_[k].store(late, std::memory_order_relaxed);
      probe_count_.store(k + 1);
      return;
    }
    late = std::min(late, 2 * kPromptWakeNanos);
    const int64_t before = wake_late_.load(std::memory_order_relaxed);
    wake_late_.store(before < 0 ? late : before + (late - before) / 8, std::memory_order_relaxed);
  }

  /// Wakes the pool's first worker 1 + kProbeWakes times, each after it has slept
  /// kProbeSleepNanos, and sets wake_late_ to how late it started, before any contention. A
  /// worker that does not go to sleep within kProbeWaitNanos ends the probe.
  void probe_wakes(Worker& w) {
    cpus_[0].store(sched_getcpu(), std::memory_order_relaxed);
    probe_count_.store(0);
    probing_.store(true);
    int sent = 0;
    for (; sent < kProbeWakes + 1; ++sent) {
      if (!wait_for(kProbeWaitNanos, [&] { return w.sleeping.load() != 0; })) break;
      wait_for(kProbeSleepNanos, [] { return false; });
      signal(w);
    }
    wait_for(kProbeWaitNanos, [&] { return probe_count_.load() >= sent; });
    probing_.store(false);
    // The first wake finds the new worker wherever it started, often on the caller's CPU; the
    // median of the others is the figure.
    const int samples = std::min(probe_count_.load(), kProbeWakes + 1) - 1;
    if (samples <= 0) return;
    int64_t late[kProbeWakes];
    for (int k = 0; k < samples; ++k) late[k] = probe_late_[k + 1].load(std::memory_order_relaxed);
    std::sort(late, late + samples);
    wake_late_.store(std::min(late[samples / 2], 2 * kPromptWakeNanos), std::memory_order_relaxed);
  }

  /// Polls until `ready()` or `nanos` have passed: whether it was ready.
  template <typename Ready>
  static bool wait_for(int64_t nanos, Ready ready) {
    const int64_t start = now_ns();
    while (!ready()) {
      if (now_ns() - start >= nanos) return false;
      cpu_relax();
    }
    return true;
  }

  /// How long an idle worker polls before it sleeps: none while the pool probes wakes;
  /// KILN_POOL_SPIN_US when set; else kContendedSpinNanos while the CPUs are contended and wakes
  /// are prompt, kSpinNanos otherwise. A worker that polls on contended CPUs spends its share of
  /// them on polling and is then preempted while it holds a chunk; one that sleeps is woken with
  /// its share unspent.
  int64_t worker_spin() const {
    if (probing_.load()) return 0;
    const int64_t fixed = fixed_spin_nanos();
    if (fixed >= 0) return fixed;
    return now_ns() < contended_until_.load(std::memory_order_relaxed) && wakes_prompt()
               ? kContendedSpinNanos
               : kSpinNanos;
  }

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
  void keep_apart(Worker& w, int self, int participants) {
    const int cpu = sched_getcpu();
    cpus_[self].store(cpu, std::memory_order_relaxed);
    if (cpu < 0 || cpu >= CPU_SETSIZE) return;
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
      if (self == 1 && fixed_spin_nanos() < 0) probe_wakes(*w);
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
      const bool slept = spin_then_sleep(
          &w.wake, &w.sleeping, [&] { return w.wake.load() != seen || stopping_.load(); },
          [&] { return w.wake.load(); },
          [&] { return fixed_spin_nanos() < 0 && note_contention(now_ns()); }, worker_spin());
      if (stopping_.load()) return;
      seen = w.wake.load();
      const int64_t woken_at = w.woken_at.exchange(0, std::memory_order_relaxed);
      if (slept && woken_at != 0) note_wake(now_ns() - woken_at);
      // The probe's worker keeps apart from the caller as it will in the loops.
      keep_apart(w, self, probing_.load() ? 2 : loop_.participants.load(std::memory_order_relaxed));
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
  // Until when (now_ns) workers take the short spin: see note_contention and worker_spin.
  std::atomic<int64_t> contended_until_{0};
  // How late woken workers start (note_wake's average, nanoseconds; -1 before any wake).
  std::atomic<int64_t> wake_late_{-1};
  // Set while probe_wakes runs; the wakes it has seen and how late each started.
  std::atomic<bool> probing_{false};
  std::atomic<int> probe_count_{0};
  std::atomic<int64_t> probe_late_[kProbeWakes + 1];
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
