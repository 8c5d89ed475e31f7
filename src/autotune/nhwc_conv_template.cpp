#include "autotune/nhwc_conv_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autotune/template_text.h"
#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::autotune {
namespace {

GemmProblem pointwise_gemm(const ConvProblem& p) { return {.n = p.m, .k = p.c}; }

// The depthwise template's register blocking: `pixels` output pixels of a row by `vectors`
// channel vectors, the kernel's taps of those vectors held in registers while a group of
// channels sweeps a row. AVX-512 (32 registers): 3x3 taps of two vectors (18) and 4 x 2 sums.
// AVX2 (16 registers) takes the same 4 x 2 block: its 18 taps do not fit and the compiler reads
// them from the stack as the FMAs' memory operands, which measured faster than the taps of one
// vector in registers with 5 sums (MobileNetV2's 32 channels at 112 x 112, one thread: 273 vs
// 368 us; its other layers within the noise). Larger kernels and fewer channels take one vector
// (taps that do not fit in registers spill to the stack too).
//
// The loop order (DepthwiseRowWriter): columns outside where the KH input rows an output row
// reads exceed about twice L1 and there are several groups. Measured on MobileNetV2's layers
// (AVX-512, one thread): 96 channels, 112 columns, stride 2 (129 KiB of rows): 295 us columns
// outside, 361 us groups outside; 144 x 56 and 576 x 14 (97 KiB): groups outside as fast or
// faster (59 vs 73 us); smaller rows: groups outside, by 10-20 %.
struct DepthwiseBlocking {
  int vectors;
  int pixels;
  bool columns_outside;  // DepthwiseRowWriter's loop order
};

DepthwiseBlocking depthwise_blocking(TemplateIsa isa, const ConvProblem& p) {
  const int64_t width = vector_width(isa), taps = p.kh * p.kw;
  DepthwiseBlocking blocking{1, isa == TemplateIsa::kAvx512 ? 8 : 5, false};
  if (taps <= 9 && p.m >= 2 * width) blocking = {2, 4, false};
  const int64_t row_bytes = p.kh * p.w * p.c * static_cast<int64_t>(sizeof(float));
  const int64_t groups = ceil_div(p.m, blocking.vectors * width);
  blocking.columns_outside = groups > 1 && row_bytes > 100 * 1024;
  return blocking;
}

// A run of channels one row function computes: `vectors` vectors from the channel its caller
// passes, the last with `lanes` channels (the vector width where it is full).
struct DepthwiseGroup {
  int vectors;
  int lanes;
};

// Writes the kernel's generic parts: the includes, the problem's constants and the interior
// columns (those whose taps all lie inside the image: [kOW0, kOW1)).
// `includes`: false where the unit's earlier text (the expansion's GEMM) included them.
void render_depthwise_header(IndentedBuffer& out, TemplateIsa isa, const ConvProblem& p,
                             const TemplateEpilogue& epilogue, bool includes = true) {
  const DepthwiseBlocking blocking = depthwise_blocking(isa, p);
  out.linef("// Kiln depthwise convolution template, channels-last, {}: {} pixels x {} vectors",
            isa_name(isa), blocking.pixels, blocking.vectors);
  out.linef("// Y[{}, {}, {}, {}] = epilogue({} + bias), W as [KH * KW][M], then the bias", p.n,
            p.oh(), p.ow(), p.m, p.text());
  out.linef("// epilogue: {}", epilogue.empty() ? "none" : epilogue.expr);
  out.linef("#pragma GCC target(\"{}\")", isa_text(isa).target);
  if (includes) {
    out.line("#include <immintrin.h>");
    out.line("");
    out.line("#include <algorithm>");
    out.line("#include <cmath>");
    out.line("#include <cstdint>");
    out.line("#include <vector>");
    out.line("#include \"kiln_rt_pool.h\"");
    out.line("");
  }
  out.line("namespace {");
  out.line("");
  render_conv_constants(out, p);
  // Column ow is interior when ow * SW - PL >= 0 and ow * SW - PL + (KW - 1) * DW <= W - 1.
  const int64_t ow = p.ow();
  const int64_t lo = std::min(ceil_div(p.pad_left, p.stride_w), ow);
  const int64_t last = p.w - 1 + p.pad_left - (p.kw - 1) * p.dilation_w;
  const int64_t hi = last < 0 ? lo : std::clamp(last / p.stride_w + 1, lo, ow);
  out.line("// The output columns whose taps all lie inside the image.");
  out.linef("constexpr int64_t kOW0 = {}, kOW1 = {};", lo, hi);
  out.linef("constexpr int64_t kBlocksEnd = kOW0 + (kOW1 - kOW0) / {0} * {0};", blocking.pixels);
  out.line("");
}

// The code of the row function: output row (b, oh), channel groups [g0, g1) (full groups of
// the blocking's vectors, then, where M is not a multiple of them, the rest: fewer vectors, the
// last masked), over all of the row's columns. The input rows are X's, or (`given_rows`) the
// caller passes a pointer to each of the KH input rows the output row reads, null for a row
// outside the image: the fused expansion's rows, which live in a ring of KH rows. The output row
// goes to Y's row (b, oh), or (`row_output`) to Y as a buffer of one row: the fused projection's
// input. Two loop orders:
//   groups outside: a group's taps are loaded into registers once and the group sweeps the row;
//   columns outside: each block of pixels runs through all the groups, so that a pixel's
//     channels (one contiguous run) are read together and each input row streams through once;
//     the taps are read per block (from L1: the whole [KH * KW][M] weight is small).
class DepthwiseRowWriter {
 public:
  DepthwiseRowWriter(IndentedBuffer& out, TemplateIsa isa, const ConvProblem& p,
                     const TemplateEpilogue& epilogue, DepthwiseBlocking blocking,
                     bool given_rows = false, bool row_output = false)
      : out_(out),
        isa_(isa),
        text_(isa_text(isa)),
        p_(p),
        epilogue_(epilogue),
        blocking_(blocking),
        given_rows_(given_rows),
        row_output_(row_output) {
    const int64_t block = blocking.vectors * text_.width;
    full_groups_ = p.m / block;
    const int64_t rest = p.m - full_groups_ * block;
    if (full_groups_ > 0) groups_.push_back({blocking.vectors, text_.width});
    if (rest > 0) {
      const int vectors = static_cast<int>(ceil_div(rest, text_.width));
      groups_.push_back({vectors, static_cast<int>(rest - (vectors - 1) * text_.width)});
    }
  }

