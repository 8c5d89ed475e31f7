#include "autotune/select.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "autotune/benchmark_helper.h"
#include "autotune/cache.h"
#include "autotune/runtime_headers.h"
#include "codecache/code_cache.h"
#include "codecache/process.h"
#include "support/error.h"
#include "support/files.h"
#include "support/hash.h"
#include "support/image_path.h"
#include "support/log.h"

namespace kiln::autotune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kSymbol = "kiln_gemm";
constexpr size_t kTableRows = 10;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The first line of a (possibly multi-line) message, for one-line logs.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// A private temporary directory, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "kiln-autotune-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      user_error("cannot create a temporary directory for autotuning in {}",
                 fs::temp_directory_path().string());
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// One choice being benchmarked, whatever its op: how to render and prepare it, its hash key, and
// what happened to it.
struct Candidate {
  std::string name;
  std::string backend;
  std::function<std::string(const std::string&)> render;
  ChoiceLinkage linkage;
  std::function<std::vector<float>()> prepare;
  std::string hash_key;
  fs::path library;
  fs::path weight;
  std::optional<CachedResult> result;
};

void drop(Candidate& candidate, const std::string& why) {
  log::write(log::Category::kAutotune, "dropped '{}': {}", candidate.name, why);
  candidate.result = CachedResult{.hash_key = candidate.hash_key, .ms = {}, .error = why};
}

void compile_candidates(std::vector<Candidate*>& candidates, const fs::path& code_cache_dir) {
  codecache::CodeCache code_cache(code_cache_dir.empty() ? codecache::default_cache_dir()
                                                         : code_cache_dir);
  process::parallel_for(candidates.size(), codecache::default_compile_threads(), [&](size_t i) {
    Candidate& candidate = *candidates[i];
    try {
      codecache::CompilerConfig config;
      const ChoiceLinkage& link = candidate.linkage;
      config.include_dirs.assign(link.include_dirs.begin(), link.include_dirs.end());
      add_runtime(config);
      config.libraries = link.libraries;
      candidate.library = code_cache.compile_shared_library(candidate.render(kSymbol), config);
    } catch (const std::exception& e) {
      drop(candidate, "failed to compile: " + first_line(e.what()));
    }
  });
}

// Prepares every compiled candidate's weight (each from the same random values), one file per
// distinct content (many template configs share a packing).
void prepare_weights(std::vector<Candidate*>& candidates, const fs::path& dir) {
  for (Candidate* candidate : candidates) {
    if (candidate->result) continue;
    try {
      const std::vector<float> prepared = candidate->prepare();
      const std::string_view bytes(reinterpret_cast<const char*>(prepared.data()),
                                   prepared.size() * sizeof(float));
      candidate->weight = dir / ("weight-" + sha256_hex(bytes).substr(0, 16) + ".bin");
      std::error_code ec;
      if (!fs::exists(candidate->weight, ec)) files::write_atomic(candidate->weight, bytes);
    } catch (const std::exception& e) {
      drop(*candidate, "failed to prepare the weight: " + first_line(e.what()));
    }
  }
}

// The progress lines the helper wrote: the results it finished, and the choice it ran last (its
// last "start" or "timing" line): after a crash, the one to blame.
struct Progress {
  std::map<int64_t, json> done;
  std::optional<int64_t> running;
  // For the progress bar: the rounds of timing run.
  size_t timed_rounds = 0;

  // Choices finished: those that failed their check, and each correct one as it goes through its
  // rounds of timing.
  size_t finished() const {
    const auto failed = std::count_if(done.begin(), done.end(), [](const auto& entry) {
      return entry.second.value("status", "") != "ok";
    });
    return static_cast<size_t>(failed) + timed_rounds / kTimingRounds;
  }
};

Progress read_progress(const fs::path& path) {
  Progress progress;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) continue;  // a line being written
    if (j.contains("start")) progress.running = j.at("start").get<int64_t>();
    if (j.contains("timing")) {
      progress.running = j.at("timing").get<int64_t>();
      ++progress.timed_rounds;
    }
    if (j.contains("done")) progress.done[j.at("done").get<int64_t>()] = j;
  }
  return progress;
}

