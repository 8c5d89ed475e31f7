#include "autotune/benchmark_helper.h"

#include <fcntl.h>
#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "codecache/loaded_library.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::autotune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using GemmFn = void(int64_t, const float*, const float*, float*);
using ConvFn = void(const float*, const float*, float*);

// Calls per run are capped so that a sub-microsecond kernel does not take millions of samples.
constexpr int kMaxReps = 10000;

// 64-byte aligned floats (the kernels need no alignment, but libraries run faster with it and the
// compiled model's buffers are aligned too).
struct AlignedBuffer {
  explicit AlignedBuffer(size_t count)
      : data(static_cast<float*>(
            std::aligned_alloc(64, std::max<size_t>(64, (count * 4 + 63) / 64 * 64)))),
        size(count) {
    if (data == nullptr) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  float* data;
  size_t size;
};

std::vector<float> read_floats(const fs::path& path) {
  const std::string bytes = files::read(path);
  if (bytes.size() % sizeof(float) != 0) {
    user_error("{}: expected raw float32 data, found {} bytes", path.string(), bytes.size());
  }
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// Appends lines to the progress file with one write() each: a line is in the file as soon as the
// call returns, whatever happens to this process afterwards.
class ProgressFile {
 public:
  explicit ProgressFile(const fs::path& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (fd_ < 0) user_error("{}: cannot open: {}", path.string(), std::strerror(errno));
  }
  ~ProgressFile() { ::close(fd_); }
  ProgressFile(const ProgressFile&) = delete;
  ProgressFile& operator=(const ProgressFile&) = delete;

  void append(const json& line) {
    const std::string text = line.dump() + "\n";
    const char* p = text.data();
    size_t left = text.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) user_error("cannot write the progress file: {}", std::strerror(errno));
      p += n;
      left -= static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
};

// Writes the weight back and drops it from every cache level (one clflush a 64-byte line). In a
// network a layer's weights come from L3 or memory: the other layers' weights pass through the
// caches between two runs of it (ResNet-50's are about 100 MB). Timed with its weights in cache,
// as the same call over and over leaves them, a choice that streams its weights well (the panels
// outermost, prefetching the next one) looks no better than one that reads them again and again
// from L2. Picked from such timings, ResNet-50's choices ran 5-12 % slower in the network than the
// heuristic ones, and 1-3 % with the weights evicted (an Emerald Rapids Xeon VM, 2 threads, kiln
// bench --against, 3 passes each). Evicting L2 instead, by reading a buffer of twice its size on
// each thread, also evicts X, which the layer before has just written in a network: those picks
// ran 11-15 % slower than the heuristic ones. A library that copies the weight at its first call
// (oneDNN's reorder into its blocked layout) still reads its copy from cache.
void evict(const AlignedBuffer& weight) {
  const char* bytes = reinterpret_cast<const char*>(weight.data);
  for (size_t i = 0; i < weight.size * sizeof(float); i += 64) _mm_clflush(bytes + i);
  _mm_mfence();
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The largest |c - r| beyond tolerance as a ratio (<= 1 means within tolerance); NaN counts as
// infinitely far.
double error_ratio(const float* c, const float* ref, size_t count, int64_t k) {
  const double atol = 1e-3 * std::sqrt(double(std::max<int64_t>(k, 1)));
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    const double diff = std::abs(double(c[i]) - double(ref[i]));
    const double ratio = diff / (atol + 1e-3 * std::abs(double(ref[i])));
    if (!(ratio <= worst))
      worst = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : std::max(worst, ratio);
  }
  return worst;
}

// A choice that ran correctly, kept loaded for the rounds of timing.
struct TimedChoice {
  int64_t index = 0;
  std::unique_ptr<codecache::LoadedLibrary> library;
  std::unique_ptr<AlignedBuffer> weight;
  std::function<void()> call;
  json done;
  // Wall time per call, its eviction included: what the call counts are sized by, so that a
  // choice takes about its budget of wall time even where evicting its weights takes longer
  // than the call (a 1 x 2048 x 1000 classifier: 8 MB of weights, a 0.2 ms call).
  double estimate_ms = 0;
  std::vector<double> samples;
};

// One call with the weight evicted first, timed (the eviction is not).
double timed_call(TimedChoice& choice) {
  evict(*choice.weight);
  const auto t0 = Clock::now();
  choice.call();
  return seconds(Clock::now() - t0) * 1e3;
}

// Inductor's do_bench budget, spread over the rounds: an estimate from 5 calls and about
// `warmup_ms` of warm-up calls first (warm_up), then per round about rep_ms / kTimingRounds of
// measured calls after one untimed call (the first after the other choices ran: its code and
// pool threads are cold), each call timed alone. Both loops also stop at a few times their budget
// of wall time: on a loaded machine a call whose threads wait for a core can take milliseconds,
// and thousands of them would stall the selection (the median shrugs the slow ones off).
void warm_up(TimedChoice& choice, const HelperRequest& request) {
  const auto start = Clock::now();
  for (int i = 0; i < 5; ++i) timed_call(choice);
  choice.estimate_ms = std::max(seconds(Clock::now() - start) * 1e3 / 5, 1e-6);
  const int warmup =
      std::clamp(static_cast<int>(request.warmup_ms / choice.estimate_ms), 1, kMaxReps);
  const auto warmup_start = Clock::now();
  for (int i = 0; i < warmup; ++i) {
    timed_call(choice);
    if (seconds(Clock::now() - warmup_start) * 1e3 > 2 * request.warmup_ms) break;
  }
}

void time_round(TimedChoice& choice, const HelperRequest& request) {
  const double budget_ms = request.rep_ms / kTimingRounds;
  const int min_reps = std::max(1, (request.min_reps + kTimingRounds - 1) / kTimingRounds);
  const int reps = std::clamp(static_cast<int>(budget_ms / choice.estimate_ms), min_reps,
                              kMaxReps / kTimingRounds);
  timed_call(choice);
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) {
    choice.samples.push_back(timed_call(choice));
    if (i + 1 >= min_reps && seconds(Clock::now() - start) * 1e3 > 4 * budget_ms) break;
  }
}

}  // namespace

