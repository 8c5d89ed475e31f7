#include "autotune/winograd_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "autotune/template_text.h"
#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::autotune {
namespace {

// A Winograd form F(m x m, 3x3): m x m output tiles from (m + 2) x (m + 2) input patches. B^T
// transforms an (m + 2)-element input column or row, A^T folds m + 2 products into m outputs, and
// G (rows of C++ initializers, evaluated in double by the rendered source) transforms the weights.
struct Form {
  int m;
  std::vector<std::vector<int>> bt, at;
  std::vector<std::string> g;
  int alpha() const { return m + 2; }
};

// F(4x4, 3x3) with the points 0, 1, -1, 2, -2 and infinity (36 products per 16 outputs), and
// F(2x2, 3x3) with 0, 1, -1 and infinity (16 per 4).
const Form& form(int tile) {
  static const Form f4{
      4,
      {{4, 0, -5, 0, 1, 0},
       {0, -4, -4, 1, 1, 0},
       {0, 4, -4, -1, 1, 0},
       {0, -2, -1, 2, 1, 0},
       {0, 2, -1, -2, 1, 0},
       {0, 4, 0, -5, 0, 1}},
      {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}},
      {"{1.0 / 4, 0, 0}", "{-1.0 / 6, -1.0 / 6, -1.0 / 6}", "{-1.0 / 6, 1.0 / 6, -1.0 / 6}",
       "{1.0 / 24, 1.0 / 12, 1.0 / 6}", "{1.0 / 24, -1.0 / 12, 1.0 / 6}", "{0, 0, 1}"}};
  static const Form f2{2,
                       {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}},
                       {{1, 1, 1, 0}, {0, 1, -1, -1}},
                       {"{1, 0, 0}", "{0.5, 0.5, 0.5}", "{0.5, -0.5, 0.5}", "{0, 0, 1}"}};
  KILN_CHECK(tile == 4 || tile == 2, "winograd template: no F({0}x{0}, 3x3) form", tile);
  return tile == 4 ? f4 : f2;
}

// Each task's two copies of a tile row's m + 2 input rows live on the stack; the same budget as the
// direct template's row buffer.
constexpr int64_t kMaxRowBytes = int64_t{256} << 10;
// V and Mt, per calling thread. Channels-last, past 32 MiB (a large static batch) the direct
// template or oneDNN take the problem, as the direct template leaves a padded copy of X of that
// size to oneDNN.
constexpr int64_t kMaxBufferBytes = int64_t{256} << 20;
constexpr int64_t kMaxNhwcBufferBytes = int64_t{32} << 20;

int64_t row_width(const ConvProblem& p, int m) { return ceil_div(p.ow(), m) * m + 2; }

int64_t tile_count(const ConvProblem& p, int m) {
  return p.n * ceil_div(p.oh(), m) * ceil_div(p.ow(), m);
}

// Tiles per register block: R rows of two vectors of output channels, at most as many as the
// ISA's registers hold beside the two weight vectors and the broadcast input (AVX-512: 12 x 2 + 3
// of 32; AVX2: 6 x 2 + 3 of 16), and no more than there are tiles. The tiles are padded to a
// multiple of R, and a padded tile costs a row of multiply-adds, so R is the size, from two
// thirds of the largest to the largest, with the fewest blocks times (R + 1), the one counting
// each block's weight loads and loop: 14 x 14's 16 tiles run as 4 blocks of 4 on AVX2 (not 3 of
// 6, 18 rows) and 2 of 8 on AVX-512 (not 2 of 12, 24 rows); 28 x 28's 49 as 10 of 5 and 5 of 10.
int64_t tiles_per_block(TemplateIsa isa, const ConvProblem& p, int m) {
  const int64_t tiles = tile_count(p, m);
  const int64_t most = std::min<int64_t>(isa == TemplateIsa::kAvx512 ? 12 : 6, tiles);
  int64_t best = most;
  for (int64_t r = most; 3 * r >= 2 * most; --r) {
    if (ceil_div(tiles, r) * (r + 1) < ceil_div(tiles, best) * (best + 1)) best = r;
  }
  return best;
}

