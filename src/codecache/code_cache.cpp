#include "codecache/code_cache.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "support/error.h"
#include "support/files.h"
#include "support/hash.h"
#include "support/identifier.h"
#include "support/log.h"

namespace kiln::codecache {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kManifestMagic = "kiln-codecache-manifest 1";
constexpr std::size_t kMaxErrorLines = 20;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Length-prefixed, so that no two different field lists hash the same bytes.
void hash_field(Sha256& hasher, std::string_view field) {
  hasher.update(std::to_string(field.size())).update(":").update(field).update(";");
}

void hash_list(Sha256& hasher, std::string_view label, const std::vector<std::string>& items) {
  hash_field(hasher, label);
  hash_field(hasher, std::to_string(items.size()));
  for (const std::string& item : items) hash_field(hasher, item);
}

std::vector<std::string> absolute_paths(const std::vector<fs::path>& paths) {
  std::vector<std::string> out;
  for (const fs::path& path : paths) out.push_back(fs::absolute(path).lexically_normal().string());
  return out;
}

bool has_native_flag(const std::vector<std::string>& flags) {
  return std::any_of(flags.begin(), flags.end(), [](const std::string& flag) {
    return flag.find("=native") != std::string::npos;
  });
}

std::string unit_file_name(const std::string& name) {
  static const std::set<std::string> kCppExtensions = {".cpp", ".cc", ".cxx", ".c++"};
  std::string safe = file_name(name);
  if (kCppExtensions.count(fs::path(safe).extension().string()) == 0) safe += ".cpp";
  return safe;
}

// What a compile's output depends on besides its sources and libraries, after `tag`: the key of
// a library (compute_key) and of a precompiled prefix (CodeCache::precompiled_prefix) start so.
void hash_compile_setup(Sha256& hasher, std::string_view tag, const CompilerConfig& config,
                        const CompilerIdentity& compiler) {
  hash_field(hasher, tag);
  hash_field(hasher, KILN_VERSION);
  hash_field(hasher, compiler.key_text());
  hash_field(hasher, has_native_flag(config.flags) ? host_cpu_identity() : "");
  hash_list(hasher, "flags", config.flags);
  hash_list(hasher, "include_dirs", absolute_paths(config.include_dirs));
}

std::string compute_key(const std::vector<SourceUnit>& sources, const CompilerConfig& config,
                        const CompilerIdentity& compiler) {
  Sha256 hasher;
  hash_compile_setup(hasher, "kiln-codecache-key 1", config, compiler);
  hash_list(hasher, "library_dirs", absolute_paths(config.library_dirs));
  hash_list(hasher, "libraries", config.libraries);
  hash_field(hasher, config.extra_key);
  hash_field(hasher, std::to_string(config.shared_sources.size()));
  for (const fs::path& shared : config.shared_sources) hash_field(hasher, files::read(shared));
  hash_field(hasher, std::to_string(sources.size()));
  for (const SourceUnit& unit : sources) {
    hash_field(hasher, unit_file_name(unit.name));
    hash_field(hasher, unit.text);
  }
  return hasher.hex_digest();
}

std::string unique_suffix() {
  std::random_device random;
  return fmt::format("{}.{:x}", ::getpid(), random());
}

// Removes a directory tree; renaming it aside first makes the removal look atomic to readers.
void discard(const fs::path& dir) {
  std::error_code ec;
  fs::path trash = dir;
  trash += ".trash." + unique_suffix();
  fs::rename(dir, trash, ec);
  fs::remove_all(ec ? dir : trash, ec);
}

// Removes the build directory unless release() was called: no partial entry outlives a failure.
class TempDir {
 public:
  explicit TempDir(fs::path path) : path_(std::move(path)) {}
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  fs::path path_;
};

enum class EntryState { kValid, kAbsent, kCorrupt };

struct Manifest {
  std::string library;
  std::uintmax_t size = 0;
  std::string sha256;
};

std::string format_manifest(const Manifest& manifest) {
  return fmt::format("{}\nlibrary {}\nsize {}\nsha256 {}\n", kManifestMagic, manifest.library,
                     manifest.size, manifest.sha256);
}

bool parse_manifest(const std::string& text, Manifest& manifest) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kManifestMagic) return false;
  std::string word;
  bool ok = static_cast<bool>(in >> word) && word == "library" && (in >> manifest.library);
  ok = ok && (in >> word) && word == "size" && (in >> manifest.size);
  ok = ok && (in >> word) && word == "sha256" && (in >> manifest.sha256);
  return ok && manifest.sha256.size() == 64;
}

