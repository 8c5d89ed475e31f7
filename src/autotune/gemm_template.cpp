#include "autotune/gemm_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "autotune/template_text.h"
#include "support/error.h"
#include "support/indented_buffer.h"

namespace kiln::autotune {
namespace {

// The generated code keeps A's packed block on each thread's stack. OpenMP worker threads get
// glibc's default thread stack (the stack rlimit, usually 8 MiB) unless OMP_STACKSIZE says
// otherwise; 512 KiB leaves room for the rest under any sensible setting.
constexpr int64_t kMaxPackedABytes = int64_t{512} << 10;

// The broadcast of one float at `ptr` into every lane.
std::string broadcast(TemplateIsa isa, const std::string& ptr) {
  if (isa == TemplateIsa::kAvx512) return fmt::format("_mm512_set1_ps(*({}))", ptr);
  return fmt::format("_mm256_broadcast_ss({})", ptr);
}

// Whether the micro-kernel applies the epilogue in registers (it has a vector form).
bool has_vector_epilogue(const TemplateEpilogue& epilogue) {
  return !epilogue.empty() && !epilogue.vector_expr.empty();
}

void render_header(IndentedBuffer& out, const GemmConfig& config, const GemmProblem& problem,
                   const TemplateEpilogue& epilogue) {
  out.linef("// Kiln GEMM template {}", config.name());
  out.linef("// C[M, {}] = epilogue(A[M, {}] @ B[{}, {}]), B prepacked into {}-column panels",
            problem.n, problem.k, problem.k, problem.n, config.nr);
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
  out.linef("constexpr int64_t kN = {};", problem.n);
  out.linef("constexpr int64_t kK = {};", problem.k);
  out.linef("constexpr int64_t kMR = {}, kNR = {};", config.mr, config.nr);
  out.linef("constexpr int64_t kMC = {}, kNC = {}, kKC = {};", config.mc, config.nc, config.kc);
  out.line("// N rounded up to NR: the row length of one packed KC block of B.");
  out.linef("constexpr int64_t kNPad = {};", round_up(problem.n, config.nr));
  out.linef("constexpr bool kHasEpilogue = {};", epilogue.empty() ? "false" : "true");
  if (has_vector_epilogue(epilogue)) {
    out.line("");
    render_vector_epilogue_helpers(out, config.isa);
  }
  out.line("");
}

void render_pack_a(IndentedBuffer& out) {
  out.line(
      "// Packs rows [i0, i0 + mc_pad) and depth [p0, p0 + kc) of A into MR-row panels: panel");
  out.line("// q holds kc steps of MR floats; rows at or past M are zero.");
  out.line(
      "inline void pack_a(int64_t M, const float* A, int64_t i0, int64_t mc_pad, int64_t p0, "
      "int64_t kc, float* Ap) {");
  {
    auto _ = out.scope();
    out.line("for (int64_t q = 0; q < mc_pad; q += kMR) {");
    {
      auto _ = out.scope();
      out.line("float* dst = Ap + q * kc;");
      out.line("for (int64_t r = 0; r < kMR; ++r) {");
      {
        auto _ = out.scope();
        out.line("const int64_t i = i0 + q + r;");
        out.line("if (i < M) {");
        out.line("    const float* src = A + i * kK + p0;");
        out.line("    for (int64_t p = 0; p < kc; ++p) dst[p * kMR + r] = src[p];");
        out.line("} else {");
        out.line("    for (int64_t p = 0; p < kc; ++p) dst[p * kMR + r] = 0.0f;");
        out.line("}");
      }
      out.line("}");
    }
    out.line("}");
  }
  out.line("}");
  out.line("");
}

// The stores of a tile that go through the stack: an edge tile, or any tile after the last K
// block when there is an epilogue. Out of line, so that what the epilogue keeps in registers
// (its constants, the bias pointer) does not take registers from the micro-kernel's FMA loop: the
// AVX2 6 x 16 block uses 15 of 16, and with a Relu6 epilogue inlined GCC spilled accumulators in
// that loop, which ran MobileNetV2's 24 -> 144 1x1 convolution at 0.26 ms against 0.13 (AMD
// EPYC, 2 threads).
void render_store_tile(IndentedBuffer& out, const TemplateEpilogue& epilogue) {
  out.linef(
      "__attribute__((noinline)) void store_tile(float* t, float* c, int64_t i0, int64_t j0, "
      "int64_t mr, int64_t nr, bool first, bool last{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    out.line("(void)i0;");
    out.line("(void)j0;");
    out.line("(void)last;");
    out.line("for (int64_t r = 0; r < mr; ++r) {");
    {
      auto _ = out.scope();
      out.line("float* cr = c + r * kN;");
      out.line("float* tr = t + r * kNR;");
      out.line("if (!first) {");
      out.line("    for (int64_t q = 0; q < nr; ++q) tr[q] += cr[q];");
      out.line("}");
      if (epilogue.empty()) {
        out.line("for (int64_t q = 0; q < nr; ++q) cr[q] = tr[q];");
      } else {
        // Separate loops for the last K block and the others, each simple enough to vectorize.
        out.line("if (last) {");
        {
          auto _ = out.scope();
          out.line("const int64_t m = i0 + r;");
          out.line("(void)m;");
          // Each element on its own: the vectorizer may run the epilogue a vector at a time
          // (kiln_simd_math.h gives it vector forms of exp, log, tanh and erf).
          out.line("#pragma omp simd");
          out.line("for (int64_t q = 0; q < nr; ++q) {");
          out.line("    const int64_t n = j0 + q;");
          out.line("    (void)n;");
          out.line("    const float v = tr[q];");
          out.linef("    cr[q] = ({});", epilogue.expr);
          out.line("}");
        }
        out.line("} else {");
        out.line("    for (int64_t q = 0; q < nr; ++q) cr[q] = tr[q];");
        out.line("}");
      }
    }
    out.line("}");
  }
  out.line("}");
  out.line("");
}

// Whether the micro-kernel prefetches the next B panel into L2. In a network the weights of a
// layer were last read a whole run ago, so with the panels the outer loop, each panel comes from
// L3 or memory in the first micro-kernel that reads it, at their speed, and from L2 in the
// others, with memory idle. Each micro-kernel of a panel (phase i / MR of the kMC / MR an M block
// holds) prefetches its share of the next panel, one 64-byte line at a time, so the next panel
// arrives while this one computes. From 64 KiB of B (prefetching at every size read the same
// within 2 % in the measurements below).
//   - B above 1 MiB (prefetching then a line per step of K): ResNet-50's 7 x 7 1x1 layers (M =
//     49, 4 MB of weights): 512 -> 2048 with the residual 0.59 -> 0.43 ms, 2048 -> 512 0.62 ->
//     0.52; MobileNetV2's 960 -> 320 0.26 -> 0.21; the decoder's vocabulary head (8 MB) -8 % (2
//     threads of an Emerald Rapids Xeon, in the network, fastest of 9 runs).
//   - Down to 64 KiB, each line requested once (a request per step of K asked for the same line
//     up to kPhases times, which cost more than it saved at AVX2: ResNet-50 -7 % on that Xeon),
//     whole networks against the 1 MiB threshold (`kiln bench --against`, 200 rounds; a
//     library against its own copy reads 0.996-1.000): on 2 cores of an Intel Xeon (2 MB L2 per
//     core) MobileNetV2 +5.9 % (AVX-512) / +1.7 % (AVX2), the 4-layer encoder +8.9 % / +5.1 %,
//     ResNet-50 +1.4 % / +0.8 %; on an AMD EPYC (Zen 4, 1 MB L2; 10 alternating rounds of
//     `kiln bench`) MobileNetV2 at AVX2 +3.5 %, ResNet-50 unchanged.
// The last panel prefetches past B's K block: prefetches do not fault.
bool prefetches_next_panel(const GemmConfig& config, const GemmProblem& problem) {
  return config.loop_order == GemmLoopOrder::kNrOuter && problem.k * problem.n * 4 > (64 << 10);
}

void render_micro_kernel(IndentedBuffer& out, const GemmConfig& config, const GemmProblem& problem,
                         const TemplateEpilogue& epilogue) {
  const bool prefetch = prefetches_next_panel(config, problem);
  const IsaText isa = isa_text(config.isa);
  const int vectors = config.nr / isa.width;
  auto acc = [](int r, int v) { return fmt::format("c{}_{}", r, v); };

  out.line(
      "// C[i0 : i0 + mr, j0 : j0 + nr] = (C +) a (kc x MR) @ b (kc x NR panel), where row r of");
  out.line(
      "// a at step p is a[r * kARow + p * kAStep] (packed: <1, kMR>; A itself: <kK, 1>). Full");
  if (has_vector_epilogue(epilogue)) {
    out.line(
        "// tiles store straight from the accumulators, through the epilogue in registers after");
    out.line("// the last K block; edge tiles go through a tile on the stack.");
  } else {
    out.line(
        "// tiles store straight from the accumulators; edge tiles and the epilogue (after the");
    out.line("// last K block) go through a tile on the stack.");
  }
  out.line("template <int64_t kARow, int64_t kAStep>");
  out.linef(
      "__attribute__((always_inline)) inline void micro_kernel(int64_t kc, const float* a, const "
      "float* b, float* C, int64_t i0, int64_t j0, int64_t mr, int64_t nr, bool first, bool "
      "last{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    for (int r = 0; r < config.mr; ++r) {
      std::string line;
      for (int v = 0; v < vectors; ++v) {
        line +=
            fmt::format("{}{} {} = {}_setzero_ps();", v ? " " : "", isa.vec, acc(r, v), isa.prefix);
      }
      out.line(line);
    }
    // Start fetching the C tile (one prefetch per 64-byte line) while the FMAs run; prefetches
    // past the end of C (edge tiles) are harmless.
    out.line("const float* c_lines = C + i0 * kN + j0;");
    for (int r = 0; r < config.mr; ++r) {
      std::string line;
      for (int l = 0; l < config.nr; l += 16) {
        line += fmt::format(
            "{}_mm_prefetch(reinterpret_cast<const char*>(c_lines + {} * kN + {}), "
            "_MM_HINT_T0);",
            l ? " " : "", r, l);
      }
      out.line(line);
    }
    // One step of K: a row of the B panel against a column of a, into the accumulators.
    auto render_step = [&] {
      for (int v = 0; v < vectors; ++v) {
        out.linef("const {} b{} = {}_loadu_ps(b + {});", isa.vec, v, isa.prefix, v * isa.width);
      }
      for (int r = 0; r < config.mr; ++r) {
        out.linef("const {} a{} = {};", isa.vec, r,
                  broadcast(config.isa, fmt::format("a + {} * kARow", r)));
        for (int v = 0; v < vectors; ++v) {
          out.linef("{} = {}_fmadd_ps(a{}, b{}, {});", acc(r, v), isa.prefix, r, v, acc(r, v));
        }
      }
      out.line("a += kAStep;");
      out.line("b += kNR;");
    };
    if (prefetch) {
      // The next panel's kc x kNR floats are shared among the kPhases micro-kernels of an M
      // block; this one requests its share a 64-byte line at a time, one line every kPfSteps
      // steps of K, so that each line is requested once.
      out.line("constexpr int64_t kPhases = (kMC + kMR - 1) / kMR;");
      out.line("constexpr int64_t kPfSteps = std::max<int64_t>(1, 16 * kPhases / kNR);");
      out.line("const float* pf = b + kc * kNR;");
      out.line("// Where in the next panel this micro-kernel's prefetches start (times kPhases).");
      out.line("const int64_t pf0 = (i0 % kMC) / kMR * kc;");
      out.line("int64_t p = 0;");
      out.line("for (; p + kPfSteps <= kc; p += kPfSteps) {");
      {
        auto _ = out.scope();
        out.line(
            "_mm_prefetch(reinterpret_cast<const char*>(pf + (pf0 + p) * kNR / kPhases), "
            "_MM_HINT_T1);");
        out.line("#pragma GCC unroll 4");
        out.line("for (int64_t q = 0; q < kPfSteps; ++q) {");
        {
          auto _ = out.scope();
          render_step();
        }
        out.line("}");
      }
      out.line("}");
      out.line("#pragma GCC unroll 4");
      out.line("for (; p < kc; ++p) {");
    } else {
      out.line("#pragma GCC unroll 4");
      out.line("for (int64_t p = 0; p < kc; ++p) {");
    }
    {
      auto _ = out.scope();
      render_step();
    }
    out.line("}");
    out.line("float* c = C + i0 * kN + j0;");
    if (has_vector_epilogue(epilogue)) {
      // The last K block of a full tile: each vector through the epilogue, then stored. The
      // epilogue is written after the FMA loop, so its constants take no registers inside it.
      out.line("if (mr == kMR && nr == kNR && last) {");
      {
        auto _ = out.scope();
        out.linef(
            "auto epilogue = [&](const kv_t v, const int64_t m, const int64_t n0) -> kv_t {{");
        out.line("    (void)m;");
        out.line("    (void)n0;");
        out.linef("    return {};", epilogue.vector_expr);
        out.line("};");
        for (int r = 0; r < config.mr; ++r) {
          for (int v = 0; v < vectors; ++v) {
            const std::string at = fmt::format("c + {} * kN + {}", r, v * isa.width);
            const std::string sum = fmt::format("first ? {0} : {1}_add_ps({1}_loadu_ps({2}), {0})",
                                                acc(r, v), isa.prefix, at);
            out.linef("{}_storeu_ps({}, epilogue({}, i0 + {}, j0 + {}));", isa.prefix, at, sum, r,
                      v * isa.width);
          }
        }
        out.line("return;");
      }
      out.line("}");
    }
    out.line("if (mr == kMR && nr == kNR && !(last && kHasEpilogue)) {");
    {
      auto _ = out.scope();
      out.line("if (first) {");
      {
        auto _ = out.scope();
        for (int r = 0; r < config.mr; ++r) {
          for (int v = 0; v < vectors; ++v) {
            out.linef("{}_storeu_ps(c + {} * kN + {}, {});", isa.prefix, r, v * isa.width,
                      acc(r, v));
          }
        }
      }
      out.line("} else {");
      {
        auto _ = out.scope();
        for (int r = 0; r < config.mr; ++r) {
          for (int v = 0; v < vectors; ++v) {
            const std::string at = fmt::format("c + {} * kN + {}", r, v * isa.width);
            out.linef("{}_storeu_ps({}, {}_add_ps({}_loadu_ps({}), {}));", isa.prefix, at,
                      isa.prefix, isa.prefix, at, acc(r, v));
          }
        }
      }
      out.line("}");
      out.line("return;");
    }
    out.line("}");
    out.line("alignas(64) float t[kMR * kNR];");
    for (int r = 0; r < config.mr; ++r) {
      for (int v = 0; v < vectors; ++v) {
        out.linef("{}_store_ps(t + {}, {});", isa.prefix, r * config.nr + v * isa.width, acc(r, v));
      }
    }
    out.linef("store_tile(t, c, i0, j0, mr, nr, first, last{});", epilogue_call_args(epilogue));
  }
  out.line("}");
  out.line("");
}

void render_tile(IndentedBuffer& out, const GemmConfig& config, const TemplateEpilogue& epilogue) {
  if (config.pack_a) {
    out.line(
        "// One (M block, N block) tile of C: every K block in turn, packing A's block first.");
  } else {
    out.line(
        "// One (M block, N block) tile of C: every K block in turn, the micro-kernel reading A");
    out.line("// in place, but for a last panel of fewer than MR rows, which is packed (zero rows");
    out.line("// past M) so that no row past M is read.");
  }
  out.linef(
      "inline void tile(int64_t M, const float* A, const float* Bp, float* C, int64_t ib, int64_t "
      "jb, float* Ap{}) {{",
      epilogue_params(epilogue));
  {
    auto _ = out.scope();
    out.line("const int64_t i0 = ib * kMC, mc = std::min(kMC, M - i0);");
    if (config.pack_a) out.line("const int64_t mc_pad = (mc + kMR - 1) / kMR * kMR;");
    out.line("const int64_t j0 = jb * kNC, nc = std::min(kNC, kN - j0);");
    out.line("for (int64_t p0 = 0; p0 < kK; p0 += kKC) {");
    {
      auto _ = out.scope();
      out.line("const int64_t kc = std::min(kKC, kK - p0);");
      out.line("const bool first = p0 == 0, last = p0 + kc == kK;");
      if (config.pack_a) {
        out.line("pack_a(M, A, i0, mc_pad, p0, kc, Ap);");
      } else {
        out.line("const int64_t mc_full = mc / kMR * kMR;");
        out.line("if (mc_full < mc) pack_a(M, A, i0 + mc_full, kMR, p0, kc, Ap);");
      }
      out.line("const float* Bblock = Bp + p0 * kNPad;");
      const std::string args = fmt::format(
          "Bblock + (j0 + j) * kc, C, i0 + i, j0 + j, std::min(kMR, mc - i), std::min(kNR, nc - "
          "j), first, last{});",
          epilogue_call_args(epilogue));
      const std::string call = config.pack_a
                                   ? "micro_kernel<1, kMR>(kc, Ap + i * kc, " + args
                                   : "if (i < mc_full) {\n"
                                     "    micro_kernel<kK, 1>(kc, A + (i0 + i) * kK + p0, " +
                                         args +
                                         "\n} else {\n"
                                         "    micro_kernel<1, kMR>(kc, Ap, " +
                                         args + "\n}";
      const char* outer = "for (int64_t j = 0; j < nc; j += kNR) {";
      const char* inner = "for (int64_t i = 0; i < mc; i += kMR) {";
      if (config.loop_order == GemmLoopOrder::kMrOuter) std::swap(outer, inner);
      out.line(outer);
      {
        auto _ = out.scope();
        out.line(inner);
        {
          auto _ = out.scope();
          out.lines(call);
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

void render_entry(IndentedBuffer& out, const GemmConfig& config, const GemmProblem& problem,
                  const std::string& function_name, const TemplateEpilogue& epilogue) {
  out.linef("extern \"C\" void {}(int64_t M, const float* A, const float* Bp, float* C{}) {{",
            function_name, epilogue_params(epilogue));
  auto _ = out.scope();
  out.line("if (M <= 0) return;");
  if (problem.k == 0) {
    // No K block runs: C is the epilogue of zero.
    out.line("(void)A;");
    out.line("(void)Bp;");
    out.line("for (int64_t m = 0; m < M; ++m) {");
    out.line("    for (int64_t n = 0; n < kN; ++n) {");
    out.line("        const float v = 0.0f;");
    out.linef("        C[m * kN + n] = {};", epilogue_value(epilogue));
    out.line("    }");
    out.line("}");
    return;
  }
  const std::string call =
      fmt::format("tile(M, A, Bp, C, ib, jb, Ap{});", epilogue_call_args(epilogue));
  out.line("const int64_t m_blocks = (M + kMC - 1) / kMC;");
  out.line("constexpr int64_t n_blocks = (kN + kNC - 1) / kNC;");
  out.line("// Threads only pay off with more than one tile and some work per thread.");
  out.line("const bool parallel = m_blocks * n_blocks > 1 && M * kN * kK >= (int64_t{1} << 18);");
  // Tiles are shared out on Kiln's pool (kiln_rt_pool.h); each chunk packs A into its own Ap.
  const char* outer = config.thread_split == GemmThreadSplit::kM   ? "m_blocks"
                      : config.thread_split == GemmThreadSplit::kN ? "n_blocks"
                                                                   : "n_blocks * m_blocks";
  out.linef("kiln_rt::parallel_for(parallel, {}, [&](int64_t kiln_lo, int64_t kiln_hi) {{", outer);
  {
    auto _ = out.scope();
    // The packed block of A (direct A packs only a short last panel).
    out.linef("alignas(64) float Ap[{} * kKC];", config.pack_a ? "kMC" : "kMR");
    switch (config.thread_split) {
      case GemmThreadSplit::kMN:
        // M blocks outermost, so that each thread computes a contiguous run of C's rows: the
        // next kernel, which shares its rows out the same way (a depthwise convolution's output
        // rows, a row-wise norm), then reads them from its own core's L2. N blocks outermost
        // left each thread a band of columns of every row. MobileNetV2 at 14 x 14 (the
        // expansion's 2 x 2 tiles): its depthwise layers 0.029 -> 0.024 ms, the network 2-3.5 %
        // faster (2 threads of an Emerald Rapids Xeon, both ISAs); the other bench-ort models
        // level.
        out.line("for (int64_t t = kiln_lo; t < kiln_hi; ++t) {");
        out.line("    const int64_t ib = t / n_blocks, jb = t % n_blocks;");
        out.line("    " + call);
        out.line("}");
        break;
      case GemmThreadSplit::kN:
        out.line("for (int64_t jb = kiln_lo; jb < kiln_hi; ++jb) {");
        out.line("    for (int64_t ib = 0; ib < m_blocks; ++ib) " + call);
        out.line("}");
        break;
      case GemmThreadSplit::kM:
        out.line("for (int64_t ib = kiln_lo; ib < kiln_hi; ++ib) {");
        out.line("    for (int64_t jb = 0; jb < n_blocks; ++jb) " + call);
        out.line("}");
        break;
    }
  }
  out.line("});");
}

const char* loop_order_name(GemmLoopOrder order) {
  return order == GemmLoopOrder::kNrOuter ? "nr-outer" : "mr-outer";
}

const char* thread_split_name(GemmThreadSplit split) {
  switch (split) {
    case GemmThreadSplit::kM:
      return "m";
    case GemmThreadSplit::kN:
      return "n";
    case GemmThreadSplit::kMN:
      return "mn";
  }
  return "?";
}

}  // namespace

int vector_width(TemplateIsa isa) { return isa == TemplateIsa::kAvx512 ? 16 : 8; }

std::string GemmConfig::name() const {
  return fmt::format("{}_{}x{}_mc{}_nc{}_kc{}_{}_{}{}", isa_name(isa), mr, nr, mc, nc, kc,
                     loop_order_name(loop_order), thread_split_name(thread_split),
                     pack_a ? "" : "_direct-a");
}

void check_gemm_config(const GemmConfig& config) {
  const int width = vector_width(config.isa);
  KILN_CHECK(config.mr > 0 && config.nr > 0 && config.mc > 0 && config.nc > 0 && config.kc > 0,
             "gemm config {}: every block must be positive", config.name());
  KILN_CHECK(config.nr % width == 0, "gemm config {}: NR must be a multiple of {}", config.name(),
             width);
  const int vectors = config.nr / width;
  const int registers = config.mr * vectors + vectors + 1;
  KILN_CHECK(registers <= register_count(config.isa),
             "gemm config {}: needs {} vector registers, {} has {}", config.name(), registers,
             isa_name(config.isa), register_count(config.isa));
  KILN_CHECK(config.mc % config.mr == 0, "gemm config {}: MC must be a multiple of MR",
             config.name());
  KILN_CHECK(config.nc % config.nr == 0, "gemm config {}: NC must be a multiple of NR",
             config.name());
  KILN_CHECK(int64_t{config.mc} * config.kc * 4 <= kMaxPackedABytes,
             "gemm config {}: the packed A block ({} bytes) is over the {} byte stack budget",
             config.name(), int64_t{config.mc} * config.kc * 4, kMaxPackedABytes);
}

int64_t packed_b_size(const GemmConfig& config, const GemmProblem& problem) {
  return problem.k * round_up(problem.n, config.nr);
}

std::vector<float> prepack_b(const GemmConfig& config, const GemmProblem& problem, const float* b) {
  check_gemm_config(config);
  const int64_t n = problem.n, k = problem.k, nr = config.nr;
  const int64_t npad = round_up(n, nr);
  std::vector<float> packed(static_cast<size_t>(packed_b_size(config, problem)), 0.0f);
  for (int64_t p0 = 0; p0 < k; p0 += config.kc) {
    const int64_t kc = std::min<int64_t>(config.kc, k - p0);
    for (int64_t j0 = 0; j0 < npad; j0 += nr) {
      float* dst = packed.data() + p0 * npad + j0 * kc;
      const int64_t width = std::min(nr, n - j0);
      for (int64_t p = 0; p < kc; ++p) {
        std::copy_n(b + (p0 + p) * n + j0, width, dst + p * nr);
      }
    }
  }
  return packed;
}

std::string render_gemm(const GemmConfig& config, const GemmProblem& problem,
                        const std::string& function_name, const TemplateEpilogue& epilogue) {
  check_gemm_config(config);
  KILN_CHECK(problem.n > 0 && problem.k >= 0,
             "gemm problem: expected N > 0 and K >= 0, found N {}, K {}", problem.n, problem.k);
  IndentedBuffer out;
  render_header(out, config, problem, epilogue);
  if (problem.k > 0) {
    render_pack_a(out);
    render_store_tile(out, epilogue);
    render_micro_kernel(out, config, problem, epilogue);
    render_tile(out, config, epilogue);
  }
  out.line("}  // namespace");
  out.line("");
  render_entry(out, config, problem, function_name, epilogue);
  out.line("}");
  return out.str();
}

TemplateIsa host_template_isa() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") ? TemplateIsa::kAvx512 : TemplateIsa::kAvx2;
}

namespace {

// One register block with the KC blocks worth trying for it.
struct RegisterBlock {
  TemplateIsa isa;
  int mr;
  int nr;
  int kc;      // the default (for most blocks a KC x NR panel of B fits a 48 KiB L1)
  int alt_kc;  // another to try: deeper (fewer passes over C) or shallower
};

std::vector<RegisterBlock> register_blocks(TemplateIsa isa, int64_t m_hint) {
  std::vector<RegisterBlock> blocks;
  if (m_hint < 4) {
    // A single row wastes the rows of a taller block; a one-row block reads B once, and reading
    // B is the whole cost. AVX-512's 1 x 64 first (4 chains of FMA, 4 lines of B per step, no
    // padding where N is a multiple of 64), then AVX2's 1 x 48 (6 chains) and 1 x 32, which
    // the default takes where 1 x 48 pads N enough (N = 256: 288 columns). Times in ms at batch 1
    // on 2 threads then 1, 1 x 64 with its rows outermost against the 1 x 48 with the next-panel
    // prefetch that came first before (kiln_gemm_bench, medians):
    //   - AMD EPYC Zen 5 VM: 1x3264x256 (bench/load's MLP) 0.018 and 0.031 against 0.025 and
    //     0.049; 1x768x3072 0.048 and 0.090 against 0.070 and 0.106; 1x2048x1000 0.052 and
    //     0.080 against 0.059 and 0.093.
    //   - Emerald Rapids Xeon VM (2 rounds): 1x3264x256 0.034 and 0.149-0.152 against 0.070
    //     and 0.167-0.176; 1x768x3072 0.225-0.253 and 0.431-0.461 against 0.360-0.442 and
    //     0.438-0.789; 1x2048x1000 0.213 and 0.381-0.412 against 0.217-0.422 and 0.393-0.423;
    //     1x3072x768 0.242-0.279 and 0.457-0.492 against 0.236-0.363 and 0.453-0.759. With
    //     the prefetch, 1 x 64 was faster than without only at 1x3072x768 on 2 threads (0.232).
    if (isa == TemplateIsa::kAvx512) blocks.push_back({TemplateIsa::kAvx512, 1, 64, 512, 1024});
    blocks.push_back({TemplateIsa::kAvx2, 1, 48, 512, 1024});
    blocks.push_back({TemplateIsa::kAvx2, 1, 32, 512, 1024});
    if (isa == TemplateIsa::kAvx512) blocks.push_back({TemplateIsa::kAvx512, 1, 96, 512, 1024});
  }
  if (isa == TemplateIsa::kAvx512) {
    // 6x64 first: the fastest or within a few percent of it at every shape of the bench on a
    // Sapphire Rapids core (its KC x NR panel of B lives in L2, which feeds it fast enough).
    blocks.push_back({TemplateIsa::kAvx512, 6, 64, 256, 128});
    blocks.push_back({TemplateIsa::kAvx512, 8, 48, 192, 320});
    blocks.push_back({TemplateIsa::kAvx512, 12, 32, 256, 384});
    blocks.push_back({TemplateIsa::kAvx512, 14, 32, 256, 384});
    // For narrow or short problems (channels-last 1x1 convolutions): 16 columns, a panel as
    // wide as one vector, and 7 rows, which tile the 49 and 196 rows of 7 x 7 and 14 x 14 images
    // with none to spare (nhwc_pointwise_config weighs them against the others).
    blocks.push_back({TemplateIsa::kAvx512, 14, 16, 384, 256});
    blocks.push_back({TemplateIsa::kAvx512, 7, 48, 192, 320});
  }
  // AVX2: 4 x 24 first (12 accumulators fed by 3 loads of B and 4 broadcasts, where 6 x 16 needs
  // 2 and 6). Timed in rounds with the weights evicted, it was the fastest at 3 of the 4 GEMM
  // shapes of a transformer encoder (M 128, d 256, FFN 1024) and within 3 % at the fourth; as
  // the default it ran the encoder and the decoder of bench/ort 6-8 % faster at AVX2 than 6 x 16
  // did (x86-64-v3 variant on an Emerald Rapids Xeon VM, 2 threads, kiln bench --against, 3
  // passes); MobileNetV2's 1x1 layers, which weigh the blocks by their padding
  // (nhwc_pointwise_config), read the same.
  blocks.push_back({TemplateIsa::kAvx2, 4, 24, 256, 384});
  blocks.push_back({TemplateIsa::kAvx2, 6, 16, 384, 256});
  blocks.push_back({TemplateIsa::kAvx2, 8, 8, 512, 256});
  // 5 x 16 tiles the 49 rows of a 7 x 7 image with one to spare (6 x 16: 5, 4 x 24: 3);
  // nhwc_pointwise_config weighs it.
  blocks.push_back({TemplateIsa::kAvx2, 5, 16, 384, 256});
  return blocks;
}

// Cache blocks for one register block: MC rows of A (A's packed block within the stack budget,
// no taller than M), and NC so that the tiles divide evenly among the threads where possible.
GemmConfig blocked_config(const RegisterBlock& block, int kc, int64_t m_hint,
                          const GemmProblem& problem, int threads) {
  GemmConfig config;
  config.isa = block.isa;
  config.mr = block.mr;
  config.nr = block.nr;
  config.kc = static_cast<int>(std::clamp<int64_t>(problem.k, 1, kc));
  // A one-row block runs its rows outermost, which at M = 1 is the same loop without the
  // next-panel prefetch (prefetches_next_panel): one row reads each panel once, in order, so
  // nothing is reused from L2 and the core's own prefetcher follows the stream.
  if (block.mr == 1) config.loop_order = GemmLoopOrder::kMrOuter;
  const int64_t m = std::max<int64_t>(m_hint, 1);
  const int64_t max_mc = kMaxPackedABytes / 4 / config.kc / block.mr * block.mr;
  int64_t mc = std::min<int64_t>(round_up(m, block.mr), std::max<int64_t>(max_mc, block.mr));
  mc = std::min<int64_t>(mc, std::max<int64_t>(block.mr, 192 / block.mr * block.mr));
  // M blocks of equal height (as many as that height needs): at M = 196 (a 14 x 14 image) blocks
  // of 192 and 4 rows gave one of two threads all the work, 0.88 ms against 0.47 at ResNet-50's
  // 1024 -> 256 1x1 convolution (blocks of 102 and 94).
  const int64_t parts = std::max(threads, 1);
  // Threads split the rows when A (M x K) is larger than B (K x N), as in a network's
  // convolutions at 14 x 14 and more: each thread then reads the rows of A it wrote itself as the
  // previous layer's output (the pool gives a thread the same part of every loop), and all of
  // B. Splitting the columns instead would have each thread read all of A, half of it from the
  // other thread's cache. A chain of eight of ResNet-50's 28 x 28 1x1 convolutions: 3.74-3.94 ms
  // against 3.87-4.25 (AMD EPYC, 2 threads).
  const bool split_rows = m > problem.n;
  const int64_t blocks_wanted = split_rows ? round_up(ceil_div(m, mc), parts) : ceil_div(m, mc);
  mc = round_up(ceil_div(m, blocks_wanted), block.mr);
  config.mc = static_cast<int>(mc);
  const int64_t m_blocks = ceil_div(m, mc);
  if (split_rows) config.thread_split = GemmThreadSplit::kM;
  // Else one N block per thread when N is wide enough (each thread then streams its own part of
  // B, which stays in its own L2: measured 10% faster than sharing all of B at 1024^3 on 2
  // cores), else as many as make the tile count a multiple of the thread count. With N blocks
  // outermost, the pool's contiguous parts hand each thread whole N blocks.
  const int64_t want_n_blocks = split_rows ? 1
                                : problem.n >= parts * 4 * block.nr
                                    ? parts
                                    : parts / std::gcd<int64_t>(m_blocks, parts);
  int64_t nc = round_up(ceil_div(problem.n, std::max<int64_t>(want_n_blocks, 1)), block.nr);
  // Keep a B block (KC x NC) within a few MiB so it stays in the shared cache across M blocks.
  const int64_t max_nc = std::max<int64_t>(block.nr, (int64_t{4} << 20) / 4 / config.kc);
  if (nc > max_nc) nc = round_up(ceil_div(problem.n, ceil_div(problem.n, max_nc)), block.nr);
  config.nc = static_cast<int>(nc);
  // Reading A in place measured as fast as packing it or faster at every shape of
  // bench/gemm_bench.cpp on a Sapphire Rapids core (1.5x at 3136x576x64, where an N block has a
  // single panel and packing is not amortized); packed A stays among the candidates.
  config.pack_a = false;
  return config;
}

// Multiply-adds of the busiest thread under `config`, the padding of short tiles included: the
// generated entry shares its tasks (M x N blocks, M blocks outermost, or whole N or M blocks) out
// on the pool, each thread a contiguous part of them.
int64_t busiest_thread_work(const GemmConfig& config, int64_t m, const GemmProblem& problem,
                            int threads) {
  const int64_t m_blocks = ceil_div(m, config.mc), n_blocks = ceil_div(problem.n, config.nc);
  auto rows = [&](int64_t ib) {
    return round_up(std::min<int64_t>(config.mc, m - ib * config.mc), config.mr);
  };
  auto columns = [&](int64_t jb) {
    return round_up(std::min<int64_t>(config.nc, problem.n - jb * config.nc), config.nr);
  };
  int64_t all_rows = 0, all_columns = 0;
  for (int64_t ib = 0; ib < m_blocks; ++ib) all_rows += rows(ib);
  for (int64_t jb = 0; jb < n_blocks; ++jb) all_columns += columns(jb);
  auto task_work = [&](int64_t t) {
    switch (config.thread_split) {
      case GemmThreadSplit::kMN:
        return rows(t / n_blocks) * columns(t % n_blocks);
      case GemmThreadSplit::kN:
        return all_rows * columns(t);
      case GemmThreadSplit::kM:
        return rows(t) * all_columns;
    }
    return int64_t{0};
  };
  const int64_t tasks = config.thread_split == GemmThreadSplit::kMN  ? m_blocks * n_blocks
                        : config.thread_split == GemmThreadSplit::kN ? n_blocks
                                                                     : m_blocks;
  // The entry's own test for running on one thread.
  const bool parallel = m_blocks * n_blocks > 1 && m * problem.n * problem.k >= (int64_t{1} << 18);
  const int64_t parts = parallel ? std::clamp<int64_t>(threads, 1, tasks) : 1;
  int64_t busiest = 0;
  for (int64_t part = 0; part < parts; ++part) {
    int64_t work = 0;
    for (int64_t t = tasks * part / parts; t < tasks * (part + 1) / parts; ++t)
      work += task_work(t);
    busiest = std::max(busiest, work);
  }
  return busiest * problem.k;
}

}  // namespace

std::vector<GemmConfig> gemm_configs(int64_t m_hint, const GemmProblem& problem, int threads,
                                     TemplateIsa isa) {
  std::vector<GemmConfig> configs;
  auto add = [&](const GemmConfig& config) {
    check_gemm_config(config);
    if (std::find(configs.begin(), configs.end(), config) == configs.end()) {
      configs.push_back(config);
    }
  };
  const std::vector<RegisterBlock> blocks = register_blocks(isa, m_hint);
  // The default first: the first register block at its default KC, or the second (of the same ISA,
  // or a one-row block of either) where its busiest thread computes at least 5 % fewer
  // multiply-adds: a one-row product of N = 32 takes AVX2's 1 x 48 over AVX-512's 1 x 64, which
  // pads it to 64 columns. The blocks' columns can split unevenly: at a
  // transformer's N = 256 on 2 threads, AVX2's 4 x 24 block leaves one thread 6 of the 11 panels
  // (144 columns against 112), where 6 x 16 gives each 8; the encoder's two 128 x 256 x 256 and
  // 128 x 1024 x 256 products ran 0.084 and 0.335 ms as 6 x 16, 0.090 and 0.366 as 4 x 24
  // (`--autotune max`, AMD EPYC Zen 4).
  const int64_t m = std::max<int64_t>(m_hint, 1);
  GemmConfig first = blocked_config(blocks.front(), blocks.front().kc, m_hint, problem, threads);
  if (blocks.size() > 1 && (blocks[1].isa == blocks.front().isa || blocks[1].mr == 1)) {
    const GemmConfig second = blocked_config(blocks[1], blocks[1].kc, m_hint, problem, threads);
    if (busiest_thread_work(second, m, problem, threads) * 20 <
        busiest_thread_work(first, m, problem, threads) * 19) {
      first = second;
    }
  }
  add(first);
  for (const RegisterBlock& block : blocks) {
    GemmConfig config = blocked_config(block, block.kc, m_hint, problem, threads);
    add(config);
    add(blocked_config(block, block.alt_kc, m_hint, problem, threads));
    GemmConfig other_order = config;
    other_order.loop_order = config.loop_order == GemmLoopOrder::kNrOuter ? GemmLoopOrder::kMrOuter
                                                                          : GemmLoopOrder::kNrOuter;
    add(other_order);
    GemmConfig other_a = config;
    other_a.pack_a = !config.pack_a;
    add(other_a);
  }
  // Other thread splits of the default, with blocks that give every thread work: M blocks of
  // about M / threads rows, or N blocks of about N / threads columns.
  const int64_t parts = std::max(threads, 1);
  GemmConfig split_m = first;
  split_m.thread_split = GemmThreadSplit::kM;
  split_m.mc =
      static_cast<int>(std::min<int64_t>(first.mc, round_up(ceil_div(m, parts), first.mr)));
  add(split_m);
  GemmConfig split_n = first;
  split_n.thread_split = GemmThreadSplit::kN;
  split_n.nc = static_cast<int>(round_up(ceil_div(problem.n, parts), first.nr));
  add(split_n);
  // A taller A block (fewer passes over each B block) when M has room for it.
  GemmConfig tall = first;
  tall.mc = first.mc * 2;
  if (m >= 2 * tall.mc && int64_t{tall.mc} * tall.kc * 4 <= kMaxPackedABytes) add(tall);
  return configs;
}

GemmConfig gemm_default_config(int64_t m_hint, const GemmProblem& problem, int threads,
                               TemplateIsa isa) {
  return gemm_configs(m_hint, problem, threads, isa).front();
}

}  // namespace kiln::autotune
