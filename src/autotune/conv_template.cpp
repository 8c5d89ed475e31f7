#include "autotune/conv_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "autotune/template_text.h"
#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::autotune {
namespace {

// The per-thread row buffer (OW rounded up to OWB, times OCB floats) lives on the stack of the
// OpenMP threads; see kMaxPackedABytes in gemm_template.cpp for the budget's reasoning.
constexpr int64_t kMaxRowBytes = int64_t{256} << 10;

int64_t row_bytes(const ConvConfig& config, const ConvProblem& problem) {
  return round_up(problem.ow(), config.owb) * config.ocb * 4;
}

void render_header(IndentedBuffer& out, const ConvConfig& config, const ConvProblem& p,
                   const TemplateEpilogue& epilogue) {
  out.linef("// Kiln convolution template {}", config.name());
  out.linef("// Y[{}, {}, {}, {}] = epilogue({} + bias), W prepacked into {}-channel panels", p.n,
            p.m, p.oh(), p.ow(), p.text(), config.ocb);
  out.linef("// epilogue: {}", epilogue.empty() ? "none" : epilogue.expr);
  out.linef("#pragma GCC target(\"{}\")", isa_text(config.isa).target);
  out.line("#include <immintrin.h>");
  out.line("");
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
  out.linef("constexpr int64_t kOCB = {}, kOWB = {}, kICB = {};", config.ocb, config.owb,
            config.icb);
  out.line("constexpr int64_t kBlocks = (kM + kOCB - 1) / kOCB;");
  out.line("// Floats of one channel block's weight panel; the bias follows the last panel.");
  out.line("constexpr int64_t kPanel = kC * kKH * kKW * kOCB;");
  out.line("constexpr int64_t kOWPad = (kOW + kOWB - 1) / kOWB * kOWB;");
  out.line("");
}

// One register block: output columns [ow0, ow0 + r) of a row, OCB channels, input channels
// [ic0, ic1). `safe` checks every input column against the image (the blocks at its edges).
void render_block(IndentedBuffer& out, const ConvConfig& config, int r, bool safe) {
  const IsaText isa = isa_text(config.isa);
  const int vectors = config.ocb / isa.width;
  const auto acc = block_accumulator;
  out.linef("// Columns [ow0, ow0 + {}), {} input column checks.", r, safe ? "with" : "without");
  out.linef(
      "__attribute__((always_inline)) inline void block_{}{}(const float* x, const float* w, "
      "float* a, int64_t ow0, int64_t ih0, int64_t kh0, int64_t kh1, int64_t ic0, int64_t ic1, "
      "bool first) {{",
      r, safe ? "_edge" : "");
  {
    auto _ = out.scope();
    for (int i = 0; i < r; ++i) {
      std::string line;
      for (int v = 0; v < vectors; ++v) {
        line += fmt::format("{}{} {};", v ? " " : "", isa.vec, acc(i, v));
      }
      out.line(line);
    }
    out.line("if (first) {");
    for (int i = 0; i < r; ++i) {
      std::string line = "   ";
      for (int v = 0; v < vectors; ++v) {
        line += fmt::format(" {} = {}_setzero_ps();", acc(i, v), isa.prefix);
      }
      out.line(line);
    }
    out.line("} else {");
    for (int i = 0; i < r; ++i) {
      std::string line = "   ";
      for (int v = 0; v < vectors; ++v) {
        line += fmt::format(" {} = {}_loadu_ps(a + {});", acc(i, v), isa.prefix,
                            i * config.ocb + v * isa.width);
      }
      out.line(line);
    }
    out.line("}");
    out.line("for (int64_t ic = ic0; ic < ic1; ++ic) {");
    {
      auto _ = out.scope();
      out.line("const float* xc = x + ic * (kH * kW);");
      out.line("const float* wc = w + ic * (kKH * kKW * kOCB);");
      out.line("for (int64_t kh = kh0; kh < kh1; ++kh) {");
      {
        auto _ = out.scope();
        out.line("const float* xrow = xc + (ih0 + kh * kDH) * kW;");
        if (!safe) out.line("const float* xr = xrow + ow0 * kSW - kPL;");
        out.line("const float* wk = wc + kh * (kKW * kOCB);");
        out.line("#pragma GCC unroll 4");
        out.line("for (int64_t kw = 0; kw < kKW; ++kw) {");
        {
          auto _ = out.scope();
          for (int v = 0; v < vectors; ++v) {
            out.linef("const {} b{} = {}_loadu_ps(wk + kw * kOCB + {});", isa.vec, v, isa.prefix,
                      v * isa.width);
          }
          if (safe) out.line("const int64_t iw = ow0 * kSW - kPL + kw * kDW;");
          for (int i = 0; i < r; ++i) {
            std::string value;
            if (safe) {
              const std::string col = fmt::format("iw + {} * kSW", i);
              value =
                  fmt::format("({0} >= 0 && {0} < kW) ? {1}_set1_ps(xrow[{0}]) : {1}_setzero_ps()",
                              col, isa.prefix);
            } else if (config.isa == TemplateIsa::kAvx512) {
              value = fmt::format("_mm512_set1_ps(xr[{} * kSW + kw * kDW])", i);
            } else {
              value = fmt::format("_mm256_broadcast_ss(xr + {} * kSW + kw * kDW)", i);
            }
            out.linef("const {} x{} = {};", isa.vec, i, value);
            render_block_fmas(out, isa, i, vectors);
          }
        }
        out.line("}");
      }
      out.line("}");
    }
    out.line("}");
    render_block_stores(out, isa, r, vectors, config.ocb, "a");
  }
  out.line("}");
  out.line("");
}

void render_row(IndentedBuffer& out, const ConvConfig& config, const ConvProblem& p,
                const TemplateEpilogue& epilogue) {
  const int64_t tail = p.ow() % config.owb;
  out.line("// One output row of one image and one channel block: every input channel block in");
  out.line("// turn over the row's column blocks (partial sums in `acc`), then the bias and the");
  out.line("// epilogue while the row is in L1, stored channel by channel.");
  out.linef(
      "inline void row(const float* X, const float* Wp, float* Y, int64_t b, int64_t j, int64_t "
      "oh, float* acc{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    out.line("const float* x = X + b * (kC * kH * kW);");
    out.line("const float* w = Wp + j * kPanel;");
    out.line("const int64_t ih0 = oh * kSH - kPT;");
    out.line("// The kernel rows inside the image.");
    out.line("int64_t kh0 = 0, kh1 = kKH;");
    out.line("while (kh0 < kKH && ih0 + kh0 * kDH < 0) ++kh0;");
    out.line("while (kh1 > kh0 && ih0 + (kh1 - 1) * kDH >= kH) --kh1;");
    out.line("for (int64_t ic0 = 0; ic0 < kC; ic0 += kICB) {");
    {
      auto _ = out.scope();
      out.line("const int64_t ic1 = std::min(kC, ic0 + kICB);");
      out.line("const bool first = ic0 == 0;");
      out.line("for (int64_t ow0 = 0; ow0 < kOW; ow0 += kOWB) {");
      {
        auto _ = out.scope();
        out.line("const int64_t r = std::min(kOWB, kOW - ow0);");
        out.line(
            "const bool inside = ow0 * kSW - kPL >= 0 && (ow0 + r - 1) * kSW - kPL + (kKW - 1) * "
            "kDW < kW;");
        out.line("float* a = acc + ow0 * kOCB;");
        const std::string args = "(x, w, a, ow0, ih0, kh0, kh1, ic0, ic1, first);";
        auto dispatch = [&](int64_t lanes) {
          out.linef("if (inside) {{");
          out.linef("    block_{}{}", lanes, args);
          out.line("} else {");
          out.linef("    block_{}_edge{}", lanes, args);
          out.line("}");
        };
        if (tail == 0) {
          dispatch(config.owb);
        } else {
          out.line("if (r == kOWB) {");
          {
            auto _ = out.scope();
            dispatch(config.owb);
          }
          out.line("} else {");
          {
            auto _ = out.scope();
            dispatch(tail);
          }
          out.line("}");
        }
      }
      out.line("}");
    }
    out.line("}");
    out.line("const float* bias = Wp + kBlocks * kPanel + j * kOCB;");
    out.line("const int64_t channels = std::min(kOCB, kM - j * kOCB);");
    out.line("for (int64_t q = 0; q < channels; ++q) {");
    {
      auto _ = out.scope();
      out.line("const int64_t m = (b * kM + j * kOCB + q) * kOH + oh;");
      out.line("(void)m;");
      out.line("float* y = Y + m * kOW;");
      out.line("const float bq = bias[q];");
      out.line("for (int64_t n = 0; n < kOW; ++n) {");
      out.line("    const float v = acc[n * kOCB + q] + bq;");
      out.linef("    y[n] = {};", epilogue_value(epilogue));
      out.line("}");
    }
    out.line("}");
  }
  out.line("}");
  out.line("");
}

void render_entry(IndentedBuffer& out, const ConvConfig& config, const ConvProblem& p,
                  const std::string& function_name, const TemplateEpilogue& epilogue) {
  out.linef("extern \"C\" void {}(const float* X, const float* Wp, float* Y{}) {{", function_name,
            epilogue_params(epilogue));
  auto _ = out.scope();
  out.line("// Threads only pay off with some work per thread.");
  out.linef("constexpr bool kParallel = kN * kBlocks * kOH > 1 && {} >= (int64_t{{1}} << 18);",
            static_cast<int64_t>(p.flops() / 2));
  // Rows are shared out on Kiln's pool (kiln_rt_pool.h).
  if (config.rows_outer) {
    out.line(
        "kiln_rt::parallel_for_3d(kParallel, kN, kOH, kBlocks, [&](int64_t b, int64_t oh, "
        "int64_t j) {");
  } else {
    out.line(
        "kiln_rt::parallel_for_3d(kParallel, kN, kBlocks, kOH, [&](int64_t b, int64_t j, "
        "int64_t oh) {");
  }
  out.line("    alignas(64) float acc[kOWPad * kOCB];");
  out.linef("    row(X, Wp, Y, b, j, oh, acc{});", epilogue_call_args(epilogue));
  out.line("});");
}

// Input channels per cache block: the block's weight panel and the input rows one output row
// reads (KH rows of W floats per channel) within `bytes` (about L1), so that both stay in L1
// while the row's column blocks sweep them.
int pick_icb(const ConvProblem& p, int ocb, int64_t bytes) {
  const int64_t per_channel = p.kh * p.kw * ocb * 4 + p.kh * p.w * 4;
  return static_cast<int>(std::clamp<int64_t>(bytes / per_channel, 4, std::max<int64_t>(p.c, 4)));
}

struct RegisterBlock {
  TemplateIsa isa;
  int ocb;
  int max_owb;
};

std::vector<RegisterBlock> register_blocks(const ConvProblem& p, TemplateIsa isa) {
  std::vector<RegisterBlock> blocks;
  if (isa == TemplateIsa::kAvx512) {
    // 32 channels x 14 columns: 28 accumulators, and 14 divides every ResNet width (112, 56,
    // 28, 14; 7 fits whole). For kernels larger than 1x1 on rows of 14 or more, 16 x 14 was the
    // fastest template at most of ResNet-50's 3x3 layers in bench/resnet_conv_bench.cpp (one
    // core of a Sapphire Rapids-class Xeon, on a loaded machine: noisy).
    // With few input channels (a network's first layer) 64 x 6 was faster by far: each broadcast
    // feeds four vectors.
    const bool spatial = p.kh * p.kw > 1 && p.ow() >= 14 && p.c >= 16;
    if (p.c < 16 && p.m >= 64) blocks.push_back({TemplateIsa::kAvx512, 64, 6});
    if (p.m <= 16 || spatial) blocks.push_back({TemplateIsa::kAvx512, 16, 14});
    blocks.push_back({TemplateIsa::kAvx512, 32, 14});
    blocks.push_back({TemplateIsa::kAvx512, 64, 6});
    if (p.m > 16 && !spatial) blocks.push_back({TemplateIsa::kAvx512, 16, 14});
  }
  if (p.m <= 8) blocks.push_back({TemplateIsa::kAvx2, 8, 12});
  blocks.push_back({TemplateIsa::kAvx2, 16, 6});
  blocks.push_back({TemplateIsa::kAvx2, 24, 4});
  if (p.m > 8) blocks.push_back({TemplateIsa::kAvx2, 8, 12});
  return blocks;
}

}  // namespace

