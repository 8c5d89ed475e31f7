#include "codegen/cuda/nvrtc_compile.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "codecache/code_cache.h"
#include "codegen/cpp/cpp_kernel.h"
#include "codegen/cuda/nvrtc_headers.h"
#include "support/error.h"
#include "support/files.h"
#include "support/hash.h"
#include "support/log.h"

#if KILN_WITH_CUDA
#include <nvrtc.h>
#endif

namespace kiln::codegen {

namespace fs = std::filesystem;

namespace {

/// The compute capability of device 0 through the driver (loaded at run time, as the wrappers
/// do), or 0 without a driver or a GPU.
int local_gpu_arch() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 0;
  using Init = int (*)(unsigned);
  using Get = int (*)(int*, int);
  using Attribute = int (*)(int*, int, int);
  auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  auto get = reinterpret_cast<Get>(dlsym(lib, "cuDeviceGet"));
  auto attribute = reinterpret_cast<Attribute>(dlsym(lib, "cuDeviceGetAttribute"));
  int device = 0, major = 0, minor = 0;
  if (init == nullptr || get == nullptr || attribute == nullptr || init(0) != 0 ||
      get(&device, 0) != 0 || attribute(&major, 75, device) != 0 ||
      attribute(&minor, 76, device) != 0) {
    return 0;
  }
  return 10 * major + minor;
}

#if KILN_WITH_CUDA
/// NVRTC, loaded at its first use (KILN_NVRTC_LIBRARY, the soname of the toolkit Kiln was built
/// with), so that the kiln binary starts, and compiles for the CPU, on a machine without the
/// CUDA toolkit.
struct Nvrtc {
  bool loaded = false;
  decltype(&::nvrtcGetErrorString) GetErrorString = nullptr;
  decltype(&::nvrtcVersion) Version = nullptr;
  decltype(&::nvrtcCreateProgram) CreateProgram = nullptr;
  decltype(&::nvrtcCompileProgram) CompileProgram = nullptr;
  decltype(&::nvrtcGetProgramLogSize) GetProgramLogSize = nullptr;
  decltype(&::nvrtcGetProgramLog) GetProgramLog = nullptr;
  decltype(&::nvrtcGetCUBINSize) GetCUBINSize = nullptr;
  decltype(&::nvrtcGetCUBIN) GetCUBIN = nullptr;
  decltype(&::nvrtcGetPTXSize) GetPTXSize = nullptr;
  decltype(&::nvrtcGetPTX) GetPTX = nullptr;
  decltype(&::nvrtcDestroyProgram) DestroyProgram = nullptr;
};

const Nvrtc& nvrtc() {
  static const Nvrtc api = [] {
    Nvrtc n;
    void* lib = dlopen(KILN_NVRTC_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return n;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    n.loaded = get(n.GetErrorString, "nvrtcGetErrorString") && get(n.Version, "nvrtcVersion") &&
               get(n.CreateProgram, "nvrtcCreateProgram") &&
               get(n.CompileProgram, "nvrtcCompileProgram") &&
               get(n.GetProgramLogSize, "nvrtcGetProgramLogSize") &&
               get(n.GetProgramLog, "nvrtcGetProgramLog") &&
               get(n.GetCUBINSize, "nvrtcGetCUBINSize") && get(n.GetCUBIN, "nvrtcGetCUBIN") &&
               get(n.GetPTXSize, "nvrtcGetPTXSize") && get(n.GetPTX, "nvrtcGetPTX") &&
               get(n.DestroyProgram, "nvrtcDestroyProgram");
    return n;
  }();
  return api;
}

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) internal_error("NVRTC: {}: {}", what, nvrtc().GetErrorString(r));
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtc().Version(&major, &minor), "nvrtcVersion");
  return fmt::format("{}.{}", major, minor);
}

