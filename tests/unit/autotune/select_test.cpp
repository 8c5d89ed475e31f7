// Algorithm selection (src/autotune/select.h) end to end: choices compiled through a fresh code
// cache, timed by the built kiln binary's hidden `autotune-bench` subcommand (KILN_AUTOTUNE_HELPER,
// since this test is not kiln), results kept in a fresh autotune cache. Checks the three modes,
// that a second `max` selection benchmarks nothing, that planted choices that do not compile,
// crash the helper or compute a wrong result are dropped with a log line while the best valid
// choice is still chosen, and that no valid choice at all is a clear UserError.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autotune/select.h"
#include "support/error.h"

#include "test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

namespace fs = std::filesystem;

// KILN_LOG is read once per process, at the first log call of any test of this binary: turn the
// autotune log on before main().
[[maybe_unused]] const bool kAutotuneLogOn = [] {
  return ::setenv("KILN_LOG", "autotune", 1) == 0;
}();

// Points the helper at the built kiln.
class SelectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("KILN_AUTOTUNE_HELPER", (fs::path(KILN_BUILD_DIR) / "bin" / "kiln").c_str(), 1);
    dir_ = fresh_dir();
  }

  GemmSelectRequest request(int64_t m, int64_t n, int64_t k, AutotuneMode mode) const {
    GemmSelectRequest r;
    r.m = m;
    r.n = n;
    r.k = k;
    r.threads = 2;
    r.mode = mode;
    r.cache_path = dir_ / "autotune.json";
    r.code_cache_dir = dir_ / "code";
    return r;
  }

  fs::path dir_;
};

// The heuristic template and both libraries: enough to select between, quick to compile.
std::vector<GemmChoicePtr> few_choices(int64_t m, const GemmProblem& problem) {
  std::vector<GemmChoicePtr> all = gemm_choices(m, problem, 2);
  return {all[0], all[1], all[2]};
}

// A choice planted to fail: its kernel does not compile, crashes, computes a wrong result, or
// computes the right result (of an M x 16 by 16 x 8 product) and then crashes: at its 10,011th
// call, after the helper's first call, estimate and warm-up (at most 1 + 5 + 10,000 calls), in
// its rounds of timing; or, where warm-up was cut short by its time limit (a slow or loaded
// machine), 100 ms after its first call, whichever comes first.
class PlantedChoice final : public GemmChoice {
 public:
  enum class Fault { kSyntaxError, kNullWrite, kWrongResult, kCrashWhenTimed };
  PlantedChoice(std::string name, Fault fault) : name_(std::move(name)), fault_(fault) {}
  std::string name() const override { return name_; }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* b, int64_t k, int64_t n) const override {
    return std::vector<float>(b, b + k * n);
  }
  std::string render(const std::string& function_name, const TemplateEpilogue&) const override {
    const std::string head = "#include <cstdint>\nextern \"C\" void " + function_name +
                             "(int64_t M, const float* A, const float* B, float* C) {\n";
    switch (fault_) {
      case Fault::kSyntaxError:
        return head + "  this is not C++;\n}\n";
      case Fault::kNullWrite:
        return head +
               "  volatile float* volatile p = nullptr;\n  *p = A[0] + B[0];\n  (void)M; "
               "(void)C;\n}\n";
      case Fault::kWrongResult:
        return head +
               "  (void)A; (void)B;\n  for (int64_t i = 0; i < M * 8; ++i) C[i] = 1.0f;\n}\n";
      case Fault::kCrashWhenTimed:
        return "#include <chrono>\n" + head +
               "  static int64_t calls = 0;\n"
               "  static const auto first = std::chrono::steady_clock::now();\n"
               "  if (++calls > 10010 ||\n"
               "      std::chrono::steady_clock::now() - first > std::chrono::milliseconds(100)) "
               "{\n"
               "    volatile float* volatile p = nullptr;\n"
               "    *p = 0;\n"
               "  }\n"
               "  for (int64_t i = 0; i < M; ++i)\n"
               "    for (int64_t j = 0; j < 8; ++j) {\n"
               "      float sum = 0;\n"
               "      for (int64_t p = 0; p < 16; ++p) sum += A[i * 16 + p] * B[p * 8 + j];\n"
               "      C[i * 8 + j] = sum;\n"
               "    }\n}\n";
    }
    return "";
  }

 private:
  std::string name_;
  Fault fault_;
};

