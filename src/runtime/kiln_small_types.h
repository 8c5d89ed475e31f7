#pragma once
/// Conversions of ONNX's 8-, 4- and 2-bit element types, written once for the compiler (constants,
/// the reference interpreter, tensor files) and for generated kernels (which include this file
/// through kiln_half.h). Self-contained: standard headers only, no math library.
///
/// In memory, every such element takes one byte: float8 codes as they are, a float4e2m1 code in
/// the low nibble, int4/int2 sign-extended in an int8_t, uint4/uint2 in a uint8_t. ONNX packs the
/// 4-bit and 2-bit types two or four to a byte (low bits first); only files and TensorProtos do.
///
/// The float narrowings round to nearest even and do not saturate: a finite value beyond the
/// largest one becomes infinity (float8e5m2) or NaN (the other float8 types), as ONNX's Cast with
/// saturate=0 specifies; saturating casts clamp to kiln::small_float_max first. Float4e2m1 has no
/// infinity or NaN: it always saturates, and NaN becomes the code 0x8, as the ONNX 1.23 reference
/// writes it. Float8e8m0 (exponent only, no sign, no zero) rounds up, Cast's default round_mode.
/// The integer narrowings keep the low bits (two's complement wrap), as Cast does for int8.
///
/// Tests: tests/unit/graph/small_types_test.cpp (values of the ONNX spec and of the ONNX 1.23
/// suite's expected outputs, and round-to-nearest-even checked on every pair of neighbours).

#include <cstdint>
#include <cstring>

