// BitCast-26 between storage types that compute in a wider type (float16, bfloat16, float8,
// float4e2m1, int4/uint4), which the ONNX 1.23 node suite's BitCast cases (float32, float64 and
// the 8- to 64-bit integers) do not reach: each model runs through the generated C++ (compile +
// run) and through the reference interpreter, and the output's bits are compared with the
// encodings the ONNX type specifications give (float16 1.0 = 0x3C00, bfloat16 1.0 = 0x3F80,
// float8e4m3fn 1.0 = 0x38, float4e2m1 1.0 = 0x2, two's complement int4).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "driver/compile.h"
#include "graph/graph.h"
#include "ir/interpreter.h"
#include "lower/lowering.h"
#include "model_builder.h"

namespace kiln::driver {
namespace {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;
using test_models::ModelBuilder;

/// A tensor of `dtype` whose elements' bytes are `bytes` (one or two bytes each, little-endian).
template <typename T>
Tensor raw_tensor(DType dtype, const std::vector<T>& bytes) {
  Tensor t(dtype, {static_cast<int64_t>(bytes.size())});
  EXPECT_EQ(graph::dtype_size(dtype), static_cast<int64_t>(sizeof(T)));
  std::copy(bytes.begin(), bytes.end(), t.mutable_values<T>().begin());
  return t;
}

template <typename T>
std::vector<T> raw_values(const Tensor& t) {
  EXPECT_EQ(graph::dtype_size(t.dtype()), static_cast<int64_t>(sizeof(T)));
  const T* p = static_cast<const T*>(t.data());
  return std::vector<T>(p, p + t.numel());
}

/// Runs BitCast(x, to) compiled and interpreted; returns both outputs.
std::vector<Tensor> bitcast_both_ways(const Tensor& x, DType to) {
  ModelBuilder m(26);
  graph::Value* in = m.input("x", x.dtype(), {x.numel()});
  m.output(m.op("BitCast", {in}, {{"to", static_cast<int64_t>(to)}}));
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path cache = fs::path(KILN_BUILD_DIR) / "test-tmp" / "driver" /
                   (std::string(info->test_suite_name()) + "." + info->name() + "." +
                    std::string(graph::dtype_name(x.dtype())));
  fs::remove_all(cache);
  CompileOptions options;
  options.cache_dir = cache;
  Tensor compiled = compile(m.model, options).run({x}).at(0);
  ir::Program program = lower::lower_graph(*m.model.graph);
  Tensor interpreted = ir::interpret(program, {{"x", x}}).at(m.model.graph->outputs()[0]->name());
  EXPECT_EQ(compiled.dtype(), to);
  EXPECT_EQ(interpreted.dtype(), to);
  return {compiled, interpreted};
}

TEST(BitCast, Float16AndBFloat16BitsAsInt16AndUInt16) {
  // float16 1.0, -2.0, 0.5, 65504 (the largest finite), -0.0.
  std::vector<uint16_t> half = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x8000};
  for (const Tensor& y : bitcast_both_ways(raw_tensor(DType::kFloat16, half), DType::kInt16)) {
    EXPECT_EQ(raw_values<int16_t>(y), (std::vector<int16_t>{15360, -16384, 14336, 31743, -32768}));
  }
  // And back: the int16 bits are float16 values again.
  std::vector<int16_t> ints = {15360, -16384, 14336, 31743};
  for (const Tensor& y : bitcast_both_ways(raw_tensor(DType::kInt16, ints), DType::kFloat16)) {
    EXPECT_EQ(raw_values<uint16_t>(y), (std::vector<uint16_t>{0x3C00, 0xC000, 0x3800, 0x7BFF}));
  }
  // bfloat16 1.0 and -2.0 as uint16.
  std::vector<uint16_t> bf = {0x3F80, 0xC000};
  for (const Tensor& y : bitcast_both_ways(raw_tensor(DType::kBFloat16, bf), DType::kUInt16)) {
    EXPECT_EQ(raw_values<uint16_t>(y), (std::vector<uint16_t>{16256, 49152}));
  }
}

TEST(BitCast, Float8AndFloat4CodesAsIntegers) {
  // float8e4m3fn 1.0, -2.0, 0.5, 448 (the largest finite) as uint8.
  std::vector<uint8_t> f8 = {0x38, 0xC0, 0x30, 0x7E};
  for (const Tensor& y : bitcast_both_ways(raw_tensor(DType::kFloat8E4M3FN, f8), DType::kUInt8)) {
    EXPECT_EQ(raw_values<uint8_t>(y), (std::vector<uint8_t>{56, 192, 48, 126}));
  }
  // uint4 2, 4, 10, 7 are the float4e2m1 codes of 1.0, 2.0, -1.0, 6.0.
  std::vector<uint8_t> u4 = {2, 4, 10, 7};
  for (const Tensor& y : bitcast_both_ways(raw_tensor(DType::kUInt4, u4), DType::kFloat4E2M1)) {
    EXPECT_EQ(raw_values<uint8_t>(y), (std::vector<uint8_t>{0x2, 0x4, 0xA, 0x7}));
  }
}

TEST(BitCast, Int4AndUInt4ShareTheirFourBits) {
  // In memory int4 is sign-extended to a byte, uint4 zero-extended: -1 is 0xF as uint4.
  std::vector<int8_t> i4 = {-1, -8, 7, 0};
  for (const Tensor& y : bitcast_both_ways(raw_tensor(DType::kInt4, i4), DType::kUInt4)) {
    EXPECT_EQ(raw_values<uint8_t>(y), (std::vector<uint8_t>{15, 8, 7, 0}));
  }
  std::vector<uint8_t> u4 = {15, 8, 7, 0};
  for (const Tensor& y : bitcast_both_ways(raw_tensor(DType::kUInt4, u4), DType::kInt4)) {
    EXPECT_EQ(raw_values<int8_t>(y), (std::vector<int8_t>{-1, -8, 7, 0}));
  }
}

TEST(BitCast, DifferentBitWidthsAreRefusedNamingBoth) {
  ModelBuilder m(26);
  graph::Value* in = m.input("x", DType::kFloat32, {2});
  m.output(m.op("BitCast", {in}, {{"to", static_cast<int64_t>(DType::kInt64)}}));
  try {
    lower::lower_graph(*m.model.graph);
    FAIL() << "BitCast float32 -> int64 lowered";
  } catch (const std::exception& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("BitCast"), std::string::npos) << message;
    EXPECT_NE(message.find("float32 (32 bits)"), std::string::npos) << message;
    EXPECT_NE(message.find("int64 (64 bits)"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace kiln::driver
