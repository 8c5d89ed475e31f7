#pragma once
/// What the GEMM and convolution templates (and the library choices' epilogue passes) spell the
/// same way in the C++ they render: an ISA's vector type, intrinsic prefix, target and width,
/// and an epilogue's extra pointer parameters and arguments; and the block arithmetic both
/// templates size their loops with.

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "autotune/gemm_template.h"

namespace kiln::autotune {

/// a / b rounded up (a >= 0, b > 0).
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// `value` rounded up to a multiple of `multiple` (> 0).
inline int64_t round_up(int64_t value, int64_t multiple) {
  return ceil_div(value, multiple) * multiple;
}

inline int register_count(TemplateIsa isa) { return isa == TemplateIsa::kAvx512 ? 32 : 16; }

inline const char* isa_name(TemplateIsa isa) {
  return isa == TemplateIsa::kAvx512 ? "avx512" : "avx2";
}

/// The intrinsics of one ISA, as the renderers spell them.
struct IsaText {
  const char* vec;
  const char* prefix;  // "_mm256" or "_mm512"
  const char* target;  // for #pragma GCC target
  int width;
};

inline IsaText isa_text(TemplateIsa isa) {
  if (isa == TemplateIsa::kAvx512) return {"__m512", "_mm512", "avx512f,avx2,fma", 16};
  return {"__m256", "_mm256", "avx2,fma", 8};
}

/// ", const float* a0, const float* a1": the epilogue's inputs as parameters.
inline std::string epilogue_params(const TemplateEpilogue& epilogue) {
  std::string text;
  for (const std::string& arg : epilogue.args) text += fmt::format(", const float* {}", arg);
  return text;
}

/// The problem's sizes as the convolution templates name them (kN, kC, kH, kW, kM; kKH, kKW, kSH,
/// kSW, kDH, kDW; kPT, kPL, kOH, kOW), one constexpr line each.
template <typename Problem, typename Buffer>
void render_conv_constants(Buffer& out, const Problem& p) {
  out.linef("constexpr int64_t kN = {}, kC = {}, kH = {}, kW = {}, kM = {};", p.n, p.c, p.h, p.w,
            p.m);
  out.linef("constexpr int64_t kKH = {}, kKW = {}, kSH = {}, kSW = {}, kDH = {}, kDW = {};", p.kh,
            p.kw, p.stride_h, p.stride_w, p.dilation_h, p.dilation_w);
  out.linef("constexpr int64_t kPT = {}, kPL = {}, kOH = {}, kOW = {};", p.pad_top, p.pad_left,
            p.oh(), p.ow());
}

/// The accumulator of row i, vector v of a convolution template's register block.
inline std::string block_accumulator(int i, int v) { return fmt::format("c{}_{}", i, v); }

/// Row i's accumulators += x<i> * b<v> for each of `vectors` weight vectors (the direct
/// convolution templates' inner step).
template <typename Buffer>
void render_block_fmas(Buffer& out, const IsaText& isa, int i, int vectors) {
  for (int v = 0; v < vectors; ++v) {
    out.linef("{0} = {1}_fmadd_ps(x{2}, b{3}, {0});", block_accumulator(i, v), isa.prefix, i, v);
  }
}

/// Stores a register block of `rows` by `vectors` accumulators to `dst` (a float pointer in the
/// rendered code), row i at i * `row_floats`: one line per row.
template <typename Buffer>
void render_block_stores(Buffer& out, const IsaText& isa, int rows, int vectors, int row_floats,
                         const std::string& dst) {
  for (int i = 0; i < rows; ++i) {
    std::string line;
    for (int v = 0; v < vectors; ++v) {
      line += fmt::format("{}{}_storeu_ps({} + {}, {});", v ? " " : "", isa.prefix, dst,
                          i * row_floats + v * isa.width, block_accumulator(i, v));
    }
    out.line(line);
  }
}

/// The stored value of a template's output: "v" (the sum) without an epilogue, else "(expr)".
inline std::string epilogue_value(const TemplateEpilogue& epilogue) {
  return epilogue.empty() ? "v" : "(" + epilogue.expr + ")";
}

/// Stores the sums of one output pixel of a channels-last template (Y [pixels, kM]) through the
/// epilogue: for `count` channels from `first`, y[n] = epilogue(v) with v = `sums`[c], m =
/// `pixel` and n = `first` + c, in a loop the vectorizer can take whole.
template <typename Buffer>
void render_pixel_store(Buffer& out, const std::string& pixel, const std::string& count,
                        const std::string& first, const std::string& sums,
                        const TemplateEpilogue& epilogue) {
  out.linef("const int64_t m = {};", pixel);
  out.line("(void)m;");
  out.line("float* y = Y + m * kM;");
  out.line("#pragma omp simd");
  out.linef("for (int64_t c = 0; c < {}; ++c) {{", count);
  out.linef("    const int64_t n = {} + c;", first);
  out.linef("    const float v = {}[c];", sums);
  out.linef("    y[n] = {};", epilogue_value(epilogue));
  out.line("}");
}

/// The kv_ helpers a vector epilogue (TemplateEpilogue::vector_expr) calls, for `isa`'s vector
/// type kv_t. kv_max and kv_min return NaN when either operand is NaN, as the scalar
/// kiln::maximum and kiln::minimum do; kv_max_num and kv_min_num, for a second operand that is
/// a number, as kiln::maximum_num and kiln::minimum_num; kv_relu keeps a NaN, as kiln::relu does.
template <typename Buffer>
void render_vector_epilogue_helpers(Buffer& out, TemplateIsa isa) {
  const IsaText t = isa_text(isa);
  const std::string nan_blend =
      isa == TemplateIsa::kAvx512
          ? "_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), r, a)"
          : "_mm256_blendv_ps(r, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q))";
  out.linef("using kv_t = {};", t.vec);
  out.linef("inline kv_t kv_set1(float x) {{ return {}_set1_ps(x); }}", t.prefix);
  out.linef("inline kv_t kv_load(const float* p) {{ return {}_loadu_ps(p); }}", t.prefix);
  for (const char* op : {"add", "sub", "mul"}) {
    out.linef("inline kv_t kv_{0}(kv_t a, kv_t b) {{ return {1}_{0}_ps(a, b); }}", op, t.prefix);
  }
  for (const char* op : {"max", "min"}) {
    out.linef("inline kv_t kv_{}(kv_t a, kv_t b) {{", op);
    out.linef("    const kv_t r = {}_{}_ps(a, b);  // b when either is NaN", t.prefix, op);
    out.linef("    return {};", nan_blend);
    out.line("}");
  }
  // kv_max_num and kv_min_num: b is a number (a Clip bound), so a NaN can only be a's, and the
  // instruction, which returns its second operand when either is NaN, keeps it.
  for (const char* op : {"max", "min"}) {
    out.linef("inline kv_t kv_{0}_num(kv_t a, kv_t b) {{ return {1}_{0}_ps(b, a); }}", op,
              t.prefix);
  }
  out.linef("inline kv_t kv_relu(kv_t a) {{ return {0}_max_ps({0}_setzero_ps(), a); }}", t.prefix);
}

/// ", a0, a1": the epilogue's inputs as arguments.
inline std::string epilogue_call_args(const TemplateEpilogue& epilogue) {
  std::string text;
  for (const std::string& arg : epilogue.args) text += ", " + arg;
  return text;
}

}  // namespace kiln::autotune
