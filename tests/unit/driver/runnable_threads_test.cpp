// Issue 14: a run with N threads never has more than N runnable threads of Kiln's, OpenBLAS's or
// oneDNN's. A model of an OpenBLAS sgemm (MatMul of two inputs, 64 x 256 x 256, by columns), an
// OpenBLAS dgemm split by columns (float64, 1 x 256 x 2048), a oneDNN convolution (weights an
// input, so no template takes it; in pieces, each a single-threaded oneDNN call) and parallel
// kernels (Relu, Softmax) runs repeatedly with N = 2 while another thread samples
// /proc/self/task/*/stat. Checked: (1) the runs start at most N - 1 threads (Kiln's pool workers,
// named kiln-pool-N; OpenBLAS and oneDNN start none of their own), (2) no sample sees more than N
// of this process's threads that may be Kiln's, OpenBLAS's or oneDNN's (runnable_threads says
// which) in state R, (3) the outputs match double-precision loops here
// (float32: 1e-4 relative + 1e-4 absolute, sums of 256 products of values in [-1, 1); float64:
// 1e-9). Not timed.

#include <dirent.h>
#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "driver/compile.h"
#include "graph/graph.h"
#include "model_builder.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;
using graph::Value;

constexpr int kThreads = 2;
constexpr int64_t kM = 64, kK = 256, kN = 256;  // sgemm by columns (N > M)
constexpr int64_t kWide = 2048;                 // dgemm by columns: 1 x kK x kWide
// Conv 3x3, pads 1: 4.7M multiply-adds in 4 blocks of 16 output channels, so the convolution
// runs in 2 pieces on the pool (kiln_rt_conv.h's conv_pieces).
constexpr int64_t kC = 8, kOc = 64, kHw = 32;

double wave(int64_t i, int64_t salt) {
  return std::sin(0.37 * static_cast<double>(i) + 1.3 * salt);
}

template <typename T>
Tensor filled(DType dtype, std::vector<int64_t> dims, int64_t salt) {
  Tensor t(dtype, std::move(dims));
  auto v = t.mutable_values<T>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>(wave(static_cast<int64_t>(i), salt));
  return t;
}

graph::Model model() {
  test_models::ModelBuilder m;
  Value* a = m.input("a", DType::kFloat32, {kM, kK});
  Value* b = m.input("b", DType::kFloat32, {kK, kN});
  Value* v = m.input("v", DType::kFloat64, {1, kK});
  Value* x = m.input("x", DType::kFloat32, {1, kC, kHw, kHw});
  Value* w = m.input("w", DType::kFloat32, {kOc, kC, 3, 3});
  Value* product = m.op("MatMul", {a, b}, {}, "product");
  m.output(m.op("Softmax", {m.op("Relu", {product}, {}, "relu")}, {{"axis", int64_t{1}}}, "soft"));
  Value* wide = m.constant(filled<double>(DType::kFloat64, {kK, kWide}, 4));
  m.output(m.op("MatMul", {v, wide}, {}, "wide"));
  m.output(m.op("Conv", {x, w}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}, "conv"));
  return std::move(m.model);
}

/// The ids of this process's threads.
std::set<int> thread_ids() {
  std::set<int> ids;
  for (const auto& entry : fs::directory_iterator("/proc/self/task")) {
    ids.insert(std::stoi(entry.path().filename().string()));
  }
  return ids;
}

/// How many of this process's threads other than `self` that may be Kiln's, OpenBLAS's or
/// oneDNN's are in state R (running or runnable); their ids and names are put in `names`. Those
/// are the threads named like the process (the calling thread, and threads of OpenBLAS and the
/// OpenMP runtime, which keep the name they are started with) and Kiln's pool workers
/// ("kiln-pool-N"). Threads a library named are left out: the CUDA driver's ("cuda-EvtHandlr"),
/// which the CUDA tests before this one in the process start, wake now and then on their own.
int runnable_threads(int self, const std::string& process_name, std::string& names) {
  int count = 0;
  names.clear();
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.' || std::atoi(entry->d_name) == self) continue;
    std::ifstream stat(std::string("/proc/self/task/") + entry->d_name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;  // the thread ended
    // "tid (comm) S ...": the state follows the last ')'.
    const size_t close = line.rfind(')');
    const size_t open = line.find('(');
    if (open == std::string::npos || close == std::string::npos || open > close) continue;
    const std::string name = line.substr(open + 1, close - open - 1);
    if (name != process_name && name.rfind("kiln-pool-", 0) != 0) continue;
    if (close + 2 < line.size() && line[close + 2] == 'R') {
      ++count;
      names += " " + line.substr(0, close + 1);
    }
  }
  closedir(dir);
  return count;
}