// First lines of the compiler's diagnostics, for an error message.
std::string first_lines(const std::string& text, std::size_t max_lines) {
  std::string out;
  std::size_t lines = 0;
  std::size_t pos = 0;
  while (pos < text.size() && lines < max_lines) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    out.append(text, pos, end - pos).append("\n");
    ++lines;
    pos = end + 1;
  }
  if (pos < text.size()) {
    auto rest = std::count(text.begin() + static_cast<std::ptrdiff_t>(pos), text.end(), '\n');
    out += fmt::format("... ({} more lines)\n", std::max<std::ptrdiff_t>(rest, 1));
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

std::vector<std::string> compile_options(const CompilerConfig& config) {
  std::vector<std::string> args = config.flags;
  for (const std::string& dir : absolute_paths(config.include_dirs)) args.push_back("-I" + dir);
  return args;
}

void append_link_options(const CompilerConfig& config, const std::string& linker,
                         std::vector<std::string>& args) {
  if (!linker.empty()) args.push_back(linker);
  for (const std::string& dir : absolute_paths(config.library_dirs)) args.push_back("-L" + dir);
  for (const std::string& library : config.libraries) {
    args.push_back(library.find('/') != std::string::npos ? library : "-l" + library);
  }
}

// The #include lines of a unit's leading run of them (blank and // comment lines may come between,
// and `#pragma GCC target` lines, which the autotuner's templates put first so that the
// intrinsics headers see the target), one per line; empty when the unit does not start that way.
// Only the directives: the comments (a template's name and sizes) would give every unit its own
// header. Including these lines first changes nothing: the unit's own copies of them then find
// each header already included (include guards, #pragma once), as a second #include of it always
// does, and set the same target again.
std::string leading_includes(const std::string& text) {
  std::string directives;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) break;  // a last line without a newline ends the prefix
    std::string_view line(text.data() + pos, end - pos);
    std::size_t first = line.find_first_not_of(" \t\r");
    if (first != std::string_view::npos) {
      line.remove_prefix(first);
      if (line.substr(0, 8) == "#include" || line.substr(0, 18) == "#pragma GCC target") {
        directives.append(line).append("\n");
      } else if (line.substr(0, 2) != "//") {
        break;
      }
    }
    pos = end + 1;
  }
  return directives;
}

// GCC's precompiled headers (.gch found beside an -include'd header); clang's are another format.
bool is_gcc(const CompilerIdentity& compiler) {
  return compiler.version.find("Free Software Foundation") != std::string::npos &&
         compiler.version.find("clang") == std::string::npos;
}

}  // namespace

// Files this object already resolved, by key: prefix headers (the header's path, or empty when
// it failed to precompile, not tried again by this object) and shared objects.
struct CodeCache::KnownFiles {
  std::mutex mutex;
  std::map<std::string, fs::path> known;
};

struct CodeCache::Slots {
  explicit Slots(std::size_t count) : free(count) {}
  void acquire() {
    std::unique_lock<std::mutex> lock(mutex);
    ready.wait(lock, [&] { return free > 0; });
    --free;
  }
  void release() {
    {
      std::lock_guard<std::mutex> guard(mutex);
      ++free;
    }
    ready.notify_one();
  }
  std::mutex mutex;
  std::condition_variable ready;
  std::size_t free;
};

