#include "autotune/cuda_choice.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support/error.h"
#include "support/log.h"

namespace kiln::autotune {
namespace {

using nlohmann::json;

/// "algo" for cuBLASLt's algorithms, "engine" for cuDNN's engines, "config" for the launch
/// configurations of Kiln's own kernels ("kiln") and for Kiln's GEMM template's choices
/// ("kiln_gemm"): the choice names' prefix.
std::string choice_prefix(const std::string& library) {
  if (library == "kiln" || library == "kiln_gemm") return "config";
  return library == "cudnn" ? "engine" : "algo";
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

/// `text` as a whole non-negative integer, or nothing.
std::optional<int64_t> parse_count(const std::string& text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  return value;
}

}  // namespace

json cuda_library_cache_key(const std::string& library, const std::string& problem,
                            const std::string& gpu, int arch, int64_t version) {
  return json{{"op", library}, {"problem", problem},         {"gpu", gpu},
              {"cc", arch},    {"library_version", version}, {"kiln", KILN_VERSION}};
}

size_t store_cuda_tune_report(const std::filesystem::path& report, const AutotuneCache& cache) {
  std::ifstream in(report);
  if (!in) return 0;  // nothing was tuned
  size_t stored = 0, number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.empty()) continue;
    // library, problem, GPU name, compute capability, version, chosen index, medians.
    const std::vector<std::string> f = split(line, '\t');
    const std::optional<int64_t> arch = f.size() == 7 ? parse_count(f[3]) : std::nullopt;
    const std::optional<int64_t> version = f.size() == 7 ? parse_count(f[4]) : std::nullopt;
    if (f.size() != 7 ||
        (f[0] != "cublaslt" && f[0] != "cudnn" && f[0] != "kiln" && f[0] != "kiln_gemm") ||
        f[1].empty() || !arch || !version) {
      user_error(
          "{}:{}: not a CUDA tuning report line (library, problem, GPU, compute "
          "capability, library version, chosen index, times, tab-separated): '{}'",
          report.string(), number, line);
    }
    CachedResults results;
    const std::vector<std::string> times = split(f[6], ',');
    for (size_t k = 0; k < times.size(); ++k) {
      CachedResult r;
      r.hash_key = f[0] + " " + f[4];
      char* end = nullptr;
      const double ms = std::strtod(times[k].c_str(), &end);
      if (times[k].empty() || end == nullptr || *end != '\0') {
        user_error("{}:{}: candidate {}'s time '{}' is not a number", report.string(), number, k,
                   times[k]);
      }
      if (ms < 0) {
        r.error = "failed to run";
      } else {
        r.ms = ms;
      }
      results[choice_prefix(f[0]) + " " + std::to_string(k)] = r;
    }
    cache.store(cuda_library_cache_key(f[0], f[1], f[2], static_cast<int>(*arch), *version),
                results);
    ++stored;
  }
  return stored;
}

std::optional<CudaLibraryChoice> lookup_cuda_library_choice(const AutotuneCache& cache,
                                                            const std::string& library,
                                                            const std::string& problem,
                                                            const std::string& gpu) {
  const json entries = cache.entries();
  std::optional<CudaLibraryChoice> best;
  std::string gpus_seen;
  const std::string prefix = choice_prefix(library) + " ";
  for (const auto& [id, entry] : entries.items()) {
    if (!entry.is_object() || !entry.contains("key") || !entry.contains("choices")) continue;
    const json& key = entry.at("key");
    if (!key.is_object() || key.value("op", "") != library || key.value("problem", "") != problem ||
        key.value("kiln", "") != KILN_VERSION) {
      continue;
    }
    const std::string entry_gpu = key.value("gpu", "");
    if (!gpu.empty() && entry_gpu != gpu) continue;
    if (gpus_seen.find("'" + entry_gpu + "'") == std::string::npos)
      gpus_seen += (gpus_seen.empty() ? "" : ", ") + ("'" + entry_gpu + "'");
    // The fastest valid choice of this entry.
    std::optional<CudaLibraryChoice> fastest;
    std::string bad;
    const json& choices = entry.at("choices");
    if (!choices.is_object()) bad = "its choices are not an object";
    for (const auto& [name, result] : choices.items()) {
      const std::optional<int64_t> index =
          name.rfind(prefix, 0) == 0 ? parse_count(name.substr(prefix.size())) : std::nullopt;
      if (!index || *index > 1024 || !result.is_object()) {
        bad = "choice '" + name + "' is not '" + prefix + "<index>'";
        break;
      }
      if (!result.contains("ms")) continue;  // dropped when it was timed
      if (!result.at("ms").is_number() || result.at("ms").get<double>() < 0) {
        bad = "choice '" + name + "' has no valid time";
        break;
      }
      const double ms = result.at("ms").get<double>();
      if (!fastest || ms < fastest->ms || (ms == fastest->ms && *index < fastest->index)) {
        fastest = CudaLibraryChoice{static_cast<int>(*index), key.value("library_version", 0LL),
                                    entry_gpu, key.value("cc", 0), ms};
      }
    }
    if (!bad.empty()) {
      std::fprintf(stderr,
                   "kiln: warning: autotune cache %s: the %s entry for '%s' is ignored (%s); the "
                   "library's heuristic choice is used\n",
                   cache.path().string().c_str(), library.c_str(), problem.c_str(), bad.c_str());
      continue;
    }
    if (!fastest) continue;
    // Deterministic among several entries: the newest library version, then the GPU's name.
    if (!best || fastest->version > best->version ||
        (fastest->version == best->version && fastest->gpu < best->gpu)) {
      best = fastest;
    }
  }
  if (best && gpu.empty() && gpus_seen.find("', '") != std::string::npos) {
    log::write(log::Category::kAutotune,
               "{} '{}': the cache holds choices for several GPUs ({}); none is used (set "
               "KILN_AUTOTUNE_GPU to one)",
               library, problem, gpus_seen);
    return std::nullopt;
  }
  return best;
}

bool cache_has_library(const AutotuneCache& cache, const std::string& library) {
  const json entries = cache.entries();
  for (const auto& [id, entry] : entries.items()) {
    if (entry.is_object() && entry.contains("key") && entry.at("key").is_object() &&
        entry.at("key").value("op", "") == library &&
        entry.at("key").value("kiln", "") == KILN_VERSION) {
      return true;
    }
  }
  return false;
}

std::string cuda_autotune_gpu() {
  const char* env = std::getenv("KILN_AUTOTUNE_GPU");
  if (env != nullptr && *env != '\0') return env;
  // Device 0's name through the driver (loaded at run time: no GPU, no name).
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return "";
  using Init = int (*)(unsigned);
  using Get = int (*)(int*, int);
  using Name = int (*)(char*, int, int);
  auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  auto get = reinterpret_cast<Get>(dlsym(lib, "cuDeviceGet"));
  auto name = reinterpret_cast<Name>(dlsym(lib, "cuDeviceGetName"));
  char text[128] = {};
  int device = 0;
  if (init == nullptr || get == nullptr || name == nullptr || init(0) != 0 ||
      get(&device, 0) != 0 || name(text, static_cast<int>(sizeof text) - 1, device) != 0) {
    return "";
  }
  return text;
}

}  // namespace kiln::autotune