json helper_request_to_json(const HelperRequest& request) {
  json choices = json::array();
  for (const HelperChoice& choice : request.choices) {
    choices.push_back({{"index", choice.index},
                       {"name", choice.name},
                       {"library", choice.library.string()},
                       {"symbol", choice.symbol},
                       {"weight", choice.weight.string()}});
  }
  json j = {{"op", request.op},
            {"m", request.m},
            {"n", request.n},
            {"k", request.k},
            {"threads", request.threads},
            {"seed", request.seed},
            {"warmup_ms", request.warmup_ms},
            {"rep_ms", request.rep_ms},
            {"min_reps", request.min_reps},
            {"reference", request.reference.string()},
            {"progress", request.progress.string()},
            {"choices", choices}};
  if (request.op == "conv") j["conv"] = conv_problem_ints(request.conv);
  return j;
}

HelperRequest helper_request_from_json(const json& j) {
  HelperRequest request;
  request.op = j.value("op", std::string("gemm"));
  if (request.op == "conv") {
    try {
      request.conv = conv_problem_from_ints(j.at("conv").get<std::vector<int64_t>>());
    } catch (const InternalError& e) {
      user_error("not a convolution request: {}", e.what());
    }
  }
  request.m = j.at("m").get<int64_t>();
  request.n = j.at("n").get<int64_t>();
  request.k = j.at("k").get<int64_t>();
  request.threads = j.at("threads").get<int>();
  request.seed = j.at("seed").get<uint32_t>();
  request.warmup_ms = j.at("warmup_ms").get<double>();
  request.rep_ms = j.at("rep_ms").get<double>();
  request.min_reps = j.at("min_reps").get<int>();
  request.reference = j.at("reference").get<std::string>();
  request.progress = j.at("progress").get<std::string>();
  for (const json& c : j.at("choices")) {
    request.choices.push_back({.index = c.at("index").get<int64_t>(),
                               .name = c.at("name").get<std::string>(),
                               .library = c.at("library").get<std::string>(),
                               .symbol = c.at("symbol").get<std::string>(),
                               .weight = c.at("weight").get<std::string>()});
  }
  return request;
}

std::vector<float> bench_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  return values;
}

