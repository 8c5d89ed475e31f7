// The process runner: capture, exit status, time limits, working directory, parallel runs.

#include "codecache/process.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/error.h"

namespace kiln::process {
namespace {

using namespace std::chrono_literals;

TEST(Process, CapturesStdoutAndExitStatus) {
  Result result = run({"echo", {"hello", "world"}, {}, std::nullopt});
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.stdout_text, "hello world\n");
  EXPECT_EQ(result.stderr_text, "");
}

TEST(Process, CapturesStderrAndFailureStatus) {
  Result result = run({"sh", {"-c", "echo oops >&2; exit 3"}, {}, std::nullopt});
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.stderr_text, "oops\n");
  EXPECT_EQ(result.status_text(), "exit status 3");
}

TEST(Process, ArgumentsAreNotInterpretedByAShell) {
  Result result = run({"echo", {"$HOME", "a b", "*"}, {}, std::nullopt});
  EXPECT_EQ(result.stdout_text, "$HOME a b *\n");
}

TEST(Process, LargeOutputOnBothStreamsDoesNotDeadlock) {
  Result result = run(
      {"sh", {"-c", "head -c 300000 /dev/zero; head -c 200000 /dev/zero >&2"}, {}, std::nullopt});
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.stdout_text.size(), 300000u);
  EXPECT_EQ(result.stderr_text.size(), 200000u);
}

TEST(Process, TimeoutKillsTheChildAndItsChildren) {
  auto start = std::chrono::steady_clock::now();
  Result result = run({"sh", {"-c", "sleep 20 & sleep 20; echo never"}, {}, 300ms});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(result.timed_out);
  EXPECT_FALSE(result.ok());
  EXPECT_LT(seconds, 10.0);  // the background sleep held the pipe too: it must have been killed
  EXPECT_NE(result.status_text().find("timed out"), std::string::npos);
}

TEST(Process, RunsInTheGivenDirectory) {
  Result result = run({"pwd", {}, "/tmp", std::nullopt});
  EXPECT_EQ(result.stdout_text, "/tmp\n");
}

TEST(Process, MissingProgramIsAUserErrorNamingIt) {
  try {
    run({"/nonexistent/program", {}, {}, std::nullopt});
    FAIL() << "expected a UserError";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/program"), std::string::npos);
  }
}

TEST(Process, RunAllKeepsOrderAndRunsInParallel) {
  std::vector<Command> commands;
  for (int i = 0; i < 4; ++i) {
    commands.push_back({"sh", {"-c", "sleep 0.5; echo " + std::to_string(i)}, {}, std::nullopt});
  }
  auto start = std::chrono::steady_clock::now();
  std::vector<Result> results = run_all(commands, 4);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(results.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(results[i].stdout_text, std::to_string(i) + "\n");
  EXPECT_LT(seconds, 1.6);  // one at a time would take 2 s
}

TEST(Process, ParallelForVisitsEveryIndexAndRethrows) {
  std::atomic<int> sum{0};
  parallel_for(100, 4, [&](std::size_t i) { sum += static_cast<int>(i); });
  EXPECT_EQ(sum.load(), 4950);
  EXPECT_THROW(parallel_for(10, 3,
                            [](std::size_t i) {
                              if (i == 5) throw std::runtime_error("boom");
                            }),
               std::runtime_error);
}

TEST(Process, CommandToStringQuotes) {
  Command command{"g++", {"-o", "a b.so", "it's"}, {}, std::nullopt};
  EXPECT_EQ(command.to_string(), "g++ -o 'a b.so' 'it'\\''s'");
}

}  // namespace
}  // namespace kiln::process