  void render() {
    out_.linef(
        "inline void row({}, const float* Wp, float* Y, int64_t b, int64_t oh, int64_t g0, "
        "int64_t g1{}) {{",
        given_rows_ ? "const float* const* rows" : "const float* X", epilogue_params(epilogue_));
    {
      auto _ = out_.scope();
      if (given_rows_) {
        out_.line("// Each kernel row's input row, where it is inside the image.");
        for (int64_t kh = 0; kh < p_.kh; ++kh) {
          out_.linef("const bool in{0} = rows[{0}] != nullptr;", kh);
        }
      } else {
        out_.line(
            "// Each kernel row's input row (its offset in the image) and whether it is inside.");
        out_.line("const int64_t ih0 = oh * kSH - kPT;");
        for (int64_t kh = 0; kh < p_.kh; ++kh) {
          out_.linef("const bool in{0} = ih0 + {0} * kDH >= 0 && ih0 + {0} * kDH < kH;", kh);
          out_.linef("const int64_t row{0} = (ih0 + {0} * kDH) * kW * kC;", kh);
        }
      }
      if (blocking_.columns_outside) {
        render_columns([&](int count, bool checked) {
          for (const DepthwiseGroup& group : groups_) {
            render_groups(group, [&] {
              render_taps(group);
              render_pixels(group, count, checked);
            });
          }
        });
      } else {
        for (const DepthwiseGroup& group : groups_) {
          render_groups(group, [&] {
            render_taps(group);
            render_columns([&](int count, bool checked) { render_pixels(group, count, checked); });
          });
        }
      }
    }
    out_.line("}");
    out_.line("");
  }

 private:
  bool is_tail(const DepthwiseGroup& group, int v) const {
    return group.lanes < text_.width && v == group.vectors - 1;
  }

  std::string load(const DepthwiseGroup& group, int v, const std::string& ptr) const {
    if (!is_tail(group, v)) return fmt::format("{}_loadu_ps({})", text_.prefix, ptr);
    if (isa_ == TemplateIsa::kAvx512) return fmt::format("_mm512_maskz_loadu_ps(tail, {})", ptr);
    return fmt::format("_mm256_maskload_ps({}, tail)", ptr);
  }

