#pragma once
/// float16 and bfloat16 conversions for generated kernels: 16-bit buffers hold the bit patterns
/// (uint16_t); loads widen to float, stores narrow with round-to-nearest-even. Self-contained
/// (used by code compiled outside Kiln's build): includes only standard headers and
/// kiln_small_types.h (the 8-, 4- and 2-bit types, which generated kernels reach through here).

#include <cstdint>
#include <cstring>

#include "kiln_small_types.h"

namespace kiln {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// IEEE half -> float (exact), including subnormals, infinities and NaN.
inline float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t bits = two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized);
  return f32_from_bits(sign | bits);
}

/// float -> IEEE half, rounding to nearest even; overflow gives infinity, NaN stays NaN.
inline uint16_t float_to_half(float f) {
  float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

/// bfloat16 -> float (exact).
inline float bf16_to_float(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

/// float -> bfloat16, rounding to nearest even; NaN stays a quiet NaN.
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace kiln