int64_t buffer_bytes(TemplateIsa isa, const ConvProblem& p, int m) {
  const int64_t padded_tiles = round_up(tile_count(p, m), tiles_per_block(isa, p, m));
  const int64_t padded_c = p.channels_last ? round_up(p.c, isa_text(isa).width) : p.c;
  const int64_t padded_m = round_up(p.m, 2 * isa_text(isa).width);
  return (m + 2) * (m + 2) * padded_tiles * (padded_c + padded_m) * 4;
}

// "4.0f * x[0] - 5.0f * x[2] + x[4]": the sum of coefficient times term over the nonzero
// coefficients; `term(i)` names the i-th term.
template <typename Row, typename Term>
std::string combination(const Row& row, Term term) {
  std::string text;
  for (size_t i = 0; i < row.size(); ++i) {
    const int k = row[i];
    if (k == 0) continue;
    const int magnitude = std::abs(k);
    const std::string product =
        magnitude == 1 ? term(i) : fmt::format("{}.0f * {}", magnitude, term(i));
    if (text.empty()) {
      text = k < 0 ? "-" + product : product;
    } else {
      text += fmt::format(" {} {}", k < 0 ? '-' : '+', product);
    }
  }
  return text;
}

void render_header(IndentedBuffer& out, TemplateIsa isa, const ConvProblem& p, const Form& f,
                   const TemplateEpilogue& epilogue) {
  const IsaText text = isa_text(isa);
  out.linef("// Kiln convolution template winograd{0} {1}: F({2}x{2}, 3x3)",
            p.channels_last ? "-nhwc" : "", isa_name(isa), f.m);
  if (p.channels_last) {
    out.linef("// Y[{}, {}, {}, {}] = epilogue({} + bias), W as it is, then the bias", p.n, p.oh(),
              p.ow(), p.m, p.text());
  } else {
    out.linef("// Y[{}, {}, {}, {}] = epilogue({} + bias), W as it is, then the bias", p.n, p.m,
              p.oh(), p.ow(), p.text());
  }
  out.linef("// epilogue: {}", epilogue.empty() ? "none" : epilogue.expr);
  out.linef("#pragma GCC target(\"{}\")", text.target);
  out.line("#include <immintrin.h>");
  out.line("");
  out.line("#include <algorithm>");
  out.line("#include <cmath>");
  out.line("#include <cstdint>");
  out.line("#include \"kiln_rt_pool.h\"");
  out.line("#include <cstring>");
  out.line("#include <map>");
  out.line("#include <mutex>");
  out.line("#include <vector>");
  out.line("");
  out.line("namespace {");
  out.line("");
  render_conv_constants(out, p);
  out.line(
      "// kTile x kTile output tiles from kAlpha x kAlpha input patches, kXi products a tile.");
  out.linef("constexpr int64_t kTile = {}, kAlpha = kTile + 2, kXi = kAlpha * kAlpha;", f.m);
  out.line("// Tiles: kTH rows of kTW, kT in all.");
  out.line(
      "constexpr int64_t kTH = (kOH + kTile - 1) / kTile, kTW = (kOW + kTile - 1) / kTile, kT = "
      "kN * kTH * kTW;");
  out.linef("// Register blocks: kR tiles by kKB output channels ({} floats a vector).",
            text.width);
  out.linef("constexpr int64_t kVW = {}, kKB = 2 * kVW, kR = {};", text.width,
            tiles_per_block(isa, p, f.m));
  out.line(
      "constexpr int64_t kTPad = (kT + kR - 1) / kR * kR, kMPad = (kM + kKB - 1) / kKB * kKB;");
  if (p.channels_last) {
    out.line("// Input channels of a tile's row of V, padded to whole vectors.");
    out.line("constexpr int64_t kCPad = (kC + kVW - 1) / kVW * kVW;");
  } else {
    out.line("// A tile row's input columns, from column -kPL: kTile per tile and 2 more.");
    out.line("constexpr int64_t kRowW = kTW * kTile + 2;");
  }
  out.line("// Channels as one vector of the input and output transforms.");
  out.linef("typedef float Vec __attribute__((vector_size({})));", text.width * 4);
  out.line("");
  out.line("inline Vec load(const float* p) {");
  out.line("    Vec v;");
  out.line("    std::memcpy(&v, p, sizeof v);");
  out.line("    return v;");
  out.line("}");
  out.line("");
}