  // `body` for each group of this kind in [g0, g1), with c0 its first channel.
  template <typename Body>
  void render_groups(const DepthwiseGroup& group, Body&& body) {
    const int64_t block = blocking_.vectors * text_.width;
    if (group.vectors == blocking_.vectors && group.lanes == text_.width) {
      out_.linef("for (int64_t g = g0; g < std::min<int64_t>(g1, {}); ++g) {{", full_groups_);
      auto _ = out_.scope();
      out_.linef("const int64_t c0 = g * {};", block);
      body();
    } else {
      out_.linef("if (g1 > {}) {{", full_groups_);
      auto _ = out_.scope();
      out_.linef("const int64_t c0 = {};", full_groups_ * block);
      body();
    }
    out_.line("}");
  }

  // Input row kh of the group, at channel c0 and column 0 (in the image's row only where in<kh>).
  std::string input_row(int64_t kh) const {
    return given_rows_ ? fmt::format("xr{}", kh) : fmt::format("xb + row{}", kh);
  }

  // The group's pointers (at channel c0), its lane mask, and its taps.
  void render_taps(const DepthwiseGroup& group) {
    if (given_rows_) {
      for (int64_t kh = 0; kh < p_.kh; ++kh) {
        out_.linef("const float* xr{0} = in{0} ? rows[{0}] + c0 : nullptr;", kh);
      }
    } else {
      out_.line("const float* xb = X + b * kH * kW * kC + c0;");
    }
    out_.line("const float* wp = Wp + c0;");
    out_.line("const float* bias = Wp + kKH * kKW * kM + c0;");
    out_.linef("float* yb = Y + {}c0;", row_output_ ? "" : "(b * kOH + oh) * kOW * kM + ");
    out_.line("(void)yb;");
    if (group.lanes < text_.width) {
      if (isa_ == TemplateIsa::kAvx512) {
        out_.linef("const __mmask16 tail = __mmask16(0x{:x});", (1u << group.lanes) - 1);
      } else {
        std::string lanes;
        for (int i = 0; i < text_.width; ++i) {
          lanes += (i > 0 ? ", " : "") + std::string(i < group.lanes ? "-1" : "0");
        }
        out_.linef("const __m256i tail = _mm256_setr_epi32({});", lanes);
      }
    }
    for (int64_t t = 0; t < p_.kh * p_.kw; ++t) {
      for (int v = 0; v < group.vectors; ++v) {
        out_.linef("const {} w{}_{} = {};", text_.vec, t, v,
                   load(group, v, fmt::format("wp + {} * kM + {}", t, v * text_.width)));
      }
    }
  }

  // `body(count, checked)` inside each loop over the row's columns, all with constant bounds:
  // the left edge, blocks of pixels, single interior pixels, the right edge.
  template <typename Body>
  void render_columns(Body&& body) {
    const int pixels = blocking_.pixels;
    out_.line("for (int64_t ow = 0; ow < kOW0; ++ow) {");
    body(1, true);
    out_.line("}");
    out_.linef("for (int64_t ow = kOW0; ow < kBlocksEnd; ow += {}) {{", pixels);
    body(pixels, false);
    out_.line("}");
    if (pixels > 1) {
      out_.line("for (int64_t ow = kBlocksEnd; ow < kOW1; ++ow) {");
      body(1, false);
      out_.line("}");
    }
    out_.line("for (int64_t ow = kOW1; ow < kOW; ++ow) {");
    body(1, true);
    out_.line("}");
  }

