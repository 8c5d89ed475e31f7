#pragma once
/// The persistent autotune cache: the benchmark results of earlier selections, in one JSON file
/// shared by every process of a user (Inductor's PersistentCache). An entry is keyed by the op,
/// its shapes, strides and dtype, the host (CPU model and SIMD flags from /proc/cpuinfo), the
/// thread count, how choices were timed (`timing`) and the Kiln version, and holds one result per choice name: its median time or
/// why it was dropped, with the choice's hash key (a result is valid only for the same code).
///
/// File layout (`version` 1):
///
///   {"version": 1,
///    "entries": {"<sha256 of the key>": {"key": {...},
///                                        "choices": {"openblas": {"hash": "...", "ms": 0.21},
///                                                    "template ...": {"hash": "...",
///                                                                     "error": "crashed ..."}}}}}
///
/// Readers take the file as it is (writes are atomic: a temporary file, then a rename); writers
/// merge their results into what is on disk under an exclusive flock on `<path>.lock`. A file
/// that cannot be parsed is logged (KILN_LOG=autotune) and treated as empty. Tested in
/// tests/unit/autotune/cache_test.cpp.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "autotune/conv_template.h"

namespace kiln::autotune {

/// The cache file: $KILN_AUTOTUNE_CACHE, else <code cache dir>/autotune.json (`code_cache_dir`,
/// or codecache::default_cache_dir() when it is empty).
std::filesystem::path default_autotune_cache_path(const std::filesystem::path& code_cache_dir = {});

/// This host's CPU for cache keys: the model name and the SIMD flags (sse*, avx*, fma, f16c,
/// amx*) of /proc/cpuinfo, read once.
struct HostCpu {
  std::string model;
  std::string isa_flags;
};
const HostCpu& host_cpu();

/// The key of a float32 GEMM C[M, N] = A[M, K] @ B[K, N], contiguous row-major, on `threads`
/// threads on this host with this Kiln version.
nlohmann::json gemm_cache_key(int64_t m, int64_t n, int64_t k, int threads);

/// The key of a float32 NCHW convolution (conv_template.h) on `threads` threads.
nlohmann::json conv_cache_key(const ConvProblem& problem, int threads);

/// The id of an entry: the SHA-256 of the key's canonical text.
std::string cache_key_id(const nlohmann::json& key);

/// One choice's cached result: a time, or the reason it was dropped.
struct CachedResult {
  /// GemmChoice::hash_key of the code that was timed.
  std::string hash_key;
  /// Median time in milliseconds when the choice ran and was correct.
  std::optional<double> ms;
  /// Why the choice was dropped (failed to compile, crashed, wrong result) when it was.
  std::string error;
  bool operator==(const CachedResult&) const = default;
};

/// Results by choice name.
using CachedResults = std::map<std::string, CachedResult>;

/// The autotune cache file at one path.
class AutotuneCache {
 public:
  explicit AutotuneCache(std::filesystem::path path) : path_(std::move(path)) {}

  const std::filesystem::path& path() const { return path_; }

  /// The results stored under `key` (empty when none, or when the file is missing or corrupt).
  CachedResults lookup(const nlohmann::json& key) const;

  /// Merges `results` into the entry of `key` (a result replaces the one of the same choice name)
  /// and writes the file atomically under the lock. Throws UserError when it cannot be written.
  void store(const nlohmann::json& key, const CachedResults& results) const;

  /// Every entry of the file, id -> {"key": ..., "choices": ...} (an empty object when the file
  /// is missing or corrupt): for lookups that match part of a key (cuda_choice.h).
  nlohmann::json entries() const;

 private:
  nlohmann::json read_file() const;

  std::filesystem::path path_;
};

}  // namespace kiln::autotune