namespace kiln {

namespace small_types_detail {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float quiet_nan(uint32_t sign) { return float_of(sign | 0x7FC00000u); }

/// The value of a finite code of a sign/exponent/mantissa format with `exponent_bias`.
inline float decode(uint32_t code, int exponent_bits, int mantissa_bits, int exponent_bias) {
  const uint32_t sign_bit = 1u << (exponent_bits + mantissa_bits);
  const uint32_t magnitude = code & (sign_bit - 1);
  const int exponent = static_cast<int>(magnitude >> mantissa_bits);
  const uint32_t mantissa = magnitude & ((1u << mantissa_bits) - 1);
  float v;
  if (exponent == 0) {
    // Subnormal: mantissa * 2^(1 - bias - mantissa_bits), exact in float.
    const float unit =
        float_of(static_cast<uint32_t>(1 - exponent_bias - mantissa_bits + 127) << 23);
    v = static_cast<float>(mantissa) * unit;
  } else {
    v = float_of((static_cast<uint32_t>(exponent - exponent_bias + 127) << 23) |
                 (mantissa << (23 - mantissa_bits)));
  }
  return (code & sign_bit) != 0 ? -v : v;
}

/// |f| (finite; `abs_bits` its bits without the sign) rounded to nearest even on the grid of a
/// format with `mantissa_bits` and `exponent_bias`, as the magnitude code; past the format's
/// largest code when it overflows (the caller decides what that becomes).
inline uint32_t round_magnitude(uint32_t abs_bits, int mantissa_bits, int exponent_bias) {
  const int exponent32 = static_cast<int>(abs_bits >> 23);
  if (exponent32 == 0) return 0;  // float32 subnormals are far below every format's half ulp
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u;
  const int exponent = exponent32 - 127 + exponent_bias;  // the target's biased exponent
  const int shift = 23 - mantissa_bits + (exponent < 1 ? 1 - exponent : 0);
  if (shift > 24) return 0;  // below half the smallest subnormal
  uint32_t q = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
  if (exponent < 1) return q;  // subnormal (q == 1 << mantissa_bits is the smallest normal)
  return (static_cast<uint32_t>(exponent) << mantissa_bits) + q - (1u << mantissa_bits);
}

/// The shared narrowing of the float8 formats. `max_magnitude`: the largest finite code without
/// sign; `overflow`: the code of a too large value or infinity (without sign when `signed_nan`
/// is false); `nan`: likewise for NaN; `unsigned_zero`: the format has no -0 (0x80 is NaN).
inline uint8_t encode8(float f, int mantissa_bits, int exponent_bias, uint32_t max_magnitude,
                       uint32_t overflow, uint32_t nan, bool signed_specials, bool unsigned_zero) {
  const uint32_t u = bits_of(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t abs_bits = u & 0x7FFFFFFFu;
  const uint32_t special_sign = signed_specials ? sign : 0u;
  if (abs_bits > 0x7F800000u) return static_cast<uint8_t>(special_sign | nan);
  if (abs_bits == 0x7F800000u) return static_cast<uint8_t>(special_sign | overflow);
  const uint32_t magnitude = round_magnitude(abs_bits, mantissa_bits, exponent_bias);
  if (magnitude > max_magnitude) return static_cast<uint8_t>(special_sign | overflow);
  if (magnitude == 0 && unsigned_zero) return 0;
  return static_cast<uint8_t>(sign | magnitude);
}

}  // namespace small_types_detail

// float8e4m3fn: bias 7, no infinity, NaN S.1111.111, largest 448.
inline float f8e4m3fn_to_float(uint8_t c) {
  if ((c & 0x7Fu) == 0x7Fu) return small_types_detail::quiet_nan((c & 0x80u) << 24);
  return small_types_detail::decode(c, 4, 3, 7);
}
inline uint8_t float_to_f8e4m3fn(float f) {
  return small_types_detail::encode8(f, 3, 7, 0x7E, 0x7F, 0x7F, true, false);
}

// float8e4m3fnuz: bias 8, no infinity, no -0, NaN 0x80, largest 240.
inline float f8e4m3fnuz_to_float(uint8_t c) {
  if (c == 0x80u) return small_types_detail::quiet_nan(0);
  return small_types_detail::decode(c, 4, 3, 8);
}
inline uint8_t float_to_f8e4m3fnuz(float f) {
  return small_types_detail::encode8(f, 3, 8, 0x7F, 0x80, 0x80, false, true);
}

// float8e5m2: bias 15, IEEE-like (infinity S.11111.00, NaN above), largest 57344.
inline float f8e5m2_to_float(uint8_t c) {
  const uint32_t sign = (c & 0x80u) << 24;
  if ((c & 0x7Fu) > 0x7Cu) return small_types_detail::quiet_nan(sign);
  if ((c & 0x7Fu) == 0x7Cu) return small_types_detail::float_of(sign | 0x7F800000u);
  return small_types_detail::decode(c, 5, 2, 15);
}
inline uint8_t float_to_f8e5m2(float f) {
  return small_types_detail::encode8(f, 2, 15, 0x7B, 0x7C, 0x7E, true, false);
}

// float8e5m2fnuz: bias 16, no infinity, no -0, NaN 0x80, largest 57344.
inline float f8e5m2fnuz_to_float(uint8_t c) {
  if (c == 0x80u) return small_types_detail::quiet_nan(0);
  return small_types_detail::decode(c, 5, 2, 16);
}
inline uint8_t float_to_f8e5m2fnuz(float f) {
  return small_types_detail::encode8(f, 2, 16, 0x7F, 0x80, 0x80, false, true);
}

// float8e8m0: 2^(c - 127), no sign, no zero, NaN 0xFF; 0 is 2^-127.
inline float f8e8m0_to_float(uint8_t c) {
  if (c == 0xFFu) return small_types_detail::quiet_nan(0);
  if (c == 0) return small_types_detail::float_of(0x00400000u);
  return small_types_detail::float_of(static_cast<uint32_t>(c) << 23);
}
/// The exponent of |f|, rounded up when f is not a power of two (0 gives code 0, 2^-127, as the
/// suite expects); infinity, NaN and values past 2^127 give NaN (0xFF).
inline uint8_t float_to_f8e8m0(float f) {
  const uint32_t abs_bits = small_types_detail::bits_of(f) & 0x7FFFFFFFu;
  if (abs_bits >= 0x7F800000u) return 0xFF;
  uint32_t exponent = abs_bits >> 23;
  if (exponent == 0) return abs_bits > 0x00400000u ? 1 : 0;  // 0 and up to 2^-127 give 2^-127
  if ((abs_bits & 0x7FFFFFu) != 0) ++exponent;
  return static_cast<uint8_t>(exponent > 0xFFu ? 0xFFu : exponent);
}

// float4e2m1 (one code in the low nibble): bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6.
inline float f4e2m1_to_float(uint8_t c) { return small_types_detail::decode(c & 0xFu, 2, 1, 1); }
inline uint8_t float_to_f4e2m1(float f) {
  const uint32_t u = small_types_detail::bits_of(f);
  const uint32_t sign = (u >> 28) & 0x8u;
  const uint32_t abs_bits = u & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return 0x8;
  if (abs_bits == 0x7F800000u) return static_cast<uint8_t>(sign | 0x7u);
  const uint32_t magnitude = small_types_detail::round_magnitude(abs_bits, 1, 1);
  return static_cast<uint8_t>(sign | (magnitude > 0x7u ? 0x7u : magnitude));
}

/// The bytes of `from` read as a `To` of the same size (ONNX BitCast in generated code).
template <typename To, typename From>
inline To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// The sub-byte integers: the low 4 or 2 bits of v, sign-extended for the signed ones.
inline int8_t wrap_int4(int32_t v) {
  return static_cast<int8_t>(static_cast<int32_t>(static_cast<uint32_t>(v) << 28) >> 28);
}
inline uint8_t wrap_uint4(int32_t v) { return static_cast<uint8_t>(v & 0xF); }
inline int8_t wrap_int2(int32_t v) {
  return static_cast<int8_t>(static_cast<int32_t>(static_cast<uint32_t>(v) << 30) >> 30);
}
inline uint8_t wrap_uint2(int32_t v) { return static_cast<uint8_t>(v & 0x3); }

}  // namespace kiln