int pick_owb(int64_t ow, int max_owb) {
  if (ow <= max_owb) return static_cast<int>(ow);
  int best = max_owb;
  int64_t best_waste = round_up(ow, max_owb) - ow;
  for (int owb = max_owb - 1; owb >= std::max(1, max_owb / 2); --owb) {
    const int64_t waste = round_up(ow, owb) - ow;
    if (waste < best_waste) {
      best = owb;
      best_waste = waste;
    }
  }
  return best;
}

double ConvProblem::flops() const {
  return 2.0 * static_cast<double>(n * m * oh() * ow()) * static_cast<double>(depth());
}

std::string ConvProblem::text() const {
  std::string extra = fmt::format("s{}", stride_h);
  if (stride_w != stride_h) extra += fmt::format("x{}", stride_w);
  if (pad_top || pad_left || pad_bottom || pad_right) {
    extra += pad_top == pad_left && pad_top == pad_bottom && pad_top == pad_right
                 ? fmt::format(", p{}", pad_top)
                 : fmt::format(", p{}.{}.{}.{}", pad_top, pad_left, pad_bottom, pad_right);
  }
  if (dilation_h != 1 || dilation_w != 1) extra += fmt::format(", d{}x{}", dilation_h, dilation_w);
  if (group != 1) extra += fmt::format(", g{}", group);
  if (channels_last) extra += ", nhwc";
  return fmt::format("conv({}x{}x{}x{}, {}x{}x{}x{}, {})", n, c, h, w, m, c / group, kh, kw, extra);
}