void expect_near_all(const std::vector<double>& want, const Tensor& got, double rel, double abs,
                     const char* what) {
  ASSERT_EQ(static_cast<size_t>(got.numel()), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g =
        got.dtype() == DType::kFloat64 ? got.values<double>()[i] : double{got.values<float>()[i]};
    ASSERT_NEAR(g, want[i], abs + rel * std::abs(want[i])) << what << " element " << i;
  }
}

TEST(RunnableThreads, ARunWithNThreadsHasAtMostNRunnable) {
  CompileOptions options;
  options.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "driver" / "runnable_threads";
  omp_set_num_threads(kThreads);  // the runs' thread count: the calling thread's OpenMP setting
  CompiledModel compiled = compile(model(), options);
  const Tensor a = filled<float>(DType::kFloat32, {kM, kK}, 1);
  const Tensor b = filled<float>(DType::kFloat32, {kK, kN}, 2);
  const Tensor v = filled<double>(DType::kFloat64, {1, kK}, 3);
  const Tensor x = filled<float>(DType::kFloat32, {1, kC, kHw, kHw}, 5);
  const Tensor w = filled<float>(DType::kFloat32, {kOc, kC, 3, 3}, 6);

  const std::set<int> before = thread_ids();
  std::atomic<bool> done{false};
  std::atomic<int> most{0};
  std::string most_names;  // the threads of the sample with the most
  std::set<int> seen;
  std::thread sampler([&] {
    const int self = static_cast<int>(syscall(SYS_gettid));
    std::string process_name;
    std::getline(std::ifstream("/proc/self/comm"), process_name);
    std::string names;
    while (!done.load()) {
      const int count = runnable_threads(self, process_name, names);
      if (count > most.load()) {
        most.store(count);
        most_names = names;
      }
      for (int id : thread_ids()) {
        if (id != self) seen.insert(id);
      }
    }
  });
  std::vector<Tensor> out;
  for (int run = 0; run < 200; ++run) out = compiled.run({a, b, v, x, w});
  done.store(true);
  sampler.join();
  std::set<int> started;
  for (int id : seen) {
    if (!before.count(id)) started.insert(id);
  }
  EXPECT_LE(static_cast<int>(started.size()), kThreads - 1)
      << "threads started by the runs beyond the pool's workers";
  for (int id : started) {  // the pool's workers carry its name
    std::string name;
    std::getline(std::ifstream("/proc/self/task/" + std::to_string(id) + "/comm"), name);
    EXPECT_EQ(name.rfind("kiln-pool-", 0), 0u) << "thread " << id << " is named '" << name << "'";
  }
  EXPECT_LE(most.load(), kThreads)
      << "runnable threads at once, the sampler excluded:" << most_names;

  // The outputs, against double-precision loops.
  auto av = a.values<float>(), bv = b.values<float>(), xv = x.values<float>();
  auto wv = w.values<float>();
  std::vector<double> soft(kM * kN);
  for (int64_t i = 0; i < kM; ++i) {
    double total = 0;
    for (int64_t j = 0; j < kN; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < kK; ++p) acc += double{av[i * kK + p]} * bv[p * kN + j];
      soft[i * kN + j] = std::exp(std::max(acc, 0.0));
      total += soft[i * kN + j];
    }
    for (int64_t j = 0; j < kN; ++j) soft[i * kN + j] /= total;
  }
  std::vector<double> wide(kWide);
  const Tensor wide_w = filled<double>(DType::kFloat64, {kK, kWide}, 4);
  for (int64_t j = 0; j < kWide; ++j) {
    for (int64_t p = 0; p < kK; ++p)
      wide[j] += v.values<double>()[p] * wide_w.values<double>()[p * kWide + j];
  }
  std::vector<double> conv(kOc * kHw * kHw);
  for (int64_t o = 0; o < kOc; ++o) {
    for (int64_t i = 0; i < kHw; ++i) {
      for (int64_t j = 0; j < kHw; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < kC; ++c) {
          for (int64_t ki = 0; ki < 3; ++ki) {
            for (int64_t kj = 0; kj < 3; ++kj) {
              const int64_t ii = i + ki - 1, jj = j + kj - 1;
              if (ii < 0 || ii >= kHw || jj < 0 || jj >= kHw) continue;
              acc += double{xv[(c * kHw + ii) * kHw + jj]} * wv[((o * kC + c) * 3 + ki) * 3 + kj];
            }
          }
        }
        conv[(o * kHw + i) * kHw + j] = acc;
      }
    }
  }
  ASSERT_EQ(out.size(), 3u);
  expect_near_all(soft, out[0], 1e-4, 1e-7, "Softmax(Relu(a @ b))");
  expect_near_all(wide, out[1], 1e-9, 1e-9, "v @ wide (float64)");
  expect_near_all(conv, out[2], 1e-4, 1e-4, "Conv(x, w)");
}

