#pragma once
/// float32 exp and log that GCC's auto-vectorizer can call in vector form, for code
/// written as scalar C++ over one element: the epilogues of the GEMM and convolution templates
/// (codegen/cpp/cpp_epilogue.cpp writes kiln_simd_exp(x) where a pointwise kernel writes
/// kiln::vec::exp; erf and tanh there use kiln_fast_math.h's inline forms, included here). Each
/// function is declared with GCC's `simd` attribute, which promises the x86-64 vector-function ABI
/// variants (SSE 4 lanes, AVX and AVX2 8 lanes, AVX-512 16 lanes: _ZGV{b,c,d,e}N<lanes>v_<name>);
/// this header defines them through Sleef's entry points of each ISA, so a loop under `#pragma omp
/// simd` (or one the vectorizer takes on its own) calls Sleef once per vector instead of libm once
/// per element. The scalar forms are Sleef's too, so a vector loop and its scalar tail round alike
/// (Sleef's u10 functions: within 1 ULP).
///
/// The variants are weak and hidden: every kernel translation unit of a library defines them,
/// the linker keeps one, and calls bind inside the library. Each is compiled for its own ISA
/// (`target`), so the header works in a translation unit built for any x86-64 level; a variant runs
/// only where the vectorizer chose its ISA. Sleef's ISA entry points are declared here under asm
/// labels, since sleef.h declares each only when the translation unit's own ISA has it.

#include <immintrin.h>

#include "kiln_fast_math.h"

// The scalar form is Sleef's scalar function itself (the asm label), so GCC names its vector
// variants after that symbol: _ZGVdN8v_Sleef_erff_u10 and so on.
#define KILN_SIMD_MATH_FUNCTION(NAME, SLEEF)                                               \
  extern "C" {                                                                             \
  __attribute__((simd("notinbranch"), const,                                               \
                 nothrow)) float kiln_simd_##NAME(float) __asm__("Sleef_" #SLEEF "f_u10"); \
  __m128 kiln_sleef_##NAME##_4(__m128) __asm__("Sleef_" #SLEEF "f4_u10sse4");              \
  __m256 kiln_sleef_##NAME##_8avx(__m256) __asm__("Sleef_" #SLEEF "f8_u10avx");            \
  __m256 kiln_sleef_##NAME##_8avx2(__m256) __asm__("Sleef_" #SLEEF "f8_u10avx2");          \
  __attribute__((target("avx512f")))                                                       \
  __m512 kiln_sleef_##NAME##_16(__m512) __asm__("Sleef_" #SLEEF "f16_u10avx512f");         \
  __attribute__((weak, used, visibility("hidden"), target("sse4.1")))                      \
  __m128 kiln_simd_##NAME##_4(__m128 x) __asm__("_ZGVbN4v_Sleef_" #SLEEF "f_u10");         \
  __m128 kiln_simd_##NAME##_4(__m128 x) { return kiln_sleef_##NAME##_4(x); }               \
  __attribute__((weak, used, visibility("hidden"), target("avx")))                         \
  __m256 kiln_simd_##NAME##_8avx(__m256 x) __asm__("_ZGVcN8v_Sleef_" #SLEEF "f_u10");      \
  __m256 kiln_simd_##NAME##_8avx(__m256 x) { return kiln_sleef_##NAME##_8avx(x); }         \
  __attribute__((weak, used, visibility("hidden"), target("avx2,fma")))                    \
  __m256 kiln_simd_##NAME##_8avx2(__m256 x) __asm__("_ZGVdN8v_Sleef_" #SLEEF "f_u10");     \
  __m256 kiln_simd_##NAME##_8avx2(__m256 x) { return kiln_sleef_##NAME##_8avx2(x); }       \
  __attribute__((weak, used, visibility("hidden"), target("avx512f")))                     \
  __m512 kiln_simd_##NAME##_16(__m512 x) __asm__("_ZGVeN16v_Sleef_" #SLEEF "f_u10");       \
  __m512 kiln_simd_##NAME##_16(__m512 x) { return kiln_sleef_##NAME##_16(x); }             \
  }

KILN_SIMD_MATH_FUNCTION(exp, exp)
KILN_SIMD_MATH_FUNCTION(log, log)

#undef KILN_SIMD_MATH_FUNCTION
