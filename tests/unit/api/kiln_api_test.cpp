// The parts of the public C++ API (include/kiln/kiln.h, libkiln.so) that need no compile:
// kiln::bench_figures' nearest-rank percentiles, and the errors of kiln::compile_bytes and of
// CompileOptions::dims, device and precision, which are found before anything is compiled.
// Compiling and running through this API is tested by tests/embed and tests/python.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "kiln/kiln.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

const std::string kMlp = std::string(KILN_TESTS_DIR) + "/../examples/models/mlp.onnx";

TEST(BenchFigures, NearestRankPercentilesAndThroughput) {
  // 1..10 ms, shuffled: p50 is the 5th smallest, p90 the 9th, p99 the 10th.
  const kiln::BenchResult r = kiln::bench_figures({7, 3, 10, 1, 9, 2, 8, 4, 6, 5}, 3);
  EXPECT_EQ(r.iters, 10);
  EXPECT_EQ(r.warmup, 3);
  EXPECT_DOUBLE_EQ(r.min_ms, 1);
  EXPECT_DOUBLE_EQ(r.p50_ms, 5);
  EXPECT_DOUBLE_EQ(r.p90_ms, 9);
  EXPECT_DOUBLE_EQ(r.p99_ms, 10);
  EXPECT_DOUBLE_EQ(r.mean_ms, 5.5);
  EXPECT_DOUBLE_EQ(r.throughput_per_s, 1000 / 5.5);
  const kiln::BenchResult one = kiln::bench_figures({2.5}, 0);
  EXPECT_DOUBLE_EQ(one.p99_ms, 2.5);
  EXPECT_DOUBLE_EQ(one.throughput_per_s, 400);
}

TEST(CompileBytes, UnparsableBytesAreAUserErrorNamingTheSource) {
  try {
    kiln::compile_bytes("not an onnx model", {}, nullptr, "my-model");
    FAIL() << "expected kiln::Error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.code(), KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("my-model"), std::string::npos) << e.what();
  }
}

TEST(CompileDims, AnUnknownSymbolIsNamedWithTheModelsSymbols) {
  kiln::CompileOptions options;
  options.dims = {{"batch", 2}, {"sequence", 8}};
  try {
    kiln::compile_bytes(read_file(kMlp), options, nullptr, "mlp");
    FAIL() << "expected kiln::Error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.code(), KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(),
                 "mlp: dims: the model's inputs have no symbolic dim 'sequence' (their symbolic "
                 "dims: batch)");
  }
}

TEST(CompileDims, ANegativeSizeIsRefused) {
  kiln::CompileOptions options;
  options.dims = {{"batch", -1}};
  try {
    kiln::compile(kMlp, options);
    FAIL() << "expected kiln::Error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.code(), KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("'batch' = -1 is negative"), std::string::npos)
        << e.what();
  }
}

TEST(CompileDevice, AnUnknownDeviceOrPrecisionIsRefused) {
  kiln::CompileOptions options;
  options.device = "gpu";
  try {
    kiln::compile(kMlp, options);
    FAIL() << "expected kiln::Error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.code(), KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("device 'gpu': expected cpu or cuda"), std::string::npos)
        << e.what();
  }
  options.device = "cuda";
  options.precision = "fp8";
  try {
    kiln::compile(kMlp, options);
    FAIL() << "expected kiln::Error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.code(), KILN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("precision 'fp8': expected fp32, tf32, fp16 or bf16"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
