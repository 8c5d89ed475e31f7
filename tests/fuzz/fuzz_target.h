#pragma once
/// Shared by the libFuzzer targets of tests/fuzz: what counts as a clean outcome and a scratch
/// directory. A reader given any bytes must either succeed or throw kiln::UserError (`kiln` exits
/// 2 with one line); anything else (an InternalError, another exception, a sanitizer report, a
/// crash) is a finding.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>

#include "support/error.h"

namespace kiln::fuzz {

/// Runs `body`; returns normally when it succeeds or throws UserError, aborts (a libFuzzer
/// crash, the input saved) on any other exception.
template <typename Body>
void expect_clean(Body&& body) {
  try {
    body();
  } catch (const UserError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: not a clean user error: %s\n", e.what());
    std::abort();
  }
}

/// A directory of this process's own under $TMPDIR (or /tmp), created on first use and removed
/// at exit; each libFuzzer worker is a process, so they never share one.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kiln-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return std::filesystem::path(pattern);
  }();
  return dir;
}

/// Writes `bytes` to `path` (replacing it).
void write_file(const std::filesystem::path& path, std::string_view bytes);

}  // namespace kiln::fuzz
