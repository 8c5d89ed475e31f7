#pragma once
/// What a wrapper generated for `--device cuda` uses (codegen/cuda/cuda_wrapper_ops.h): the CUDA
/// driver API loaded at run time with dlopen("libcuda.so.1") (so building a model needs no
/// driver and no GPU), the model's kernels loaded from the cubins embedded in the wrapper,
/// kernel launches, and storage the GPU and the host both reach.
///
/// Storage is CUDA managed memory: the kernels run on the GPU, while library calls (GEMM,
/// convolution, TopK, ...), index checks and sizes computed from data run on the host, reading
/// and writing the same buffers after a synchronization. Model inputs are copied into it when a
/// run starts, constants once per run state, outputs back to the caller's host buffers when the
/// run ends. Every launch is followed by a synchronization, so a failing kernel is named.

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kiln_rt.h"

namespace kiln_cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;

/// The driver entry points used, found by name in libcuda.so.1 once per process.
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuMemAllocManaged)(CUdeviceptr*, size_t, unsigned);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUcontext context = nullptr;
  int arch = 0;              // compute capability as 10 * major + minor
  int max_shared_bytes = 0;  // dynamic shared memory a block may opt in to
};

inline const char* error_text(const Driver& d, CUresult r) {
  const char* text = nullptr;
  if (d.cuGetErrorString == nullptr || d.cuGetErrorString(r, &text) != 0 || text == nullptr)
    return "unknown CUDA error";
  return text;
}

template <typename F>
inline void find_symbol(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (f == nullptr) kiln_rt::fail("the CUDA driver (libcuda.so.1) has no %s", name);
}

