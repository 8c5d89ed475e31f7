#pragma once
/// Compilation of the CUDA kernels of a model in process with NVRTC, to one cubin per GPU
/// architecture, kept in the code cache (its folder's cuda/, keyed by the source, the
/// architecture and NVRTC's version). Available when Kiln was built with the CUDA toolkit
/// (KILN_WITH_CUDA); otherwise every call fails with a clear error.

#include <filesystem>
#include <string>
#include <vector>

namespace kiln::codegen {

struct CudaBinary {
  int arch = 0;       // compute capability as 10 * major + minor: 90 for sm_90
  std::string cubin;  // or, with `ptx`, the PTX text (NUL-terminated)
  bool ptx = false;   // PTX for the virtual architecture compute_<arch>: the driver compiles it
                      // for any GPU of that compute capability or newer
};

/// True when this Kiln can compile CUDA kernels: it was built with the toolkit's headers and
/// NVRTC loads.
bool nvrtc_available();

/// Why CUDA kernels cannot be compiled here, or "" when they can.
std::string nvrtc_missing();

/// The architectures to compile for: KILN_CUDA_ARCHS ("80,90"), else the GPU of this machine
/// when the CUDA driver finds one, else sm_80 and sm_90.
std::vector<int> cuda_target_archs();

/// The architectures of a library built by `kiln compile --device cuda`, whatever GPU this
/// machine has: KILN_CUDA_ARCHS, else sm_80 and sm_90.
std::vector<int> cuda_library_archs();

/// NVRTC's version ("13.0"), or "" when NVRTC is not available.
std::string nvrtc_version_text();

/// Compiles `source` (a complete CUDA unit) for each of `archs`, and with `ptx_arch` > 0 to PTX
/// for compute_<ptx_arch> too (last), or takes them from the code cache in `cache_dir` (under
/// cuda/); a compile error is an internal error quoting NVRTC's log (generated code must
/// compile).
std::vector<CudaBinary> nvrtc_compile(const std::string& source, const std::vector<int>& archs,
                                      const std::filesystem::path& cache_dir, int ptx_arch = 0);

}  // namespace kiln::codegen