void draw_progress_bar(const std::string& problem, size_t finished, size_t total) {
  constexpr size_t kWidth = 30;
  const size_t filled = total == 0 ? kWidth : finished * kWidth / total;
  fmt::print(stderr, "\rAUTOTUNE {} [{}{}] {}/{} choices", problem, std::string(filled, '#'),
             std::string(kWidth - filled, '.'), finished, total);
  std::fflush(stderr);
}

// Runs the helper; on a terminal, a progress bar follows its progress file meanwhile.
process::Result run_helper(const process::Command& command, const fs::path& progress_path,
                           const std::string& problem, size_t offset, size_t total) {
  if (!::isatty(STDERR_FILENO)) return process::run(command);
  std::atomic<bool> finished{false};
  process::Result result;
  std::exception_ptr error;
  std::thread child([&] {
    try {
      result = process::run(command);
    } catch (...) {
      error = std::current_exception();
    }
    finished = true;
  });
  while (!finished) {
    draw_progress_bar(problem, offset + read_progress(progress_path).finished(), total);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  child.join();
  fmt::print(stderr, "\r\033[K");
  if (error) std::rethrow_exception(error);
  return result;
}

std::string result_error(const json& done) {
  const std::string status = done.value("status", "");
  if (status == "wrong") {
    const double ratio = done.value("max_error", -1.0);
    return ratio < 0 ? "wrong result (NaN or infinite values)"
                     : fmt::format("wrong result ({:.3g} times the tolerance)", ratio);
  }
  return "failed to run: " + first_line(done.value("error", std::string("unknown error")));
}

// Times the compiled candidates in helper processes: one run for all of them, and after a crash
// another run for the candidates the crashed run had not started.
void benchmark_candidates(std::vector<Candidate*>& candidates, const HelperRequest& base,
                          const std::string& problem, const fs::path& dir,
                          SelectionInfo& selection) {
  // Libraries first: their results are the most trustworthy reference for the others.
  std::vector<int64_t> remaining;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (!candidates[i]->result) remaining.push_back(static_cast<int64_t>(i));
  }
  std::stable_partition(remaining.begin(), remaining.end(), [&](int64_t i) {
    return candidates[static_cast<size_t>(i)]->backend == "extern";
  });
  const fs::path helper = autotune_helper_path();
  const size_t total = remaining.size();
  while (!remaining.empty()) {
    const size_t run = selection.helper_runs++;
    HelperRequest helper_request = base;
    helper_request.reference = dir / "reference.bin";
    helper_request.progress = dir / fmt::format("progress-{}.jsonl", run);
    for (int64_t i : remaining) {
      const Candidate& candidate = *candidates[static_cast<size_t>(i)];
      helper_request.choices.push_back({.index = i,
                                        .name = candidate.name,
                                        .library = candidate.library,
                                        .symbol = kSymbol,
                                        .weight = candidate.weight});
    }
    const fs::path request_path = dir / fmt::format("request-{}.json", run);
    files::write_atomic(request_path, helper_request_to_json(helper_request).dump(2));
    process::Command command;
    command.program = helper.string();
    command.args = {"autotune-bench", request_path.string()};
    command.timeout =
        std::chrono::milliseconds(60'000 + 30'000 * static_cast<int64_t>(remaining.size()));
    const process::Result result =
        run_helper(command, helper_request.progress, problem, total - remaining.size(), total);
    const Progress progress = read_progress(helper_request.progress);
    std::vector<int64_t> not_started;
    bool crash_found = false;
    for (int64_t i : remaining) {
      Candidate& candidate = *candidates[static_cast<size_t>(i)];
      const auto done = progress.done.find(i);
      if (done != progress.done.end()) {
        ++selection.benchmarked;
        if (done->second.value("status", "") == "ok") {
          candidate.result = CachedResult{.hash_key = candidate.hash_key,
                                          .ms = done->second.at("ms").get<double>(),
                                          .error = {}};
        } else {
          drop(candidate, result_error(done->second));
        }
      } else if (progress.running == i) {
        ++selection.benchmarked;
        crash_found = true;
        drop(candidate, fmt::format("crashed the benchmark helper ({})", result.status_text()));
      } else {
        // Not started, or started and correct but not yet timed to the end when another choice
        // crashed (the helper times the correct choices in interleaved rounds): run it again.
        not_started.push_back(i);
      }
    }
    if (!not_started.empty() && not_started.size() == remaining.size()) {
      // The helper ran no choice at all: it is not a working kiln binary.
      user_error(
          "the autotune benchmark helper '{}' failed ({}) before running any choice{}{}; set "
          "KILN_AUTOTUNE_HELPER to the kiln binary",
          helper.string(), result.status_text(), result.stderr_text.empty() ? "" : ": ",
          first_line(result.stderr_text));
    }
    if (!crash_found && !result.ok()) {
      log::write(log::Category::kAutotune, "benchmark helper ended with {} after every choice",
                 result.status_text());
    }
    remaining = std::move(not_started);
  }
}