/// The driver with device 0's primary context, loaded on first use; fails with a clear message
/// when the machine has no driver or no GPU.
inline Driver& driver() {
  static Driver d = [] {
    Driver r{};
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
      kiln_rt::fail("this model runs on CUDA, but the CUDA driver (libcuda.so.1) is not found");
    find_symbol(lib, "cuInit", r.cuInit);
    find_symbol(lib, "cuDeviceGet", r.cuDeviceGet);
    find_symbol(lib, "cuDeviceGetAttribute", r.cuDeviceGetAttribute);
    find_symbol(lib, "cuDevicePrimaryCtxRetain", r.cuDevicePrimaryCtxRetain);
    find_symbol(lib, "cuCtxSetCurrent", r.cuCtxSetCurrent);
    find_symbol(lib, "cuCtxSynchronize", r.cuCtxSynchronize);
    find_symbol(lib, "cuModuleLoadData", r.cuModuleLoadData);
    find_symbol(lib, "cuModuleUnload", r.cuModuleUnload);
    find_symbol(lib, "cuModuleGetFunction", r.cuModuleGetFunction);
    find_symbol(lib, "cuLaunchKernel", r.cuLaunchKernel);
    find_symbol(lib, "cuMemAllocManaged", r.cuMemAllocManaged);
    find_symbol(lib, "cuMemFree_v2", r.cuMemFree);
    find_symbol(lib, "cuGetErrorString", r.cuGetErrorString);
    find_symbol(lib, "cuFuncSetAttribute", r.cuFuncSetAttribute);
    CUresult e = r.cuInit(0);
    if (e != 0) kiln_rt::fail("CUDA: cuInit failed: %s (no CUDA device?)", error_text(r, e));
    CUdevice dev = 0;
    e = r.cuDeviceGet(&dev, 0);
    if (e != 0) kiln_rt::fail("CUDA: no device 0: %s", error_text(r, e));
    int major = 0, minor = 0;
    r.cuDeviceGetAttribute(&major, 75, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    r.cuDeviceGetAttribute(&minor, 76, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    r.arch = 10 * major + minor;
    // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    r.cuDeviceGetAttribute(&r.max_shared_bytes, 97, dev);
    e = r.cuDevicePrimaryCtxRetain(&r.context, dev);
    if (e != 0) kiln_rt::fail("CUDA: no context on device 0: %s", error_text(r, e));
    return r;
  }();
  d.cuCtxSetCurrent(d.context);
  return d;
}

inline void check(CUresult e, const char* what) {
  if (e != 0) kiln_rt::fail("CUDA: %s: %s", what, error_text(driver(), e));
}

/// Managed memory (reachable from the GPU and the host) of at least `bytes`.
inline void* alloc_managed(size_t bytes) {
  CUdeviceptr p = 0;
  check(driver().cuMemAllocManaged(&p, bytes == 0 ? 1 : bytes, 1 /* CU_MEM_ATTACH_GLOBAL */),
        "cuMemAllocManaged");
  return reinterpret_cast<void*>(p);
}

inline void free_managed(const void* p) {
  if (p != nullptr) driver().cuMemFree(reinterpret_cast<CUdeviceptr>(p));
}

/// The kernels of one model: cubins for one or more architectures (`arch` 80 for sm_80 ...).
struct Cubin {
  int arch;
  const unsigned char* data;
};

/// What one run state keeps on the GPU: the loaded module, its kernels, the arena of the
/// intermediates and the constants copied into managed memory.
class RunState {
 public:
  RunState() = default;
  RunState(const RunState&) = delete;
  RunState& operator=(const RunState&) = delete;
  ~RunState() {
    if (arena_ != nullptr) free_managed(arena_);
    for (void* c : constants_) free_managed(c);
    if (module_ != nullptr) driver().cuModuleUnload(module_);
  }

  /// Loads the module for this GPU's architecture once; `names` are the kernels, in the order
  /// launch() numbers them.
  void load(const Cubin* cubins, size_t n_cubins, const char* const* names, size_t n_names) {
    if (module_ != nullptr || n_names == 0 || names[0] == nullptr) return;
    Driver& d = driver();
    const Cubin* chosen = nullptr;
    for (size_t k = 0; k < n_cubins; ++k) {
      if (cubins[k].arch == d.arch) chosen = &cubins[k];
    }
    if (chosen == nullptr) {
      kiln_rt::fail(
          "CUDA: the model was compiled for other GPUs, not for sm_%d (set "
          "KILN_CUDA_ARCHS when compiling)",
          d.arch);
    }
    check(d.cuModuleLoadData(&module_, chosen->data), "loading the model's kernels");
    functions_.resize(n_names);
    for (size_t k = 0; k < n_names; ++k) {
      check(d.cuModuleGetFunction(&functions_[k], module_, names[k]), names[k]);
    }
  }

  CUfunction function(int k) const { return functions_[static_cast<size_t>(k)]; }

  char* arena(int64_t bytes) {
    const size_t want = static_cast<size_t>(bytes > 0 ? bytes : 0);
    if (arena_ == nullptr || want > arena_bytes_) {
      if (arena_ != nullptr) free_managed(arena_);
      arena_ = static_cast<char*>(alloc_managed(want));
      arena_bytes_ = want;
    }
    return arena_;
  }

  /// Constant `k` (host data of `bytes`) in managed memory, copied on first use.
  const void* constant(size_t k, const void* host, size_t bytes) {
    if (constants_.size() <= k) constants_.resize(k + 1, nullptr);
    if (constants_[k] == nullptr) {
      constants_[k] = alloc_managed(bytes);
      std::memcpy(constants_[k], host, bytes);
    }
    return constants_[k];
  }

 private:
  CUmodule module_ = nullptr;
  std::vector<CUfunction> functions_;
  char* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  std::vector<void*> constants_;
};

/// A run's storage outside the arena, in managed memory (kiln_rt::Workspace's interface).
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    for (void* p : live_) free_managed(p);
  }
  template <typename T>
  T* alloc(int64_t numel) {
    void* p = alloc_managed(static_cast<size_t>(numel > 0 ? numel : 0) * sizeof(T));
    live_.push_back(p);
    return static_cast<T*>(p);
  }
  void release(const void* p) {
    for (size_t k = 0; k < live_.size(); ++k) {
      if (live_[k] != p) continue;
      free_managed(p);
      live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(k));
      return;
    }
  }
  void adopt(void* p) { live_.push_back(p); }
  bool detach(const void* p) {
    for (size_t k = 0; k < live_.size(); ++k) {
      if (live_[k] != p) continue;
      live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(k));
      return true;
    }
    return false;
  }
  /// A copy of model input `in` (elements of `element_size` bytes) the GPU can read.
  template <typename T>
  const T* upload(const kiln_rt::TensorArg& in) {
    size_t n = 1;
    for (int k = 0; k < in.rank; ++k) n *= static_cast<size_t>(in.dims[k]);
    T* p = alloc<T>(static_cast<int64_t>(n));
    if (n > 0) std::memcpy(p, in.data, n * sizeof(T));
    return p;
  }

 private:
  std::vector<void*> live_;
};

