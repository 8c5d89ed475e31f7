// Tests of graph::DType, graph::Tensor and the float16 / bfloat16 conversions.

#include "graph/tensor.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "graph/dtype.h"
#include "support/error.h"

namespace kiln::graph {
namespace {

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(DTypeTest, NamesSizesAndCodes) {
  EXPECT_EQ(dtype_name(DType::kFloat32), "float32");
  EXPECT_EQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_name(DType::kString), "string");
  EXPECT_EQ(dtype_size(DType::kFloat16), 2);
  EXPECT_EQ(dtype_size(DType::kBool), 1);
  EXPECT_EQ(dtype_size(DType::kUInt64), 8);
  EXPECT_EQ(dtype_size(DType::kString), 0);
  EXPECT_EQ(dtype_size(DType::kUndefined), 0);
  for (int code :
       {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26}) {
    std::optional<DType> d = dtype_from_onnx(code);
    ASSERT_TRUE(d.has_value()) << code;
    EXPECT_EQ(static_cast<int>(*d), code);
  }
  for (int code : {14, 15, 27, -1, 1000}) {
    EXPECT_FALSE(dtype_from_onnx(code).has_value()) << code;
  }
  EXPECT_EQ(dtype_cpp_storage(DType::kFloat32), "float");
  EXPECT_EQ(dtype_cpp_storage(DType::kFloat16), "uint16_t");
  EXPECT_EQ(dtype_cpp_storage(DType::kBool), "bool");
  EXPECT_EQ(dtype_cpp_storage(DType::kString), "");
  EXPECT_TRUE(is_floating(DType::kBFloat16));
  EXPECT_FALSE(is_floating(DType::kInt32));
  EXPECT_TRUE(is_integer(DType::kUInt8));
  EXPECT_FALSE(is_integer(DType::kBool));
  EXPECT_TRUE(is_signed(DType::kInt8));
  EXPECT_FALSE(is_signed(DType::kUInt32));
  EXPECT_FALSE(is_signed(DType::kBool));
}

TEST(TensorTest, OwnedIsZeroFilledAndAligned) {
  Tensor t(DType::kFloat32, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (float v : t.values<float>()) EXPECT_EQ(v, 0.0f);
  t.mutable_values<float>()[4] = 2.5f;
  EXPECT_EQ(t.element_as_double(4), 2.5);

  Tensor scalar(DType::kInt64, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.nbytes(), 8u);
  Tensor empty(DType::kFloat64, {3, 0});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_NE(empty.data(), nullptr);

  // Copies share the bytes (the storage is reference counted).
  Tensor copy = t;
  EXPECT_EQ(copy.data(), t.data());
}

TEST(TensorTest, BorrowedKeepsOwnerAliveAndIsReadOnly) {
  bool released = false;
  auto* buffer = new int32_t[4]{1, -2, 3, -4};
  {
    std::shared_ptr<const void> owner(buffer, [&released](const void* p) {
      delete[] static_cast<const int32_t*>(p);
      released = true;
    });
    Tensor t(DType::kInt32, {2, 2}, owner, buffer, 16);
    owner.reset();
    EXPECT_FALSE(released);
    EXPECT_EQ(t.element_as_int64(3), -4);
    EXPECT_THROW(t.mutable_data(), InternalError);
    Tensor copy = t;
    t = Tensor();
    EXPECT_FALSE(released);
    EXPECT_EQ(copy.values<int32_t>()[1], -2);
  }
  EXPECT_TRUE(released);
  EXPECT_THROW(Tensor(DType::kInt32, {3}, nullptr, buffer, 8), InternalError);
}

TEST(TensorTest, Strings) {
  Tensor t = Tensor::strings({2}, {"a", "bc"});
  EXPECT_EQ(t.dtype(), DType::kString);
  EXPECT_EQ(t.numel(), 2);
  EXPECT_EQ(t.string_values()[1], "bc");
  EXPECT_THROW(Tensor::strings({3}, {"a"}), InternalError);
  EXPECT_THROW(t.element_as_double(0), InternalError);
}

template <typename T>
Tensor make(DType dtype, std::vector<T> values) {
  Tensor t(dtype, {static_cast<int64_t>(values.size())});
  std::memcpy(t.mutable_data(), values.data(), values.size() * sizeof(T));
  return t;
}

TEST(TensorTest, ElementAccessEveryDType) {
  EXPECT_EQ(make<float>(DType::kFloat32, {1.5f, -2.75f}).element_as_double(1), -2.75);
  EXPECT_EQ(make<double>(DType::kFloat64, {0.1}).element_as_double(0), 0.1);
  EXPECT_EQ(make<uint16_t>(DType::kFloat16, {0x3e00}).element_as_double(0), 1.5);
  EXPECT_EQ(make<uint16_t>(DType::kBFloat16, {0xc040}).element_as_double(0), -3.0);
  EXPECT_EQ(make<uint8_t>(DType::kUInt8, {255}).element_as_int64(0), 255);
  EXPECT_EQ(make<int8_t>(DType::kInt8, {-128}).element_as_int64(0), -128);
  EXPECT_EQ(make<uint16_t>(DType::kUInt16, {65535}).element_as_int64(0), 65535);
  EXPECT_EQ(make<int16_t>(DType::kInt16, {-32768}).element_as_double(0), -32768.0);
  EXPECT_EQ(make<int32_t>(DType::kInt32, {-7}).element_as_int64(0), -7);
  EXPECT_EQ(make<int64_t>(DType::kInt64, {std::numeric_limits<int64_t>::min()}).element_as_int64(0),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(make<uint32_t>(DType::kUInt32, {4000000000u}).element_as_int64(0), 4000000000);
  EXPECT_EQ(make<uint64_t>(DType::kUInt64, {1ull << 40}).element_as_int64(0), int64_t{1} << 40);
  EXPECT_EQ(make<uint64_t>(DType::kUInt64, {~0ull}).element_as_int64(0),
            std::numeric_limits<int64_t>::max());
  Tensor b = make<uint8_t>(DType::kBool, {0, 1});
  EXPECT_EQ(b.element_as_int64(0), 0);
  EXPECT_EQ(b.element_as_double(1), 1.0);
  // Float to int64 truncates toward zero and saturates; nan gives 0.
  Tensor f = make<float>(DType::kFloat32, {-2.7f, 1e30f, -1e30f, NAN});
  EXPECT_EQ(f.element_as_int64(0), -2);
  EXPECT_EQ(f.element_as_int64(1), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(f.element_as_int64(2), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.element_as_int64(3), 0);
  EXPECT_THROW(f.element_as_double(4), InternalError);
}

TEST(HalfTest, DecodesKnownBitPatterns) {
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(half_to_float(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(half_to_float(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(bits_of(half_to_float(0x0000)), 0x00000000u);
  EXPECT_EQ(bits_of(half_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(half_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7c01)));  // signalling nan stays nan
  EXPECT_TRUE(std::isnan(half_to_float(0xfe00)));
}

TEST(HalfTest, EncodesWithRoundToNearestEven) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);  // just below the halfway point to 65536
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e10f), 0xfc00);
  const float ulp = std::ldexp(1.0f, -10);               // spacing of halves in [1, 2)
  EXPECT_EQ(float_to_half(1.0f + ulp / 2), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(float_to_half(1.0f + 3 * ulp / 2), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(float_to_half(1.0f + ulp / 2 + std::ldexp(1.0f, -20)), 0x3c01);  // above the tie
  EXPECT_EQ(float_to_half(1.0f + ulp / 2 - std::ldexp(1.0f, -20)), 0x3c00);  // below the tie
  EXPECT_EQ(float_to_half(2.0f - ulp / 4), 0x4000);  // carry into the exponent
  // Subnormals: multiples of 2^-24.
  const float sub = std::ldexp(1.0f, -24);
  EXPECT_EQ(float_to_half(sub), 0x0001);
  EXPECT_EQ(float_to_half(sub / 2), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(float_to_half(sub / 2 + std::ldexp(1.0f, -40)), 0x0001);
  EXPECT_EQ(float_to_half(3 * sub / 2), 0x0002);  // tie -> even (up)
  EXPECT_EQ(float_to_half(5 * sub / 2), 0x0002);  // tie -> even (down)
  EXPECT_EQ(float_to_half(-sub), 0x8001);
  EXPECT_EQ(float_to_half(1023 * sub), 0x03ff);
  EXPECT_EQ(float_to_half(1023.5f * sub), 0x0400);  // rounds up into the smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(float_to_half(float_of(0x00000001)), 0x0000);  // float subnormal
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
  uint16_t nan = float_to_half(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  // A signalling nan whose payload lives only in the low bits must not become infinity.
  EXPECT_NE(float_to_half(float_of(0x7f800001)) & 0x03ff, 0);
  EXPECT_EQ(float_to_half(float_of(0xffc00000)) & 0x8000, 0x8000);
}

TEST(HalfTest, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float f = half_to_float(static_cast<uint16_t>(h));
    bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_TRUE(std::isnan(half_to_float(float_to_half(f)))) << h;
    } else {
      ASSERT_EQ(float_to_half(f), h) << std::hex << h;
    }
  }
}

#ifdef __FLT16_MAX__
// GCC's _Float16 conversion (libgcc's __truncsfhf2) is an independent correctly rounded reference.
TEST(HalfTest, MatchesCompilerFloat16OnSampledFloats) {
  int64_t checked = 0;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 509) {
    float f = float_of(static_cast<uint32_t>(bits));
    if (std::isnan(f)) continue;
    volatile float vf = f;
    auto reference = std::bit_cast<uint16_t>(static_cast<_Float16>(vf));
    ASSERT_EQ(float_to_half(f), reference) << std::hex << bits;
    ++checked;
  }
  EXPECT_GT(checked, 8'000'000);
}
#endif

TEST(BFloat16Test, KnownBitPatterns) {
  EXPECT_EQ(bfloat16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bfloat16_to_float(0xc040), -3.0f);
  EXPECT_EQ(bfloat16_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bfloat16_to_float(0x7fc0)));
  EXPECT_EQ(bfloat16_to_float(0x0001), float_of(0x00010000));  // subnormal

  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(float_of(0x3f808000)), 0x3f80);  // tie -> even (down)
  EXPECT_EQ(float_to_bfloat16(float_of(0x3f818000)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bfloat16(float_of(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(float_to_bfloat16(float_of(0x3f807fff)), 0x3f80);  // below the tie
  EXPECT_EQ(float_to_bfloat16(float_of(0x7f7fffff)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(float_to_bfloat16(float_of(0x00008000)), 0x0000);  // subnormal tie -> even
  EXPECT_EQ(float_to_bfloat16(float_of(0x00018000)), 0x0002);
  EXPECT_EQ(float_to_bfloat16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  // Nans stay nans, even with the payload only in the bits that are dropped.
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(float_of(0x7f800001)))));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(float_of(0xffffffff)))));
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    if ((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0) continue;  // nan
    ASSERT_EQ(float_to_bfloat16(bfloat16_to_float(static_cast<uint16_t>(b))), b);
  }
}

}  // namespace
}  // namespace kiln::graph
