#include "autotune/depthwise_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "autotune/template_text.h"
#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::autotune {
namespace {

void render_header(IndentedBuffer& out, TemplateIsa isa, const ConvProblem& p,
                   const TemplateEpilogue& epilogue) {
  const InteriorColumns inside = depthwise_interior(p);
  out.linef("// Kiln depthwise convolution template {}", isa_name(isa));
  out.linef("// Y[{}, {}, {}, {}] = epilogue({} + bias), W as [M][KH * KW], then the bias", p.n,
            p.m, p.oh(), p.ow(), p.text());
  out.linef("// epilogue: {}", epilogue.empty() ? "none" : epilogue.expr);
  out.linef("#pragma GCC target(\"{}\")", isa_text(isa).target);
  out.line("#include <algorithm>");
  out.line("#include <cmath>");
  out.line("#include <cstdint>");
  // std::vector: a channels-last depthwise render placed in this unit keeps its staging rows
  // in vectors.
  out.line("#include <vector>");
  out.line("#include \"kiln_rt_pool.h\"");
  out.line("");
  out.line("namespace {");
  out.line("");
  render_conv_constants(out, p);
  out.line("// Output channels per input channel (the depth multiplier).");
  out.line("constexpr int64_t kMult = kM / kC;");
  out.line("// The output columns whose every tap reads inside the image's columns.");
  out.linef("constexpr int64_t kOW0 = {}, kOW1 = {};", inside.begin, inside.end);
  out.line("");
}

// The taps of one kernel column over the output columns [from, to), each input column checked
// against the image.
void render_checked_columns(IndentedBuffer& out, const std::string& from, const std::string& to) {
  out.linef("for (int64_t n = {}; n < {}; ++n) {{", from, to);
  out.line("    const int64_t iw = n * kSW + shift;");
  out.line("    if (iw >= 0 && iw < kW) acc[n] += wk * xr[iw];");
  out.line("}");
}

void render_row(IndentedBuffer& out, const ConvProblem& p, const TemplateEpilogue& epilogue) {
  const InteriorColumns inside = depthwise_interior(p);
  out.line("// One output row of one channel: the bias, then one pass per kernel tap over the");
  out.line("// row (the interior columns vectorized, the edge columns checked), then the epilogue");
  out.line("// as the row is stored.");
  out.linef(
      "inline void row(const float* X, const float* Wp, float* Y, int64_t b, int64_t oc, "
      "int64_t oh{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    out.line("const float* x = X + (b * kC + oc / kMult) * (kH * kW);");
    out.line("const float* w = Wp + oc * (kKH * kKW);");
    out.line("const int64_t ih0 = oh * kSH - kPT;");
    out.line("// The kernel rows inside the image.");
    out.line("int64_t kh0 = 0, kh1 = kKH;");
    out.line("while (kh0 < kKH && ih0 + kh0 * kDH < 0) ++kh0;");
    out.line("while (kh1 > kh0 && ih0 + (kh1 - 1) * kDH >= kH) --kh1;");
    out.line("alignas(64) float acc[kOW];");
    out.line("const float bias = Wp[kM * kKH * kKW + oc];");
    out.line("for (int64_t n = 0; n < kOW; ++n) acc[n] = bias;");
    out.line("for (int64_t kh = kh0; kh < kh1; ++kh) {");
    {
      auto _ = out.scope();
      out.line("const float* xr = x + (ih0 + kh * kDH) * kW;");
      out.line("for (int64_t kw = 0; kw < kKW; ++kw) {");
      {
        auto _ = out.scope();
        out.line("const float wk = w[kh * kKW + kw];");
        out.line("const int64_t shift = kw * kDW - kPL;");
        if (inside.begin > 0) render_checked_columns(out, "0", "kOW0");
        if (inside.end > inside.begin) {
          out.line("#pragma omp simd");
          out.line("for (int64_t n = kOW0; n < kOW1; ++n) acc[n] += wk * xr[n * kSW + shift];");
        }
        if (inside.end < p.ow()) render_checked_columns(out, "kOW1", "kOW");
      }
      out.line("}");
    }
    out.line("}");
    out.line("const int64_t m = (b * kM + oc) * kOH + oh;");
    out.line("(void)m;");
    out.line("float* y = Y + m * kOW;");
    out.line("for (int64_t n = 0; n < kOW; ++n) {");
    out.line("    const float v = acc[n];");
    out.linef("    y[n] = {};", epilogue_value(epilogue));
    out.line("}");
  }
  out.line("}");
  out.line("");
}

void render_entry(IndentedBuffer& out, const ConvProblem& p, const std::string& function_name,
                  const TemplateEpilogue& epilogue) {
  out.linef("extern \"C\" void {}(const float* X, const float* Wp, float* Y{}) {{", function_name,
            epilogue_params(epilogue));
  auto _ = out.scope();
  out.line("// Threads only pay off with some work per thread.");
  out.linef("constexpr bool kParallel = kN * kM * kOH > 1 && {} >= (int64_t{{1}} << 16);",
            static_cast<int64_t>(p.flops() / 2));
  out.line(
      "kiln_rt::parallel_for_3d(kParallel, kN, kM, kOH, [&](int64_t b, int64_t oc, "
      "int64_t oh) {");
  out.linef("    row(X, Wp, Y, b, oc, oh{});", epilogue_call_args(epilogue));
  out.line("});");
}

}  // namespace

InteriorColumns depthwise_interior(const ConvProblem& p) {
  InteriorColumns columns;
  columns.begin = std::min(ceil_div(p.pad_left, p.stride_w), p.ow());
  // The last column ow has ow * SW - PL + (KW - 1) * DW <= W - 1.
  const int64_t last = p.w - 1 + p.pad_left - (p.kw - 1) * p.dilation_w;
  columns.end = last < 0 ? columns.begin : std::clamp(last / p.stride_w + 1, columns.begin, p.ow());
  return columns;
}

std::string render_depthwise(TemplateIsa isa, const ConvProblem& problem,
                             const std::string& function_name, const TemplateEpilogue& epilogue) {
  check_conv_problem(problem);
  KILN_CHECK(problem.depthwise(), "depthwise template: {} is not a depthwise convolution",
             problem.text());
  IndentedBuffer out;
  render_header(out, isa, problem, epilogue);
  render_row(out, problem, epilogue);
  out.line("}  // namespace");
  out.line("");
  render_entry(out, problem, function_name, epilogue);
  out.line("}");
  return out.str();
}

}  // namespace kiln::autotune