/// Waits for the GPU: before the host reads what kernels wrote.
inline void synchronize(const char* after) { check(driver().cuCtxSynchronize(), after); }

template <typename T>
inline auto kernel_arg(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return v;
  }
}

/// Launches kernel `k` of `state` and waits for it; a grid with no block launches nothing.
/// Integer arguments are passed as the kernels' int64_t sizes.
template <typename... Args>
inline void launch(RunState& state, int k, const char* name, int64_t gx, int64_t gy, int64_t gz,
                   int64_t bx, int64_t by, int64_t bz, int64_t shared, Args... args) {
  if (gx <= 0 || gy <= 0 || gz <= 0) return;
  if (gx > 2147483647 || gy > 65535 || gz > 65535)
    kiln_rt::fail("CUDA: kernel %s: its grid (%lld x %lld x %lld) is too large", name,
                  static_cast<long long>(gx), static_cast<long long>(gy),
                  static_cast<long long>(gz));
  // Above 48 KiB a kernel's dynamic shared memory (reductions keep a row's values there) must be
  // asked for, up to what the device allows.
  if (shared > 48 * 1024) {
    if (shared > driver().max_shared_bytes) {
      kiln_rt::fail(
          "CUDA: kernel %s needs %lld bytes of shared memory for one row, the GPU "
          "has %d",
          name, static_cast<long long>(shared), driver().max_shared_bytes);
    }
    check(driver().cuFuncSetAttribute(state.function(k), 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */,
                                      static_cast<int>(shared)),
          name);
  }
  auto values = std::make_tuple(kernel_arg(args)...);
  std::apply(
      [&](auto&... v) {
        void* params[] = {static_cast<void*>(&v)..., nullptr};
        check(driver().cuLaunchKernel(state.function(k), static_cast<unsigned>(gx),
                                      static_cast<unsigned>(gy), static_cast<unsigned>(gz),
                                      static_cast<unsigned>(bx), static_cast<unsigned>(by),
                                      static_cast<unsigned>(bz), static_cast<unsigned>(shared),
                                      nullptr, params, nullptr),
              name);
      },
      values);
  synchronize(name);
}

/// Hands model output `out` to the caller in host memory: sets its dtype and shape and copies
/// `data` into the caller's buffer, or into fresh host storage (released with free()).
inline void finish_output(kiln_rt::TensorArg& out, const void* data, int32_t dtype, int rank,
                          const int64_t* dims, size_t element_size, const char* name) {
  size_t bytes = element_size;
  for (int k = 0; k < rank; ++k) bytes *= static_cast<size_t>(dims[k]);
  out.dtype = dtype;
  out.rank = rank;
  for (int k = 0; k < rank; ++k) out.dims[k] = dims[k];
  if (out.data != nullptr) {
    if (out.capacity < bytes) {
      kiln_rt::fail("output '%s': the buffer given holds %zu bytes, the output needs %zu", name,
                    out.capacity, bytes);
    }
  } else {
    out.data = kiln_rt::aligned_alloc_bytes(bytes);
    out.capacity = bytes;
  }
  if (bytes > 0 && out.data != data) std::memcpy(out.data, data, bytes);
}

}  // namespace kiln_cuda
