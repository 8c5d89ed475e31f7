#pragma once
/// The C++ GEMM template: renders, for one configuration (GemmConfig) and one problem (N and K
/// fixed, M a run-time argument), the source of a float32 kernel
///
///   C[M, N] = epilogue(A[M, K] @ B[K, N])      (row-major, contiguous)
///
/// in the Goto / BLIS style: B is a constant weight packed once at compile time (prepack_b) into
/// the panels the micro-kernel reads; A is packed per cache block into MR-row panels on the
/// stack (or read in place); an MR x NR register-blocked micro-kernel broadcasts A and loads NR /
/// VW vectors of B per k (AVX2 + FMA, or AVX-512), and, where B exceeds 64 KiB, prefetches
/// its share of the next B panel into L2; OpenMP threads share the (M block, N block)
/// tiles. The optional epilogue is a C++ expression applied to each output element before it is
/// stored. Tested in tests/unit/autotune/gemm_template_test.cpp; benchmarked by
/// bench/gemm_bench.cpp.
///
/// The rendered function is
///
///   extern "C" void <name>(int64_t M, const float* A, const float* Bp, float* C
///                          [, const float* <epilogue argument>]...);
///
/// where Bp is prepack_b's result (any alignment) and the pointers need no alignment. The source
/// is C++17, needs OpenMP (-fopenmp; without it the kernel runs on one thread) and turns on its
/// ISA with `#pragma GCC target`, so GCC compiles an AVX-512 config under any -march (other
/// compilers need -mavx512f or -march=native); running one needs a CPU that has the ISA
/// (host_template_isa). A process that loads and unloads kernel libraries should link the OpenMP
/// runtime itself, or unloading the last library that uses it unloads it under its idle threads.

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::autotune {

/// The vector instruction set a kernel is written for.
enum class TemplateIsa {
  kAvx2,    ///< 256-bit ymm, 16 registers, FMA3
  kAvx512,  ///< 512-bit zmm, 32 registers (AVX-512F)
};

/// Floats per vector register of `isa` (8 or 16).
int vector_width(TemplateIsa isa);

/// The order of the two loops inside one (M block, N block, K block) step.
enum class GemmLoopOrder {
  /// For each NR panel of B, for each MR panel of A: the KC x NR panel of B stays in L1 and the
  /// packed A block streams from L2 (BLIS's order).
  kNrOuter,
  /// For each MR panel of A, for each NR panel of B: the KC x MR panel of A stays in L1 and the
  /// packed B block streams from L2 (better when the B block is small and M blocks are short).
  kMrOuter,
};

/// How OpenMP threads share the (M block, N block) tiles of C.
enum class GemmThreadSplit {
  kM,   ///< threads split the M blocks; each walks every N block
  kN,   ///< threads split the N blocks; each walks every M block
  kMN,  ///< threads split the tiles of both (M block major: a thread's rows are contiguous)
};

/// One point of the template's search space.
struct GemmConfig {
  TemplateIsa isa = TemplateIsa::kAvx2;
  /// Register block: MR rows of A (broadcast) by NR columns of B (NR a multiple of the vector
  /// width). Needs MR * NR / VW accumulators + NR / VW B registers + 1 broadcast register.
  int mr = 6;
  int nr = 16;
  /// Cache blocks: MC rows of A per packed block (a multiple of MR), NC columns of C per N block
  /// (a multiple of NR), KC depth per packed block.
  int mc = 96;
  int nc = 768;
  int kc = 256;
  GemmLoopOrder loop_order = GemmLoopOrder::kNrOuter;
  GemmThreadSplit thread_split = GemmThreadSplit::kMN;
  /// Pack each MC x KC block of A into MR-row panels (true), or let the micro-kernel read A in
  /// place, MR rows K apart (false: no packing pass, which pays off when N is small and A is
  /// read few times; a last panel of fewer than MR rows is still packed).
  bool pack_a = true;

  /// A short name for logs and tables, e.g. "avx2_6x16_mc96_nc768_kc256_nr-outer_mn" (with
  /// "_direct-a" when A is not packed).
  std::string name() const;
  bool operator==(const GemmConfig&) const = default;
};

/// The fixed part of the problem: the generated kernel takes M at run time.
struct GemmProblem {
  int64_t n = 0;
  int64_t k = 0;
};

/// An optional per-element epilogue: `expr` is a C++ float expression over `v` (the accumulated
/// value of C[m, n]), `m` and `n` (int64_t indices) and the pointer arguments named in `args`,
/// which the kernel takes after C as `const float*`. Example, bias then Relu:
///   {.expr = "std::max(v + bias[n], 0.0f)", .args = {"bias"}}.
/// It may call std:: functions from <algorithm> and <cmath>. An empty expr means none.
///
/// `vector_expr`, when not empty, is the same epilogue a vector at a time, for the GEMM template
/// to apply in registers: a C++ expression over `v` (a kv_t, the kernel's vector of C[m, n0 ..
/// n0 + width)), `m`, `n0` and the same arguments, through the kv_ helpers of
/// render_vector_epilogue_helpers (kv_set1, kv_load, kv_add, kv_sub, kv_mul, kv_max, kv_min,
/// kv_max_num, kv_min_num, kv_relu). Without it the template stores each tile through a scalar loop
/// on the stack.
struct TemplateEpilogue {
  std::string expr;
  std::vector<std::string> args;
  std::string vector_expr;
  bool empty() const { return expr.empty(); }
};

/// Throws InternalError when `config` is inconsistent: NR not a multiple of the vector width,
/// more registers than the ISA has, MC not a multiple of MR, NC not a multiple of NR, a non
/// positive block, or an A block too large for the stack.
void check_gemm_config(const GemmConfig& config);

/// The number of floats prepack_b produces for `problem` under `config`.
int64_t packed_b_size(const GemmConfig& config, const GemmProblem& problem);

/// Packs the row-major K x N matrix `b` into the layout the kernel of `config` reads: for each KC
/// block of K (depth kc = min(KC, K - p0)), for each NR panel of N, kc rows of NR floats, the
/// columns past N zero. The panel of (p0, j0) starts at p0 * roundup(N, NR) + j0 * kc.
std::vector<float> prepack_b(const GemmConfig& config, const GemmProblem& problem, const float* b);

/// Renders the kernel source (one translation unit defining `function_name` as extern "C").
std::string render_gemm(const GemmConfig& config, const GemmProblem& problem,
                        const std::string& function_name, const TemplateEpilogue& epilogue = {});

/// The ISA the current CPU runs best: kAvx512 when it has AVX-512F, else kAvx2.
TemplateIsa host_template_isa();

/// The candidate configs for a problem of about `m_hint` rows on `threads` threads, for `isa`
/// (both AVX2 and, when isa is kAvx512, AVX-512 register blocks). Every one passes
/// check_gemm_config; the first is gemm_default_config's choice.
std::vector<GemmConfig> gemm_configs(int64_t m_hint, const GemmProblem& problem, int threads,
                                     TemplateIsa isa);

/// The heuristic choice (no benchmarking) for the same arguments.
GemmConfig gemm_default_config(int64_t m_hint, const GemmProblem& problem, int threads,
                               TemplateIsa isa);

}  // namespace kiln::autotune
