#include "codecache/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "support/error.h"

extern char** environ;

namespace kiln::process {
namespace {

using Clock = std::chrono::steady_clock;

bool needs_quotes(const std::string& arg) {
  if (arg.empty()) return true;
  return arg.find_first_of(" \t\n'\"\\$`*?;&|<>()[]{}~#") != std::string::npos;
}

// Owns the spawn attribute objects so every exit path destroys them.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Reads what is available on each pipe until both reach end of file, killing the child's process
// group once the deadline passes.
void drain(pid_t pid, std::array<int, 2>& fds, std::array<std::string*, 2> sinks,
           std::optional<Clock::time_point> deadline, Result& result) {
  std::array<char, 1 << 16> buffer;
  while (fds[0] >= 0 || fds[1] >= 0) {
    int wait_ms = -1;
    if (deadline && !result.timed_out) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) {
        ::kill(-pid, SIGKILL);
        result.timed_out = true;
      } else {
        wait_ms = static_cast<int>(std::min<long long>(left, 1 << 30));
      }
    }
    std::array<pollfd, 2> polls = {pollfd{fds[0], POLLIN, 0}, pollfd{fds[1], POLLIN, 0}};
    int n = ::poll(polls.data(), polls.size(), wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      internal_error("poll on child pipes failed: {}", std::strerror(errno));
    }
    for (size_t i = 0; i < 2; ++i) {
      if (fds[i] < 0 || polls[i].revents == 0) continue;
      ssize_t got = ::read(fds[i], buffer.data(), buffer.size());
      if (got > 0) {
        sinks[i]->append(buffer.data(), static_cast<size_t>(got));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        close_fd(fds[i]);
      }
    }
  }
}

}  // namespace

std::string Command::to_string() const {
  std::string out;
  auto append = [&](const std::string& arg) {
    if (!out.empty()) out += ' ';
    if (!needs_quotes(arg)) {
      out += arg;
      return;
    }
    out += '\'';
    for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  };
  append(program);
  for (const std::string& arg : args) append(arg);
  return out;
}

std::string Result::status_text() const {
  if (timed_out) return fmt::format("timed out after {:.1f} s", seconds);
  if (term_signal != 0)
    return fmt::format("killed by signal {} ({})", term_signal, ::strsignal(term_signal));
  return fmt::format("exit status {}", exit_code);
}

Result run(const Command& command) {
  std::array<int, 2> out_pipe{-1, -1};
  std::array<int, 2> err_pipe{-1, -1};
  // Close-on-exec, so children spawned concurrently from other threads never inherit them.
  if (::pipe2(out_pipe.data(), O_CLOEXEC) != 0 || ::pipe2(err_pipe.data(), O_CLOEXEC) != 0) {
    int err = errno;
    for (int* fd : {&out_pipe[0], &out_pipe[1], &err_pipe[0], &err_pipe[1]}) close_fd(*fd);
    user_error("cannot run '{}': cannot create pipes: {}", command.program, std::strerror(err));
  }

  SpawnSetup setup;
  posix_spawn_file_actions_adddup2(&setup.actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&setup.actions, err_pipe[1], STDERR_FILENO);
  posix_spawn_file_actions_addopen(&setup.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  if (!command.cwd.empty()) {
    posix_spawn_file_actions_addchdir_np(&setup.actions, command.cwd.c_str());
  }
  // The child starts with no blocked signals and default handlers, whatever this process set up.
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  sigdelset(&all, SIGKILL);
  sigdelset(&all, SIGSTOP);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  // A time limit kills the whole process group, so a compiler driver's own children die too.
  if (command.timeout) flags |= POSIX_SPAWN_SETPGROUP;
  posix_spawnattr_setflags(&setup.attr, flags);
  posix_spawnattr_setsigmask(&setup.attr, &none);
  posix_spawnattr_setsigdefault(&setup.attr, &all);
  posix_spawnattr_setpgroup(&setup.attr, 0);

  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(command.program.c_str()));
  for (const std::string& arg : command.args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);

  Result result;
  auto start = Clock::now();
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, command.program.c_str(), &setup.actions, &setup.attr, argv.data(),
                          environ);
  close_fd(out_pipe[1]);
  close_fd(err_pipe[1]);
  if (rc != 0) {
    close_fd(out_pipe[0]);
    close_fd(err_pipe[0]);
    user_error("cannot run '{}': {}", command.program, std::strerror(rc));
  }

  std::optional<Clock::time_point> deadline;
  if (command.timeout) deadline = start + *command.timeout;
  std::array<int, 2> fds = {out_pipe[0], err_pipe[0]};
  drain(pid, fds, {&result.stdout_text, &result.stderr_text}, deadline, result);

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) internal_error("waitpid({}) failed: {}", pid, std::strerror(errno));
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.term_signal = WTERMSIG(status);
  return result;
}

std::vector<Result> run_all(const std::vector<Command>& commands, std::size_t max_parallel) {
  std::vector<Result> results(commands.size());
  std::vector<std::exception_ptr> errors(commands.size());
  parallel_for(commands.size(), max_parallel, [&](std::size_t i) {
    try {
      results[i] = run(commands[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  });
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return results;
}

void parallel_for(std::size_t count, std::size_t max_threads,
                  const std::function<void(std::size_t)>& body) {
  if (count == 0) return;
  std::size_t threads = std::clamp<std::size_t>(max_threads, 1, count);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto worker = [&] {
    while (!failed.load()) {
      std::size_t i = next.fetch_add(1);
      if (i >= count) return;
      try {
        body(i);
      } catch (...) {
        std::lock_guard<std::mutex> guard(error_mutex);
        if (!first_error) first_error = std::current_exception();
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (std::size_t t = 1; t < threads; ++t) {
    // Running on fewer threads beats failing when the system refuses more.
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;
    }
  }
  worker();
  for (std::thread& thread : pool) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace kiln::process
