#pragma once
/// CUDA library choices in the autotune cache (issue 18, item 3): which of cuBLASLt's heuristic
/// algorithms runs a matrix product, and which of cuDNN's engines a convolution.
///
/// Timing happens on the GPU, in the run state of a model built with `--autotune max`
/// (kiln_rt_cuda.h RunState::time_candidates): each new product plan times the first 8
/// algorithms of cuBLASLt's heuristic, each new convolution plan the first 4 engines
/// make_conv_plan accepts, with CUDA events (one warm-up run, then the median of 5), and with
/// $KILN_CUDA_TUNE_REPORT set appends one line per problem to that file. The driver
/// (`kiln run --device cuda --autotune max`, `kiln compile --device cuda --autotune max` on a
/// machine with a GPU) reads that report into the autotune cache (store_cuda_tune_report).
///
/// An entry's key names the library, the problem (the text kiln_rt_cuda.h's matmul_problem_text
/// or conv_problem_text writes: dtypes, precision, epilogue, sizes, strides, layout), the GPU's
/// name and compute capability, the library's version and Kiln's version; its choices are
/// "algo <i>" / "engine <i>" with their median times (or "failed"); the GEMM template's choices,
/// timed in the same run, are a "kiln_gemm" entry of the same problem with "config <i>" choices.
/// Codegen looks a call site's problem up (lookup_cuda_library_choice) and bakes the fastest index
/// and the library version into the wrapper (state.cuda.library_choice), so that a library compiled
/// on a machine without a GPU, from a cache copied from one with the GPU, runs the same algorithms.
/// At run time a choice for another library version, or an index the library no longer lists, falls
/// back to the heuristic's first with one note on stderr. Tested in
/// tests/unit/autotune/cuda_choice_test.cpp.
///
/// Library "kiln" holds the launch configurations of Kiln's own reduction kernels
/// (codegen/cuda/cuda_kernel.h): the problem is the kernel's launch_problem, the choices are
/// "config <i>" (an index among the configurations Kiln generates for it), the version is
/// NVRTC's (1000 * major + 10 * minor); codegen builds the chosen configuration alone
/// (CudaCodegen::generate_kernel), and an index past the kernel's configurations is ignored
/// with a warning.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "autotune/cache.h"

namespace kiln::autotune {

/// A cached choice for one library call: the index among the library's candidates, the library
/// version it was timed with, and the GPU (name, compute capability as 10 * major + minor).
struct CudaLibraryChoice {
  int index = 0;
  int64_t version = 0;
  std::string gpu;
  int arch = 0;
  double ms = 0;
  bool operator==(const CudaLibraryChoice&) const = default;
};

/// The key of one problem of `library` ("cublaslt", "cudnn", "kiln" for the launch
/// configurations of Kiln's own kernels, or "kiln_gemm" for Kiln's GEMM template, whose version
/// is kiln_rt_cuda.h's kGemmTemplateVersion) on one GPU and library
/// version.
nlohmann::json cuda_library_cache_key(const std::string& library, const std::string& problem,
                                      const std::string& gpu, int arch, int64_t version);

/// Stores each line of the tuning report at `report` (RunState::report_tuning's lines) in
/// `cache`; returns the number of lines stored. A line that is not such a report line is a
/// UserError naming the file and line.
size_t store_cuda_tune_report(const std::filesystem::path& report, const AutotuneCache& cache);

/// The fastest valid choice `cache` holds for `library`'s `problem` on GPU `gpu` (any GPU when
/// empty, if the cache holds the problem for only one; the newest library version when it holds
/// several), or nothing. An entry whose choices are not "algo <i>" / "engine <i>" with a time
/// is ignored with a warning on stderr naming the cache and the problem.
std::optional<CudaLibraryChoice> lookup_cuda_library_choice(const AutotuneCache& cache,
                                                            const std::string& library,
                                                            const std::string& problem,
                                                            const std::string& gpu);

/// True when `cache` holds an entry of `library` ("kiln_gemm": Kiln's GEMM template, timed
/// beside cuBLASLt) for this Kiln: a compile then carries the template's kernels.
bool cache_has_library(const AutotuneCache& cache, const std::string& library);

/// The GPU library choices are looked up for: $KILN_AUTOTUNE_GPU (a name as the cache holds
/// it, e.g. "NVIDIA H100 80GB HBM3"), else the name of this machine's GPU 0, else "" (a build
/// machine without a GPU: whichever single GPU the cache holds the problem for).
std::string cuda_autotune_gpu();

}  // namespace kiln::autotune