struct CodeCache::Entry {
  std::string key;
  fs::path dir;
  fs::path lock;
  fs::path library;
  fs::path manifest;
  fs::path failed;
};

namespace {

// kValid when the entry is complete and its library matches the manifest; otherwise `reason`
// says what is wrong.
EntryState check_entry(const fs::path& dir, const fs::path& library, const fs::path& manifest_path,
                       std::string& reason) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return EntryState::kAbsent;
  Manifest manifest;
  std::string text;
  try {
    text = files::read(manifest_path);
  } catch (const UserError&) {
    reason = "manifest missing";
    return EntryState::kCorrupt;
  }
  if (!parse_manifest(text, manifest)) {
    reason = "manifest unreadable";
    return EntryState::kCorrupt;
  }
  if (manifest.library != library.filename().string()) {
    reason = fmt::format("manifest names library '{}'", manifest.library);
    return EntryState::kCorrupt;
  }
  std::uintmax_t size = fs::file_size(library, ec);
  if (ec) {
    reason = fmt::format("library missing: {}", ec.message());
    return EntryState::kCorrupt;
  }
  if (size != manifest.size) {
    reason = fmt::format("library is {} bytes, manifest says {}", size, manifest.size);
    return EntryState::kCorrupt;
  }
  try {
    if (sha256_file_hex(library) != manifest.sha256) {
      reason = "library SHA-256 differs from the manifest";
      return EntryState::kCorrupt;
    }
  } catch (const UserError& error) {
    reason = error.what();
    return EntryState::kCorrupt;
  }
  return EntryState::kValid;
}

// Called with the key's lock held, so any build directory of this key is left over from a
// process that died while building.
void remove_stale_builds(const fs::path& shard, const std::string& key) {
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(shard, ec)) {
    if (item.path().filename().string().rfind(key + ".tmp.", 0) == 0) discard(item.path());
  }
}

// Writes the manifest last, then renames the finished build directory to the entry's name.
void install(TempDir& build_dir, const std::string& library, const fs::path& entry_dir) {
  fs::path built = build_dir.path() / library;
  std::error_code ec;
  std::uintmax_t size = fs::file_size(built, ec);
  if (ec) user_error("the compiler reported success but wrote no {}", built.string());
  Manifest manifest{library, size, sha256_file_hex(built)};
  files::write_atomic(build_dir.path() / "manifest", format_manifest(manifest));
  fs::rename(build_dir.path(), entry_dir, ec);
  if (ec) user_error("cannot move {} into the cache: {}", entry_dir.string(), ec.message());
  build_dir.release();
}

// Keeps the failed build's directory as <key>.failed (replacing an older one) with the compiler's
// output beside the sources, and throws the UserError that points there.
[[noreturn]] void fail_build(TempDir& build_dir, const fs::path& failed_dir,
                             const std::string& source_name, const process::Command& command,
                             const process::Result& result) {
  const std::string& output = result.stderr_text.empty() ? result.stdout_text : result.stderr_text;
  std::error_code ec;
  files::write_atomic(build_dir.path() / "compiler-output.txt",
                      fmt::format("$ cd {} && {}\n{}\n{}", build_dir.path().string(),
                                  command.to_string(), result.status_text(), output));
  fs::remove_all(failed_dir, ec);
  fs::rename(build_dir.path(), failed_dir, ec);
  // When it cannot be moved, it stays where it is rather than lose the source.
  fs::path kept = ec ? build_dir.path() : failed_dir;
  build_dir.release();
  fs::path source = source_name.empty() ? kept : kept / source_name;
  std::string what =
      source_name.empty()
          ? fmt::format("linking generated code failed: {}", command.program)
          : fmt::format("compiling generated code failed: {} on {}", command.program, source_name);
  user_error("{} ({})\nsource kept at {}\nfull compiler output in {}\n{}", what,
             result.status_text(), source.string(), (kept / "compiler-output.txt").string(),
             first_lines(output, kMaxErrorLines));
}

}  // namespace