// Issue 14: OpenBLAS products cut into blocks on Kiln's pool (kiln_rt_pool.h's parallel_gemm,
// which cuts C along the larger of M and N, gemm_by_rows). One model holds MatMuls of two inputs
// (so no template takes them; each is kiln_rt::gemm, an OpenBLAS sgemm per block) at odd sizes
// that take every way of cutting: rows with a partial last block (131 x 67 x 45, 600 x 100 x 7),
// columns with a partial last block (37 x 129 x 301, 1 x 515 x 1001), and the narrow case where
// neither axis has two full units (13 x 2049 x 23, cut by columns). It is compiled once and run
// with 1, 2, 3 and 4 threads; each output is checked against a double-precision loop here, with
// the float32 tolerance 1e-5 relative + 1e-6 x K absolute (a sum of K products of values in
// [-1, 1]: float32 rounding grows with K). Not timed.
struct Shape {
  int64_t m, k, n;
};
const std::vector<Shape> kShapes = {
    {131, 67, 45}, {600, 100, 7}, {37, 129, 301}, {1, 515, 1001}, {13, 2049, 23}};

TEST(ParallelGemm, OddSizesMatchADoubleReferenceAtOneToFourThreads) {
  test_models::ModelBuilder builder;
  std::vector<Tensor> inputs;
  for (size_t s = 0; s < kShapes.size(); ++s) {
    const Shape& sh = kShapes[s];
    const std::string id = std::to_string(s);
    Value* a = builder.input("a" + id, DType::kFloat32, {sh.m, sh.k});
    Value* b = builder.input("b" + id, DType::kFloat32, {sh.k, sh.n});
    builder.output(builder.op("MatMul", {a, b}, {}, "product" + id));
    inputs.push_back(filled<float>(DType::kFloat32, {sh.m, sh.k}, 2 * static_cast<int64_t>(s)));
    inputs.push_back(filled<float>(DType::kFloat32, {sh.k, sh.n}, 2 * static_cast<int64_t>(s) + 1));
  }
  CompileOptions options;
  options.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "driver" / "parallel_gemm";
  omp_set_num_threads(2);
  CompiledModel compiled = compile(std::move(builder.model), options);

  // The products, in double precision.
  std::vector<std::vector<double>> want;
  for (size_t s = 0; s < kShapes.size(); ++s) {
    const Shape& sh = kShapes[s];
    auto a = inputs[2 * s].values<float>(), b = inputs[2 * s + 1].values<float>();
    std::vector<double> c(static_cast<size_t>(sh.m * sh.n));
    for (int64_t i = 0; i < sh.m; ++i) {
      for (int64_t j = 0; j < sh.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < sh.k; ++p) acc += double{a[i * sh.k + p]} * b[p * sh.n + j];
        c[i * sh.n + j] = acc;
      }
    }
    want.push_back(std::move(c));
  }

  for (int threads = 1; threads <= 4; ++threads) {
    omp_set_num_threads(threads);  // the run's thread count: the calling thread's setting
    const std::vector<Tensor> out = compiled.run(inputs);
    ASSERT_EQ(out.size(), kShapes.size());
    for (size_t s = 0; s < kShapes.size(); ++s) {
      const Shape& sh = kShapes[s];
      ASSERT_EQ(out[s].numel(), sh.m * sh.n);
      auto got = out[s].values<float>();
      for (size_t i = 0; i < want[s].size(); ++i) {
        ASSERT_NEAR(got[i], want[s][i], 1e-5 * std::abs(want[s][i]) + 1e-6 * sh.k)
            << sh.m << " x " << sh.k << " x " << sh.n << " at " << threads << " threads, element "
            << i;
      }
    }
  }
}