  // One block of `count` pixels from column ow: the sums start at the bias; each kernel row
  // inside the image adds its taps, column by column of the input (a column that neighbouring
  // pixels of a stride-1 block share is loaded once); `checked`: each column is also tested to
  // be inside the image (the edge columns, one pixel at a time).
  void render_pixels(const DepthwiseGroup& group, int count, bool checked) {
    auto _ = out_.scope();
    for (int q = 0; q < count; ++q) {
      for (int v = 0; v < group.vectors; ++v) {
        out_.linef("{} a{}_{} = {};", text_.vec, q, v,
                   load(group, v, fmt::format("bias + {}", v * text_.width)));
      }
    }
    out_.line("const int64_t iw0 = ow * kSW - kPL;");
    for (int64_t kh = 0; kh < p_.kh; ++kh) {
      out_.linef("if (in{}) {{", kh);
      {
        auto _ = out_.scope();
        if (checked) {
          for (int64_t kw = 0; kw < p_.kw; ++kw) {
            out_.linef("if (iw0 + {0} * kDW >= 0 && iw0 + {0} * kDW < kW) {{", kw);
            for (int v = 0; v < group.vectors; ++v) {
              out_.linef("    a0_{0} = {1}_fmadd_ps({2}, w{3}_{0}, a0_{0});", v, text_.prefix,
                         load(group, v,
                              fmt::format("{} + (iw0 + {} * kDW) * kC + {}", input_row(kh), kw,
                                          v * text_.width)),
                         kh * p_.kw + kw);
            }
            out_.line("}");
          }
        } else {
          out_.linef("const float* x = {} + iw0 * kC;", input_row(kh));
          // Input column j (from iw0) feeds pixel q's tap kw where q * SW + kw * DW == j.
          const int64_t columns = (count - 1) * p_.stride_w + (p_.kw - 1) * p_.dilation_w + 1;
          for (int64_t j = 0; j < columns; ++j) {
            std::vector<std::pair<int, int64_t>> uses;
            for (int q = 0; q < count; ++q) {
              for (int64_t kw = 0; kw < p_.kw; ++kw) {
                if (q * p_.stride_w + kw * p_.dilation_w == j) uses.emplace_back(q, kw);
              }
            }
            if (uses.empty()) continue;
            for (int v = 0; v < group.vectors; ++v) {
              out_.linef("{{ const {} x{} = {};", text_.vec, v,
                         load(group, v, fmt::format("x + {} * kC + {}", j, v * text_.width)));
              for (const auto& [q, kw] : uses) {
                out_.linef("  a{0}_{1} = {2}_fmadd_ps(x{1}, w{3}_{1}, a{0}_{1});", q, v,
                           text_.prefix, kh * p_.kw + kw);
              }
              out_.line("}");
            }
          }
        }
      }
      out_.line("}");
    }
    render_store(group, count);
  }

  // The sums of `count` pixels to Y: as they are without an epilogue, else through an aligned
  // buffer and a loop over the channels that the vectorizer runs a vector at a time.
  void render_store(const DepthwiseGroup& group, int count) {
    if (epilogue_.empty()) {
      for (int q = 0; q < count; ++q) {
        for (int v = 0; v < group.vectors; ++v) {
          const std::string ptr = fmt::format("yb + (ow + {}) * kM + {}", q, v * text_.width);
          if (!is_tail(group, v)) {
            out_.linef("{}_storeu_ps({}, a{}_{});", text_.prefix, ptr, q, v);
          } else if (isa_ == TemplateIsa::kAvx512) {
            out_.linef("_mm512_mask_storeu_ps({}, tail, a{}_{});", ptr, q, v);
          } else {
            out_.linef("_mm256_maskstore_ps({}, tail, a{}_{});", ptr, q, v);
          }
        }
      }
      return;
    }
    out_.linef("alignas(64) float sums[{}][{}];", count, group.vectors * text_.width);
    for (int q = 0; q < count; ++q) {
      for (int v = 0; v < group.vectors; ++v) {
        out_.linef("{}_store_ps(sums[{}] + {}, a{}_{});", text_.prefix, q, v * text_.width, q, v);
      }
    }
    out_.linef("for (int64_t q = 0; q < {}; ++q) {{", count);
    {
      auto _ = out_.scope();
      render_pixel_store(out_, row_output_ ? "ow + q" : "(b * kOH + oh) * kOW + ow + q",
                         std::to_string((group.vectors - 1) * text_.width + group.lanes), "c0",
                         "sums[q]", epilogue_);
    }
    out_.line("}");
  }