fs::path default_cache_dir() {
  const char* env = std::getenv("KILN_CACHE_DIR");
  if (env != nullptr && *env != '\0') return fs::absolute(env).lexically_normal();
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return fs::path(home) / ".cache" / "kiln";
  return fmt::format("/tmp/kiln-cache-{}", ::getuid());
}

std::size_t default_compile_threads() {
  const char* env = std::getenv("KILN_COMPILE_THREADS");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    long value = std::strtol(env, &end, 10);
    if (*end != '\0' || value <= 0) {
      user_error("KILN_COMPILE_THREADS must be a positive integer, found '{}'", env);
    }
    return static_cast<std::size_t>(value);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

fs::path default_pch_dir() {
  const char* env = std::getenv("KILN_PCH_DIR");
  if (env == nullptr || *env == '\0') return {};
  return fs::absolute(env).lexically_normal();
}

CodeCache::CodeCache(fs::path dir, std::size_t max_jobs, fs::path pch_dir)
    : dir_(fs::absolute(dir).lexically_normal()),
      max_jobs_(std::max<std::size_t>(1, max_jobs)),
      slots_(std::make_unique<Slots>(max_jobs_)),
      pch_dir_(pch_dir.empty() ? fs::path() : fs::absolute(pch_dir).lexically_normal()),
      prefixes_(std::make_unique<KnownFiles>()),
      objects_(std::make_unique<KnownFiles>()) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) user_error("cannot create code cache directory {}: {}", dir_.string(), ec.message());
}

CodeCache::~CodeCache() = default;

std::string CodeCache::key(const std::vector<SourceUnit>& sources,
                           const CompilerConfig& config) const {
  return compute_key(sources, config, compiler_identity(config.compiler));
}

fs::path CodeCache::entry_dir(const std::string& key) const { return entry_for(key).dir; }

CodeCache::Entry CodeCache::entry_for(const std::string& key) const {
  Entry entry;
  entry.key = key;
  fs::path shard = dir_ / key.substr(0, 2);
  entry.dir = shard / key;
  entry.lock = shard / (key + ".lock");
  entry.failed = shard / (key + ".failed");
  entry.library = entry.dir / fmt::format("kernel-{}.so", key.substr(0, 16));
  entry.manifest = entry.dir / "manifest";
  return entry;
}

fs::path CodeCache::compile_shared_library(const std::string& source,
                                           const CompilerConfig& config) {
  return compile_shared_library(std::vector<SourceUnit>{{"kernel.cpp", source}}, config);
}

fs::path CodeCache::compile_shared_library(const std::vector<SourceUnit>& sources,
                                           const CompilerConfig& config) {
  KILN_CHECK(!sources.empty(), "compile_shared_library needs at least one source");
  std::set<std::string> names;
  for (const SourceUnit& unit : sources) {
    KILN_CHECK(names.insert(unit_file_name(unit.name)).second,
               "two translation units named '{}' in one library", unit.name);
  }
  const CompilerIdentity& compiler = compiler_identity(config.compiler);
  Entry entry = entry_for(compute_key(sources, config, compiler));

  std::string reason;
  if (check_entry(entry.dir, entry.library, entry.manifest, reason) == EntryState::kValid) {
    ++hits_;
    log::write(log::Category::kCompile, "cache hit {}", entry.library.string());
    return entry.library;
  }
  // Checked again under the lock: the entry may have been finished by the process we waited on.
  files::FileLock lock(entry.lock);
  EntryState state = check_entry(entry.dir, entry.library, entry.manifest, reason);
  if (state == EntryState::kValid) {
    ++hits_;
    log::write(log::Category::kCompile, "cache hit {} (built by another process or thread)",
               entry.library.string());
    return entry.library;
  }
  if (state == EntryState::kCorrupt) {
    log::write(log::Category::kCompile, "corrupt cache entry {}: {}; rebuilding",
               entry.dir.string(), reason);
    discard(entry.dir);
    ++rebuilds_;
  }
  build(sources, config, compiler, entry);
  ++compiles_;
  return entry.library;
}

