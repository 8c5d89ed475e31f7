#pragma once
/// Running child processes: one program with an argument vector (never a shell string), its
/// stdout and stderr captured, an optional time limit; and a bounded parallel loop to run many at
/// once. Used by the code cache to run the compiler, and by the autotuner to run benchmark helpers
/// in isolated processes. Tested in tests/unit/codecache/process_test.cpp.

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kiln::process {

/// What to run.
struct Command {
  /// The program: a path, or a bare name looked up in PATH.
  std::string program;
  /// Arguments after argv[0] (argv[0] is `program`).
  std::vector<std::string> args;
  /// Working directory of the child; empty keeps the parent's.
  std::filesystem::path cwd;
  /// Kill the child (and everything in its process group) after this long.
  std::optional<std::chrono::milliseconds> timeout;

  /// The command line for messages, arguments quoted where they hold spaces or quotes.
  std::string to_string() const;
};

/// How a child ended and what it wrote.
struct Result {
  /// Exit status when the child exited normally; -1 otherwise.
  int exit_code = -1;
  /// The signal that ended the child, or 0.
  int term_signal = 0;
  /// True when the child was killed for running past Command::timeout.
  bool timed_out = false;
  std::string stdout_text;
  std::string stderr_text;
  /// Wall time from spawn to reaping.
  double seconds = 0;

  /// True when the child exited with status 0.
  bool ok() const { return exit_code == 0 && !timed_out; }
  /// "exit status 1", "killed by signal 9 (Killed)" or "timed out after 2.0 s".
  std::string status_text() const;
};

/// Runs `command` to completion, stdin from /dev/null, capturing stdout and stderr. Throws
/// UserError when the program cannot be started (not found, not executable), naming it. A child
/// that fails is not an error here: look at the Result.
Result run(const Command& command);

/// Runs `commands`, at most `max_parallel` at a time (0 means one at a time); results in the order
/// of `commands`. If any command cannot be started, the others still finish and the first such
/// error is rethrown.
std::vector<Result> run_all(const std::vector<Command>& commands, std::size_t max_parallel);

/// Calls `body(i)` for every i in [0, count) on up to `max_threads` threads (the calling thread is
/// one of them). Rethrows the first exception a body threw, after every started body finished;
/// bodies not yet started when one throws are skipped.
void parallel_for(std::size_t count, std::size_t max_threads,
                  const std::function<void(std::size_t)>& body);

}  // namespace kiln::process