/// The CPU thread `tid` of this process last ran on (field 39 of its stat), -1 when unreadable.
int last_cpu(int tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return -1;
  std::istringstream fields(line.substr(line.rfind(')') + 2));  // from field 3, the state
  std::string field;
  for (int i = 3; i <= 39 && fields >> field; ++i) {
    if (i == 39) return std::stoi(field);
  }
  return -1;
}

// Issue 14: a pool worker that finds itself on the CPU of the loop's caller moves to another
// CPU (kiln_rt_pool.cpp's keep_apart), since the scheduler, counting runnable threads, may keep
// the two on one CPU and the busy processes on the others. Set up here: the test's thread (the
// caller) held on CPU a, a spinning thread held on CPU b, the worker put on a and then allowed
// a and b again; the scheduler then has no reason to move it (two runnable threads on each
// side either way). After runs of a parallel Relu the worker must be on b, and its allowed CPUs
// must be both again (moved, not pinned). Needs two CPUs; not timed.
TEST(PoolWorkers, MoveOffTheCallersCpu) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  auto only = [](int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return set;
  };
  cpu_set_t both;
  CPU_ZERO(&both);
  CPU_SET(cpus[0], &both);
  CPU_SET(cpus[1], &both);

  test_models::ModelBuilder m;
  m.output(m.op("Relu", {m.input("x", DType::kFloat32, {512, 1024})}, {}, "relu"));
  CompileOptions options;
  options.cache_dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "driver" / "pool_apart";
  omp_set_num_threads(2);
  CompiledModel compiled = compile(std::move(m.model), options);
  const Tensor x = filled<float>(DType::kFloat32, {512, 1024}, 7);

  const std::set<int> before = thread_ids();
  compiled.run({x});  // starts the worker
  std::vector<int> started;
  for (int id : thread_ids()) {
    if (!before.count(id)) started.push_back(id);
  }
  ASSERT_EQ(started.size(), 1u) << "the pool's one worker";
  const int worker = started[0];

  cpu_set_t a = only(cpus[0]), b = only(cpus[1]);
  ASSERT_EQ(sched_setaffinity(0, sizeof(a), &a), 0);
  std::atomic<bool> done{false};
  std::thread busy([&] {
    sched_setaffinity(0, sizeof(b), &b);
    while (!done.load(std::memory_order_relaxed)) {
    }
  });
  ASSERT_EQ(sched_setaffinity(worker, sizeof(a), &a), 0);  // the kernel moves it to a
  ASSERT_EQ(sched_setaffinity(worker, sizeof(both), &both), 0);
  std::vector<Tensor> out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < until) out = compiled.run({x});
  const int where = last_cpu(worker);
  cpu_set_t now;
  const int got = sched_getaffinity(worker, sizeof(now), &now);
  done.store(true);
  busy.join();
  sched_setaffinity(0, sizeof(allowed), &allowed);

  EXPECT_EQ(where, cpus[1]) << "the worker stayed on the caller's CPU " << cpus[0];
  ASSERT_EQ(got, 0);
  EXPECT_TRUE(CPU_EQUAL(&now, &both)) << "the worker's allowed CPUs were not given back";
  ASSERT_EQ(out.size(), 1u);
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(out[0].values<float>()[i], std::max(x.values<float>()[i], 0.0f)) << i;
  }
}

}  // namespace
}  // namespace kiln::driver
