#pragma once
/// The benchmark helper: the child process that times GEMM and convolution choices, isolated from
/// the compiler process so that a choice that crashes or hangs never takes Kiln down (and so that
/// no fork happens after OpenMP started threads: the parent runs `kiln autotune-bench REQUEST.json`
/// through fork + exec). select.cpp writes the request; the hidden CLI subcommand
/// (src/cli/autotune_command.cpp) calls run_benchmark_helper.
///
/// The helper generates A (M x K, seeded uniform [-1, 1); for a convolution X, N*C*H*W), and
/// first, for each choice in order,
///   1. appends {"start": index} to the progress file (written through at once, so the parent
///      can tell which choice a crash belongs to),
///   2. loads its library and prepared weight and runs it once on C filled with NaN, checking C
///      against the reference: the output of the first choice that ran (written to the reference
///      file, so a retry after a crash checks against the same values). Tolerance |c - r| <= 1e-3
///      * (sqrt(K) + |r|): float32 rounding of a K-term dot product of values in [-1, 1) grows
///      about like sqrt(K), and a wrong or unwritten element is off by O(sqrt(K)) or NaN; a wrong
///      or failing choice gets its "done" line (status "wrong" or "error") at once,
///   3. warms a correct one up as Inductor's do_bench does: an estimate from 5 calls, then about
///      `warmup_ms` of calls.
/// Then it times the correct choices in interleaved rounds (kTimingRounds of them, each about
/// rep_ms / kTimingRounds of calls of each choice, in an order rotated every round, after a
/// {"timing": index} line), every call timed alone with the prepared weight evicted from the caches
/// before it (clflush, not timed: in a network the weights come from L3 or memory), and appends
/// {"done": index, "status": "ok", "ms": median, "reps", "max_error"} for each. After a crash the
/// parent blames the choice of the last "start" or "timing" line. Tested through select_gemm in
/// tests/unit/autotune/select_test.cpp.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autotune/conv_template.h"

namespace kiln::autotune {

/// The rounds in which the helper times the correct choices (benchmark_helper.cpp says why).
inline constexpr int kTimingRounds = 5;

/// One choice to time: its compiled library and entry symbol, and its prepared weight (raw
/// float32, the result of GemmChoice::prepare).
struct HelperChoice {
  /// The parent's index for the choice (echoed in the progress file).
  int64_t index = 0;
  std::string name;
  std::filesystem::path library;
  std::string symbol;
  std::filesystem::path weight;
};

/// What the helper reads from REQUEST.json.
struct HelperRequest {
  /// "gemm": the choices are GEMM kernels of m, n, k (void(int64_t M, const float* A, const
  /// float* B, float* C)); "conv": convolution kernels of `conv` (void(const float* X, const
  /// float* W, float* Y)), the tolerance's K being C * KH * KW.
  std::string op = "gemm";
  ConvProblem conv;
  int64_t m = 0, n = 0, k = 0;
  int threads = 1;
  /// A is bench_matrix(M, K, seed); the parent prepares the weights from bench_matrix(K, N,
  /// seed + 1).
  uint32_t seed = 0;
  double warmup_ms = 25;
  double rep_ms = 100;
  int min_reps = 3;
  /// The reference output (raw float32, M x N): read when it exists, else written by the first
  /// choice that runs.
  std::filesystem::path reference;
  /// Where progress lines are appended (JSON, one object a line).
  std::filesystem::path progress;
  std::vector<HelperChoice> choices;
};

nlohmann::json helper_request_to_json(const HelperRequest& request);
HelperRequest helper_request_from_json(const nlohmann::json& json);

/// Seeded uniform [-1, 1) values, row-major rows x cols: the benchmark inputs.
std::vector<float> bench_matrix(int64_t rows, int64_t cols, uint32_t seed);

/// Runs the request in `request_path`; returns the exit status (0 when every choice was
/// processed, whatever its result). Throws UserError when the request cannot be read.
int run_benchmark_helper(const std::filesystem::path& request_path);

}  // namespace kiln::autotune