  IndentedBuffer& out_;
  TemplateIsa isa_;
  IsaText text_;
  const ConvProblem& p_;
  const TemplateEpilogue& epilogue_;
  DepthwiseBlocking blocking_;
  bool given_rows_;
  bool row_output_;
  int64_t full_groups_ = 0;
  std::vector<DepthwiseGroup> groups_;
};

// The entry: tasks of (output row, run of channel groups); rows alone when there are enough of
// them to share among threads, else each row's groups cut into runs (MobileNetV2's 7x7 layers).
void render_depthwise_entry(IndentedBuffer& out, TemplateIsa isa, const ConvProblem& p,
                            const std::string& function_name, const TemplateEpilogue& epilogue) {
  const DepthwiseBlocking blocking = depthwise_blocking(isa, p);
  const int64_t groups = ceil_div(p.m, blocking.vectors * vector_width(isa));
  const int64_t rows = p.n * p.oh();
  const int64_t runs = rows >= 32 ? 1 : std::min(groups, ceil_div(32, rows));
  out.linef("extern \"C\" void {}(const float* X, const float* Wp, float* Y{}) {{", function_name,
            epilogue_params(epilogue));
  auto _ = out.scope();
  out.line("// Threads only pay off with some work per thread.");
  out.linef("constexpr bool kParallel = {} > 1 && {} >= (int64_t{{1}} << 16);", rows * runs,
            static_cast<int64_t>(p.flops() / 2));
  out.linef("constexpr int64_t kGroups = {}, kRuns = {};", groups, runs);
  out.line("kiln_rt::parallel_for_2d(kParallel, kN * kOH, kRuns, [&](int64_t r, int64_t run) {");
  out.linef(
      "    row(X, Wp, Y, r / kOH, r % kOH, run * kGroups / kRuns, (run + 1) * kGroups / kRuns{});",
      epilogue_call_args(epilogue));
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
  // block of AVX-512 (MobileNetV2 projects to 16, 24 and 32 channels), and its M the pixels,
  // 49 at 7 x 7, which no block of 6, 8, 12 or 14 rows tiles. Among the configs of the register
  // blocks, each as gemm_configs first proposes it, the one whose busiest thread computes the
  // fewest elements of C, padding included (weighted as below), the default first among equals.
  // Elements of C count by the cost of their FMAs, in sixteenths:
  //   - 16 for a block of 2 or more vectors a row;
  //   - 17 for AVX2's 5 x 16 block, whose 10 accumulators take 7 loads for 10 FMAs (6 x 16: 8 for
  //     12): it goes where it saves rows, the 7 x 7 layers (49 rows, 50 as 5 x 16, 54 as 6 x 16),
  //     MobileNetV2's of which ran 4-8 % faster so (x86-64-v3 variant, AMD EPYC Zen 4, 2 threads),
  //     and not where it saves under 6 % (as the prologue of the fused 112 x 112 expansion, at
  //     0.6 % fewer rows, it ran 9 % slower);
  //   - 18 for the one-vector blocks (AVX-512's 14 x 16): a load for every FMA, where the wider
  //     blocks load B once for 2-4 FMAs. At 49 x 960 -> 320 it ran 0.22 ms against 0.17 for the
  //     7 x 48 block, which computes 20 % more columns (bench/gemm_bench.cpp, 2 threads of an
  //     Emerald Rapids Xeon);
  //   - 20 for an AVX2 block on AVX-512, whose column can cost up to twice one of a 512-bit block
  //     (on CPUs with full AVX-512 units; the same on those that split them, as AMD's EPYC).
  // So on AVX-512, 16 output channels take the 14 x 16 block (the 32 -> 16 projection at 112 x
  // 112: 0.05-0.07 ms against 0.08-0.11 as AVX2 6 x 16 and 0.09-0.12 as 12 x 32), 24 the AVX2
  // 4 x 24 block (the narrowest AVX-512 one computes 8 columns of padding), and the 7 x 7 layers
  // the 7 x 48 block (960 -> 160: 0.087 ms against 0.105 as 6 x 64; 160 -> 960: 0.060 against
  // 0.100). Where threads split the columns (fewer rows than columns), what counts is the busiest
  // thread's panels: at 960 -> 320 (7 x 7), 7 panels of 48 split 4 and 3.
  const std::vector<GemmConfig> configs =
      gemm_configs(p.n * p.h * p.w, pointwise_gemm(p), threads, isa);
  const int64_t parts = std::max(threads, 1), m = std::max<int64_t>(p.n * p.h * p.w, 1);
  auto cost = [&](const GemmConfig& config) {
    const int64_t m_blocks = ceil_div(m, config.mc);
    // Rows computed: whole M blocks, and the last one's rows rounded up to MR. Where threads split
    // the M blocks, the busiest thread's share, times the threads.
    int64_t rows = (m_blocks - 1) * config.mc + round_up(m - (m_blocks - 1) * config.mc, config.mr);
    if (config.thread_split == GemmThreadSplit::kM) {
      rows = std::min(rows, ceil_div(m_blocks, parts) * config.mc) * parts;
    }
    const int64_t panels = ceil_div(p.m, config.nr);
    const bool split_columns = config.thread_split != GemmThreadSplit::kM;
    const int64_t columns = (split_columns ? round_up(panels, parts) : panels) * config.nr;
    const int weight = config.isa != isa                                    ? 20
                       : config.nr == vector_width(isa)                     ? 18
                       : config.isa == TemplateIsa::kAvx2 && config.mr == 5 ? 17
                                                                            : 16;
    return rows * columns * weight;
  };
  // The 14 x 32 block is left to the autotuner: it holds 31 of the 32 vector registers, and at
  // the 14 x 14 layers, whose 196 rows it tiles exactly, it ran 25 % slower than 6 x 64 (64 ->
  // 384 with its Clip: 0.068 ms against 0.053, in the network).
  GemmConfig best = configs.front();
  std::vector<std::pair<int, int>> seen;
  for (const GemmConfig& config : configs) {
    const std::pair<int, int> block{config.mr, config.nr};
    if (std::find(seen.begin(), seen.end(), block) != seen.end()) continue;
    seen.push_back(block);
    if (config.isa == TemplateIsa::kAvx512 && config.mr == 14 && config.nr == 32) continue;
    if (cost(config) < cost(best)) best = config;
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
  // The same a vector at a time, where the convolution's epilogue has a vector form.
  const std::string biased_vector = "kv_add(v, kv_load(kiln_bias + n0))";
  if (epilogue.empty()) {
    biased.vector_expr = biased_vector;
  } else if (!epilogue.vector_expr.empty()) {
    biased.vector_expr = fmt::format("[&](const kv_t v) -> kv_t {{ return {}; }}({})",
                                     epilogue.vector_expr, biased_vector);
  }
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

std::string render_nhwc_pointwise_scaled(const GemmConfig& config, const ConvProblem& p,
                                         const std::string& function_name,
                                         const TemplateEpilogue& epilogue) {
  KILN_CHECK(nhwc_pointwise_applies(p) && p.n == 1,
             "pointwise template: {} is not a channels-last 1x1 of one image", p.text());
  const std::string unscaled = function_name + "_unscaled";
  std::string text = render_nhwc_pointwise(config, p, unscaled, epilogue);
  IndentedBuffer out;
  out.line("");
  out.linef("extern \"C\" void {}(const float* X, const float* Wp, const float* S, float* Y{}) {{",
            function_name, epilogue_params(epilogue));
  {
    auto _ = out.scope();
    out.line("// The packed weight with the rows of input channel k scaled by S[k] (for each KC");
    out.line("// block of K, its NR-column panels of kc rows each), then the bias.");
    out.linef("constexpr int64_t kPacked = {};", packed_b_size(config, pointwise_gemm(p)));
    out.line("static thread_local std::vector<float> scaled;");
    out.line("scaled.resize(kPacked + kN);");
    out.line("float* b = scaled.data();");
    out.line("for (int64_t p0 = 0; p0 < kK; p0 += kKC) {");
    out.line("    const int64_t kc = std::min(kKC, kK - p0);");
    out.line("    for (int64_t j = 0; j < kNPad; j += kNR) {");
    out.line("        const float* src = Wp + p0 * kNPad + j * kc;");
    out.line("        float* dst = b + p0 * kNPad + j * kc;");
    out.line("        for (int64_t k = 0; k < kc; ++k) {");
    out.line("            const float s = S[p0 + k];");
    out.line(
        "            for (int64_t x = 0; x < kNR; ++x) dst[k * kNR + x] = src[k * kNR + x] * s;");
    out.line("        }");
    out.line("    }");
    out.line("}");
    out.line("std::copy(Wp + kPacked, Wp + kPacked + kN, b + kPacked);");
    out.linef("{}(X, b, Y{});", unscaled, epilogue_call_args(epilogue));
  }
  out.line("}");
  return text + out.str();
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
  DepthwiseRowWriter(out, isa, problem, epilogue, depthwise_blocking(isa, problem)).render();
  out.line("}  // namespace");
  out.line("");
  render_depthwise_entry(out, isa, problem, function_name, epilogue);
  out.line("}");
  return out.str();
}

bool nhwc_expand_depthwise_applies(const ConvProblem& pw, const ConvProblem& dw) {
  return nhwc_pointwise_applies(pw) && nhwc_depthwise_applies(dw) && pw.n == dw.n && pw.h == dw.h &&
         pw.w == dw.w && pw.m == dw.c && dw.dilation_h == 1 && dw.stride_h <= dw.kh;
}

namespace {

// The unit of a depthwise convolution and a 1x1 convolution on the pointwise template fused into
// one function (the expansion before it, or the projection after it): `gemm`, the pointwise
// template's unit, then in namespace kiln_depthwise the depthwise row function (with
// `dw_epilogue`; reading the input rows the caller gives, or else writing a buffer of one row)
// and run(X, <weight>, Wp, Y[, `epilogue`'s arguments]), preceded by the comment lines `about`,
// whose threads each take a run [r0, r1) of the depthwise convolution's output rows and run
// `thread_body` (kBias, the pointwise bias's place in its prepared weight, kRows and kGroups at
// hand); then the extern "C" entry `function_name`, which calls run.
std::string render_depthwise_pair(const std::string& gemm, TemplateIsa isa, const ConvProblem& dw,
                                  const TemplateEpilogue& dw_epilogue, bool given_rows,
                                  const GemmConfig& pw_config, const ConvProblem& pw,
                                  const std::string& weight, const std::vector<std::string>& about,
                                  const std::string& function_name,
                                  const TemplateEpilogue& epilogue,
                                  const std::function<void(IndentedBuffer&)>& thread_body) {
  IndentedBuffer out;
  out.line("");
  out.line("namespace kiln_depthwise {");
  render_depthwise_header(out, isa, dw, dw_epilogue, /*includes=*/false);
  const DepthwiseBlocking blocking = depthwise_blocking(isa, dw);
  DepthwiseRowWriter(out, isa, dw, dw_epilogue, blocking, given_rows, /*row_output=*/!given_rows)
      .render();
  for (const std::string& line : about) out.line("// " + line);
  const std::string params =
      fmt::format("const float* X, const float* {}, const float* Wp, float* Y{}", weight,
                  epilogue_params(epilogue));
  out.linef("inline void run({}) {{", params);
  {
    auto _ = out.scope();
    out.linef("constexpr int64_t kBias = {};", packed_b_size(pw_config, pointwise_gemm(pw)));
    out.linef("constexpr int64_t kRows = kN * kOH, kGroups = {};",
              ceil_div(dw.m, blocking.vectors * vector_width(isa)));
    out.line("// Threads only pay off with some work per thread.");
    out.linef("constexpr bool kParallel = kRows > 1 && {} >= (int64_t{{1}} << 16);",
              static_cast<int64_t>((pw.flops() + dw.flops()) / 2));
    out.line("kiln_rt::parallel_threads(kParallel, [&](int64_t t, int64_t threads) {");
    {
      auto _ = out.scope();
      out.line("const int64_t r0 = t * kRows / threads, r1 = (t + 1) * kRows / threads;");
      thread_body(out);
    }
    out.line("});");
  }
  out.line("}");
  out.line("");
  out.line("}  // namespace");
  out.line("}  // namespace kiln_depthwise");
  out.line("");
  out.linef("extern \"C\" void {}({}) {{", function_name, params);
  out.linef("    kiln_depthwise::run(X, {}, Wp, Y{});", weight, epilogue_call_args(epilogue));
  out.line("}");
  return gemm + out.str();
}

}  // namespace

std::string render_nhwc_expand_depthwise(const GemmConfig& pw_config, const ConvProblem& pw,
                                         const TemplateEpilogue& pw_epilogue, TemplateIsa isa,
                                         const ConvProblem& dw, const std::string& function_name,
                                         const TemplateEpilogue& epilogue) {
  check_conv_problem(dw);
  KILN_CHECK(nhwc_expand_depthwise_applies(pw, dw),
             "expansion + depthwise template: {} does not feed {}", pw.text(), dw.text());
  // The expansion's GEMM is called a row at a time: its epilogue sees the row's pixels as m
  // from 0, so it may not read buffers by m.
  KILN_CHECK(pw_epilogue.args.empty(),
             "expansion + depthwise template: the expansion's epilogue reads buffers");
  const std::string expand = function_name + "_expand";
  const std::vector<std::string> about = {
      "Each thread takes a run of output rows. The expansion's rows it reads are computed",
      "once each, as the run reaches them, into a ring of KH rows (row ih in slot ih % KH:",
      "an output row reads KH consecutive rows, and a stride of at most KH never skips",
      "one), so they are read back from L1 or L2; only a run's first rows are computed by",
      "two threads."};
  return render_depthwise_pair(
      render_nhwc_pointwise(pw_config, pw, expand, pw_epilogue), isa, dw, epilogue,
      /*given_rows=*/true, pw_config, pw, "Wx", about, function_name, epilogue,
      [&](IndentedBuffer& out) {
        out.linef("constexpr int64_t kXC = {}, kRowFloats = kW * kC;", pw.c);
        out.line("static thread_local std::vector<float> ring;");
        out.line("ring.resize(kKH * kRowFloats);");
        out.line("const float* rows[kKH];");
        out.line("int64_t next = 0;  // the image's first input row not computed yet");
        out.line("for (int64_t r = r0; r < r1; ++r) {");
        {
          auto _ = out.scope();
          out.line("const int64_t b = r / kOH, oh = r % kOH;");
          out.line("if (oh == 0) next = 0;");
          out.line("const int64_t ih0 = oh * kSH - kPT, end = std::min(ih0 + kKH, kH);");
          out.line("for (int64_t ih = std::max(ih0, next); ih < end; ++ih) {");
          out.linef(
              "    {}_gemm(kW, X + (b * kH + ih) * kW * kXC, Wx, ring.data() + ih % kKH * "
              "kRowFloats, Wx + kBias);",
              expand);
          out.line("}");
          out.line("next = std::max(next, end);");
          out.line("for (int64_t kh = 0; kh < kKH; ++kh) {");
          out.line("    const int64_t ih = ih0 + kh;");
          out.line(
              "    rows[kh] = ih >= 0 && ih < kH ? ring.data() + ih % kKH * kRowFloats : "
              "nullptr;");
          out.line("}");
          out.linef("row(rows, Wp, Y, b, oh, 0, kGroups{});", epilogue_call_args(epilogue));
        }
        out.line("}");
      });
}

bool nhwc_depthwise_project_applies(const ConvProblem& dw, const ConvProblem& pw) {
  return nhwc_depthwise_applies(dw) && nhwc_pointwise_applies(pw) && dw.n == pw.n &&
         dw.oh() == pw.h && dw.ow() == pw.w && dw.m == pw.c;
}

std::string render_nhwc_depthwise_project(TemplateIsa isa, const ConvProblem& dw,
                                          const TemplateEpilogue& dw_epilogue,
                                          const GemmConfig& pw_config, const ConvProblem& pw,
                                          const std::string& function_name,
                                          const TemplateEpilogue& epilogue) {
  check_conv_problem(dw);
  KILN_CHECK(nhwc_depthwise_project_applies(dw, pw),
             "depthwise + projection template: {} does not feed {}", dw.text(), pw.text());
  // Both run a row at a time, their epilogues seeing the row's pixels as m from 0: they may not
  // read buffers by m.
  KILN_CHECK(dw_epilogue.args.empty() && epilogue.args.empty(),
             "depthwise + projection template: an epilogue reads buffers");
  const std::string project = function_name + "_project";
  const std::vector<std::string> about = {
      "Each thread takes a run of output rows. The depthwise convolution writes each row",
      "into a buffer of one row, which the projection's GEMM reads back from L1 at once:",
      "the depthwise output never goes to memory."};
  return render_depthwise_pair(
      render_nhwc_pointwise(pw_config, pw, project, epilogue), isa, dw, dw_epilogue,
      /*given_rows=*/false, pw_config, pw, "Wd", about, function_name, epilogue,
      [&](IndentedBuffer& out) {
        out.linef("constexpr int64_t kPM = {};", pw.m);
        out.line("static thread_local std::vector<float> row_buffer;");
        out.line("row_buffer.resize(kOW * kM);");
        out.line("for (int64_t r = r0; r < r1; ++r) {");
        out.line("    row(X, Wd, row_buffer.data(), r / kOH, r % kOH, 0, kGroups);");
        out.linef("    {}_gemm(kOW, row_buffer.data(), Wp, Y + r * kOW * kPM, Wp + kBias);",
                  project);
        out.line("}");
      });
}

}  // namespace kiln::autotune