/// The kernels NVRTC's errors fall in: for each "kernels.cu(LINE): error" of `log`, the name of
/// the last __global__ function that starts at or before LINE of `source` ("the prelude" before
/// the first), each once, in the log's order.
std::string kernels_with_errors(const std::string& source, const std::string& log) {
  std::vector<std::string> starts;  // per source line (1-based at index 1): the kernel it is in
  starts.push_back("");
  std::string current = "the prelude";
  std::istringstream lines(source);
  for (std::string line; std::getline(lines, line);) {
    size_t global = line.find("__global__");
    if (global != std::string::npos) {
      size_t paren = line.find('(', global);
      size_t begin = line.rfind(' ', paren == std::string::npos ? line.size() : paren);
      if (paren != std::string::npos && begin != std::string::npos && begin > global)
        current = line.substr(begin + 1, paren - begin - 1);
    }
    starts.push_back(current);
  }
  std::vector<std::string> names;
  const std::string marker = "kernels.cu(";
  for (size_t at = log.find(marker); at != std::string::npos; at = log.find(marker, at + 1)) {
    size_t close = log.find(')', at);
    if (close == std::string::npos || log.compare(close, 9, "): error:") != 0) continue;
    size_t line = std::strtoul(log.c_str() + at + marker.size(), nullptr, 10);
    if (line == 0 || line >= starts.size()) continue;
    if (std::find(names.begin(), names.end(), starts[line]) == names.end())
      names.push_back(starts[line]);
  }
  if (names.empty()) return "(no error line names a kernel)";
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

/// The cubin of `source` for sm_`arch`, or with `ptx` its PTX for the virtual architecture
/// compute_`arch` (NUL-terminated, as cuModuleLoadData takes it).
std::string compile_one(const std::string& source, int arch, bool ptx) {
  const auto& headers = nvrtc_std_headers();
  std::vector<const char*> names, contents;
  for (const auto& [name, content] : headers) {
    names.push_back(name.c_str());
    contents.push_back(content.c_str());
  }
  nvrtcProgram program = nullptr;
  check_nvrtc(
      nvrtc().CreateProgram(&program, source.c_str(), "kernels.cu",
                            static_cast<int>(headers.size()), contents.data(), names.data()),
      "nvrtcCreateProgram");
  const std::string gpu = fmt::format("--gpu-architecture={}_{}", ptx ? "compute" : "sm", arch);
  const std::string include = "-I" + cpp_runtime_include_dir().string();
  // -default-device: the runtime's scalar helpers (plain inline functions) become device code.
  const char* options[] = {gpu.c_str(), include.c_str(), "-default-device", "-std=c++17",
                           "--fmad=false"};
  nvrtcResult result = nvrtc().CompileProgram(program, 5, options);
  size_t log_size = 0;
  nvrtc().GetProgramLogSize(program, &log_size);
  std::string log(log_size, '\0');
  if (log_size > 0) nvrtc().GetProgramLog(program, log.data());
  if (result != NVRTC_SUCCESS) {
    nvrtc().DestroyProgram(&program);
    internal_error(
        "NVRTC could not compile the generated CUDA kernels for sm_{} (errors in {}):\n{}", arch,
        kernels_with_errors(source, log), log);
  }
  size_t size = 0;
  std::string binary;
  if (ptx) {
    check_nvrtc(nvrtc().GetPTXSize(program, &size), "nvrtcGetPTXSize");  // with the NUL
    binary.assign(size, '\0');
    check_nvrtc(nvrtc().GetPTX(program, binary.data()), "nvrtcGetPTX");
  } else {
    check_nvrtc(nvrtc().GetCUBINSize(program, &size), "nvrtcGetCUBINSize");
    binary.assign(size, '\0');
    check_nvrtc(nvrtc().GetCUBIN(program, binary.data()), "nvrtcGetCUBIN");
  }
  nvrtc().DestroyProgram(&program);
  return binary;
}
#endif

}  // namespace

bool nvrtc_available() {
#if KILN_WITH_CUDA
  return nvrtc().loaded;
#else
  return false;
#endif
}

std::string nvrtc_missing() {
#if KILN_WITH_CUDA
  if (nvrtc().loaded) return "";
  return fmt::format("NVRTC ({}, from the CUDA toolkit Kiln was built with) cannot be loaded",
                     KILN_NVRTC_LIBRARY);
#else
  return "this Kiln was built without the CUDA toolkit (CMake found no NVRTC); it compiles for "
         "the CPU only";
#endif
}

std::string nvrtc_version_text() {
#if KILN_WITH_CUDA
  if (nvrtc().loaded) return nvrtc_version();
#endif
  return "";
}

std::vector<int> cuda_target_archs() {
  if (const char* env = std::getenv("KILN_CUDA_ARCHS"); env != nullptr && *env != '\0') {
    std::vector<int> archs;
    std::stringstream list(env);
    std::string item;
    while (std::getline(list, item, ',')) {
      if (item.starts_with("sm_")) item = item.substr(3);
      char* end = nullptr;
      long arch = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || arch < 50 || arch > 200) {
        user_error("KILN_CUDA_ARCHS: '{}' is not an architecture (expected a list like 80,90)",
                   item);
      }
      archs.push_back(static_cast<int>(arch));
    }
    return archs;
  }
  if (int arch = local_gpu_arch(); arch > 0) return {arch};
  return cuda_library_archs();
}

std::vector<int> cuda_library_archs() {
  if (const char* env = std::getenv("KILN_CUDA_ARCHS"); env != nullptr && *env != '\0')
    return cuda_target_archs();
  return {80, 90};
}

std::vector<CudaBinary> nvrtc_compile(const std::string& source, const std::vector<int>& archs,
                                      const fs::path& cache_dir, int ptx_arch) {
#if KILN_WITH_CUDA
  if (std::string why = nvrtc_missing(); !why.empty()) user_error("--device cuda: {}", why);
  std::vector<CudaBinary> binaries;
  auto build = [&](int arch, bool ptx) {
    Sha256 sha;
    sha.update(source);
    sha.update(fmt::format("|{}_{}|nvrtc {}", ptx ? "compute" : "sm", arch, nvrtc_version()));
    for (const auto& [name, content] : nvrtc_std_headers()) sha.update(name + content);
    const fs::path path = cache_dir / "cuda" / (sha.hex_digest() + (ptx ? ".ptx" : ".cubin"));
    CudaBinary binary{arch, {}, ptx};
    if (fs::exists(path)) {
      binary.cubin = files::read(path);
      log::write(log::Category::kCompile, "{} from the code cache: {}", ptx ? "PTX" : "cubin",
                 path.string());
    } else {
      binary.cubin = compile_one(source, arch, ptx);
      fs::create_directories(path.parent_path());
      files::write_atomic(path, binary.cubin);
      log::write(log::Category::kCompile, "NVRTC compiled {}_{}: {}", ptx ? "compute" : "sm", arch,
                 path.string());
    }
    binaries.push_back(std::move(binary));
  };
  for (int arch : archs) build(arch, false);
  if (ptx_arch > 0) build(ptx_arch, true);
  return binaries;
#else
  (void)source;
  (void)archs;
  (void)cache_dir;
  (void)ptx_arch;
  user_error("this Kiln was built without the CUDA toolkit: it cannot compile for --device cuda");
#endif
}

}  // namespace kiln::codegen