// U[Xi][MPad / KB][C][KB] (channels past M zero) and the bias padded to MPad, per weight
// pointer: each task of pass 2 streams one contiguous C x KB strip.
void render_weight_transform(IndentedBuffer& out, const Form& f) {
  out.line("struct Transformed {");
  out.line("    std::vector<float> u, bias;");
  out.line("};");
  out.line("");
  out.line("// G g G^T of every 3x3 weight g, in double, on the first call with a weight pointer.");
  out.line("const Transformed& transformed(const float* Wp) {");
  {
    auto _ = out.scope();
    out.line("static std::mutex mutex;");
    out.line("static std::map<const float*, Transformed> known;");
    out.line("std::lock_guard<std::mutex> lock(mutex);");
    out.line("auto [it, fresh] = known.try_emplace(Wp);");
    out.line("Transformed& t = it->second;");
    out.line("if (!fresh) return t;");
    out.line("static const double G[kAlpha][3] = {");
    for (const std::string& row : f.g) out.linef("    {},", row);
    out.line("};");
    out.line("t.u.assign(kXi * kC * kMPad, 0.0f);");
    out.line("t.bias.assign(kMPad, 0.0f);");
    out.line("std::copy(Wp + kM * kC * 9, Wp + kM * kC * 9 + kM, t.bias.begin());");
    out.line("float* u = t.u.data();");
    out.line("kiln_rt::parallel_for(kM * kC >= 4096, kM, [&](int64_t lo, int64_t hi) {");
    out.line("for (int64_t k = lo; k < hi; ++k) {");
    out.line("    for (int64_t c = 0; c < kC; ++c) {");
    out.line("        const float* g = Wp + (k * kC + c) * 9;");
    out.line("        double gg[kAlpha][3];");
    out.line("        for (int a = 0; a < kAlpha; ++a) {");
    out.line("            for (int j = 0; j < 3; ++j) {");
    out.line(
        "                gg[a][j] = G[a][0] * g[j] + G[a][1] * g[3 + j] + G[a][2] * g[6 + j];");
    out.line("            }");
    out.line("        }");
    out.line("        for (int a = 0; a < kAlpha; ++a) {");
    out.line("            for (int b = 0; b < kAlpha; ++b) {");
    out.line("                const double s = gg[a][0] * G[b][0] + gg[a][1] * G[b][1] +");
    out.line("                                 gg[a][2] * G[b][2];");
    out.line(
        "                u[((a * kAlpha + b) * (kMPad / kKB) + k / kKB) * (kC * kKB) + c * kKB "
        "+");
    out.line("                  k % kKB] = static_cast<float>(s);");
    out.line("            }");
    out.line("        }");
    out.line("    }");
    out.line("}");
    out.line("});");
    out.line("return t;");
  }
  out.line("}");
  out.line("");
}