// A convolution choice planted to fail: its kernel does not compile, or crashes.
class PlantedConvChoice final : public ConvChoice {
 public:
  PlantedConvChoice(std::string name, const ConvProblem& problem, bool crash)
      : name_(std::move(name)), problem_(problem), crash_(crash) {}
  std::string name() const override { return name_; }
  std::string backend() const override { return "template"; }
  std::vector<float> prepare(const float* w, const float*) const override {
    return std::vector<float>(w, w + problem_.m * problem_.depth());
  }
  std::string render(const std::string& function_name, const TemplateEpilogue&) const override {
    const std::string head =
        "extern \"C\" void " + function_name + "(const float* X, const float* W, float* Y) {\n";
    if (!crash_) return head + "  this is not C++;\n}\n";
    return head + "  volatile float* volatile p = nullptr;\n  *p = X[0] + W[0];\n  (void)Y;\n}\n";
  }
  const ConvProblem& problem() const override { return problem_; }

 private:
  std::string name_;
  ConvProblem problem_;
  bool crash_;
};

TEST_F(SelectTest, OffIsTheHeuristicAndTouchesNothing) {
  const GemmSelection s = select_gemm(request(64, 96, 80, AutotuneMode::kOff));
  ASSERT_NE(s.choice, nullptr);
  EXPECT_EQ(s.choice->name(), gemm_choices(64, {.n = 96, .k = 80}, 2).front()->name());
  EXPECT_EQ(s.source, "heuristic");
  EXPECT_EQ(s.benchmarked, 0u);
  EXPECT_EQ(s.helper_runs, 0u);
  EXPECT_FALSE(fs::exists(dir_ / "autotune.json"));
  EXPECT_FALSE(fs::exists(dir_ / "code"));
}

TEST_F(SelectTest, SecondMaxSelectionBenchmarksNothingAndDefaultReadsTheCache) {
  const GemmProblem problem{.n = 96, .k = 80};
  GemmSelectRequest r = request(64, problem.n, problem.k, AutotuneMode::kDefault);
  r.choices = few_choices(64, problem);

  // Default mode with an empty cache: the heuristic, nothing benchmarked.
  GemmSelection s = select_gemm(r);
  EXPECT_EQ(s.source, "heuristic");
  EXPECT_EQ(s.choice->name(), r.choices[0]->name());
  EXPECT_EQ(s.benchmarked, 0u);

  r.mode = AutotuneMode::kMax;
  ::testing::internal::CaptureStderr();
  const GemmSelection first = select_gemm(r);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(first.source, "benchmark");
  EXPECT_EQ(first.benchmarked, 3u);
  EXPECT_EQ(first.helper_runs, 1u);
  ASSERT_EQ(first.timings.size(), 3u) << log;
  EXPECT_TRUE(first.dropped.empty());
  EXPECT_EQ(first.choice->name(), first.timings.front().name);
  for (const GemmChoiceTiming& t : first.timings) {
    EXPECT_GT(t.ms, 0);
    EXPECT_FALSE(t.cached);
  }
  EXPECT_GE(first.timings[1].ms, first.timings[0].ms);
  // Inductor's table: the problem, each choice with its time and percentage of the best.
  EXPECT_NE(log.find("AUTOTUNE matmul(64x80, 80x96)\n"), std::string::npos) << log;
  EXPECT_NE(log.find("  " + first.timings[0].name + " "), std::string::npos) << log;
  EXPECT_NE(log.find(" ms 100.0%"), std::string::npos) << log;
  EXPECT_NE(log.find("SubProcess AUTOTUNE benchmarking takes "), std::string::npos) << log;
  EXPECT_NE(log.find("seconds precompiling"), std::string::npos) << log;

  const GemmSelection second = select_gemm(r);
  EXPECT_EQ(second.benchmarked, 0u);
  EXPECT_EQ(second.helper_runs, 0u);
  EXPECT_EQ(second.source, "cache");
  EXPECT_EQ(second.choice->name(), first.choice->name());
  ASSERT_EQ(second.timings.size(), 3u);
  EXPECT_TRUE(second.timings[0].cached);

  r.mode = AutotuneMode::kDefault;
  s = select_gemm(r);
  EXPECT_EQ(s.source, "cache");
  EXPECT_EQ(s.choice->name(), first.choice->name());
  EXPECT_EQ(s.benchmarked, 0u);

  // A new choice (not in the cache) is the only one max benchmarks next.
  r.mode = AutotuneMode::kMax;
  r.choices.push_back(gemm_choices(64, problem, 2).back());
  s = select_gemm(r);
  EXPECT_EQ(s.benchmarked, 1u);
  EXPECT_EQ(s.timings.size(), 4u);
}

