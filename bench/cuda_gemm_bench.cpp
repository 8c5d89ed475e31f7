// kiln_cuda_gemm_bench: Kiln's tensor-core GEMM template (codegen/cuda/cuda_gemm_template.h)
// against cuBLASLt on the products of BERT-base at sequence 128 (M 128: the attention's
// projections 768x768, the feed-forward's 768x3072 with bias and Gelu and 3072x768 with bias and
// the residual, the concatenated Q/K/V 768x2304) and ResNet-50's classifier (M 1, 2048x1000, a
// Gemm with B as [N][K]), at TF32 and float16. Both run through kiln_rt_cuda.h's
// RunState::matmul with the same epilogue: cuBLASLt with its heuristic's first algorithm, the
// template with each of its choices (configuration, split-K or not). Each is timed with CUDA
// events over 200 calls after 20 of warm-up; it prints TFLOP/s and the ratio of the template's
// best to cuBLASLt's time. It asserts nothing. Without a GPU it prints
// "skipped: no CUDA device".
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "codegen/cuda/cuda_gemm_template.h"
#include "codegen/cuda/cuda_kernel.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "runtime/kiln_half.h"
#include "runtime/kiln_rt_cuda.h"

#ifndef KILN_BENCH_CACHE_DIR
#define KILN_BENCH_CACHE_DIR "bench-cache"
#endif

