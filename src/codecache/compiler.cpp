#include "codecache/compiler.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "codecache/process.h"
#include "support/error.h"

namespace kiln::codecache {
namespace {

namespace fs = std::filesystem;

bool is_executable_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
}

// The lookup execvp would do, done here so a missing compiler gets a message about CXX rather
// than a bare ENOENT from the spawn.
std::optional<fs::path> find_program(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string::npos) {
    if (!is_executable_file(name)) return std::nullopt;
    return fs::absolute(name);
  }
  const char* env = std::getenv("PATH");
  std::string_view rest = env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    size_t colon = rest.find(':');
    std::string_view dir = rest.substr(0, colon);
    fs::path candidate = fs::path(dir.empty() ? "." : std::string(dir)) / name;
    if (is_executable_file(candidate)) return fs::absolute(candidate);
    if (colon == std::string_view::npos) return std::nullopt;
    rest = rest.substr(colon + 1);
  }
}

std::string trim(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::string ask_compiler(const CompilerIdentity& id, const std::string& option) {
  process::Result result = process::run({id.path.string(), {option}, {}, std::nullopt});
  if (!result.ok()) {
    user_error(
        "C++ compiler '{}' ({}) does not work: '{} {}' gave {}: {}; set the CXX environment "
        "variable to a working C++ compiler",
        id.requested, id.path.string(), id.path.string(), option, result.status_text(),
        trim(result.stderr_text));
  }
  return trim(result.stdout_text);
}

CompilerIdentity identify(const std::string& compiler) {
  std::optional<fs::path> path = find_program(compiler);
  if (!path) {
    user_error(
        "C++ compiler '{}' not found or not executable; set the CXX environment variable to a "
        "C++ compiler (for example g++ or clang++)",
        compiler);
  }
  CompilerIdentity id;
  id.requested = compiler;
  id.path = *path;
  std::error_code ec;
  id.real_path = fs::canonical(*path, ec);
  if (ec) id.real_path = *path;
  id.version = ask_compiler(id, "--version");
  id.machine = ask_compiler(id, "-dumpmachine");
  return id;
}

std::string read_cpu_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::string model;
  std::string flags;
  while (std::getline(in, line)) {
    if (line.empty()) break;  // the first processor is enough: they share one ISA
    if (line.rfind("model name", 0) == 0) model = line;
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) flags = line;
  }
  return model + "\n" + flags;
}

}  // namespace

std::string compiler_from_env() {
  const char* env = std::getenv("CXX");
  if (env == nullptr || *env == '\0') return "g++";
  return env;
}

std::vector<std::string> sanitizer_flags_from_env() {
  const char* env = std::getenv("KILN_SANITIZE");
  if (env == nullptr || *env == '\0') return {};
  std::string_view rest = env;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view name = rest.substr(0, comma);
    if (name != "address" && name != "undefined" && name != "thread") {
      user_error(
          "KILN_SANITIZE='{}': '{}' is not a sanitizer Kiln knows; expected a comma-separated "
          "list of address, undefined and thread",
          env, name);
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return {fmt::format("-fsanitize={}", env), "-fno-sanitize-recover=all",
          "-fno-omit-frame-pointer"};
}

std::vector<std::string> default_jit_flags() {
  // -fno-semantic-interposition: nothing in a generated library is meant to be replaced by a
  // definition from another object, so calls inside it may bind locally and be inlined. Without
  // it, the AVX2 1x1 convolution template with a fused Relu6 ran at half the speed in a shared
  // library that it did linked into a program (MobileNetV2's 24 -> 144: 0.26 against 0.13 ms,
  // AMD EPYC, 2 threads).
  std::vector<std::string> flags = {"-O3",       "-march=native", "-fopenmp",
                                    "-shared",   "-fPIC",         "-fno-semantic-interposition",
                                    "-std=c++17"};
  std::vector<std::string> sanitize = sanitizer_flags_from_env();
  flags.insert(flags.end(), sanitize.begin(), sanitize.end());
  return flags;
}

std::string CompilerIdentity::key_text() const {
  return fmt::format("{}\n{}\n{}\n{}\n", path.string(), real_path.string(), version, machine);
}

const CompilerIdentity& compiler_identity(const std::string& compiler) {
  // Each distinct name is identified once; failures are not remembered, so fixing the
  // environment mid-process (or a test changing CXX) takes effect.
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<CompilerIdentity>> known;
  std::lock_guard<std::mutex> guard(mutex);
  auto it = known.find(compiler);
  if (it != known.end()) return *it->second;
  auto id = std::make_unique<CompilerIdentity>(identify(compiler));
  return *known.emplace(compiler, std::move(id)).first->second;
}

namespace {

std::mutex linker_mutex;
std::map<std::string, std::string> linker_options;  // compiler path -> option

bool linker_is_kilns_choice() {
  const char* env = std::getenv("KILN_LINKER");
  return env == nullptr || *env == '\0';
}

}  // namespace

std::string linker_option(const CompilerIdentity& compiler) {
  std::lock_guard<std::mutex> guard(linker_mutex);
  auto it = linker_options.find(compiler.path.string());
  if (it != linker_options.end()) return it->second;
  // `<compiler> -fuse-ld=NAME -Wl,--version` runs the compiler's driver and that linker only
  // (about 20 ms); it fails when the compiler does not know the option or the linker is missing.
  auto runs = [&](const std::string& name) {
    return process::run(
               {compiler.path.string(), {"-fuse-ld=" + name, "-Wl,--version"}, {}, std::nullopt})
        .ok();
  };
  std::string option;
  if (linker_is_kilns_choice()) {
    for (const char* name : {"gold", "lld"}) {
      if (runs(name)) {
        option = std::string("-fuse-ld=") + name;
        break;
      }
    }
  } else if (const std::string wanted = std::getenv("KILN_LINKER"); wanted != "default") {
    if (runs(wanted)) {
      option = "-fuse-ld=" + wanted;
    } else {
      fmt::print(stderr,
                 "kiln: warning: KILN_LINKER={}: {} cannot link with it; linking with the "
                 "compiler's default linker\n",
                 wanted, compiler.path.string());
    }
  }
  return linker_options.emplace(compiler.path.string(), option).first->second;
}

bool give_up_linker(const CompilerIdentity& compiler, const std::string& option) {
  if (option.empty() || !linker_is_kilns_choice()) return false;
  std::lock_guard<std::mutex> guard(linker_mutex);
  linker_options[compiler.path.string()] = "";
  return true;
}

const std::string& host_cpu_identity() {
  static const std::string identity = read_cpu_identity();
  return identity;
}

}  // namespace kiln::codecache