std::vector<int64_t> conv_problem_ints(const ConvProblem& p) {
  return {p.n,
          p.c,
          p.h,
          p.w,
          p.m,
          p.kh,
          p.kw,
          p.stride_h,
          p.stride_w,
          p.pad_top,
          p.pad_left,
          p.pad_bottom,
          p.pad_right,
          p.dilation_h,
          p.dilation_w,
          p.group,
          p.channels_last ? 1 : 0};
}

ConvProblem conv_problem_from_ints(const std::vector<int64_t>& v) {
  KILN_CHECK(v.size() == 17, "a convolution problem has 17 values, found {}", v.size());
  return {v[0], v[1],  v[2],  v[3],  v[4],  v[5],  v[6],  v[7],      v[8],
          v[9], v[10], v[11], v[12], v[13], v[14], v[15], v[16] != 0};
}

void check_conv_problem(const ConvProblem& p) {
  KILN_CHECK(p.n > 0 && p.c > 0 && p.h > 0 && p.w > 0 && p.m > 0 && p.kh > 0 && p.kw > 0 &&
                 p.stride_h > 0 && p.stride_w > 0 && p.dilation_h > 0 && p.dilation_w > 0 &&
                 p.pad_top >= 0 && p.pad_left >= 0 && p.pad_bottom >= 0 && p.pad_right >= 0 &&
                 p.group > 0 && p.c % p.group == 0 && p.m % p.group == 0,
             "conv problem {}: expected positive sizes and a group dividing C and M", p.text());
  KILN_CHECK(p.oh() > 0 && p.ow() > 0, "conv problem {}: empty output", p.text());
}