void CodeCache::build(const std::vector<SourceUnit>& sources, const CompilerConfig& config,
                      const CompilerIdentity& compiler, const Entry& entry) {
  auto start = Clock::now();
  fs::path shard = entry.dir.parent_path();
  remove_stale_builds(shard, entry.key);
  TempDir build_dir(shard / (entry.key + ".tmp." + unique_suffix()));
  std::error_code ec;
  fs::create_directories(build_dir.path(), ec);
  if (ec) user_error("cannot create {}: {}", build_dir.path().string(), ec.message());

  std::vector<std::string> names;
  for (const SourceUnit& unit : sources) {
    names.push_back(unit_file_name(unit.name));
    files::write_atomic(build_dir.path() / names.back(), unit.text);
  }
  // The compiler runs inside the build directory on relative names, so its diagnostics name
  // "kernel.cpp" rather than a temporary path that is gone by the time anyone reads them.
  std::string library = entry.library.filename().string();
  auto command = [&](std::vector<std::string> args) {
    return process::Command{compiler.path.string(), std::move(args), build_dir.path(), {}};
  };
  // Compiles unit i with its precompiled prefix (KILN_PCH_DIR) when there is one; a failure is
  // compiled again without it, so that a failed build reports the plain command and diagnostics.
  auto run_with_prefix = [&](std::size_t i, const process::Command& plain) {
    fs::path prefix = precompiled_prefix(sources[i].text, config, compiler);
    if (!prefix.empty()) {
      process::Command with = plain;
      with.args.insert(with.args.begin(), {"-include", prefix.string()});
      process::Result result = run_compiler(with, compiler_runs_);
      if (result.ok()) return result;
      log::write(log::Category::kCompile, "{} failed with the precompiled prefix {}; again without",
                 sources[i].name, prefix.string());
    }
    return run_compiler(plain, compiler_runs_);
  };
  // Whether a failed build is the linker's fault: an empty unit, linked with the same flags,
  // directories and libraries, fails with `linker` and links without it. So an error in the
  // generated code or a missing library is reported as it is, without building again.
  const std::string linker = linker_option(compiler);
  auto linker_at_fault = [&] {
    auto links = [&](const std::string& option) {
      std::vector<std::string> args = config.flags;
      args.insert(args.end(),
                  {"-shared", "-x", "c++", "/dev/null", "-x", "none", "-o", "linker-probe.so"});
      append_link_options(config, option, args);
      return process::run(command(std::move(args))).ok();
    };
    return !links(linker) && links("");
  };
  // Runs a command that links the library (`run` being one of the two above). When it fails
  // through the linker Kiln chose, the command runs again with the compiler's default linker,
  // and `command` becomes the one whose result is returned, for the failure's report.
  auto link = [&](process::Command& command, const auto& run) {
    process::Result result = run(command);
    if (result.ok() || linker.empty() || !linker_at_fault() || !give_up_linker(compiler, linker)) {
      return result;
    }
    log::write(log::Category::kCompile,
               "{} failed with {}; again with the compiler's default linker", library, linker);
    command.args.erase(std::find(command.args.begin(), command.args.end(), linker));
    return run(command);
  };
  // The shared sources' objects (built once, then found in the cache). With several units they
  // are resolved after the units compile, so that a compiler refusing everything reports the
  // generated code, whose source is kept.
  std::vector<std::string> objects;
  auto resolve_objects = [&] {
    for (const fs::path& shared : config.shared_sources) {
      objects.push_back(shared_object(shared, config, compiler).string());
    }
  };
  if (sources.size() == 1) {
    resolve_objects();
    std::vector<std::string> args = compile_options(config);
    args.insert(args.end(), {names[0], "-o", library});
    args.insert(args.end(), objects.begin(), objects.end());
    append_link_options(config, linker, args);
    process::Command one = command(std::move(args));
    process::Result result =
        link(one, [&](const process::Command& c) { return run_with_prefix(0, c); });
    if (!result.ok()) fail_build(build_dir, entry.failed, names[0], one, result);
  } else {
    std::vector<process::Command> compiles;
    for (const std::string& name : names) {
      std::vector<std::string> args = compile_options(config);
      args.insert(args.end(), {"-c", name, "-o", name + ".o"});
      compiles.push_back(command(std::move(args)));
    }
    std::vector<process::Result> results(compiles.size());
    process::parallel_for(compiles.size(), max_jobs_,
                          [&](std::size_t i) { results[i] = run_with_prefix(i, compiles[i]); });
    for (std::size_t i = 0; i < results.size(); ++i) {
      if (!results[i].ok()) fail_build(build_dir, entry.failed, names[i], compiles[i], results[i]);
    }
    resolve_objects();
    std::vector<std::string> args = config.flags;
    for (const std::string& name : names) args.push_back(name + ".o");
    args.insert(args.end(), objects.begin(), objects.end());
    args.insert(args.end(), {"-o", library});
    append_link_options(config, linker, args);
    process::Command objects_to_library = command(std::move(args));
    process::Result result = link(objects_to_library, [&](const process::Command& c) {
      return run_compiler(c, compiler_runs_);
    });
    if (!result.ok()) fail_build(build_dir, entry.failed, "", objects_to_library, result);
  }

  install(build_dir, library, entry.dir);
  fs::remove_all(entry.failed, ec);  // an earlier failure of this key no longer applies
  log::write(log::Category::kCompile, "compiled {} source(s) in {:.2f} s -> {}", sources.size(),
             seconds_since(start), entry.library.string());
}