// Pass 1, one task: B^T d B of every tile of one tile row of one channel.
void render_input_transform(IndentedBuffer& out, const Form& f) {
  out.line(
      "// V[Xi][C][TPad]: B^T d B of every tile's kAlpha x kAlpha input patch d (zeros outside the "
      "image).");
  out.line(
      "void transform_input_row(const float* X, float* V, int64_t b, int64_t c, int64_t ti) {");
  {
    auto _ = out.scope();
    out.line("const float* x = X + (b * kC + c) * (kH * kW);");
    out.line("// The input columns [lo, hi) of the row buffer are inside the image.");
    out.line("constexpr int64_t lo = std::min(kPL, kRowW);");
    out.line("constexpr int64_t hi = std::max(lo, std::min(kPL + kW, kRowW));");
    out.line("alignas(64) float d[kAlpha][kRowW];");
    out.line("for (int64_t r = 0; r < kAlpha; ++r) {");
    out.line("    const int64_t ih = ti * kTile - kPT + r;");
    out.line("    if (ih < 0 || ih >= kH) {");
    out.line("        std::fill_n(d[r], kRowW, 0.0f);");
    out.line("        continue;");
    out.line("    }");
    out.line("    std::fill_n(d[r], lo, 0.0f);");
    out.line("    std::copy(x + ih * kW + (lo - kPL), x + ih * kW + (hi - kPL), d[r] + lo);");
    out.line("    std::fill(d[r] + hi, d[r] + kRowW, 0.0f);");
    out.line("}");
    out.line("// B^T down every column of the row buffer.");
    out.line("alignas(64) float e[kAlpha][kRowW];");
    out.line("#pragma omp simd");
    out.line("for (int64_t w = 0; w < kRowW; ++w) {");
    for (size_t a = 0; a < f.bt.size(); ++a) {
      out.linef("    e[{}][w] = {};", a,
                combination(f.bt[a], [](size_t r) { return fmt::format("d[{}][w]", r); }));
    }
    out.line("}");
    out.line(
        "// B^T along each tile's kAlpha columns, vectorized over the tiles of the row (whose V");
    out.line("// entries are consecutive).");
    out.line("float* v = V + c * kTPad + (b * kTH + ti) * kTW;");
    out.line("for (int64_t a = 0; a < kAlpha; ++a) {");
    {
      auto _ = out.scope();
      out.line("const float* s = e[a];");
      out.line("float* va = v + a * kAlpha * (kC * kTPad);");
      out.line("#pragma omp simd");
      out.line("for (int64_t tj = 0; tj < kTW; ++tj) {");
      for (size_t j = 0; j < f.bt.size(); ++j) {
        out.linef("    va[{} * (kC * kTPad) + tj] = {};", j, combination(f.bt[j], [](size_t i) {
                    return fmt::format("s[tj * kTile + {}]", i);
                  }));
      }
      out.line("}");
    }
    out.line("}");
  }
  out.line("}");
  out.line("");
}

// Pass 1 of the channels-last layout, one task: B^T d B of every tile of one tile row, a vector
// of input channels at a time (each pixel's channels are contiguous in X).
void render_input_transform_nhwc(IndentedBuffer& out, const Form& f) {
  out.line("// V[Xi][TPad][CPad]: B^T d B of every tile's kAlpha x kAlpha input patch d (zeros");
  out.line("// outside the image and past kC).");
  out.line("void transform_input_row(const float* X, float* V, int64_t b, int64_t ti) {");
  {
    auto _ = out.scope();
    out.line("for (int64_t tj = 0; tj < kTW; ++tj) {");
    {
      auto _ = out.scope();
      out.line("float* v = V + ((b * kTH + ti) * kTW + tj) * kCPad;");
      out.line("const int64_t ih0 = ti * kTile - kPT, iw0 = tj * kTile - kPL;");
      out.line("for (int64_t c0 = 0; c0 < kC; c0 += kVW) {");
      {
        auto _ = out.scope();
        out.line("const int64_t lanes = std::min<int64_t>(kVW, kC - c0);");
        out.line("Vec d[kAlpha][kAlpha];");
        out.line("for (int64_t r = 0; r < kAlpha; ++r) {");
        out.line("    const int64_t ih = ih0 + r;");
        out.line("    for (int64_t q = 0; q < kAlpha; ++q) {");
        out.line("        const int64_t iw = iw0 + q;");
        out.line("        Vec x = {};");
        out.line("        if (ih >= 0 && ih < kH && iw >= 0 && iw < kW) {");
        out.line("            std::memcpy(&x, X + ((b * kH + ih) * kW + iw) * kC + c0,");
        out.line("                        sizeof(float) * lanes);");
        out.line("        }");
        out.line("        d[r][q] = x;");
        out.line("    }");
        out.line("}");
        out.line("// B^T down the columns, then along the rows.");
        out.line("Vec e[kAlpha][kAlpha];");
        out.line("for (int64_t q = 0; q < kAlpha; ++q) {");
        for (size_t a = 0; a < f.bt.size(); ++a) {
          out.linef("    e[{}][q] = {};", a,
                    combination(f.bt[a], [](size_t r) { return fmt::format("d[{}][q]", r); }));
        }
        out.line("}");
        out.line("for (int64_t a = 0; a < kAlpha; ++a) {");
        {
          auto _ = out.scope();
          out.line("float* va = v + a * kAlpha * (kTPad * kCPad) + c0;");
          for (size_t j = 0; j < f.bt.size(); ++j) {
            out.linef("const Vec v{} = {};", j,
                      combination(f.bt[j], [](size_t i) { return fmt::format("e[a][{}]", i); }));
            out.linef("std::memcpy(va + {0} * (kTPad * kCPad), &v{0}, sizeof v{0});", j);
          }
        }
        out.line("}");
      }
      out.line("}");
    }
    out.line("}");
  }
  out.line("}");
  out.line("");
}

