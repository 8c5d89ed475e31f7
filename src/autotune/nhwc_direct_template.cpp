#include "autotune/nhwc_direct_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "autotune/nhwc_conv_template.h"
#include "autotune/template_text.h"
#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::autotune {
namespace {

constexpr int64_t kMaxPaddedBytes = int64_t{32} << 20;

// The most groups one channel block may merge (grouped_fits).
constexpr int64_t kMaxMergedGroups = 4;

// Groups one channel block of `ocb` output channels spans: 1 when ungrouped or inside a group
// (M / G a multiple of ocb), else ocb / (M / G) (grouped_fits says whether that tiles).
int64_t merged_groups(const ConvProblem& p, int64_t ocb) {
  const int64_t mg = p.m / p.group;
  return p.group == 1 || mg % ocb == 0 ? 1 : ocb / mg;
}

// Input channels one channel block of `ocb` output channels reads: C when ungrouped, else
// C / G for each group it spans.
int64_t block_channels(const ConvProblem& p, int64_t ocb) {
  return p.c / p.group * merged_groups(p, ocb);
}

// Whether channel blocks of `ocb` output channels tile a grouped problem's groups: each block
// inside one group, or each block whole groups (ocb a multiple of M / G, at most
// kMaxMergedGroups of them, and G a multiple of their count, so no block reads past the input
// channels). A merged block multiplies by zero the weights between its groups' channels: it
// does ocb / (M / G) times the multiply-adds, in vectors of full width.
bool grouped_fits(const ConvProblem& p, int64_t ocb) {
  const int64_t mg = p.m / p.group, merged = merged_groups(p, ocb);
  if (p.group == 1 || mg % ocb == 0) return true;
  return ocb % mg == 0 && merged <= kMaxMergedGroups && p.group % merged == 0;
}

void render_header(IndentedBuffer& out, const ConvConfig& config, const ConvProblem& p,
                   const TemplateEpilogue& epilogue) {
  out.linef("// Kiln direct convolution template, channels-last, {}", config.name());
  out.linef("// Y[{}, {}, {}, {}] = epilogue({} + bias), W prepacked into {}-channel panels", p.n,
            p.oh(), p.ow(), p.m, p.text(), config.ocb);
  out.linef("// epilogue: {}", epilogue.empty() ? "none" : epilogue.expr);
  out.linef("#pragma GCC target(\"{}\")", isa_text(config.isa).target);
  out.line("#include <immintrin.h>");
  out.line("");
  out.line("#include <algorithm>");
  out.line("#include <cmath>");
  out.line("#include <cstdint>");
  out.line("#include <cstring>");
  out.line("#include <vector>");
  out.line("#include \"kiln_rt_pool.h\"");
  out.line("");
  out.line("namespace {");
  out.line("");
  render_conv_constants(out, p);
  out.linef("constexpr int64_t kPR = {};", p.pad_right);
  out.linef("constexpr int64_t kOCB = {}, kOWB = {};", config.ocb, config.owb);
  out.line("constexpr int64_t kBlocks = (kM + kOCB - 1) / kOCB;");
  if (p.group == 1) {
    out.line("// Input channels of a channel block.");
    out.line("constexpr int64_t kCB = kC;");
  } else {
    out.linef("// Groups: {} input and {} output channels each. A channel block reads kCB input",
              p.c / p.group, p.m / p.group);
    out.line("// channels from its first group's (zero weights between the groups it merges).");
    out.linef("constexpr int64_t kCg = {}, kMg = {};", p.c / p.group, p.m / p.group);
    out.linef("constexpr int64_t kCB = {};", block_channels(p, config.ocb));
  }
  out.line("// Floats of one channel block's weight panel; the bias follows the last panel.");
  out.line("constexpr int64_t kPanel = kKH * kKW * kCB * kOCB;");
  out.line("// Columns of an input row as the blocks read it: the padding columns are zeros.");
  out.line("constexpr int64_t kWP = kPL + kW + kPR;");
  out.line("constexpr int64_t kRowBlocks = (kOW + kOWB - 1) / kOWB, kPhases = kOH * kRowBlocks;");
  out.line("");
}

// Whether a register block prefetches the next channel block's weight panel into L2. Where the
// weights do not fit in L2 (channel blocks outermost: rows_outer false), a thread computes every
// row of a channel block before the next one, so each panel comes from memory once, in the
// block's first row, at the speed of memory rather than of the FMAs, and the block's other rows
// run from L2 with memory idle. Each register block of a channel block (phase p of the kPhases
// = rows x register blocks per row a panel serves) prefetches the p-th kPhases-th of the next
// panel, spread over its FMA loop, so that panel arrives while this one computes. ResNet-18's
// 7 x 7 x 512 3x3 layers (9 MB of weights): 1.21 -> 0.89 ms; 14 x 14 x 256: 0.89 -> 0.80 (2
// threads of an Emerald Rapids Xeon, in the network, fastest of 9 runs). A thread's last panel
// prefetches the next thread's first, or past the weights: prefetches do not fault.
bool prefetches_next_panel(const ConvConfig& config) { return !config.rows_outer; }

// One register block: output pixels [ow0, ow0 + r) of a row, OCB channels from the panel `w`,
// every kernel row in [kh0, kh1), every kernel column and input channel; the sums (the bias
// first) stored to t[r][OCB].
void render_block(IndentedBuffer& out, const ConvConfig& config, const ConvProblem& p, int r) {
  const IsaText isa = isa_text(config.isa);
  const int vectors = config.ocb / isa.width;
  const auto acc = block_accumulator;
  out.linef("// Output pixels [ow0, ow0 + {}) of a row.", r);
  out.linef(
      "__attribute__((always_inline)) inline void block_{}(const float* x, const float* w, "
      "const float* bias, float* t, int64_t ow0, int64_t ih0, int64_t kh0, int64_t kh1, "
      "[[maybe_unused]] int64_t phase) {{",
      r);
  const bool prefetch = prefetches_next_panel(config);
  {
    auto _ = out.scope();
    for (int i = 0; i < r; ++i) {
      std::string line;
      for (int v = 0; v < vectors; ++v) {
        line += fmt::format("{}{} {} = {}_loadu_ps(bias + {});", v ? " " : "", isa.vec, acc(i, v),
                            isa.prefix, v * isa.width);
      }
      out.line(line);
    }
    out.line("for (int64_t kh = kh0; kh < kh1; ++kh) {");
    {
      auto _ = out.scope();
      out.line("const float* xrow = x + (ih0 + kh * kDH) * (kWP * kC) + ow0 * kSW * kC;");
      out.line("const float* wrow = w + kh * (kKW * kCB * kOCB);");
      if (prefetch) {
        out.line("// Where in the next panel this block's prefetches start (times kPhases).");
        out.line("const int64_t pf0 = phase * kPanel + kh * (kKW * kCB * kOCB);");
      }
      // Where a block reads all of a pixel's channels and the kernel's columns are adjacent
      // pixels (dilation 1), a kernel row's (column, channel) pairs are consecutive floats of
      // both X's row and the panel: one loop over them. With few channels (an RGB stem's 3), a
      // loop over the channels alone is too short, and GCC, unrolling it fully, spilled
      // accumulators of the 6 x 64 block.
      const bool flat = p.group == 1 && p.dilation_w == 1;
      auto body = [&] {
        if (prefetch) {
          out.line("_mm_prefetch(reinterpret_cast<const char*>(w + kPanel + (pf0 + (wk - wrow) +");
          out.line("             c * kOCB) / kPhases), _MM_HINT_T1);");
        }
        for (int v = 0; v < vectors; ++v) {
          out.linef("const {} b{} = {}_loadu_ps(wk + c * kOCB + {});", isa.vec, v, isa.prefix,
                    v * isa.width);
        }
        for (int i = 0; i < r; ++i) {
          const std::string value =
              config.isa == TemplateIsa::kAvx512
                  ? fmt::format("_mm512_set1_ps(xr[{} * kSW * kC + c])", i)
                  : fmt::format("_mm256_broadcast_ss(xr + {} * kSW * kC + c)", i);
          out.linef("const {} x{} = {};", isa.vec, i, value);
          render_block_fmas(out, isa, i, vectors);
        }
      };
      if (flat) {
        out.line("const float* xr = xrow;");
        out.line("const float* wk = wrow;");
        out.line("#pragma GCC unroll 4");
        out.line("for (int64_t c = 0; c < kKW * kC; ++c) {");
        auto _ = out.scope();
        body();
      } else {
        out.line("for (int64_t kw = 0; kw < kKW; ++kw) {");
        auto _ = out.scope();
        out.line("const float* xr = xrow + kw * kDW * kC;");
        out.line("const float* wk = wrow + kw * (kCB * kOCB);");
        out.line("#pragma GCC unroll 4");
        out.line("for (int64_t c = 0; c < kCB; ++c) {");
        {
          auto __ = out.scope();
          body();
        }
        out.line("}");
      }
      out.line("}");
    }
    out.line("}");
    render_block_stores(out, isa, r, vectors, config.ocb, "t");
  }
  out.line("}");
  out.line("");
}

// Stores the r pixels of a register block's sums `t` through the epilogue. Out of line, so that
// what the epilogue keeps in registers does not take them from the block's FMA loop (inlined,
// it can make GCC spill accumulators there; see the GEMM template's store_tile).
void render_store_block(IndentedBuffer& out, const TemplateEpilogue& epilogue) {
  out.linef(
      "__attribute__((noinline)) void store_block(float* Y, const float* t, int64_t b, int64_t "
      "oh, int64_t ow0, int64_t r, int64_t j, int64_t channels{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    out.line("for (int64_t i = 0; i < r; ++i) {");
    {
      auto _ = out.scope();
      out.line("const float* ti = t + i * kOCB;");
      render_pixel_store(out, "(b * kOH + oh) * kOW + ow0 + i", "channels", "j * kOCB", "ti",
                         epilogue);
    }
    out.line("}");
  }
  out.line("}");
  out.line("");
}

// One output row of one image and one channel block: its register blocks, each stored through
// the epilogue pixel by pixel while its sums are in L1.
void render_row(IndentedBuffer& out, const ConvConfig& config, const ConvProblem& p,
                const TemplateEpilogue& epilogue) {
  const int64_t tail = p.ow() % config.owb;
  out.linef(
      "inline void row(const float* X, const float* Wp, float* Y, int64_t b, int64_t j, int64_t "
      "oh{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    if (p.group == 1) {
      out.line("const float* x = X + b * (kH * kWP * kC);");
    } else {
      out.line("// From the first input channel of the block's first group.");
      out.line("const float* x = X + b * (kH * kWP * kC) + j * kOCB / kMg * kCg;");
    }
    out.line("const float* w = Wp + j * kPanel;");
    out.line("const float* bias = Wp + kBlocks * kPanel + j * kOCB;");
    out.line("const int64_t ih0 = oh * kSH - kPT;");
    out.line("// The kernel rows inside the image.");
    out.line("int64_t kh0 = 0, kh1 = kKH;");
    out.line("while (kh0 < kKH && ih0 + kh0 * kDH < 0) ++kh0;");
    out.line("while (kh1 > kh0 && ih0 + (kh1 - 1) * kDH >= kH) --kh1;");
    out.line("const int64_t channels = std::min(kOCB, kM - j * kOCB);");
    out.line("alignas(64) float t[kOWB * kOCB];");
    out.line("for (int64_t ow0 = 0; ow0 < kOW; ow0 += kOWB) {");
    {
      auto _ = out.scope();
      out.line("const int64_t r = std::min(kOWB, kOW - ow0);");
      const std::string args = "(x, w, bias, t, ow0, ih0, kh0, kh1, oh * kRowBlocks + ow0 / kOWB);";
      if (tail == 0) {
        out.linef("block_{}{}", config.owb, args);
      } else {
        out.linef("if (r == kOWB) {{");
        out.linef("    block_{}{}", config.owb, args);
        out.line("} else {");
        out.linef("    block_{}{}", tail, args);
        out.line("}");
      }
      out.linef("store_block(Y, t, b, oh, ow0, r, j, channels{});", epilogue_call_args(epilogue));
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
  out.line("const float* xs = X;");
  out.line("if constexpr (kPL + kPR > 0) {");
  {
    auto _ = out.scope();
    out.line("// X with zero columns on either side of each row, in a buffer of this thread (the");
    out.line("// pool's threads read it through `xs`). Only the columns of X are written, so the");
    out.line("// padding columns stay the zeros the buffer was made with.");
    out.line("static thread_local std::vector<float> padded(kN * kH * kWP * kC, 0.0f);");
    out.line("float* xp = padded.data();");
    out.line("kiln_rt::parallel_for(kN * kH * kW * kC >= (int64_t{1} << 16), kN * kH,");
    out.line("                      [&](int64_t lo, int64_t hi) {");
    out.line("    for (int64_t row = lo; row < hi; ++row) {");
    out.line("        std::memcpy(xp + (row * kWP + kPL) * kC, X + row * (kW * kC),");
    out.line("                    sizeof(float) * kW * kC);");
    out.line("    }");
    out.line("});");
    out.line("xs = xp;");
  }
  out.line("}");
  out.line("// Threads only pay off with some work per thread.");
  out.linef("constexpr bool kParallel = kN * kBlocks * kOH > 1 && {} >= (int64_t{{1}} << 18);",
            static_cast<int64_t>(p.flops() / 2));
  const std::string call = fmt::format("row(xs, Wp, Y, b, j, oh{});", epilogue_call_args(epilogue));
  if (config.rows_outer) {
    out.line(
        "kiln_rt::parallel_for_3d(kParallel, kN, kOH, kBlocks, [&](int64_t b, int64_t oh, "
        "int64_t j) {");
  } else {
    out.line(
        "kiln_rt::parallel_for_3d(kParallel, kN, kBlocks, kOH, [&](int64_t b, int64_t j, "
        "int64_t oh) {");
  }
  out.linef("    {}", call);
  out.line("});");
}

// Output pixels per register block: the fewest blocks a row needs at `max_owb`, each as full as
// that count allows (a shorter last block takes the rest). Unlike the NCHW template, which avoids
// a tail to keep its row buffer aligned, a smaller block here costs more than a tail: at 56
// columns and 6 pixels, 4-pixel blocks (no tail) read each weight vector for 4 FMAs instead of 6.
int direct_owb(int64_t ow, int max_owb) {
  const int64_t blocks = ceil_div(ow, max_owb);
  return static_cast<int>(ceil_div(ow, blocks));
}

struct RegisterBlock {
  TemplateIsa isa;
  int ocb;
  int max_owb;
};

// The register blocks of an ISA, the heuristic's first. Measured with `--autotune max` at
// ResNet-50's layers on a 16-core AVX-512 Xeon host, 2 threads (timings within about 10 % of
// one another are noise there): AVX-512 64 channels by 6 pixels at stride 1 over rows of 28 or
// more (56 x 56 x 64: 0.72 ms against 0.85 for oneDNN) and with few input channels (a network's
// first layer, where each broadcast then feeds four vectors); else 32 by up to 14 (14 divides
// every ResNet width, 7 fits whole). AVX2 (16 registers): 16 by 6 first, then 24 by 4 and 8 by 12;
// but 24 by 4 first where rows are cut into blocks of 4 pixels or fewer anyway (7 and 8 columns):
// its 12 accumulators then do the work of 8. Within ResNet-18 (AMD EPYC, 2 threads) the 7 x 7 x
// 512 layers took 2.05 ms at 16 by 4 and 1.12 ms at 24 by 4 (alone: 1.10 and 1.00 ms).
// Strided 1x1 layers (ResNet's projections) take 64 by up to 6 too: at ResNet-50's 512 -> 1024
// (28 x 28, stride 2) 0.90 ms against 0.97 or more for 32 by 14 (AMD EPYC, 2 threads, alone).
// A first layer of fewer than 64 output channels takes AVX-512 16 by 14: at MobileNetV2's
// (3 -> 32, 3x3 stride 2) 0.126 ms against 0.168 for 32 by 14 (AMD EPYC, 2 threads).
std::vector<RegisterBlock> register_blocks(const ConvProblem& p, TemplateIsa isa) {
  std::vector<RegisterBlock> blocks;
  if (isa == TemplateIsa::kAvx512) {
    const bool wide = p.stride_w == 1 && p.ow() >= 28;
    const bool strided_1x1 = p.kh == 1 && p.kw == 1;
    if (p.m >= 64 && (p.c < 16 || wide || strided_1x1)) {
      blocks.push_back({TemplateIsa::kAvx512, 64, 6});
    }
    if (p.m <= 16 || p.c < 16) blocks.push_back({TemplateIsa::kAvx512, 16, 14});
    blocks.push_back({TemplateIsa::kAvx512, 32, 14});
    blocks.push_back({TemplateIsa::kAvx512, 64, 6});
    blocks.push_back({TemplateIsa::kAvx512, 48, 9});
    blocks.push_back({TemplateIsa::kAvx512, 16, 14});
  }
  if (p.m <= 8) blocks.push_back({TemplateIsa::kAvx2, 8, 12});
  if (p.m >= 24 && direct_owb(p.ow(), 6) <= 4) blocks.push_back({TemplateIsa::kAvx2, 24, 4});
  blocks.push_back({TemplateIsa::kAvx2, 16, 6});
  blocks.push_back({TemplateIsa::kAvx2, 24, 4});
  blocks.push_back({TemplateIsa::kAvx2, 8, 12});
  return blocks;
}

}  // namespace

bool nhwc_direct_applies(const ConvProblem& p) {
  // The padded copy of X is kept per calling thread for each such convolution of a library:
  // past kMaxPaddedBytes (a large static batch) oneDNN, which pads as it reads, takes it.
  const int64_t padded_bytes = p.n * p.h * (p.pad_left + p.w + p.pad_right) * p.c * 4;
  const bool padded = p.pad_left + p.pad_right > 0;
  if (!p.channels_last || p.depthwise() || nhwc_pointwise_applies(p)) return false;
  if (padded && padded_bytes > kMaxPaddedBytes) return false;
  for (const RegisterBlock& block : register_blocks(p, TemplateIsa::kAvx2)) {
    if (grouped_fits(p, block.ocb)) return true;
  }
  return false;
}

void check_nhwc_direct(const ConvConfig& config, const ConvProblem& problem) {
  check_conv_config(config);
  check_conv_problem(problem);
  KILN_CHECK(nhwc_direct_applies(problem),
             "direct channels-last template: {} is not a channels-last convolution other than "
             "1x1 stride 1 and depthwise, with groups that channel blocks tile",
             problem.text());
  KILN_CHECK(grouped_fits(problem, config.ocb),
             "direct channels-last template: blocks of {} channels do not tile the groups of {}",
             config.ocb, problem.text());
  KILN_CHECK(config.icb == problem.c, "direct channels-last template: config {} blocks C = {}",
             config.name(), problem.c);
}

std::vector<ConvConfig> nhwc_direct_configs(const ConvProblem& problem, TemplateIsa isa) {
  std::vector<ConvConfig> configs;
  // Rows outermost when every weight fits in about half of L2 (as the NCHW template decides):
  // a thread's channel blocks then share the input rows of one output row.
  const bool rows_outer = problem.m * problem.depth() * 4 <= (int64_t{1} << 20);
  std::vector<RegisterBlock> blocks;
  for (const RegisterBlock& block : register_blocks(problem, isa)) {
    if (grouped_fits(problem, block.ocb)) blocks.push_back(block);
  }
  // Grouped: the blocks that merge the fewest groups first (the fewest wasted multiply-adds).
  std::stable_sort(blocks.begin(), blocks.end(),
                   [&](const RegisterBlock& a, const RegisterBlock& b) {
                     return merged_groups(problem, a.ocb) < merged_groups(problem, b.ocb);
                   });
  for (const RegisterBlock& block : blocks) {
    for (bool outer : {rows_outer, !rows_outer}) {
      ConvConfig config;
      config.isa = block.isa;
      config.ocb = block.ocb;
      config.owb = direct_owb(problem.ow(), block.max_owb);
      config.icb = static_cast<int>(problem.c);
      config.rows_outer = outer;
      check_conv_config(config);
      if (std::find(configs.begin(), configs.end(), config) == configs.end()) {
        configs.push_back(config);
      }
    }
  }
  return configs;
}

int64_t packed_nhwc_direct_size(const ConvConfig& config, const ConvProblem& p) {
  const int64_t padded = round_up(p.m, config.ocb);
  return padded * p.kh * p.kw * block_channels(p, config.ocb) + padded;
}

int64_t nhwc_direct_weight_offset(const ConvConfig& config, const ConvProblem& p, int64_t m,
                                  int64_t t) {
  const int64_t c = t / (p.kh * p.kw), kh = t / p.kw % p.kh, kw = t % p.kw;
  const int64_t ocb = config.ocb, cb = block_channels(p, ocb);
  // The input channel's place among its block's: c within its group, after the groups the block
  // starts before it (none when the block lies inside one group).
  const int64_t cg = p.c / p.group, mg = p.m / p.group;
  const int64_t first_group = m / ocb * ocb / mg;
  const int64_t at = (m / mg - first_group) * cg + c;
  return m / ocb * (p.kh * p.kw * cb * ocb) + ((kh * p.kw + kw) * cb + at) * ocb + m % ocb;
}

int64_t nhwc_direct_bias_offset(const ConvConfig& config, const ConvProblem& p, int64_t m) {
  return round_up(p.m, config.ocb) * p.kh * p.kw * block_channels(p, config.ocb) + m;
}

std::vector<float> prepack_nhwc_direct(const ConvConfig& config, const ConvProblem& p,
                                       const float* w, const float* bias) {
  check_nhwc_direct(config, p);
  std::vector<float> packed(static_cast<size_t>(packed_nhwc_direct_size(config, p)), 0.0f);
  for (int64_t m = 0; m < p.m; ++m) {
    for (int64_t t = 0; t < p.depth(); ++t) {
      packed[static_cast<size_t>(nhwc_direct_weight_offset(config, p, m, t))] =
          w[m * p.depth() + t];
    }
    if (bias != nullptr) {
      packed[static_cast<size_t>(nhwc_direct_bias_offset(config, p, m))] = bias[m];
    }
  }
  return packed;
}

std::string render_nhwc_direct(const ConvConfig& config, const ConvProblem& problem,
                               const std::string& function_name, const TemplateEpilogue& epilogue) {
  check_nhwc_direct(config, problem);
  IndentedBuffer out;
  render_header(out, config, problem, epilogue);
  const int64_t tail = problem.ow() % config.owb;
  render_block(out, config, problem, config.owb);
  if (tail != 0) render_block(out, config, problem, static_cast<int>(tail));
  render_store_block(out, epilogue);
  render_row(out, config, problem, epilogue);
  out.line("}  // namespace");
  out.line("");
  render_entry(out, config, problem, function_name, epilogue);
  out.line("}");
  return out.str();
}

}  // namespace kiln::autotune