process::Result CodeCache::run_compiler(const process::Command& command,
                                        std::atomic<std::size_t>& counter) {
  slots_->acquire();
  process::Result result;
  try {
    result = process::run(command);
  } catch (...) {
    slots_->release();
    throw;
  }
  slots_->release();
  ++counter;
  log::write(log::Category::kCompile, "{} ({:.2f} s, {})", command.to_string(), result.seconds,
             result.status_text());
  return result;
}

fs::path CodeCache::precompiled_prefix(const std::string& text, const CompilerConfig& config,
                                       const CompilerIdentity& compiler) {
  if (pch_dir_.empty() || !is_gcc(compiler)) return {};
  std::string prefix = leading_includes(text);
  if (prefix.empty()) return {};
  Sha256 hasher;
  hash_compile_setup(hasher, "kiln-pch-key 1", config, compiler);
  hash_field(hasher, config.extra_key);
  hash_field(hasher, prefix);
  const std::string key = hasher.hex_digest();

  // One thread of this object resolves a key at a time; the file lock does the same between
  // objects and processes sharing pch_dir_.
  std::lock_guard<std::mutex> guard(prefixes_->mutex);
  auto known = prefixes_->known.find(key);
  if (known != prefixes_->known.end()) return known->second;
  const fs::path dir = pch_dir_ / key;
  const fs::path header = dir / "prefix.h";
  fs::path& result = prefixes_->known[key];
  std::error_code ec;
  fs::create_directories(pch_dir_, ec);
  if (ec) {
    log::write(log::Category::kCompile, "no precompiled headers: cannot create {}: {}",
               pch_dir_.string(), ec.message());
    return result;
  }
  files::FileLock lock(pch_dir_ / (key + ".lock"));
  fs::path gch = header;
  gch += ".gch";
  if (fs::exists(gch, ec)) return result = header;  // renamed into place whole, so complete

  auto start = Clock::now();
  TempDir build_dir(pch_dir_ / (key + ".tmp." + unique_suffix()));
  fs::create_directories(build_dir.path(), ec);
  if (ec) return result;
  files::write_atomic(build_dir.path() / "prefix.h", prefix);
  std::vector<std::string> args = compile_options(config);
  args.insert(args.end(), {"-x", "c++-header", "prefix.h", "-o", "prefix.h.gch"});
  process::Command command{compiler.path.string(), std::move(args), build_dir.path(), {}};
  process::Result built = run_compiler(command, pch_builds_);
  if (!built.ok()) {
    log::write(log::Category::kCompile, "no precompiled header {}: {}", header.string(),
               first_lines(built.stderr_text, kMaxErrorLines));
    return result;
  }
  fs::rename(build_dir.path(), dir, ec);
  if (ec) return result;
  build_dir.release();
  log::write(log::Category::kCompile, "precompiled {} in {:.2f} s", header.string(),
             seconds_since(start));
  return result = header;
}