// Pass 2, one task: kR tiles by kKB output channels of one of the kXi products.
void render_multiply(IndentedBuffer& out, TemplateIsa isa, int64_t r, bool channels_last) {
  const IsaText t = isa_text(isa);
  auto acc = [](int64_t i, int v) { return fmt::format("c{}_{}", i, v); };
  out.linef("// Mt[xi][t][k] = sum_c V[xi][{}] * U[xi][c][k] for kR tiles and kKB channels.",
            channels_last ? "t][c" : "c][t");
  out.line(
      "void multiply_block(const float* U, const float* V, float* Mt, int64_t xi, int64_t kb, "
      "int64_t tb) {");
  {
    auto _ = out.scope();
    out.line("const float* u = U + (xi * (kMPad / kKB) + kb) * (kC * kKB);");
    if (channels_last) {
      out.line("const float* v = V + (xi * kTPad + tb * kR) * kCPad;");
    } else {
      out.line("const float* v = V + xi * (kC * kTPad) + tb * kR;");
    }
    for (int64_t i = 0; i < r; ++i) {
      out.linef("{0} {1} = {2}_setzero_ps(), {3} = {2}_setzero_ps();", t.vec, acc(i, 0), t.prefix,
                acc(i, 1));
    }
    // The weights come from memory: a layer's U (F(4x4): 4x the size of W, 9.4 MB at 14 x 14 x 256)
    // is read once, a strip (C x KB) at a time, by consecutive tasks (the tile blocks of one strip,
    // then the next strip, which follows it in U). So each tile block prefetches its share of the
    // next strip into L2, one row (KB floats: a 64-byte line on AVX2, two on AVX-512) every kBlocks
    // steps of C: block tb the rows [tb * kFetchRows, (tb + 1) * kFetchRows). Spread so, the
    // requests stay few in flight at a time and the next strip arrives while this one is used.
    // ResNet-50's 14 x 14 x 256 layer alone with every cache flushed before each call (AMD EPYC
    // Zen 4, 2 threads, AVX2): this pass 0.50-0.52 ms with the first tile block prefetching the
    // whole next strip, 0.40-0.41 ms spread, 0.36 with U in cache. Prefetching two strips ahead
    // measured the same as one; into L1 instead of L2, slower. The last strip's prefetches run
    // past U: they do not fault.
    out.line("constexpr int64_t kBlocks = kTPad / kR, kFetchRows = (kC + kBlocks - 1) / kBlocks;");
    out.line("const float* const fetch = u + (kC + tb * kFetchRows) * kKB;");
    out.line("const int64_t fetch_rows = std::min(kFetchRows, kC - tb * kFetchRows);");
    out.line("for (int64_t c = 0; c < kC; ++c) {");
    {
      auto _ = out.scope();
      out.line("if (c % kBlocks == 0 && c / kBlocks < fetch_rows) {");
      for (int line = 0; line < 2 * t.width * 4 / 64; ++line) {
        out.linef(
            "    _mm_prefetch(reinterpret_cast<const char*>(fetch + c / kBlocks * kKB + {}), "
            "_MM_HINT_T1);",
            line * 16);
      }
      out.line("}");
      out.linef("const {} b0 = {}_loadu_ps(u + c * kKB);", t.vec, t.prefix);
      out.linef("const {} b1 = {}_loadu_ps(u + c * kKB + kVW);", t.vec, t.prefix);
      if (!channels_last) out.line("const float* vc = v + c * kTPad;");
      for (int64_t i = 0; i < r; ++i) {
        const std::string value =
            channels_last ? fmt::format("v[{} * kCPad + c]", i) : fmt::format("vc[{}]", i);
        out.linef(
            "{{ const {0} a = {1}_set1_ps({2}); {3} = {1}_fmadd_ps(a, b0, {3}); "
            "{4} = {1}_fmadd_ps(a, b1, {4}); }}",
            t.vec, t.prefix, value, acc(i, 0), acc(i, 1));
      }
    }
    out.line("}");
    out.line("float* o = Mt + (xi * kTPad + tb * kR) * kMPad + kb * kKB;");
    for (int64_t i = 0; i < r; ++i) {
      out.linef("{0}_storeu_ps(o + {1} * kMPad, {2}); {0}_storeu_ps(o + {1} * kMPad + kVW, {3});",
                t.prefix, i, acc(i, 0), acc(i, 1));
    }
  }
  out.line("}");
  out.line("");
}

