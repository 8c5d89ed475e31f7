#include "autotune/nhwc_conv_template.h"

#include <fmt/format.h>

#include <algorithm>

#include "autotune/template_text.h"
#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::autotune {
namespace {

GemmProblem pointwise_gemm(const ConvProblem& p) { return {.n = p.m, .k = p.c}; }

// The depthwise template's channels per register block: four vectors, so that a block's sums
// stay in registers while the taps stream through.
int64_t depthwise_block(TemplateIsa isa) { return 4 * vector_width(isa); }

void render_depthwise_header(IndentedBuffer& out, TemplateIsa isa, const ConvProblem& p,
                             const TemplateEpilogue& epilogue) {
  out.linef("// Kiln depthwise convolution template, channels-last, {}", isa_name(isa));
  out.linef("// Y[{}, {}, {}, {}] = epilogue({} + bias), W as [KH * KW][M], then the bias", p.n,
            p.oh(), p.ow(), p.m, p.text());
  out.linef("// epilogue: {}", epilogue.empty() ? "none" : epilogue.expr);
  out.linef("#pragma GCC target(\"{}\")", isa_text(isa).target);
  out.line("#include <algorithm>");
  out.line("#include <cmath>");
  out.line("#include <cstdint>");
  out.line("#include \"kiln_rt_pool.h\"");
  out.line("");
  out.line("namespace {");
  out.line("");
  render_conv_constants(out, p);
  out.linef("constexpr int64_t kCB = {};", depthwise_block(isa));
  out.line("");
}

// kCount channels from c0 of the output pixel (b, oh, ow): the bias, one vector pass per kernel
// tap inside the image ([kh0, kh1) x [kw0, kw1)), then the epilogue as they are stored.
void render_depthwise_block(IndentedBuffer& out, const TemplateEpilogue& epilogue) {
  out.line("template <int64_t kCount>");
  out.linef(
      "inline void block(const float* X, const float* Wp, float* Y, int64_t b, int64_t oh, "
      "int64_t ow, int64_t c0, int64_t kh0, int64_t kh1, int64_t kw0, int64_t kw1{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    out.line("alignas(64) float acc[kCount];");
    out.line("const float* bias = Wp + kKH * kKW * kM + c0;");
    out.line("#pragma omp simd");
    out.line("for (int64_t c = 0; c < kCount; ++c) acc[c] = bias[c];");
    out.line("const int64_t ih0 = oh * kSH - kPT, iw0 = ow * kSW - kPL;");
    out.line("for (int64_t kh = kh0; kh < kh1; ++kh) {");
    {
      auto _ = out.scope();
      out.line("const int64_t row = (b * kH + ih0 + kh * kDH) * kW + iw0;");
      out.line("const float* wr = Wp + kh * kKW * kM + c0;");
      out.line("for (int64_t kw = kw0; kw < kw1; ++kw) {");
      out.line("    const float* x = X + (row + kw * kDW) * kC + c0;");
      out.line("    const float* w = wr + kw * kM;");
      out.line("    #pragma omp simd");
      out.line("    for (int64_t c = 0; c < kCount; ++c) acc[c] += x[c] * w[c];");
      out.line("}");
    }
    out.line("}");
    out.line("const int64_t m = (b * kOH + oh) * kOW + ow;");
    out.line("(void)m;");
    out.line("float* y = Y + m * kM;");
    out.line("for (int64_t c = 0; c < kCount; ++c) {");
    out.line("    const int64_t n = c0 + c;");
    out.line("    (void)n;");
    out.line("    const float v = acc[c];");
    out.linef("    y[n] = {};", epilogue_value(epilogue));
    out.line("}");
  }
  out.line("}");
  out.line("");
}

void render_depthwise_entry(IndentedBuffer& out, TemplateIsa isa, const ConvProblem& p,
                            const std::string& function_name, const TemplateEpilogue& epilogue) {
  const std::string args = epilogue_call_args(epilogue);
  out.linef("extern \"C\" void {}(const float* X, const float* Wp, float* Y{}) {{", function_name,
            epilogue_params(epilogue));
  auto _ = out.scope();
  out.line("// Threads only pay off with some work per thread.");
  out.linef("constexpr bool kParallel = kN * kOH > 1 && {} >= (int64_t{{1}} << 16);",
            static_cast<int64_t>(p.flops() / 2));
  out.line("kiln_rt::parallel_for_2d(kParallel, kN, kOH, [&](int64_t b, int64_t oh) {");
  out.line("    {");
  out.line("        // The kernel rows inside the image.");
  out.line("        const int64_t ih0 = oh * kSH - kPT;");
  out.line("        int64_t kh0 = 0, kh1 = kKH;");
  out.line("        while (kh0 < kKH && ih0 + kh0 * kDH < 0) ++kh0;");
  out.line("        while (kh1 > kh0 && ih0 + (kh1 - 1) * kDH >= kH) --kh1;");
  out.line("        for (int64_t ow = 0; ow < kOW; ++ow) {");
  out.line("            const int64_t iw0 = ow * kSW - kPL;");
  out.line("            int64_t kw0 = 0, kw1 = kKW;");
  out.line("            while (kw0 < kKW && iw0 + kw0 * kDW < 0) ++kw0;");
  out.line("            while (kw1 > kw0 && iw0 + (kw1 - 1) * kDW >= kW) --kw1;");
  out.line("            int64_t c0 = 0;");
  out.line("            for (; c0 + kCB <= kM; c0 += kCB) {");
  out.linef("                block<kCB>(X, Wp, Y, b, oh, ow, c0, kh0, kh1, kw0, kw1{});", args);
  out.line("            }");
  if (p.m % depthwise_block(isa) != 0) {
    out.linef("            block<kM % kCB>(X, Wp, Y, b, oh, ow, c0, kh0, kh1, kw0, kw1{});", args);
  }
  out.line("        }");
  out.line("    }");
  out.line("});");
}

}  // namespace