// Inductor's AUTOTUNE table: the top choices with times and percentage of the best.
void print_results(const std::string& problem, const SelectionInfo& selection) {
  std::string text = fmt::format("AUTOTUNE {}\n", problem);
  const double best = selection.timings.empty() ? 0 : selection.timings.front().ms;
  for (size_t i = 0; i < selection.timings.size() && i < kTableRows; ++i) {
    const GemmChoiceTiming& timing = selection.timings[i];
    text += fmt::format("  {} {:.4f} ms {:.1f}%{}\n", timing.name, timing.ms,
                        timing.ms > 0 ? 100 * best / timing.ms : 100.0,
                        timing.cached ? " (cached)" : "");
  }
  text += fmt::format(
      "SubProcess AUTOTUNE benchmarking takes {:.4f} seconds and {:.4f} seconds precompiling for "
      "{} choices ({} dropped)\n",
      selection.benchmark_seconds, selection.precompile_seconds, selection.benchmarked,
      selection.dropped.size());
  fmt::print(stderr, "{}", text);
}

void check_shape(const GemmSelectRequest& request) {
  if (request.m < 0 || request.n <= 0 || request.k < 0) {
    user_error("autotune: expected M >= 0, N > 0 and K >= 0, found {}",
               gemm_problem_text(request.m, request.n, request.k));
  }
}

template <typename ChoicePtr>
void check_choices(const std::vector<ChoicePtr>& choices) {
  KILN_CHECK(!choices.empty(), "autotune: no choices");
  std::set<std::string> names;
  for (const ChoicePtr& choice : choices) {
    KILN_CHECK(choice != nullptr, "a null choice");
    KILN_CHECK(names.insert(choice->name()).second, "two choices named '{}'", choice->name());
  }
}

// What one selection needs besides its candidates.
struct Problem {
  std::string text;      // for the log: "matmul(...)", "conv(...)"
  json key;              // the autotune cache key
  HelperRequest helper;  // the helper request without its choices
  AutotuneMode mode = AutotuneMode::kDefault;
  fs::path cache_path;
  fs::path code_cache_dir;
  bool print_results = true;
};