TEST_F(SelectTest, PlantedFailuresAreDroppedAndLoggedAndTheBestValidChoiceWins) {
  const GemmProblem problem{.n = 8, .k = 16};
  GemmSelectRequest r = request(24, problem.n, problem.k, AutotuneMode::kMax);
  std::vector<GemmChoicePtr> valid = few_choices(24, problem);
  // The crash comes before valid choices in the helper's order, so a second helper run must
  // time them; the wrong one comes after the crash.
  r.choices = {
      std::make_shared<PlantedChoice>("planted crash", PlantedChoice::Fault::kNullWrite),
      std::make_shared<PlantedChoice>("planted syntax error", PlantedChoice::Fault::kSyntaxError),
      valid[1],
      std::make_shared<PlantedChoice>("planted wrong", PlantedChoice::Fault::kWrongResult),
      valid[0],
      valid[2]};
  ::testing::internal::CaptureStderr();
  const GemmSelection s = select_gemm(r);
  const std::string log = ::testing::internal::GetCapturedStderr();

  ASSERT_EQ(s.dropped.size(), 3u) << log;
  EXPECT_NE(s.dropped.at("planted syntax error").find("failed to compile"), std::string::npos);
  EXPECT_NE(s.dropped.at("planted crash").find("crashed the benchmark helper"), std::string::npos)
      << s.dropped.at("planted crash");
  EXPECT_NE(s.dropped.at("planted wrong").find("wrong result"), std::string::npos)
      << s.dropped.at("planted wrong");
  EXPECT_NE(log.find("[kiln:autotune] dropped 'planted syntax error': failed to compile"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("[kiln:autotune] dropped 'planted crash': crashed"), std::string::npos) << log;
  EXPECT_NE(log.find("[kiln:autotune] dropped 'planted wrong': wrong result"), std::string::npos)
      << log;
  EXPECT_EQ(s.helper_runs, 2u);
  ASSERT_EQ(s.timings.size(), 3u);
  EXPECT_EQ(s.choice->name(), s.timings.front().name);
  EXPECT_NE(s.choice->name().rfind("planted", 0), 0u);

  // The failures are cached too: the next max selection tries nothing again.
  const GemmSelection again = select_gemm(r);
  EXPECT_EQ(again.benchmarked, 0u);
  EXPECT_EQ(again.helper_runs, 0u);
  EXPECT_EQ(again.choice->name(), s.choice->name());
  EXPECT_EQ(again.dropped.size(), 3u);
}

// A choice that is correct but crashes the helper while it times the choices in rounds is
// dropped as the crash; the correct choices started before it are timed by a second helper run
// (a crash in its warm-up, on a slow machine, must end the same way).
TEST_F(SelectTest, CrashDuringTheRoundsOfTimingDropsOnlyTheChoiceThatRan) {
  const GemmProblem problem{.n = 8, .k = 16};
  GemmSelectRequest r = request(24, problem.n, problem.k, AutotuneMode::kMax);
  std::vector<GemmChoicePtr> valid = few_choices(24, problem);
  r.choices = {
      valid[0],
      std::make_shared<PlantedChoice>("planted late crash", PlantedChoice::Fault::kCrashWhenTimed),
      valid[1], valid[2]};
  ::testing::internal::CaptureStderr();
  const GemmSelection s = select_gemm(r);
  const std::string log = ::testing::internal::GetCapturedStderr();

  ASSERT_EQ(s.dropped.size(), 1u) << log;
  EXPECT_NE(s.dropped.at("planted late crash").find("crashed the benchmark helper"),
            std::string::npos)
      << s.dropped.at("planted late crash");
  EXPECT_EQ(s.helper_runs, 2u);
  ASSERT_EQ(s.timings.size(), 3u) << log;
  EXPECT_NE(s.choice->name().rfind("planted", 0), 0u);
}

// Convolution choices go through the same machinery: compiled, isolated in the helper, timed,
// cached; planted failures are dropped and logged; the table names the convolution.
TEST_F(SelectTest, ConvolutionChoicesAreIsolatedTimedAndCached) {
  const ConvProblem p{.n = 1,
                      .c = 6,
                      .h = 10,
                      .w = 9,
                      .m = 10,
                      .kh = 3,
                      .kw = 3,
                      .stride_h = 2,
                      .stride_w = 2,
                      .pad_top = 1,
                      .pad_left = 1,
                      .pad_bottom = 1,
                      .pad_right = 1};
  const std::vector<ConvChoicePtr> all = conv_choices(p, 2);
  ConvSelectRequest r;
  r.problem = p;
  r.threads = 2;
  r.mode = AutotuneMode::kOff;
  r.cache_path = dir_ / "autotune.json";
  r.code_cache_dir = dir_ / "code";
  EXPECT_EQ(select_conv(r).choice->name(), all.front()->name());
  EXPECT_EQ(select_conv(r).source, "heuristic");
  EXPECT_FALSE(fs::exists(dir_ / "autotune.json"));

  r.mode = AutotuneMode::kMax;
  r.choices = {std::make_shared<PlantedConvChoice>("planted crash", p, true), all[1],
               std::make_shared<PlantedConvChoice>("planted syntax error", p, false), all[0],
               all[2]};
  ::testing::internal::CaptureStderr();
  const ConvSelection s = select_conv(r);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(s.dropped.size(), 2u) << log;
  EXPECT_NE(s.dropped.at("planted syntax error").find("failed to compile"), std::string::npos);
  EXPECT_NE(s.dropped.at("planted crash").find("crashed the benchmark helper"), std::string::npos);
  EXPECT_NE(log.find("[kiln:autotune] dropped 'planted crash': crashed"), std::string::npos) << log;
  EXPECT_NE(log.find("AUTOTUNE conv(1x6x10x9, 10x6x3x3, s2, p1)\n"), std::string::npos) << log;
  ASSERT_EQ(s.timings.size(), 3u) << log;
  EXPECT_EQ(s.choice->name(), s.timings.front().name);
  EXPECT_EQ(s.source, "benchmark");

  const ConvSelection again = select_conv(r);
  EXPECT_EQ(again.benchmarked, 0u);
  EXPECT_EQ(again.helper_runs, 0u);
  EXPECT_EQ(again.source, "cache");
  EXPECT_EQ(again.choice->name(), s.choice->name());
}

TEST_F(SelectTest, NoValidChoiceIsAUserError) {
  GemmSelectRequest r = request(4, 8, 8, AutotuneMode::kMax);
  r.choices = {
      std::make_shared<PlantedChoice>("planted syntax error", PlantedChoice::Fault::kSyntaxError),
      std::make_shared<PlantedChoice>("planted crash", PlantedChoice::Fault::kNullWrite)};
  try {
    select_gemm(r);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("no valid choice for matmul(4x8, 8x8)"), std::string::npos) << message;
    EXPECT_NE(message.find("planted crash: crashed"), std::string::npos) << message;
  }
  // Off mode still answers (the heuristic is not checked without benchmarking).
  r.mode = AutotuneMode::kOff;
  EXPECT_EQ(select_gemm(r).choice->name(), "planted syntax error");
}