// Pass 3, one task: A^T p A of one tile, a vector of output channels at a time, then the bias and
// the epilogue as each output is stored (NCHW: a channel's rows; channels-last: a pixel's
// channels).
void render_output_transform(IndentedBuffer& out, const Form& f, const TemplateEpilogue& epilogue,
                             bool channels_last) {
  out.line("// Y: A^T p A of one tile's kXi products p, plus the bias, through the epilogue.");
  out.linef(
      "void transform_output_tile(const float* Mt, const float* bias, float* Y, int64_t t{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    out.line("const int64_t b = t / (kTH * kTW), ti = (t / kTW) % kTH, tj = t % kTW;");
    out.line("const int64_t rows = std::min<int64_t>(kTile, kOH - ti * kTile);");
    out.line("const int64_t cols = std::min<int64_t>(kTile, kOW - tj * kTile);");
    out.line("for (int64_t k0 = 0; k0 < kM; k0 += kVW) {");
    {
      auto _ = out.scope();
      out.line("Vec p[kXi];  // the tile's products, [kAlpha][kAlpha]");
      out.line(
          "for (int64_t xi = 0; xi < kXi; ++xi) p[xi] = load(Mt + (xi * kTPad + t) * kMPad + k0);");
      out.line("// A^T down the columns, then along the rows.");
      out.line("Vec s[kTile][kAlpha];");
      out.line("for (int64_t j = 0; j < kAlpha; ++j) {");
      for (size_t i = 0; i < f.at.size(); ++i) {
        out.linef("    s[{}][j] = {};", i, combination(f.at[i], [&](size_t a) {
                    return fmt::format("p[{} + j]", a * f.alpha());
                  }));
      }
      out.line("}");
      out.line("const Vec bv = load(bias + k0);");
      out.line("alignas(64) float tile[kTile * kTile][kVW];  // [row * kTile + column][channel]");
      out.line("for (int64_t i = 0; i < kTile; ++i) {");
      for (size_t j = 0; j < f.at.size(); ++j) {
        const std::string sum =
            combination(f.at[j], [](size_t k) { return fmt::format("s[i][{}]", k); });
        out.linef("    const Vec y{} = bv + {};", j, sum);
        out.linef("    std::memcpy(tile[i * kTile + {0}], &y{0}, sizeof y{0});", j);
      }
      out.line("}");
      out.line("const int64_t lanes = std::min<int64_t>(kVW, kM - k0);");
      if (channels_last) {
        out.line("for (int64_t i = 0; i < rows; ++i) {");
        out.line("    for (int64_t j = 0; j < cols; ++j) {");
        {
          auto outer = out.scope();
          auto inner = out.scope();
          out.line("const float* sums = tile[i * kTile + j];");
          render_pixel_store(out, "(b * kOH + ti * kTile + i) * kOW + tj * kTile + j", "lanes",
                             "k0", "sums", epilogue);
        }
        out.line("    }");
        out.line("}");
      } else {
        out.line("for (int64_t q = 0; q < lanes; ++q) {");
        {
          auto _ = out.scope();
          out.line("for (int64_t i = 0; i < rows; ++i) {");
          {
            auto _ = out.scope();
            out.line("const int64_t m = (b * kM + k0 + q) * kOH + ti * kTile + i;");
            out.line("(void)m;");
            out.line("float* yr = Y + m * kOW;");
            out.line("for (int64_t j = 0; j < cols; ++j) {");
            out.line("    const int64_t n = tj * kTile + j;");
            out.line("    const float v = tile[i * kTile + j][q];");
            out.linef("    yr[n] = {};", epilogue_value(epilogue));
            out.line("}");
          }
          out.line("}");
        }
        out.line("}");
      }
    }
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
  out.line("const Transformed& weights = transformed(Wp);");
  out.line("// This thread's buffers (the OpenMP threads below each see their own thread_local,");
  out.line("// so they take the pointers). Tiles past kT stay zero: no pass writes them.");
  out.linef("static thread_local std::vector<float> v_buffer(kXi * {} * kTPad);",
            p.channels_last ? "kCPad" : "kC");
  out.line("static thread_local std::vector<float> mt_buffer(kXi * kTPad * kMPad);");
  out.line("float* const V = v_buffer.data();");
  out.line("float* const Mt = mt_buffer.data();");
  out.line("const float* const U = weights.u.data();");
  out.line("const float* const bias = weights.bias.data();");
  out.line("// Threads only pay off with some work per thread.");
  out.linef("constexpr bool kParallel = {} >= (int64_t{{1}} << 18);",
            static_cast<int64_t>(p.flops() / 2));
  // Three passes on Kiln's pool (kiln_rt_pool.h), each over the caller's V and Mt.
  if (p.channels_last) {
    out.line("kiln_rt::parallel_for(kParallel, kN * kTH, [&](int64_t lo, int64_t hi) {");
    out.line("    for (int64_t row = lo; row < hi; ++row) {");
    out.line("        transform_input_row(X, V, row / kTH, row % kTH);");
    out.line("    }");
    out.line("});");
  } else {
    out.line(
        "kiln_rt::parallel_for_3d(kParallel, kN, kC, kTH, [&](int64_t b, int64_t c, "
        "int64_t ti) {");
    out.line("    transform_input_row(X, V, b, c, ti);");
    out.line("});");
  }
  out.line(
      "kiln_rt::parallel_for_3d(kParallel, kXi, kMPad / kKB, kTPad / kR, [&](int64_t xi, "
      "int64_t kb, int64_t tb) {");
  out.line("    multiply_block(U, V, Mt, xi, kb, tb);");
  out.line("});");
  out.line("kiln_rt::parallel_for(kParallel, kT, [&](int64_t lo, int64_t hi) {");
  out.line("    for (int64_t t = lo; t < hi; ++t) {");
  out.linef("        transform_output_tile(Mt, bias, Y, t{});", epilogue_call_args(epilogue));
  out.line("    }");
  out.line("});");
}

}  // namespace

