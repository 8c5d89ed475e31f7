#include "autotune/cache.h"

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>

#include "codecache/code_cache.h"
#include "support/error.h"
#include "support/files.h"
#include "support/hash.h"
#include "support/log.h"

namespace kiln::autotune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kFormatVersion = 1;
// How the benchmark helper timed a choice (benchmark_helper.h): with its weights evicted from the
// caches before each call. Results timed otherwise (with the weights in cache, before) rank the
// choices differently, so they are not reused.
constexpr std::string_view kTiming = "weights evicted";

// The flags that decide which kernels run and how fast: vector ISAs and matrix units.
bool is_isa_flag(const std::string& flag) {
  for (const char* prefix : {"sse", "ssse", "avx", "fma", "f16c", "amx"}) {
    if (flag.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

HostCpu read_host_cpu() {
  HostCpu cpu;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string field = line.substr(0, line.find_first_of(" \t"));
    std::string value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.erase(0, 1);
    if (field == "model" && line.rfind("model name", 0) == 0 && cpu.model.empty()) {
      cpu.model = value;
    } else if (field == "flags" && flags.empty()) {
      std::istringstream words(value);
      for (std::string flag; words >> flag;) {
        if (is_isa_flag(flag)) flags.insert(flag);
      }
    }
  }
  for (const std::string& flag : flags) {
    cpu.isa_flags += (cpu.isa_flags.empty() ? "" : " ") + flag;
  }
  if (cpu.model.empty()) cpu.model = "unknown";
  return cpu;
}

json result_to_json(const CachedResult& result) {
  json j{{"hash", result.hash_key}};
  if (result.ms) j["ms"] = *result.ms;
  if (!result.error.empty()) j["error"] = result.error;
  return j;
}

CachedResult result_from_json(const json& j) {
  CachedResult result;
  result.hash_key = j.at("hash").get<std::string>();
  if (j.contains("ms")) result.ms = j.at("ms").get<double>();
  if (j.contains("error")) result.error = j.at("error").get<std::string>();
  return result;
}

}  // namespace

fs::path default_autotune_cache_path(const fs::path& code_cache_dir) {
  const char* env = std::getenv("KILN_AUTOTUNE_CACHE");
  if (env != nullptr && *env != '\0') return fs::path(env);
  return (code_cache_dir.empty() ? codecache::default_cache_dir() : code_cache_dir) /
         "autotune.json";
}

const HostCpu& host_cpu() {
  static const HostCpu cpu = read_host_cpu();
  return cpu;
}

json gemm_cache_key(int64_t m, int64_t n, int64_t k, int threads) {
  // Strides of A, B and C in elements (row-major contiguous today; part of the key so that
  // strided problems later never reuse these results).
  return json{{"op", "gemm"},
              {"m", m},
              {"n", n},
              {"k", k},
              {"strides", {{k, 1}, {n, 1}, {n, 1}}},
              {"dtype", "float32"},
              {"cpu", host_cpu().model},
              {"isa", host_cpu().isa_flags},
              {"threads", threads},
              {"timing", kTiming},
              {"kiln", KILN_VERSION}};
}

json conv_cache_key(const ConvProblem& p, int threads) {
  json key{{"op", "conv2d"},
           {"x", {p.n, p.c, p.h, p.w}},
           {"w", {p.m, p.c / p.group, p.kh, p.kw}},
           {"strides", {p.stride_h, p.stride_w}},
           {"pads", {p.pad_top, p.pad_left, p.pad_bottom, p.pad_right}},
           {"dilations", {p.dilation_h, p.dilation_w}},
           {"layout", "nchw"},
           {"dtype", "float32"},
           {"cpu", host_cpu().model},
           {"isa", host_cpu().isa_flags},
           {"threads", threads},
           {"timing", kTiming},
           {"kiln", KILN_VERSION}};
  // Keys of ungrouped convolutions stay what they were before groups existed.
  if (p.group != 1) key["group"] = p.group;
  return key;
}

std::string cache_key_id(const json& key) { return sha256_hex(key.dump()); }

json AutotuneCache::read_file() const {
  std::error_code ec;
  if (!fs::exists(path_, ec)) return json::object();
  try {
    json j = json::parse(files::read(path_));
    if (!j.is_object() || j.value("version", 0) != kFormatVersion || !j.contains("entries") ||
        !j.at("entries").is_object()) {
      log::write(log::Category::kAutotune, "{}: not a version {} autotune cache; ignored",
                 path_.string(), kFormatVersion);
      return json::object();
    }
    return j;
  } catch (const std::exception& e) {
    log::write(log::Category::kAutotune, "{}: unreadable autotune cache ({}); ignored",
               path_.string(), e.what());
    return json::object();
  }
}

CachedResults AutotuneCache::lookup(const json& key) const {
  const json file = read_file();
  CachedResults results;
  if (!file.contains("entries")) return results;
  const json& entries = file.at("entries");
  const auto entry = entries.find(cache_key_id(key));
  if (entry == entries.end()) return results;
  try {
    for (const auto& [name, value] : entry->at("choices").items()) {
      results[name] = result_from_json(value);
    }
  } catch (const std::exception& e) {
    log::write(log::Category::kAutotune, "{}: bad entry for {} ({}); ignored", path_.string(),
               key.dump(), e.what());
    return {};
  }
  return results;
}

json AutotuneCache::entries() const {
  json file = read_file();
  return file.contains("entries") ? file.at("entries") : json::object();
}

void AutotuneCache::store(const json& key, const CachedResults& results) const {
  std::error_code ec;
  if (path_.has_parent_path()) fs::create_directories(path_.parent_path(), ec);
  fs::path lock_path = path_;
  lock_path += ".lock";
  files::FileLock lock(lock_path);
  json file = read_file();
  if (!file.contains("entries"))
    file = json{{"version", kFormatVersion}, {"entries", json::object()}};
  json& entry = file["entries"][cache_key_id(key)];
  entry["key"] = key;
  if (!entry.contains("choices") || !entry["choices"].is_object()) {
    entry["choices"] = json::object();
  }
  for (const auto& [name, result] : results) entry["choices"][name] = result_to_json(result);
  files::write_atomic(path_, file.dump(2) + "\n");
}

}  // namespace kiln::autotune