bool nhwc_pointwise_applies(const ConvProblem& p) {
  return p.channels_last && p.group == 1 && p.kh == 1 && p.kw == 1 && p.stride_h == 1 &&
         p.stride_w == 1 && p.pad_top == 0 && p.pad_left == 0 && p.pad_bottom == 0 &&
         p.pad_right == 0;
}

bool nhwc_depthwise_applies(const ConvProblem& p) {
  return p.channels_last && p.depthwise() && p.m == p.c;
}

GemmConfig nhwc_pointwise_config(const ConvProblem& p, int threads, TemplateIsa isa) {
  // The GEMM's N is the convolution's output channels, often narrower than the default 6x64
  // block of AVX-512 (MobileNetV2 projects to 16, 24 and 32 channels): among the configs of the
  // ISA's register blocks, each as gemm_configs first proposes it, the one that pads N least,
  // the default first among equals.
  const std::vector<GemmConfig> configs =
      gemm_configs(p.n * p.h * p.w, pointwise_gemm(p), threads, isa);
  GemmConfig best = configs.front();
  std::vector<int> seen;
  for (const GemmConfig& config : configs) {
    if (config.isa != isa || std::find(seen.begin(), seen.end(), config.nr) != seen.end()) {
      continue;
    }
    seen.push_back(config.nr);
    if (round_up(p.m, config.nr) < round_up(p.m, best.nr)) best = config;
  }
  return best;
}

std::vector<float> prepack_nhwc_pointwise(const GemmConfig& config, const ConvProblem& p,
                                          const float* w, const float* bias) {
  KILN_CHECK(nhwc_pointwise_applies(p), "pointwise template: {} is not a channels-last 1x1",
             p.text());
  std::vector<float> wt(static_cast<size_t>(p.c * p.m));
  for (int64_t m = 0; m < p.m; ++m) {
    for (int64_t c = 0; c < p.c; ++c) wt[static_cast<size_t>(c * p.m + m)] = w[m * p.c + c];
  }
  std::vector<float> out = prepack_b(config, pointwise_gemm(p), wt.data());
  if (bias != nullptr) {
    out.insert(out.end(), bias, bias + p.m);
  } else {
    out.resize(out.size() + static_cast<size_t>(p.m), 0.0f);
  }
  return out;
}

