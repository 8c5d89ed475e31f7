#pragma once
/// The code cache: compiles generated C++ into shared libraries with the system compiler, keyed by
/// content, and finds them again. Kiln's counterpart of Inductor's CppCodeCache + AsyncCompile.
///
/// An entry's key is the SHA-256 of the source texts (with their names), the compiler flags,
/// include and library options, CompilerConfig::extra_key, the compiler's identity, the host CPU
/// when a flag asks for -march=native, and KILN_VERSION. Layout under the cache directory:
///
///   <dir>/<key[0:2]>/<key>/         one finished entry: the sources, kernel-<key[0:16]>.so and
///                                   `manifest` (the .so's name, size and SHA-256)
///   <dir>/<key[0:2]>/<key>.lock     lock file held while the entry is checked or built
///   <dir>/<key[0:2]>/<key>.failed/  sources and compiler output of the last failed build
///   <dir>/objects/<key>/            the object of a shared source (CompilerConfig::shared_sources)
///
/// Precompiled headers (opt-in, GCC only): when $KILN_PCH_DIR names a directory, each translation
/// unit's leading run of #include lines (and `#pragma GCC target` lines among them: its "prefix",
/// the runtime and system headers that make up most of a small unit's compile time) is compiled
/// once per compiler, flags, include directories, extra_key and host CPU into
/// <KILN_PCH_DIR>/<key>/prefix.h.gch, and the unit is compiled with
/// `-include <KILN_PCH_DIR>/<key>/prefix.h`: GCC then loads the headers' parsed state instead of
/// parsing them, and the unit's own #include lines find them already included. The object code is
/// the same; GCC ignores a precompiled header that does not fit the flags and parses the header
/// instead. The directory may be shared by caches and processes (`make test` shares one among all
/// its tests); a unit that fails to compile with its prefix is compiled again without it, so that
/// errors and their messages are those of a plain compile.
///
/// Entries are built in a temporary directory and renamed into place, under a per-key lock, so
/// concurrent processes never see a partial entry and never build one twice. An entry whose .so
/// does not match its manifest is logged (KILN_LOG=compile) and rebuilt. Tested in
/// tests/unit/codecache/code_cache_test.cpp.

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "codecache/compiler.h"
#include "codecache/process.h"

namespace kiln::codecache {

/// One translation unit: a file name (such as "kernel.cpp"; it is made file-name safe, and given
/// ".cpp" when it has no C++ extension) and its text.
struct SourceUnit {
  std::string name;
  std::string text;
};

/// One shared library to build: its translation units and how to compile them.
struct LibrarySpec {
  std::vector<SourceUnit> sources;
  CompilerConfig config;
};

/// Counters since the CodeCache was constructed.
struct CacheStats {
  /// Requests answered by an existing entry (including one another process just finished).
  std::size_t hits = 0;
  /// Entries built (each one is one shared library).
  std::size_t compiles = 0;
  /// Of `compiles`, how many replaced a corrupt or partial entry.
  std::size_t rebuilds = 0;
  /// Compiler processes run (compiles and links; precompiled headers are counted apart).
  std::size_t compiler_runs = 0;
  /// Precompiled headers built (KILN_PCH_DIR).
  std::size_t pch_builds = 0;
};

/// The cache directory: $KILN_CACHE_DIR, else $HOME/.cache/kiln, else /tmp/kiln-cache-<uid>.
std::filesystem::path default_cache_dir();

/// Where precompiled headers of the units' leading #include lines are kept: $KILN_PCH_DIR made
/// absolute, or an empty path (no precompiled headers) when it is unset or empty.
std::filesystem::path default_pch_dir();

/// How many compiler processes may run at once: $KILN_COMPILE_THREADS, else the hardware threads.
/// Throws UserError when KILN_COMPILE_THREADS is not a positive integer.
std::size_t default_compile_threads();

/// A code cache rooted at one directory. Thread-safe: one object may be shared by threads, and any
/// number of processes may share the directory.
class CodeCache {
 public:
  /// Uses (and creates) `dir`; at most `max_jobs` compiler processes run at once through this
  /// object. Throws UserError when `dir` cannot be created.
  /// `pch_dir`: see default_pch_dir(); empty for none.
  explicit CodeCache(std::filesystem::path dir = default_cache_dir(),
                     std::size_t max_jobs = default_compile_threads(),
                     std::filesystem::path pch_dir = default_pch_dir());
  ~CodeCache();
  CodeCache(const CodeCache&) = delete;
  CodeCache& operator=(const CodeCache&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

  /// The cache key (64 hex characters) of building `sources` with `config`. Identifies the
  /// compiler first, so it throws like compile_shared_library when the compiler is missing.
  std::string key(const std::vector<SourceUnit>& sources, const CompilerConfig& config) const;

  /// The directory of the entry for `key` (whether or not it exists).
  std::filesystem::path entry_dir(const std::string& key) const;

  /// Returns the path of a shared library built from `sources` (one or more translation units,
  /// compiled to objects in parallel, then linked), from the cache when a valid entry exists.
  /// Throws UserError when the compiler fails: the message names the source kept for inspection in
  /// the cache and quotes the compiler's first error lines.
  std::filesystem::path compile_shared_library(const std::vector<SourceUnit>& sources,
                                               const CompilerConfig& config = {});

  /// compile_shared_library for one source named "kernel.cpp".
  std::filesystem::path compile_shared_library(const std::string& source,
                                               const CompilerConfig& config = {});

  /// Builds independent libraries in parallel (within the max_jobs bound on compiler processes);
  /// paths in the order of `libraries`. Rethrows the first failure after the builds under way end.
  std::vector<std::filesystem::path> compile_many(const std::vector<LibrarySpec>& libraries);

  /// A snapshot of the counters.
  CacheStats stats() const;

 private:
  struct Slots;
  struct Entry;

  Entry entry_for(const std::string& key) const;
  void build(const std::vector<SourceUnit>& sources, const CompilerConfig& config,
             const CompilerIdentity& compiler, const Entry& entry);
  /// Runs a compiler process in one of the max_jobs slots, counted in `counter`
  /// (compiler_runs_ or pch_builds_), and logs it.
  process::Result run_compiler(const process::Command& command, std::atomic<std::size_t>& counter);
  /// The prefix header (with its .gch beside it) for the leading #include lines of `text`, built
  /// when missing; an empty path when there is none to use (no pch_dir_, not GCC, no leading
  /// #include, or the header failed to precompile).
  std::filesystem::path precompiled_prefix(const std::string& text, const CompilerConfig& config,
                                           const CompilerIdentity& compiler);
  /// The object of one of config.shared_sources, compiled when the cache lacks it. Throws
  /// UserError when it does not compile.
  std::filesystem::path shared_object(const std::filesystem::path& source,
                                      const CompilerConfig& config,
                                      const CompilerIdentity& compiler);

  std::filesystem::path dir_;
  std::size_t max_jobs_;
  std::unique_ptr<Slots> slots_;
  std::filesystem::path pch_dir_;
  struct KnownFiles;
  std::unique_ptr<KnownFiles> prefixes_;
  std::unique_ptr<KnownFiles> objects_;
  std::atomic<std::size_t> hits_{0};
  std::atomic<std::size_t> compiles_{0};
  std::atomic<std::size_t> rebuilds_{0};
  std::atomic<std::size_t> compiler_runs_{0};
  std::atomic<std::size_t> pch_builds_{0};
};

}  // namespace kiln::codecache
