#pragma once
// Kiln runtime: the thread pool that runs the parallel loops of generated kernels, templates and
// runtime calls (in place of OpenMP teams). The pool itself is in kiln_rt_pool.cpp, which every
// generated library links (a pool of its own per library); this header holds the loops'
// templates and needs only omp.h (to read the requested thread count) and two standard headers,
// so every generated file can include it cheaply.
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
//   - a worker spins a bounded time (kiln_rt_pool.cpp's worker_spin()) for its next loop, then
//     sleeps on a futex;
//   - a worker that takes up a loop on the CPU of the loop's caller, or of another worker, moves
//     to a CPU none of them is on (kiln_rt_pool.cpp's keep_apart): threads of one loop that
//     share a core only take turns;
//   - a loop whose work does not pay for waking threads runs on the caller (the grain check is
//     the caller's: parallel_for's `parallel` argument);
//   - a run asking for N threads wakes at most N - 1 workers, so with the caller at most N of
//     Kiln's threads are runnable; OpenBLAS and oneDNN are called single-threaded from chunks
//     (SingleThreadedCall), so they add none.
// The requested count is OpenMP's (omp_get_max_threads() of the calling thread): `kiln bench
// --threads`, the C API's thread option and the autotuner set it with omp_set_num_threads.
// One loop runs on the pool at a time; a loop started while the pool is busy (a concurrent run
// of the model, or a loop inside a chunk) runs on its caller alone.

#include <omp.h>

#include <cstdint>
#include <type_traits>

namespace kiln_rt {
namespace pool_detail {

/// A loop body: runs [begin, end) of the loop whose state is ctx.
using Body = void (*)(void* ctx, int64_t begin, int64_t end);

/// Runs body over [0, n) on up to `threads` threads of this library's pool (the caller one of
/// them); false when the pool is running another loop: the caller then runs it alone. Defined in
/// kiln_rt_pool.cpp. Hidden, as everything of the pool: each library has its own, and a symbol
/// of default visibility would bind one library's calls to another's pool.
__attribute__((visibility("hidden"))) bool run_on_pool(int threads, int64_t n, Body body,
                                                       void* ctx);

/// Threads the pool has created so far (the test of issue 14 reads it).
__attribute__((visibility("hidden"))) int pool_workers();

template <typename F>
void call_body(void* ctx, int64_t begin, int64_t end) {
  (*static_cast<F*>(ctx))(begin, end);
}

}  // namespace pool_detail

/// The thread count a run asked for (OpenMP's setting of the calling thread).
inline int requested_threads() {
  const int threads = omp_get_max_threads();
  return threads > 1 ? threads : 1;
}

/// Runs body(begin, end) over chunks covering [0, n): on the pool's threads when `parallel` (the
/// caller's test that the work pays for it) and more than one thread is requested, else on the
/// calling thread in one chunk. Chunks may run in any order and concurrently.
template <typename F>
inline void parallel_for(bool parallel, int64_t n, F&& body) {
  if (n <= 0) return;
  const int threads = parallel && n > 1 ? requested_threads() : 1;
  using Body = std::remove_reference_t<F>;
  if (threads > 1 && pool_detail::run_on_pool(threads, n, &pool_detail::call_body<Body>,
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
    block(by_rows, lo * unit, hi * unit < extent ? hi * unit : extent);
  });
}

}  // namespace kiln_rt
