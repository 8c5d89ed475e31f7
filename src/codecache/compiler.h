#pragma once
/// The C++ compiler as the code cache sees it: how to invoke it (CompilerConfig) and what it is
/// (CompilerIdentity: resolved path, `--version` and `-dumpmachine` output), which goes into every
/// cache key so that changing compilers never reuses old binaries. Tested in
/// tests/unit/codecache/code_cache_test.cpp.

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::codecache {

/// The compiler named by the CXX environment variable, or "g++" when CXX is unset or empty.
std::string compiler_from_env();

/// The flags that KILN_SANITIZE (a comma-separated list of address, undefined and thread, e.g.
/// "address,undefined") adds to generated code: -fsanitize=<list> -fno-sanitize-recover=all
/// -fno-omit-frame-pointer; none when it is unset or empty. Such code must be loaded by a process
/// built with the same sanitizers (build-asan's kiln, make test-sanitize). Throws UserError
/// naming an unknown sanitizer.
std::vector<std::string> sanitizer_flags_from_env();

/// Flags for code compiled and loaded in this process:
/// -O3 -march=native -fopenmp -shared -fPIC -fno-semantic-interposition -std=c++17, then
/// sanitizer_flags_from_env(). Being flags, the sanitizers enter the code cache key.
std::vector<std::string> default_jit_flags();

/// How to compile and link one shared library. A default-constructed config is the JIT default;
/// callers add the include directories and libraries their generated code needs.
struct CompilerConfig {
  /// A program name looked up in PATH, or a path. One program, not a command line.
  std::string compiler = compiler_from_env();
  /// Passed to every compile and to the link (-shared is ignored by gcc and clang with -c).
  std::vector<std::string> flags = default_jit_flags();
  /// Become -I options; made absolute (against the current directory) before use.
  std::vector<std::filesystem::path> include_dirs;
  /// Become -L options; made absolute before use.
  std::vector<std::filesystem::path> library_dirs;
  /// Link libraries after the objects: a name ("sleef" -> -lsleef) or a path to a library file.
  std::vector<std::string> libraries;
  /// Sources that many libraries share (the runtime's kiln_rt.cpp and thread pool): each is
  /// compiled once per compiler, flags, include directories and extra_key into an object kept in
  /// the cache (<dir>/objects/) and linked into every library built with this config. Their texts
  /// enter the library's key.
  std::vector<std::filesystem::path> shared_sources;
  /// Folded into the cache key as is: callers whose code includes headers that can change
  /// (for example a hash of the runtime headers) put it here, since headers are not hashed.
  std::string extra_key;
};

/// What a compiler is, for cache keys and messages.
struct CompilerIdentity {
  /// The program as configured ("g++").
  std::string requested;
  /// Where it was found (absolute, not resolving symlinks: ccache-style wrappers need their name).
  std::filesystem::path path;
  /// `path` with symlinks resolved.
  std::filesystem::path real_path;
  /// Output of `<compiler> --version`.
  std::string version;
  /// Output of `<compiler> -dumpmachine` (the target triple).
  std::string machine;

  /// Everything above in one string, for hashing.
  std::string key_text() const;
};

/// Finds and runs `compiler` (--version, -dumpmachine) the first time a name is asked for in this
/// process, then answers from memory. Throws UserError naming the compiler and the CXX variable
/// when it is not found, not executable, or does not answer --version.
const CompilerIdentity& compiler_identity(const std::string& compiler);

/// The option that makes `compiler` link with a faster linker than its default, or "" for the
/// default. A small model's link took 0.17 s with GNU ld and 0.065 s with gold (g++ 12, AMD
/// EPYC): a quarter of what building a one-kernel model costs. KILN_LINKER picks the linker by
/// its -fuse-ld= name (gold, lld, mold, bfd) or "default" (the compiler's own); unset, gold and
/// then lld are tried. A linker the compiler cannot run is left out (an explicit KILN_LINKER
/// too, with a warning). Asked once per compiler and process, when something is linked first.
/// The linker is not part of cache keys: a library does the same whichever linker built it.
std::string linker_option(const CompilerIdentity& compiler);

/// Called when a link failed through `option` (from linker_option) where the compiler's default
/// linker succeeds. Returns true when the link should be run again without it: the option was
/// Kiln's own choice (KILN_LINKER unset), which `compiler` then gives up for the rest of the
/// process. A linker that answers the probe can still fail where the default does not: gold stops
/// at a dangling libstdc++.so symlink in the compiler's library directory, which GNU ld passes
/// over for libstdc++.a (a GCC 13 installed under /opt/gcc).
bool give_up_linker(const CompilerIdentity& compiler, const std::string& option);

/// A short description of this host's CPU (model name and feature flags from /proc/cpuinfo; empty
/// when unreadable), read once. Part of the key of code built with -march=native.
const std::string& host_cpu_identity();

}  // namespace kiln::codecache
