// Tests of the 8-, 4- and 2-bit element types (runtime/kiln_small_types.h and their graph::
// wrappers): values from the ONNX spec's float8 and float4 tables, the ONNX 1.23 suite's
// expected outputs (node/test_cast_*: computed by ONNX's reference implementation, not by Kiln),
// round-to-nearest-even checked against the decoded neighbours of every code, and ONNX's
// packing of 4- and 2-bit elements.

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "graph/dtype.h"
#include "graph/tensor.h"
#include "runtime/kiln_small_types.h"

namespace kiln::graph {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const DType kFloat8Types[] = {DType::kFloat8E4M3FN, DType::kFloat8E4M3FNUZ, DType::kFloat8E5M2,
                              DType::kFloat8E5M2FNUZ};

/// Clamps to the type's largest finite value as a saturating Cast does before narrowing.
uint8_t saturating(DType dtype, float v) {
  const auto max = static_cast<float>(small_float_max(dtype));
  if (v > max) v = max;
  if (v < -max) v = -max;
  return float_to_small_float(dtype, v);
}

TEST(SmallTypesTest, SpecValues) {
  // The ONNX spec's table (docs/Float8.md): largest, smallest normal and subnormal values.
  EXPECT_EQ(f8e4m3fn_to_float(0x7E), 448.0f);
  EXPECT_EQ(f8e4m3fn_to_float(0x08), 0x1.0p-6f);
  EXPECT_EQ(f8e4m3fn_to_float(0x01), 0x1.0p-9f);
  EXPECT_TRUE(std::isnan(f8e4m3fn_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(f8e4m3fn_to_float(0xFF)));
  EXPECT_EQ(f8e4m3fnuz_to_float(0x7F), 240.0f);
  EXPECT_EQ(f8e4m3fnuz_to_float(0x01), 0x1.0p-10f);
  EXPECT_TRUE(std::isnan(f8e4m3fnuz_to_float(0x80)));
  EXPECT_EQ(f8e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(f8e5m2_to_float(0x01), 0x1.0p-16f);
  EXPECT_EQ(f8e5m2_to_float(0x7C), kInf);
  EXPECT_EQ(f8e5m2_to_float(0xFC), -kInf);
  EXPECT_TRUE(std::isnan(f8e5m2_to_float(0x7D)));
  EXPECT_EQ(f8e5m2fnuz_to_float(0x7F), 57344.0f);
  EXPECT_EQ(f8e5m2fnuz_to_float(0x01), 0x1.0p-17f);
  EXPECT_TRUE(std::isnan(f8e5m2fnuz_to_float(0x80)));
  // float4e2m1 (docs/Float4.md): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
  const float kE2M1[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint8_t c = 0; c < 8; ++c) {
    EXPECT_EQ(f4e2m1_to_float(c), kE2M1[c]);
    EXPECT_EQ(f4e2m1_to_float(static_cast<uint8_t>(c | 8)), -kE2M1[c]);
  }
  // float8e8m0: 2^(c - 127); 0xFF is NaN.
  EXPECT_EQ(f8e8m0_to_float(127), 1.0f);
  EXPECT_EQ(f8e8m0_to_float(0), 0x1.0p-127f);
  EXPECT_EQ(f8e8m0_to_float(254), 0x1.0p127f);
  EXPECT_TRUE(std::isnan(f8e8m0_to_float(0xFF)));
  for (DType d : kFloat8Types) EXPECT_EQ(dtype_size(d), 1);
  EXPECT_EQ(small_float_max(DType::kFloat8E4M3FN), 448.0);
  EXPECT_EQ(small_float_max(DType::kFloat4E2M1), 6.0);
}

TEST(SmallTypesTest, EveryCodeRoundTrips) {
  for (DType d : kFloat8Types) {
    for (int c = 0; c < 256; ++c) {
      float v = small_float_to_float(d, static_cast<uint8_t>(c));
      if (std::isnan(v)) continue;
      EXPECT_EQ(float_to_small_float(d, v), c) << dtype_name(d) << " code " << c;
    }
  }
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(float_to_f4e2m1(f4e2m1_to_float(static_cast<uint8_t>(c))), c);
  }
  for (int c = 0; c < 255; ++c) {
    EXPECT_EQ(float_to_f8e8m0(f8e8m0_to_float(static_cast<uint8_t>(c))), c);
  }
}

// Between two neighbouring finite values, the midpoint goes to the one with an even code and
// anything off the midpoint to the nearer one, computed from the decoded values in double.
TEST(SmallTypesTest, RoundsToNearestEven) {
  for (DType d : kFloat8Types) {
    std::vector<std::pair<double, int>> positives;
    for (int c = 0; c < 128; ++c) {
      float v = small_float_to_float(d, static_cast<uint8_t>(c));
      if (std::isfinite(v)) positives.push_back({v, c});
    }
    for (size_t k = 0; k + 1 < positives.size(); ++k) {
      auto [lo, lo_code] = positives[k];
      auto [hi, hi_code] = positives[k + 1];
      ASSERT_LT(lo, hi);
      const double mid = (lo + hi) / 2;
      const int even = lo_code % 2 == 0 ? lo_code : hi_code;
      EXPECT_EQ(float_to_small_float(d, static_cast<float>(mid)), even) << dtype_name(d) << mid;
      const double eps = (hi - lo) / 64;
      EXPECT_EQ(float_to_small_float(d, static_cast<float>(mid - eps)), lo_code);
      EXPECT_EQ(float_to_small_float(d, static_cast<float>(mid + eps)), hi_code);
      if (d == DType::kFloat8E4M3FN || d == DType::kFloat8E5M2) {
        // Negative values mirror positive ones in the sign bit.
        EXPECT_EQ(float_to_small_float(d, static_cast<float>(-(mid + eps))), hi_code | 0x80);
      }
    }
  }
}

// Inputs and expected outputs of the suite's test_cast_FLOAT_to_FLOAT8* and
// test_cast_no_saturate_FLOAT_to_FLOAT8* cases.
TEST(SmallTypesTest, SuiteCastsToFloat8) {
  const float in[] = {0.47892547f, 0.48033667f, 0.49968487f, 0.81910545f, 0.47031248f,
                      0.72290379f, 1e6f,        1e-7f,       kNaN,        kInf,
                      kInf,        -kInf,       -1e-7f,      1e-7f,       -1e6f};
  struct Case {
    DType dtype;
    std::vector<uint8_t> saturated, not_saturated;
  };
  const Case cases[] = {
      {DType::kFloat8E4M3FN,
       {0x2f, 0x2f, 0x30, 0x35, 0x2f, 0x34, 0x7e, 0x00, 0x7f, 0x7e, 0x7e, 0xfe, 0x80, 0x00, 0xfe},
       {0x2f, 0x2f, 0x30, 0x35, 0x2f, 0x34, 0x7f, 0x00, 0x7f, 0x7f, 0x7f, 0xff, 0x80, 0x00, 0xff}},
      {DType::kFloat8E5M2,
       {0x38, 0x38, 0x38, 0x3b, 0x38, 0x3a, 0x7b, 0x00, 0x7e, 0x7b, 0x7b, 0xfb, 0x80, 0x00, 0xfb},
       {0x38, 0x38, 0x38, 0x3b, 0x38, 0x3a, 0x7c, 0x00, 0x7e, 0x7c, 0x7c, 0xfc, 0x80, 0x00, 0xfc}},
      {DType::kFloat8E4M3FNUZ,
       {},
       {0x37, 0x37, 0x38, 0x3d, 0x37, 0x3c, 0x80, 0x00, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00, 0x80}},
      {DType::kFloat8E5M2FNUZ,
       {0x3c, 0x3c, 0x3c, 0x3f, 0x3c, 0x3e, 0x7f, 0x00, 0x80, 0x7f, 0x7f, 0xff, 0x00, 0x00, 0xff},
       {}},
  };
  for (const Case& c : cases) {
    for (size_t i = 0; i < std::size(in); ++i) {
      if (!c.saturated.empty()) {
        EXPECT_EQ(saturating(c.dtype, in[i]), c.saturated[i]) << dtype_name(c.dtype) << " " << i;
      }
      if (!c.not_saturated.empty()) {
        EXPECT_EQ(float_to_small_float(c.dtype, in[i]), c.not_saturated[i])
            << dtype_name(c.dtype) << " " << i;
      }
    }
  }
}

// test_cast_FLOAT_to_FLOAT4E2M1 and test_cast_e8m0_FLOAT_to_FLOAT8E8M0.
TEST(SmallTypesTest, SuiteCastsToFloat4AndE8M0) {
  const float in4[] = {0.48f, 0.25f, 1.05f, -3.5f, -8, 9,     1e6f, 1e-7f,
                       kNaN,  kInf,  kInf,  -kInf, -4, 0.01f, -0.0f};
  const uint8_t out4[] = {0x1, 0x0, 0x2, 0xe, 0xf, 0x7, 0x7, 0x0,
                          0x8, 0x7, 0x7, 0xf, 0xe, 0x0, 0x8};
  for (size_t i = 0; i < std::size(in4); ++i) EXPECT_EQ(float_to_f4e2m1(in4[i]), out4[i]) << i;
  const float in8[] = {0, 0.124f, 0.25f, 0.5f, 1.1f, 2, 4, 8};
  const uint8_t out8[] = {0x00, 0x7c, 0x7d, 0x7e, 0x80, 0x80, 0x81, 0x82};
  for (size_t i = 0; i < std::size(in8); ++i) EXPECT_EQ(float_to_f8e8m0(in8[i]), out8[i]) << i;
  EXPECT_EQ(float_to_f8e8m0(kInf), 0xFF);
  EXPECT_EQ(saturating(DType::kFloat8E8M0, kInf), 0xFE);
}

// test_cast_FLOAT_to_INT4 / UINT4 (-9..15) and _INT2 / _UINT2 (-3..3): casts wrap, and the
// packed bytes are the suite's raw_data.
TEST(SmallTypesTest, SubByteIntegersWrapAndPack) {
  std::vector<uint8_t> int4, uint4;
  for (int v = -9; v <= 15; ++v) {
    int4.push_back(static_cast<uint8_t>(wrap_small_integer(DType::kInt4, v)));
    uint4.push_back(static_cast<uint8_t>(wrap_small_integer(DType::kUInt4, v)));
  }
  EXPECT_EQ(wrap_small_integer(DType::kInt4, -9), 7);
  EXPECT_EQ(wrap_small_integer(DType::kInt4, 8), -8);
  EXPECT_EQ(wrap_small_integer(DType::kUInt4, -1), 15);
  const std::vector<uint8_t> packed4 = {0x87, 0xa9, 0xcb, 0xed, 0x0f, 0x21, 0x43,
                                        0x65, 0x87, 0xa9, 0xcb, 0xed, 0x0f};
  for (const auto& [dtype, elements] : {std::pair{DType::kInt4, int4}, {DType::kUInt4, uint4}}) {
    ASSERT_EQ(dtype_packed_bytes(dtype, 25), 13);
    std::vector<uint8_t> packed(13);
    pack_sub_byte(dtype, elements.data(), 25, packed.data());
    EXPECT_EQ(packed, packed4) << dtype_name(dtype);
    std::vector<uint8_t> back(25);
    unpack_sub_byte(dtype, packed.data(), 25, back.data());
    EXPECT_EQ(back, elements) << dtype_name(dtype);
  }
  std::vector<uint8_t> int2;
  for (int v = -3; v <= 3; ++v) {
    int2.push_back(static_cast<uint8_t>(wrap_small_integer(DType::kInt2, v)));
  }
  EXPECT_EQ(static_cast<int8_t>(int2[0]), 1);   // -3 wraps to 1
  EXPECT_EQ(static_cast<int8_t>(int2[6]), -1);  // 3 wraps to -1
  ASSERT_EQ(dtype_packed_bytes(DType::kInt2, 7), 2);
  std::vector<uint8_t> packed2(2);
  pack_sub_byte(DType::kInt2, int2.data(), 7, packed2.data());
  EXPECT_EQ(packed2, (std::vector<uint8_t>{0x39, 0x39}));
  std::vector<uint8_t> back2(7);
  unpack_sub_byte(DType::kInt2, packed2.data(), 7, back2.data());
  EXPECT_EQ(back2, int2);
  // test_dequantizelinear_int4's input: int32_data [16, 199, 8] holds 0, 1, 7, -4, 8 -> -8.
  const uint8_t dq[] = {16, 199, 8};
  std::vector<uint8_t> five(5);
  unpack_sub_byte(DType::kInt4, dq, 5, five.data());
  const int8_t expected[] = {0, 1, 7, -4, -8};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(static_cast<int8_t>(five[i]), expected[i]) << i;
}

TEST(SmallTypesTest, ComputeTypesAndNames) {
  EXPECT_EQ(compute_dtype(DType::kFloat8E5M2), DType::kFloat32);
  EXPECT_EQ(compute_dtype(DType::kFloat4E2M1), DType::kFloat32);
  EXPECT_EQ(compute_dtype(DType::kInt4), DType::kInt32);
  EXPECT_EQ(compute_dtype(DType::kUInt2), DType::kInt32);
  EXPECT_EQ(dtype_name(DType::kFloat8E4M3FNUZ), "float8e4m3fnuz");
  EXPECT_EQ(dtype_cpp_storage(DType::kInt4), "int8_t");
  EXPECT_EQ(dtype_cpp_storage(DType::kFloat8E8M0), "uint8_t");
  EXPECT_EQ(dtype_packed_bits(DType::kFloat4E2M1), 4);
  EXPECT_EQ(dtype_packed_bits(DType::kFloat8E4M3FN), 8);
  EXPECT_FALSE(is_integer(DType::kInt4));
  EXPECT_TRUE(is_signed(DType::kInt2));
  EXPECT_FALSE(is_signed(DType::kUInt4));
}

}  // namespace
}  // namespace kiln::graph