std::string ConvConfig::name() const {
  return fmt::format("{}_oc{}x{}_ic{}{}", isa_name(isa), ocb, owb, icb, rows_outer ? "_rows" : "");
}

void check_conv_config(const ConvConfig& config) {
  const int width = vector_width(config.isa);
  KILN_CHECK(config.ocb > 0 && config.owb > 0 && config.icb > 0,
             "conv config {}: every block must be positive", config.name());
  KILN_CHECK(config.ocb % width == 0, "conv config {}: OCB must be a multiple of {}", config.name(),
             width);
  const int vectors = config.ocb / width;
  const int registers = config.owb * vectors + vectors + 1;
  KILN_CHECK(registers <= register_count(config.isa),
             "conv config {}: needs {} vector registers, {} has {}", config.name(), registers,
             isa_name(config.isa), register_count(config.isa));
}

ConvConfig decode_conv_config(const std::string& text) {
  ConvConfig c;
  char isa[16] = {};
  KILN_CHECK(
      std::sscanf(text.c_str(), "%15[a-z0-9]_oc%dx%d_ic%d", isa, &c.ocb, &c.owb, &c.icb) == 4,
      "not a conv config: '{}'", text);
  KILN_CHECK(std::string(isa) == "avx2" || std::string(isa) == "avx512",
             "conv config '{}': unknown ISA", text);
  c.isa = std::string(isa) == "avx512" ? TemplateIsa::kAvx512 : TemplateIsa::kAvx2;
  c.rows_outer = text.size() > 5 && text.compare(text.size() - 5, 5, "_rows") == 0;
  KILN_CHECK(c.name() == text, "conv config '{}' reads back as '{}'", text, c.name());
  check_conv_config(c);
  return c;
}

int64_t packed_conv_weight_size(const ConvConfig& config, const ConvProblem& p) {
  const int64_t padded = round_up(p.m, config.ocb);
  return padded * p.depth() + padded;
}

std::vector<float> prepack_conv_weights(const ConvConfig& config, const ConvProblem& p,
                                        const float* w, const float* bias) {
  check_conv_config(config);
  const int64_t ocb = config.ocb, depth = p.depth(), blocks = ceil_div(p.m, ocb);
  std::vector<float> packed(static_cast<size_t>(packed_conv_weight_size(config, p)), 0.0f);
  for (int64_t oc = 0; oc < p.m; ++oc) {
    const int64_t j = oc / ocb, q = oc % ocb;
    for (int64_t t = 0; t < depth; ++t) {  // t = (ic * KH + kh) * KW + kw, as in W
      packed[static_cast<size_t>((j * depth + t) * ocb + q)] = w[oc * depth + t];
    }
    if (bias != nullptr) packed[static_cast<size_t>(blocks * ocb * depth + oc)] = bias[oc];
  }
  return packed;
}