int64_t nhwc_pointwise_weight_offset(const GemmConfig& config, const ConvProblem& p, int64_t m,
                                     int64_t c) {
  // prepack_b's panels: for each KC block of K (= C) starting at p0, for each NR panel of N (= M)
  // starting at j0, kc rows of NR floats at p0 * roundup(N, NR) + j0 * kc.
  const int64_t p0 = c / config.kc * config.kc, kc = std::min<int64_t>(config.kc, p.c - p0);
  const int64_t j0 = m / config.nr * config.nr;
  return p0 * round_up(p.m, config.nr) + j0 * kc + (c - p0) * config.nr + (m - j0);
}

int64_t nhwc_pointwise_bias_offset(const GemmConfig& config, const ConvProblem& p, int64_t m) {
  return packed_b_size(config, pointwise_gemm(p)) + m;
}

std::string render_nhwc_pointwise(const GemmConfig& config, const ConvProblem& p,
                                  const std::string& function_name,
                                  const TemplateEpilogue& epilogue) {
  check_conv_problem(p);
  KILN_CHECK(nhwc_pointwise_applies(p), "pointwise template: {} is not a channels-last 1x1",
             p.text());
  // The GEMM's epilogue adds the bias (its first argument), then applies the convolution's
  // epilogue to the biased sum: the GEMM's (m, n) are the pixel and the channel, as the
  // convolution's epilogue reads them.
  TemplateEpilogue biased;
  biased.args.push_back("kiln_bias");
  biased.args.insert(biased.args.end(), epilogue.args.begin(), epilogue.args.end());
  biased.expr = epilogue.empty()
                    ? "v + kiln_bias[n]"
                    : fmt::format("[&](const float v) -> float {{ return {}; }}(v + kiln_bias[n])",
                                  epilogue.expr);
  const std::string gemm_name = function_name + "_gemm";
  std::string text =
      fmt::format("// Kiln 1x1 convolution, channels-last: {} as a GEMM\n", p.text());
  text += render_gemm(config, pointwise_gemm(p), gemm_name, biased);
  text += fmt::format(
      "\nextern \"C\" void {}(const float* X, const float* Wp, float* Y{}) {{\n"
      "    {}(int64_t{{{}}}, X, Wp, Y, Wp + {}{});\n"
      "}}\n",
      function_name, epilogue_params(epilogue), gemm_name, p.n * p.h * p.w,
      packed_b_size(config, pointwise_gemm(p)), epilogue_call_args(epilogue));
  return text;
}

std::vector<float> prepack_nhwc_depthwise(const ConvProblem& p, const float* w, const float* bias) {
  KILN_CHECK(nhwc_depthwise_applies(p), "depthwise template: {} is not channels-last depthwise",
             p.text());
  const int64_t taps = p.kh * p.kw;
  std::vector<float> out(static_cast<size_t>((taps + 1) * p.m), 0.0f);
  for (int64_t m = 0; m < p.m; ++m) {
    for (int64_t t = 0; t < taps; ++t) out[static_cast<size_t>(t * p.m + m)] = w[m * taps + t];
    if (bias != nullptr) out[static_cast<size_t>(taps * p.m + m)] = bias[m];
  }
  return out;
}

std::string render_nhwc_depthwise(TemplateIsa isa, const ConvProblem& problem,
                                  const std::string& function_name,
                                  const TemplateEpilogue& epilogue) {
  check_conv_problem(problem);
  KILN_CHECK(nhwc_depthwise_applies(problem),
             "depthwise template: {} is not a channels-last depthwise convolution", problem.text());
  IndentedBuffer out;
  render_depthwise_header(out, isa, problem, epilogue);
  render_depthwise_block(out, epilogue);
  out.line("}  // namespace");
  out.line("");
  render_depthwise_entry(out, isa, problem, function_name, epilogue);
  out.line("}");
  return out.str();
}

}  // namespace kiln::autotune