int run_benchmark_helper(const fs::path& request_path) {
  HelperRequest request;
  try {
    request = helper_request_from_json(json::parse(files::read(request_path)));
  } catch (const json::exception& e) {
    user_error("{}: not an autotune benchmark request: {}", request_path.string(), e.what());
  }
  const bool conv = request.op == "conv";
  if (conv) {
    check_conv_problem(request.conv);
  } else if (request.op != "gemm") {
    user_error("{}: unknown op '{}'", request_path.string(), request.op);
  } else if (request.m < 0 || request.n <= 0 || request.k < 0) {
    user_error("{}: bad GEMM shape {}x{}x{}", request_path.string(), request.m, request.k,
               request.n);
  }
  const ConvProblem& p = request.conv;
  const int64_t in_rows = conv ? 1 : request.m, in_cols = conv ? p.n * p.c * p.h * p.w : request.k;
  const int64_t depth = conv ? p.depth() : request.k;
  omp_set_num_threads(std::max(request.threads, 1));
  ProgressFile progress(request.progress);

  const std::vector<float> a_values = bench_matrix(in_rows, in_cols, request.seed);
  AlignedBuffer a(a_values.size());
  std::copy(a_values.begin(), a_values.end(), a.data);
  const size_t out_size =
      static_cast<size_t>(conv ? p.n * p.m * p.oh() * p.ow() : request.m * request.n);
  AlignedBuffer c(out_size);
  std::optional<std::vector<float>> reference;
  std::error_code ec;
  if (fs::exists(request.reference, ec)) {
    reference = read_floats(request.reference);
    if (reference->size() != out_size) user_error("{}: wrong size", request.reference.string());
  }

  // First each choice on its own: loaded, checked against the reference, warmed up; a wrong or
  // failing one is done at once.
  std::vector<TimedChoice> timed;
  for (const HelperChoice& choice : request.choices) {
    progress.append({{"start", choice.index}});
    TimedChoice t;
    t.index = choice.index;
    t.done = {{"done", choice.index}};
    try {
      t.library = std::make_unique<codecache::LoadedLibrary>(choice.library);
      GemmFn* gemm = conv ? nullptr : t.library->symbol<GemmFn>(choice.symbol);
      ConvFn* conv_fn = conv ? t.library->symbol<ConvFn>(choice.symbol) : nullptr;
      const std::vector<float> weight_values = read_floats(choice.weight);
      t.weight = std::make_unique<AlignedBuffer>(weight_values.size());
      std::copy(weight_values.begin(), weight_values.end(), t.weight->data);
      const float* w = t.weight->data;
      t.call = [&request, &a, &c, w, gemm, conv_fn] {
        if (conv_fn != nullptr) {
          conv_fn(a.data, w, c.data);
        } else {
          gemm(request.m, a.data, w, c.data);
        }
      };

      std::fill_n(c.data, out_size, std::numeric_limits<float>::quiet_NaN());
      t.call();
      if (!reference) {
        reference.emplace(c.data, c.data + out_size);
        files::write_atomic(request.reference,
                            std::string_view(reinterpret_cast<const char*>(reference->data()),
                                             out_size * sizeof(float)));
      }
      const double ratio = error_ratio(c.data, reference->data(), out_size, depth);
      t.done["max_error"] = std::isfinite(ratio) ? ratio : -1.0;
      if (!(ratio <= 1.0)) {
        t.done["status"] = "wrong";
      } else {
        warm_up(t, request);
        timed.push_back(std::move(t));
        continue;
      }
    } catch (const std::exception& e) {
      t.done["status"] = "error";
      t.done["error"] = e.what();
    }
    progress.append(t.done);
  }

  // Rounds of timing: each round times every correct choice for 1/kTimingRounds of its budget, in
  // an order rotated by one each round. Over the seconds that a problem's choices take, a shared
  // machine's speed moves by tens of percent (the development VM's: 30 % within a minute), so
  // choices timed one after another meet different phases. Two runs over ResNet-50's 24 layers,
  // choices timed one after another: the first run's pick was a median 7 % and at most 97 % slower
  // than the second run's pick in the second run's timings; timed in rounds, 4-6 % and at most
  // 35-45 %, and the network with the picks of either run as fast as with the heuristic choices
  // (p50 ratio 1.00, the heuristic's first; the picks of choices timed one after another with the
  // weights in cache: 1.05-1.12).
  // A "timing" line names the choice running, for a crash from here on.
  for (int round = 0; round < kTimingRounds; ++round) {
    for (size_t i = 0; i < timed.size(); ++i) {
      TimedChoice& t = timed[(i + static_cast<size_t>(round)) % timed.size()];
      progress.append({{"timing", t.index}});
      time_round(t, request);
    }
  }
  for (TimedChoice& t : timed) {
    std::vector<double>& samples = t.samples;
    const size_t middle = samples.size() / 2;
    std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(middle),
                     samples.end());
    t.done["status"] = "ok";
    t.done["ms"] = samples[middle];
    t.done["reps"] = samples.size();
    progress.append(t.done);
  }
  return 0;
}

}  // namespace kiln::autotune