namespace {

using kiln::codegen::CudaGemmPrecision;
using kiln_cuda::Epilogue;

struct Problem {
  const char* name;
  int64_t m, n, k;
  bool b_nk;
  Epilogue epilogue;
  bool residual;
};

constexpr int kWarmup = 20, kCalls = 200;

/// Milliseconds per call of `call`, timed with events on the run state's stream.
template <typename F>
double time_ms(kiln_cuda::RunState& state, F call) {
  kiln_cuda::Driver& d = kiln_cuda::driver();
  for (int i = 0; i < kWarmup; ++i) call();
  kiln_cuda::CUevent start = nullptr, stop = nullptr;
  kiln_cuda::check(d.cuEventCreate(&start, 0), "event");
  kiln_cuda::check(d.cuEventCreate(&stop, 0), "event");
  kiln_cuda::check(d.cuEventRecord(start, state.stream()), "event");
  for (int i = 0; i < kCalls; ++i) call();
  kiln_cuda::check(d.cuEventRecord(stop, state.stream()), "event");
  kiln_cuda::check(d.cuEventSynchronize(stop), "event");
  float ms = 0;
  kiln_cuda::check(d.cuEventElapsedTime(&ms, start, stop), "event");
  d.cuEventDestroy(start);
  d.cuEventDestroy(stop);
  return ms / kCalls;
}

template <typename T>
void bench(CudaGemmPrecision precision, const std::vector<Problem>& problems) {
  const std::vector<kiln::codegen::CudaBinary> binaries = kiln::codegen::nvrtc_compile(
      kiln::codegen::cuda_kernel_prelude() + kiln::codegen::cuda_gemm_template_source({precision}),
      kiln::codegen::cuda_target_archs(), KILN_BENCH_CACHE_DIR);
  std::vector<kiln_cuda::Cubin> cubins;
  for (const auto& b : binaries)
    cubins.push_back({b.arch, reinterpret_cast<const unsigned char*>(b.cubin.data()), b.ptx});
  const char* const names[] = {nullptr};
  kiln_cuda::RunState state;
  state.reserve_library_workspace();
  state.begin_run(cubins.data(), cubins.size(), names, 1);
  const bool half = std::is_same_v<T, uint16_t>;
  int site = 0;
  for (const Problem& p : problems) {
    const int64_t a_n = p.m * p.k, b_n = p.k * p.n, o_n = p.m * p.n;
    const int64_t bytes = (a_n + b_n + 2 * o_n + p.n + 4 * 64) * static_cast<int64_t>(sizeof(T));
    char* arena = state.arena(bytes);
    T* a = reinterpret_cast<T*>(arena);
    T* b = a + (a_n + 63) / 64 * 64;
    T* bias = b + (b_n + 63) / 64 * 64;
    T* residual = bias + (p.n + 63) / 64 * 64;
    T* out = residual + (o_n + 63) / 64 * 64;
    std::vector<T> host(static_cast<size_t>(a_n + b_n + 2 * o_n + p.n + 4 * 64));
    for (size_t i = 0; i < host.size(); ++i) {
      const float v = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
      if constexpr (half) {
        host[i] = kiln::float_to_half(v);
      } else {
        host[i] = v;
      }
    }
    kiln_cuda::check(kiln_cuda::driver().cuMemcpyHtoDAsync(kiln_cuda::device_ptr(a), host.data(),
                                                           host.size() * sizeof(T), state.stream()),
                     "upload");
    const int64_t sizes[] = {p.m, p.n}, a_strides[] = {p.k, 1};
    const int64_t b_strides[] = {p.b_nk ? 1 : p.n, p.b_nk ? p.k : 1}, out_strides[] = {p.n, 1};
    const kiln_cuda::MatMulShape shape{2, sizes, p.k, a_strides, b_strides, out_strides};
    auto run = [&](int s) {
      state.matmul<T>(s, shape, a, b, out, 1.0, p.epilogue, bias, p.residual ? residual : nullptr,
                      true, p.name);
    };
    const double flops = 2.0 * static_cast<double>(p.m * p.n * p.k);
    const int blas_site = site++;
    const double blas_ms = time_ms(state, [&] { run(blas_site); });
    fmt::print("{:5} {:24} M {:4} N {:5} K {:5}  cuBLASLt        {:8.4f} ms {:7.2f} TFLOP/s\n",
               kiln::codegen::cuda_gemm_precision_name(precision), p.name, p.m, p.n, p.k, blas_ms,
               flops / blas_ms * 1e-9);
    double best = 0;
    int best_choice = -1;
    for (int choice = 0; choice < kiln_cuda::kGemmTemplateChoices; ++choice) {
      const int s = site++;
      state.gemm_template_choice(s, choice, kiln_cuda::kGemmTemplateVersion);
      run(s);
      if (state.gemm_template_ran(s) != choice) continue;  // split-K where the shape splits
      const double ms = time_ms(state, [&] { run(s); });
      const kiln_cuda::GemmConfig& c = kiln_cuda::kGemmConfigs[choice / 2];
      fmt::print("{:5} {:24} {:27} template {:3}x{:3}{:8} {:8.4f} ms {:7.2f} TFLOP/s\n", "", "", "",
                 c.bm, c.bn, choice % 2 ? " split-K" : "", ms, flops / ms * 1e-9);
      if (best_choice < 0 || ms < best) {
        best = ms;
        best_choice = choice;
      }
    }
    fmt::print("{:5} {:24} template's best (choice {}) / cuBLASLt: {:.2f}x the time\n",
               kiln::codegen::cuda_gemm_precision_name(precision), p.name, best_choice,
               best / blas_ms);
  }
  state.synchronize("gemm bench");
  state.end_run();
}

}  // namespace

int main() {
  // What the driver reports, as a model library checks it when it loads.
  if (kiln_cuda::report_driver(kiln_cuda::DeviceNeeds{}).devices == 0) {
    fmt::print("skipped: no CUDA device\n");
    return 0;
  }
  const std::vector<Problem> problems = {
      {"bert attention out", 128, 768, 768, false, Epilogue::kBias, true},
      {"bert qkv (concat)", 128, 2304, 768, false, Epilogue::kBias, false},
      {"bert ffn1 gelu", 128, 3072, 768, false, Epilogue::kGeluBias, false},
      {"bert ffn2", 128, 768, 3072, false, Epilogue::kBias, true},
      {"resnet50 fc (Gemm, B^T)", 1, 1000, 2048, true, Epilogue::kBias, false},
  };
  bench<float>(CudaGemmPrecision::kTf32, problems);
  bench<uint16_t>(CudaGemmPrecision::kF16, problems);
  return 0;
}