std::vector<float> unpack_conv_weights(const ConvConfig& config, const ConvProblem& p,
                                       const float* packed) {
  const int64_t ocb = config.ocb, depth = p.depth(), blocks = ceil_div(p.m, ocb);
  std::vector<float> out(static_cast<size_t>(p.m * depth + p.m));
  for (int64_t oc = 0; oc < p.m; ++oc) {
    const int64_t j = oc / ocb, q = oc % ocb;
    for (int64_t t = 0; t < depth; ++t) {
      out[static_cast<size_t>(oc * depth + t)] = packed[(j * depth + t) * ocb + q];
    }
    out[static_cast<size_t>(p.m * depth + oc)] = packed[blocks * ocb * depth + oc];
  }
  return out;
}

std::string render_conv(const ConvConfig& config, const ConvProblem& problem,
                        const std::string& function_name, const TemplateEpilogue& epilogue) {
  check_conv_config(config);
  check_conv_problem(problem);
  KILN_CHECK(row_bytes(config, problem) <= kMaxRowBytes,
             "conv config {}: the row buffer of {} is over the stack budget", config.name(),
             problem.text());
  IndentedBuffer out;
  render_header(out, config, problem, epilogue);
  const int64_t tail = problem.ow() % config.owb;
  for (bool safe : {false, true}) {
    render_block(out, config, config.owb, safe);
    if (tail != 0) render_block(out, config, static_cast<int>(tail), safe);
  }
  render_row(out, config, problem, epilogue);
  out.line("}  // namespace");
  out.line("");
  render_entry(out, config, problem, function_name, epilogue);
  out.line("}");
  return out.str();
}

std::vector<ConvConfig> conv_configs(const ConvProblem& problem, int threads, TemplateIsa isa) {
  (void)threads;  // the tasks (image, channel block, row) are many at every ResNet shape
  std::vector<ConvConfig> configs;
  auto add = [&](const ConvConfig& config) {
    check_conv_config(config);
    if (row_bytes(config, problem) > kMaxRowBytes) return;
    if (std::find(configs.begin(), configs.end(), config) == configs.end()) {
      configs.push_back(config);
    }
  };
  // Rows outermost when every weight fits in about half of L2: a channel-block-outer order
  // streams the whole input once per block (ResNet-50's 1x1 layers at 56 x 56 and 28 x 28).
  const bool rows_outer = problem.m * problem.depth() * 4 <= (int64_t{1} << 20);
  // For kernels larger than 1x1 the default takes all input channels in one block while the
  // block's weight panel stays within L2's share (160 KiB): the row buffer then goes through
  // memory once (measured alongside the register block above).
  const std::vector<RegisterBlock> blocks = register_blocks(problem, isa);
  if (problem.kh * problem.kw > 1 &&
      problem.depth() * blocks.front().ocb * 4 <= (int64_t{160} << 10)) {
    ConvConfig whole;
    whole.isa = blocks.front().isa;
    whole.ocb = blocks.front().ocb;
    whole.owb = pick_owb(problem.ow(), blocks.front().max_owb);
    whole.icb = static_cast<int>(problem.c);
    whole.rows_outer = rows_outer;
    add(whole);
  }
  for (const RegisterBlock& block : blocks) {
    ConvConfig config;
    config.isa = block.isa;
    config.ocb = block.ocb;
    config.owb = pick_owb(problem.ow(), block.max_owb);
    config.icb = pick_icb(problem, block.ocb, 32 << 10);
    config.rows_outer = rows_outer;
    add(config);
    ConvConfig other_order = config;
    other_order.rows_outer = !rows_outer;
    add(other_order);
    ConvConfig whole = config;  // no input channel blocking
    whole.icb = static_cast<int>(problem.c);
    add(whole);
    ConvConfig small = config;  // half the panel
    small.icb = pick_icb(problem, block.ocb, 16 << 10);
    add(small);
  }
  return configs;
}

std::optional<ConvConfig> conv_default_config(const ConvProblem& problem, int threads,
                                              TemplateIsa isa) {
  std::vector<ConvConfig> configs = conv_configs(problem, threads, isa);
  if (configs.empty()) return std::nullopt;
  return configs.front();
}

}  // namespace kiln::autotune