// The selection among `candidates` (the heuristic one first), shared by every op: the index of
// the choice in `selection_index`.
void select_candidate(std::vector<Candidate>& candidates, const Problem& problem,
                      SelectionInfo& selection, size_t& selection_index) {
  selection_index = 0;
  selection.source = "heuristic";
  if (problem.mode == AutotuneMode::kOff) return;

  const AutotuneCache cache(problem.cache_path.empty()
                                ? default_autotune_cache_path(problem.code_cache_dir)
                                : problem.cache_path);
  const CachedResults cached = cache.lookup(problem.key);
  for (Candidate& candidate : candidates) {
    const auto found = cached.find(candidate.name);
    if (found != cached.end() && found->second.hash_key == candidate.hash_key) {
      candidate.result = found->second;
    }
  }
  std::set<std::string> fresh;
  std::vector<Candidate*> to_benchmark;
  if (problem.mode == AutotuneMode::kMax) {
    for (Candidate& candidate : candidates) {
      if (!candidate.result) to_benchmark.push_back(&candidate);
    }
  }
  if (!to_benchmark.empty()) {
    TempDir dir;
    const auto compile_start = Clock::now();
    compile_candidates(to_benchmark, problem.code_cache_dir);
    selection.precompile_seconds = seconds_since(compile_start);
    const auto bench_start = Clock::now();
    prepare_weights(to_benchmark, dir.path());
    std::vector<Candidate*> runnable;
    for (Candidate* candidate : to_benchmark) {
      if (!candidate->result) runnable.push_back(candidate);
    }
    if (!runnable.empty()) {
      benchmark_candidates(runnable, problem.helper, problem.text, dir.path(), selection);
    }
    selection.benchmark_seconds = seconds_since(bench_start);
    CachedResults results;
    for (Candidate* candidate : to_benchmark) {
      fresh.insert(candidate->name);
      if (candidate->result) results[candidate->name] = *candidate->result;
    }
    cache.store(problem.key, results);
  }

  for (const Candidate& candidate : candidates) {
    if (!candidate.result) continue;
    if (candidate.result->ms) {
      selection.timings.push_back(
          {candidate.name, *candidate.result->ms, fresh.count(candidate.name) == 0});
    } else {
      selection.dropped[candidate.name] = candidate.result->error;
    }
  }
  std::stable_sort(
      selection.timings.begin(), selection.timings.end(),
      [](const GemmChoiceTiming& x, const GemmChoiceTiming& y) { return x.ms < y.ms; });
  if (problem.print_results && !fresh.empty()) print_results(problem.text, selection);

  if (selection.timings.empty()) {
    if (problem.mode == AutotuneMode::kMax) {
      std::string reasons;
      for (const auto& [name, why] : selection.dropped) {
        reasons += fmt::format("{}{}: {}", reasons.empty() ? "" : "; ", name, why);
      }
      user_error("autotune: no valid choice for {} ({})", problem.text, reasons);
    }
    log::write(log::Category::kAutotune, "{}: no cached timings; heuristic choice '{}'",
               problem.text, candidates.front().name);
    return;
  }
  const std::string best = selection.timings.front().name;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].name == best) selection_index = i;
  }
  selection.source = fresh.count(best) != 0 ? "benchmark" : "cache";
  log::write(log::Category::kAutotune, "{}: chose '{}' ({:.4f} ms, from the {})", problem.text,
             best, selection.timings.front().ms, selection.source);
}

}  // namespace

AutotuneMode parse_autotune_mode(std::string_view text, std::string_view what) {
  if (text == "off") return AutotuneMode::kOff;
  if (text == "default") return AutotuneMode::kDefault;
  if (text == "max") return AutotuneMode::kMax;
  user_error("{}: expected off, default or max, found '{}'", what, text);
}

std::string_view autotune_mode_name(AutotuneMode mode) {
  switch (mode) {
    case AutotuneMode::kOff:
      return "off";
    case AutotuneMode::kDefault:
      return "default";
    case AutotuneMode::kMax:
      return "max";
  }
  return "?";
}

AutotuneMode autotune_mode_from_env() {
  const char* env = std::getenv("KILN_AUTOTUNE");
  if (env == nullptr || *env == '\0') return AutotuneMode::kDefault;
  return parse_autotune_mode(env, "KILN_AUTOTUNE");
}

fs::path autotune_helper_path() {
  const char* env = std::getenv("KILN_AUTOTUNE_HELPER");
  if (env != nullptr && *env != '\0') return fs::path(env);
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) user_error("autotune: cannot find this program (/proc/self/exe: {})", ec.message());
  // Inside libkiln.so the process is the user's program, not kiln: use the kiln beside the
  // library (PREFIX/bin/kiln for PREFIX/lib/libkiln.so, also in a build tree).
  const fs::path image = running_image_path();
  if (!image.empty() && image != fs::weakly_canonical(self, ec)) {
    const fs::path kiln = installed_path("bin/kiln");
    if (!kiln.empty()) return kiln;
  }
  return self;
}

std::string gemm_problem_text(int64_t m, int64_t n, int64_t k) {
  return fmt::format("matmul({}x{}, {}x{})", m, k, k, n);
}