TEST_F(SelectTest, HelperThatIsNotKilnIsAClearError) {
  ::setenv("KILN_AUTOTUNE_HELPER", "/bin/false", 1);
  GemmSelectRequest r = request(4, 8, 8, AutotuneMode::kMax);
  r.choices = few_choices(4, {.n = 8, .k = 8});
  try {
    select_gemm(r);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_AUTOTUNE_HELPER"), std::string::npos) << e.what();
  }
}

TEST_F(SelectTest, ModeComesFromKilnAutotuneWhenTheRequestLeavesItOpen) {
  GemmSelectRequest r = request(4, 8, 8, AutotuneMode::kOff);
  r.mode.reset();
  r.choices = {std::make_shared<PlantedChoice>("planted crash", PlantedChoice::Fault::kNullWrite)};
  ::setenv("KILN_AUTOTUNE", "off", 1);
  EXPECT_EQ(autotune_mode_from_env(), AutotuneMode::kOff);
  EXPECT_EQ(select_gemm(r).choice->name(), "planted crash");
  ::setenv("KILN_AUTOTUNE", "max", 1);
  EXPECT_THROW(select_gemm(r), UserError);  // benchmarked: the only choice crashes
  ::setenv("KILN_AUTOTUNE", "fastest", 1);
  EXPECT_THROW(autotune_mode_from_env(), UserError);
  ::unsetenv("KILN_AUTOTUNE");
  EXPECT_EQ(autotune_mode_from_env(), AutotuneMode::kDefault);
}

TEST(AutotuneMode, ParsesTheThreeModes) {
  EXPECT_EQ(parse_autotune_mode("off"), AutotuneMode::kOff);
  EXPECT_EQ(parse_autotune_mode("default"), AutotuneMode::kDefault);
  EXPECT_EQ(parse_autotune_mode("max"), AutotuneMode::kMax);
  EXPECT_THROW(parse_autotune_mode("fast", "--autotune"), UserError);
  EXPECT_EQ(autotune_mode_name(AutotuneMode::kMax), "max");
}

}  // namespace
}  // namespace kiln::autotune