bool winograd_applies(const ConvProblem& p, int tile) {
  // The channels-last input transform reads X in place (no row buffer on the stack).
  return (tile == 4 || tile == 2) && p.group == 1 && p.kh == 3 && p.kw == 3 && p.stride_h == 1 &&
         p.stride_w == 1 && p.dilation_h == 1 && p.dilation_w == 1 && p.oh() > 0 && p.ow() > 0 &&
         (p.channels_last || 2 * (tile + 2) * row_width(p, tile) * 4 <= kMaxRowBytes) &&
         std::max(buffer_bytes(TemplateIsa::kAvx2, p, tile),
                  buffer_bytes(TemplateIsa::kAvx512, p, tile)) <=
             (p.channels_last ? kMaxNhwcBufferBytes : kMaxBufferBytes);
}

std::string render_winograd(TemplateIsa isa, int tile, const ConvProblem& problem,
                            const std::string& function_name, const TemplateEpilogue& epilogue) {
  check_conv_problem(problem);
  KILN_CHECK(winograd_applies(problem, tile),
             "winograd template: {0} is not a 3x3 stride-1 convolution for F({1}x{1}, 3x3)",
             problem.text(), tile);
  const Form& f = form(tile);
  IndentedBuffer out;
  render_header(out, isa, problem, f, epilogue);
  render_weight_transform(out, f);
  if (problem.channels_last) {
    render_input_transform_nhwc(out, f);
  } else {
    render_input_transform(out, f);
  }
  render_multiply(out, isa, tiles_per_block(isa, problem, tile), problem.channels_last);
  render_output_transform(out, f, epilogue, problem.channels_last);
  out.line("}  // namespace");
  out.line("");
  render_entry(out, problem, function_name, epilogue);
  out.line("}");
  return out.str();
}

}  // namespace kiln::autotune