fs::path CodeCache::shared_object(const fs::path& source, const CompilerConfig& config,
                                  const CompilerIdentity& compiler) {
  const std::string text = files::read(source);
  Sha256 hasher;
  hash_compile_setup(hasher, "kiln-shared-object 1", config, compiler);
  hash_field(hasher, config.extra_key);
  hash_field(hasher, unit_file_name(source.filename().string()));
  hash_field(hasher, text);
  const std::string key = hasher.hex_digest();

  // As precompiled_prefix: one thread of this object resolves a key at a time, the file lock
  // orders objects and processes sharing the cache.
  std::lock_guard<std::mutex> guard(objects_->mutex);
  auto known = objects_->known.find(key);
  if (known != objects_->known.end()) return known->second;
  const fs::path objects_dir = dir_ / "objects";
  const std::string name = unit_file_name(source.filename().string());
  const fs::path object = objects_dir / key / (name + ".o");
  std::error_code ec;
  fs::create_directories(objects_dir, ec);
  if (ec) user_error("cannot create {}: {}", objects_dir.string(), ec.message());
  files::FileLock lock(objects_dir / (key + ".lock"));
  if (!fs::exists(object, ec)) {  // renamed into place whole, so complete when there
    TempDir build_dir(objects_dir / (key + ".tmp." + unique_suffix()));
    fs::create_directories(build_dir.path(), ec);
    if (ec) user_error("cannot create {}: {}", build_dir.path().string(), ec.message());
    files::write_atomic(build_dir.path() / name, text);
    std::vector<std::string> args = compile_options(config);
    args.insert(args.end(), {"-c", name, "-o", name + ".o"});
    process::Command command{compiler.path.string(), std::move(args), build_dir.path(), {}};
    process::Result built = run_compiler(command, compiler_runs_);
    if (!built.ok()) {
      user_error("compiling {} failed ({}):\n{}\ncommand: {}", source.string(), built.status_text(),
                 first_lines(built.stderr_text, kMaxErrorLines), command.to_string());
    }
    fs::rename(build_dir.path(), object.parent_path(), ec);
    if (ec && !fs::exists(object)) {
      user_error("cannot store {} in {}: {}", name, objects_dir.string(), ec.message());
    }
    if (!ec) build_dir.release();
  }
  return objects_->known[key] = object;
}

std::vector<fs::path> CodeCache::compile_many(const std::vector<LibrarySpec>& libraries) {
  std::vector<fs::path> paths(libraries.size());
  process::parallel_for(libraries.size(), max_jobs_, [&](std::size_t i) {
    paths[i] = compile_shared_library(libraries[i].sources, libraries[i].config);
  });
  return paths;
}

CacheStats CodeCache::stats() const {
  return CacheStats{hits_.load(), compiles_.load(), rebuilds_.load(), compiler_runs_.load(),
                    pch_builds_.load()};
}

}  // namespace kiln::codecache