namespace {

// The fields of a selection's Problem every op's request has.
template <typename Request>
Problem problem_of(const Request& request, std::string text, int threads) {
  Problem problem;
  problem.text = std::move(text);
  problem.mode = request.mode ? *request.mode : autotune_mode_from_env();
  problem.cache_path = request.cache_path;
  problem.code_cache_dir = request.code_cache_dir;
  problem.print_results = request.print_results;
  problem.helper.threads = threads;
  problem.helper.seed = request.seed;
  return problem;
}

// The candidate of one choice; `prepare` makes its prepared weight.
template <typename ChoicePtr>
Candidate candidate_of(const ChoicePtr& choice, std::function<std::vector<float>()> prepare) {
  Candidate candidate;
  candidate.name = choice->name();
  candidate.backend = choice->backend();
  candidate.render = [choice](const std::string& symbol) { return choice->render(symbol); };
  candidate.linkage = choice->linkage();
  candidate.prepare = std::move(prepare);
  candidate.hash_key = choice->hash_key();
  return candidate;
}

// The selection among `choices` (the heuristic one first) whose candidates are `candidates`
// (none in off mode: the heuristic's).
template <typename Selection, typename ChoicePtr>
Selection select_among(const std::vector<ChoicePtr>& choices, std::vector<Candidate>& candidates,
                       const Problem& problem) {
  Selection selection;
  size_t index = 0;
  selection.source = "heuristic";
  if (!candidates.empty()) select_candidate(candidates, problem, selection, index);
  selection.choice = choices[index];
  return selection;
}

}  // namespace

GemmSelection select_gemm(const GemmSelectRequest& request) {
  const int threads = request.threads > 0 ? request.threads : omp_get_max_threads();
  check_shape(request);
  const GemmProblem gemm{.n = request.n, .k = request.k};
  const std::vector<GemmChoicePtr> choices =
      request.choices.empty()
          ? gemm_choices(request.m, gemm, threads, request.isa.value_or(host_template_isa()))
          : request.choices;
  check_choices(choices);

  Problem problem =
      problem_of(request, gemm_problem_text(request.m, request.n, request.k), threads);
  problem.helper.m = request.m;
  problem.helper.n = request.n;
  problem.helper.k = request.k;
  std::vector<Candidate> candidates;
  if (problem.mode != AutotuneMode::kOff) {
    problem.key = gemm_cache_key(request.m, request.n, request.k, threads);
    // The random weight, made once when the first candidate is prepared.
    auto b = std::make_shared<std::vector<float>>();
    for (const GemmChoicePtr& choice : choices) {
      candidates.push_back(
          candidate_of(choice, [choice, b, k = request.k, n = request.n, seed = request.seed] {
            if (b->empty()) *b = bench_matrix(k, n, seed + 1);
            return choice->prepare(b->data(), k, n);
          }));
    }
  }
  return select_among<GemmSelection>(choices, candidates, problem);
}

ConvSelection select_conv(const ConvSelectRequest& request) {
  const int threads = request.threads > 0 ? request.threads : omp_get_max_threads();
  check_conv_problem(request.problem);
  const std::vector<ConvChoicePtr> choices =
      request.choices.empty()
          ? conv_choices(request.problem, threads, request.isa.value_or(host_template_isa()))
          : request.choices;
  check_choices(choices);

  Problem problem = problem_of(request, request.problem.text(), threads);
  problem.helper.op = "conv";
  problem.helper.conv = request.problem;
  std::vector<Candidate> candidates;
  if (problem.mode != AutotuneMode::kOff) {
    problem.key = conv_cache_key(request.problem, threads);
    const ConvProblem& p = request.problem;
    // The random weight and bias, made once when the first candidate is prepared.
    auto w = std::make_shared<std::vector<float>>();
    auto bias = std::make_shared<std::vector<float>>();
    for (const ConvChoicePtr& choice : choices) {
      candidates.push_back(candidate_of(choice, [choice, p, w, bias, seed = request.seed] {
        if (w->empty()) {
          *w = bench_matrix(p.m, p.depth(), seed + 1);
          *bias = bench_matrix(1, p.m, seed + 2);
        }
        return choice->prepare(w->data(), bias->data());
      }));
    }
  }
  return select_among<ConvSelection>(choices, candidates, problem);
}

}  // namespace kiln::autotune
