#pragma once
/// Algorithm selection for GEMM and convolution (Inductor's AlgorithmSelectorCache): picks one
/// GemmChoice or ConvChoice for a problem, by heuristic, from the persistent autotune cache, or by
/// benchmarking. Both go through the same machinery below (compile, prepare, isolated helper,
/// cache, AUTOTUNE table); a convolution's table is headed `AUTOTUNE conv(1x64x56x56, ...)`.
///
///   off      the heuristic choice (the first choice: gemm_default_config's template)
///   default  the fastest valid choice the autotune cache holds for the problem, else the heuristic
///   max      benchmarks every choice the cache holds no result for, stores the results, and
///            picks the fastest valid one; a second selection of the same problem benchmarks
///            nothing
///
/// Benchmarking: the choices are compiled in parallel through the code cache; the weights are
/// prepared (GemmChoice::prepare) from seeded random values; then the kiln binary itself
/// (/proc/self/exe, or $KILN_AUTOTUNE_HELPER) runs as a child, `kiln autotune-bench
/// REQUEST.json` (benchmark_helper.h), which checks and times each choice. A choice that fails to
/// compile, gives a wrong result, or crashes or hangs the child is dropped with a log line
/// (KILN_LOG=autotune) and the child is started again for the choices after it. The results are
/// printed as Inductor prints them (`AUTOTUNE matmul(128x768, 768x3072)`, the top 10 with their
/// times and percentage of the best, and the seconds spent benchmarking and precompiling), with a
/// progress bar while benchmarking when stderr is a terminal. Tested in
/// tests/unit/autotune/select_test.cpp.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autotune/choice.h"
#include "autotune/conv_choice.h"

namespace kiln::autotune {

enum class AutotuneMode { kOff, kDefault, kMax };

/// "off", "default" or "max"; throws UserError naming `what` (such as "--autotune") otherwise.
AutotuneMode parse_autotune_mode(std::string_view text, std::string_view what = "KILN_AUTOTUNE");

std::string_view autotune_mode_name(AutotuneMode mode);

/// $KILN_AUTOTUNE when set and not empty, else kDefault. Throws UserError on a bad value.
AutotuneMode autotune_mode_from_env();

/// The benchmark helper program: $KILN_AUTOTUNE_HELPER when set, else this process's binary
/// (inside libkiln.so: the kiln installed beside the library, when there is one).
std::filesystem::path autotune_helper_path();

/// One GEMM to select for: C[M, N] = A[M, K] @ B[K, N], float32, contiguous row-major, B constant.
struct GemmSelectRequest {
  /// Rows of A: the value, or a size hint when M is symbolic (the kernels take M at run time).
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  /// OpenMP threads the kernel will run on; 0 means omp_get_max_threads().
  int threads = 0;
  /// The mode; empty means autotune_mode_from_env() (KILN_AUTOTUNE, else default).
  std::optional<AutotuneMode> mode;
  /// The autotune cache file; empty means default_autotune_cache_path().
  std::filesystem::path cache_path;
  /// The code cache the choices are compiled in; empty means codecache::default_cache_dir().
  std::filesystem::path code_cache_dir;
  /// The ISA of the template configs (a library built for an older CPU); empty: this host's.
  std::optional<TemplateIsa> isa;
  /// The candidates, the heuristic choice first; empty means gemm_choices(m, {n, k}, threads,
  /// isa).
  /// Names must be unique.
  std::vector<GemmChoicePtr> choices;
  /// Seed of the benchmark inputs.
  uint32_t seed = 0;
  /// Print the AUTOTUNE table to stderr when something was benchmarked.
  bool print_results = true;
};

/// One valid choice's median time.
struct GemmChoiceTiming {
  std::string name;
  double ms = 0;
  /// True when the time came from the autotune cache, not from this call.
  bool cached = false;
};

/// What a selection decided, and how (the choice itself is in GemmSelection / ConvSelection).
struct SelectionInfo {
  /// "heuristic", "cache" or "benchmark".
  std::string source;
  /// Valid choices with their times, fastest first (empty in off mode, and in default mode
  /// when the cache holds nothing for the problem).
  std::vector<GemmChoiceTiming> timings;
  /// Choices dropped (now or in the cached results): name -> why.
  std::map<std::string, std::string> dropped;
  /// Choices benchmarked (or tried) by this call; 0 when everything came from the cache.
  size_t benchmarked = 0;
  /// Helper processes this call started.
  size_t helper_runs = 0;
  double precompile_seconds = 0;
  double benchmark_seconds = 0;
};

struct GemmSelection : SelectionInfo {
  GemmChoicePtr choice;
};

/// Selects a choice for `request` (see the file comment). Throws UserError when the request is
/// malformed, when the helper cannot run, or in max mode when no choice is valid.
GemmSelection select_gemm(const GemmSelectRequest& request);

/// One convolution to select for (conv_template.h's ConvProblem, constant weight and bias).
struct ConvSelectRequest {
  ConvProblem problem;
  /// As GemmSelectRequest's.
  int threads = 0;
  std::optional<AutotuneMode> mode;
  std::filesystem::path cache_path;
  std::filesystem::path code_cache_dir;
  /// The ISA of the template configs; empty: this host's.
  std::optional<TemplateIsa> isa;
  /// The candidates, the heuristic choice first; empty means conv_choices(problem, threads,
  /// isa).
  std::vector<ConvChoicePtr> choices;
  uint32_t seed = 0;
  bool print_results = true;
};

struct ConvSelection : SelectionInfo {
  ConvChoicePtr choice;
};

/// Selects a convolution choice as select_gemm selects a GEMM one.
ConvSelection select_conv(const ConvSelectRequest& request);

/// "matmul(128x768, 768x3072)": the problem as the AUTOTUNE log names it.
std::string gemm_problem_text(int64_t m, int64_t n, int64_t k);

}  // namespace kiln::autotune
