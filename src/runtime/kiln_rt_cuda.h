#pragma once
/// What a wrapper generated for `--device cuda` uses (codegen/cuda/cuda_wrapper_ops.h): the CUDA
/// driver API loaded at run time with dlopen("libcuda.so.1") (so building a model needs no
/// driver and no GPU), the model's kernels loaded from the cubins embedded in the wrapper,
/// kernel launches, and device memory.
///
/// Storage is device memory: the arena the compile planned (grown on demand, kept by the run
/// state), a workspace for sizes known only mid-run and for outputs (stream-ordered
/// allocations, kiln_rt::BasicWorkspace over DeviceMemory), and the constants, uploaded once
/// per run state. Each run state has its own stream; everything a run does is queued on it,
/// and the host waits for it only where it needs data: the inputs and outputs of an op on the
/// host (HostCall, explicit copies of the buffers it reads and writes), a size read from data
/// (RunState::read), and the outputs at the end (finish_output).
///
/// Index checks run on the GPU (RunState::check_indices launches the module's
/// kiln_check_indices kernel): the first index out of range sets the module's error word
/// (`kiln_error`), the kernels that read checked indices then stop, and every synchronization
/// reads the word and fails with the CPU's message.

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
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
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuModuleGetGlobal)(CUdeviceptr*, size_t*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemAllocAsync)(CUdeviceptr*, size_t, CUstream);
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUcontext context = nullptr;
  int arch = 0;               // compute capability as 10 * major + minor
  int max_shared_bytes = 0;   // dynamic shared memory a block may opt in to
  bool memory_pools = false;  // stream-ordered allocation (cuMemAllocAsync)
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

inline void find_symbols(void* lib, Driver& r) {
  find_symbol(lib, "cuInit", r.cuInit);
  find_symbol(lib, "cuDeviceGet", r.cuDeviceGet);
  find_symbol(lib, "cuDeviceGetAttribute", r.cuDeviceGetAttribute);
  find_symbol(lib, "cuDevicePrimaryCtxRetain", r.cuDevicePrimaryCtxRetain);
  find_symbol(lib, "cuCtxSetCurrent", r.cuCtxSetCurrent);
  find_symbol(lib, "cuModuleLoadData", r.cuModuleLoadData);
  find_symbol(lib, "cuModuleUnload", r.cuModuleUnload);
  find_symbol(lib, "cuModuleGetFunction", r.cuModuleGetFunction);
  find_symbol(lib, "cuModuleGetGlobal_v2", r.cuModuleGetGlobal);
  find_symbol(lib, "cuLaunchKernel", r.cuLaunchKernel);
  find_symbol(lib, "cuMemAlloc_v2", r.cuMemAlloc);
  find_symbol(lib, "cuMemFree_v2", r.cuMemFree);
  find_symbol(lib, "cuMemAllocAsync", r.cuMemAllocAsync);
  find_symbol(lib, "cuMemFreeAsync", r.cuMemFreeAsync);
  find_symbol(lib, "cuMemcpyHtoDAsync_v2", r.cuMemcpyHtoDAsync);
  find_symbol(lib, "cuMemcpyDtoHAsync_v2", r.cuMemcpyDtoHAsync);
  find_symbol(lib, "cuMemsetD8Async", r.cuMemsetD8Async);
  find_symbol(lib, "cuStreamCreate", r.cuStreamCreate);
  find_symbol(lib, "cuStreamDestroy_v2", r.cuStreamDestroy);
  find_symbol(lib, "cuStreamSynchronize", r.cuStreamSynchronize);
  find_symbol(lib, "cuGetErrorString", r.cuGetErrorString);
  find_symbol(lib, "cuFuncSetAttribute", r.cuFuncSetAttribute);
}

/// The driver with device 0's primary context, loaded on first use; fails with a clear message
/// when the machine has no driver or no GPU.
inline Driver& driver() {
  static Driver d = [] {
    Driver r{};
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
      kiln_rt::fail("%s",
                    "this model runs on CUDA, but the CUDA driver (libcuda.so.1) is not found");
    find_symbols(lib, r);
    CUresult e = r.cuInit(0);
    if (e != 0) kiln_rt::fail("CUDA: cuInit failed: %s (no CUDA device?)", error_text(r, e));
    CUdevice dev = 0;
    e = r.cuDeviceGet(&dev, 0);
    if (e != 0) kiln_rt::fail("CUDA: no device 0: %s", error_text(r, e));
    int major = 0, minor = 0, pools = 0;
    r.cuDeviceGetAttribute(&major, 75, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    r.cuDeviceGetAttribute(&minor, 76, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    r.arch = 10 * major + minor;
    // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    r.cuDeviceGetAttribute(&r.max_shared_bytes, 97, dev);
    r.cuDeviceGetAttribute(&pools, 115, dev);  // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
    r.memory_pools = pools != 0;
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

inline CUdeviceptr device_ptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

/// Device memory of at least `bytes` (one byte for none), allocated at once.
inline void* alloc_device(size_t bytes) {
  CUdeviceptr p = 0;
  check(driver().cuMemAlloc(&p, bytes == 0 ? 1 : bytes), "cuMemAlloc");
  return reinterpret_cast<void*>(p);
}

/// Stream-ordered device memory for a run's workspace (kiln_rt::BasicWorkspace): allocated and
/// freed in the order of the run's stream, so neither waits for the GPU. Without memory pools
/// on the device, plain allocations.
struct DeviceMemory {
  CUstream stream = nullptr;
  void* alloc(size_t bytes) const {
    Driver& d = driver();
    if (!d.memory_pools) return alloc_device(bytes);
    CUdeviceptr p = 0;
    check(d.cuMemAllocAsync(&p, bytes == 0 ? 1 : bytes, stream), "cuMemAllocAsync");
    return reinterpret_cast<void*>(p);
  }
  void free(void* p) const {
    Driver& d = driver();
    if (d.memory_pools) {
      d.cuMemFreeAsync(device_ptr(p), stream);
    } else {
      d.cuStreamSynchronize(stream);
      d.cuMemFree(device_ptr(p));
    }
  }
};

/// A run's storage outside the arena, in device memory.
using DeviceWorkspace = kiln_rt::BasicWorkspace<DeviceMemory>;

/// The kernels of one model: cubins for one or more architectures (`arch` 80 for sm_80 ...).
struct Cubin {
  int arch;
  const unsigned char* data;
};

/// The module's error word (`kiln_error` in codegen/cuda/cuda_kernel.cpp's prelude): `code` 1
/// when index check number `check` found `value` at `position`.
struct DeviceError {
  int32_t code;
  int32_t check;
  long long position;
  long long value;
};

template <typename T>
inline auto kernel_arg(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return v;
  }
}

/// Launches `f` on `stream` without waiting for it; a grid with no block launches nothing.
/// Integer arguments are passed as the kernels' int64_t sizes.
template <typename... Args>
inline void launch_function(CUfunction f, CUstream stream, const char* name, int64_t gx, int64_t gy,
                            int64_t gz, int64_t bx, int64_t by, int64_t bz, int64_t shared,
                            Args... args) {
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
    check(driver().cuFuncSetAttribute(f, 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */,
                                      static_cast<int>(shared)),
          name);
  }
  auto values = std::make_tuple(kernel_arg(args)...);
  std::apply(
      [&](auto&... v) {
        void* params[] = {static_cast<void*>(&v)..., nullptr};
        check(driver().cuLaunchKernel(f, static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                                      static_cast<unsigned>(gz), static_cast<unsigned>(bx),
                                      static_cast<unsigned>(by), static_cast<unsigned>(bz),
                                      static_cast<unsigned>(shared), stream, params, nullptr),
              name);
      },
      values);
}

/// What one run state keeps on the GPU: its stream, the loaded module and its kernels, the
/// arena of the intermediates, the constants, and the index checks of the current run.
class RunState {
 public:
  RunState() = default;
  RunState(const RunState&) = delete;
  RunState& operator=(const RunState&) = delete;
  ~RunState() {
    if (stream_ == nullptr) return;
    Driver& d = driver();
    d.cuStreamSynchronize(stream_);
    if (arena_ != nullptr) d.cuMemFree(device_ptr(arena_));
    for (void* c : constants_) {
      if (c != nullptr) d.cuMemFree(device_ptr(c));
    }
    if (module_ != nullptr) d.cuModuleUnload(module_);
    d.cuStreamDestroy(stream_);
  }

  /// Starts a run: creates the stream and loads the module for this GPU's architecture the first
  /// time (`names` are the kernels, in the order launch() numbers them), then clears the error
  /// word.
  void begin_run(const Cubin* cubins, size_t n_cubins, const char* const* names, size_t n_names) {
    Driver& d = driver();
    if (stream_ == nullptr) {
      check(d.cuStreamCreate(&stream_, 1 /* CU_STREAM_NON_BLOCKING */), "creating a stream");
      load(cubins, n_cubins, names, n_names);
    }
    checks_.clear();
    if (error_ != 0)
      check(d.cuMemsetD8Async(error_, 0, sizeof(DeviceError), stream_), "clearing the error word");
  }

  CUstream stream() const { return stream_; }
  DeviceMemory memory() const { return DeviceMemory{stream_}; }

  /// Kernel `k` of the module, launched on the run's stream.
  template <typename... Args>
  void launch(int k, const char* name, Args... args) {
    launch_function(functions_[static_cast<size_t>(k)], stream_, name, args...);
  }

  /// The arena, grown to `bytes` (the old one is freed once the GPU is done with it).
  char* arena(int64_t bytes) {
    const size_t want = static_cast<size_t>(bytes > 0 ? bytes : 0);
    if (arena_ == nullptr || want > arena_bytes_) {
      Driver& d = driver();
      if (arena_ != nullptr) {
        check(d.cuStreamSynchronize(stream_), "growing the arena");
        d.cuMemFree(device_ptr(arena_));
        arena_ = nullptr;
      }
      arena_ = static_cast<char*>(alloc_device(want));
      arena_bytes_ = want;
    }
    return arena_;
  }

  /// Constant `k` (host data of `bytes`, alive as long as the model) in device memory, uploaded
  /// on first use, in the order of the run's stream.
  const void* constant(size_t k, const void* host, size_t bytes) {
    if (constants_.size() <= k) constants_.resize(k + 1, nullptr);
    if (constants_[k] == nullptr) {
      void* p = alloc_device(bytes);
      constants_[k] = p;
      upload(static_cast<char*>(p), static_cast<const char*>(host), static_cast<int64_t>(bytes));
    }
    return constants_[k];
  }

  /// A copy on the GPU of model input `in`, in `ws`.
  template <typename T>
  const T* upload_input(DeviceWorkspace& ws, const kiln_rt::TensorArg& in) {
    size_t n = 1;
    for (int k = 0; k < in.rank; ++k) n *= static_cast<size_t>(in.dims[k]);
    T* p = ws.alloc<T>(static_cast<int64_t>(n));
    upload(p, static_cast<const T*>(in.data), static_cast<int64_t>(n));
    return p;
  }

  /// Queues a copy of `numel` elements from the host to the GPU. The host data may be reused
  /// once this returns (the driver stages pageable memory).
  template <typename T>
  void upload(T* device, const T* host, int64_t numel) {
    if (numel <= 0) return;
    check(driver().cuMemcpyHtoDAsync(device_ptr(device), host,
                                     static_cast<size_t>(numel) * sizeof(T), stream_),
          "copying to the GPU");
  }

  /// Queues a copy of `numel` elements from the GPU to the host; the host may read them after
  /// the next synchronize().
  template <typename T>
  void download(T* host, const T* device, int64_t numel) {
    if (numel <= 0) return;
    check(driver().cuMemcpyDtoHAsync(host, device_ptr(device),
                                     static_cast<size_t>(numel) * sizeof(T), stream_),
          "copying from the GPU");
  }

  /// Waits for everything queued on the run's stream (`what` names the reason in errors), then
  /// fails if an index check failed.
  void synchronize(const char* what) {
    Driver& d = driver();
    check(d.cuStreamSynchronize(stream_), what);
    if (checks_.empty() || error_ == 0) return;
    DeviceError e{};
    check(d.cuMemcpyDtoHAsync(&e, error_, sizeof e, stream_), "reading the error word");
    check(d.cuStreamSynchronize(stream_), "reading the error word");
    if (e.code == 0) return;
    const Check& c = checks_.at(static_cast<size_t>(e.check));
    // The message of kiln_rt::check_indices on the CPU.
    kiln_rt::fail("%s: index %lld is out of range for an axis of size %lld (valid: %lld to %lld)",
                  c.node.c_str(), e.value, static_cast<long long>(c.size),
                  static_cast<long long>(-c.size), static_cast<long long>(c.size - 1));
  }

  /// Element `k` of `device`, for the host: a size computed from data. Waits for the GPU.
  template <typename T>
  T read(const T* device, int64_t k, const char* what) {
    T value{};
    download(&value, device + k, 1);
    synchronize(what);
    return value;
  }

  /// Checks that `count` indices at `indices` lie in [-size, size) (`ignored` aside), on the GPU
  /// without waiting: a failure sets the error word, read at the next synchronization. Without
  /// the check kernels (a model with no kernels), on the host.
  template <typename T>
  void check_indices(const T* indices, int64_t count, int64_t size, bool has_ignored,
                     int64_t ignored, const char* node) {
    static_assert(std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>,
                  "indices are int32 or int64");
    CUfunction f = std::is_same_v<T, int32_t> ? check_i32_ : check_i64_;
    if (f == nullptr || error_ == 0) {
      std::vector<T> host(static_cast<size_t>(count > 0 ? count : 0));
      download(host.data(), indices, count);
      synchronize(node);
      kiln_rt::check_indices(host.data(), count, size, has_ignored, ignored, node);
      return;
    }
    checks_.push_back({node, size});
    launch_function(f, stream_, "kiln_check_indices", 1, 1, 1, 256, 1, 1, 0, indices, count, size,
                    has_ignored ? 1 : 0, ignored, static_cast<int64_t>(checks_.size() - 1));
  }

 private:
  struct Check {
    std::string node;
    int64_t size;
  };

  void load(const Cubin* cubins, size_t n_cubins, const char* const* names, size_t n_names) {
    if (n_cubins == 0 || cubins[0].data == nullptr) return;
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
      if (names[k] == nullptr) continue;
      check(d.cuModuleGetFunction(&functions_[k], module_, names[k]), names[k]);
    }
    check(d.cuModuleGetFunction(&check_i32_, module_, "kiln_check_indices_i32"),
          "kiln_check_indices_i32");
    check(d.cuModuleGetFunction(&check_i64_, module_, "kiln_check_indices_i64"),
          "kiln_check_indices_i64");
    size_t bytes = 0;
    check(d.cuModuleGetGlobal(&error_, &bytes, module_, "kiln_error"), "the error word");
  }

  CUstream stream_ = nullptr;
  CUmodule module_ = nullptr;
  std::vector<CUfunction> functions_;
  CUfunction check_i32_ = nullptr;
  CUfunction check_i64_ = nullptr;
  CUdeviceptr error_ = 0;      // the module's DeviceError
  std::vector<Check> checks_;  // this run's index checks, numbered as the kernel reports them
  char* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  std::vector<void*> constants_;
};

/// An op on the host (codegen/cuda/host_fallback.h), over the GPU buffers it is given, numbered:
/// host copies of those it reads (in(), copied from the GPU), host storage for the one it
/// writes (out()), copied to the GPU by finish(). ready() waits for the copies from the GPU.
class HostCall {
 public:
  HostCall(RunState& state, std::initializer_list<const void*> device)
      : state_(state), device_(device) {}
  HostCall(const HostCall&) = delete;
  HostCall& operator=(const HostCall&) = delete;
  ~HostCall() {
    for (void* p : host_) std::free(p);
  }

  template <typename T>
  const T* in(size_t k, int64_t numel) {
    T* host = alloc<T>(numel);
    state_.download(host, static_cast<const T*>(device_.at(k)), numel);
    return host;
  }
  template <typename T>
  T* out(size_t k, int64_t numel) {
    T* host = alloc<T>(numel);
    written_.push_back({k, host, static_cast<int64_t>(sizeof(T)) * (numel > 0 ? numel : 0)});
    return host;
  }
  void ready(const char* what) { state_.synchronize(what); }
  void finish() {
    for (const Written& w : written_) {
      state_.upload(static_cast<char*>(const_cast<void*>(device_.at(w.k))),
                    static_cast<const char*>(w.host), w.bytes);
    }
  }

 private:
  struct Written {
    size_t k;
    const void* host;
    int64_t bytes;
  };
  template <typename T>
  T* alloc(int64_t numel) {
    void* p = kiln_rt::aligned_alloc_bytes(static_cast<size_t>(numel > 0 ? numel : 0) * sizeof(T));
    host_.push_back(p);
    return static_cast<T*>(p);
  }

  RunState& state_;
  std::vector<const void*> device_;
  std::vector<void*> host_;
  std::vector<Written> written_;
};

/// Hands model output `out` to the caller in host memory, once the run is done: sets its dtype
/// and shape and copies `data` (on the GPU) into the caller's buffer, or into fresh host
/// storage (released with free()).
inline void finish_output(RunState& state, kiln_rt::TensorArg& out, const void* data, int32_t dtype,
                          int rank, const int64_t* dims, size_t element_size, const char* name) {
  size_t bytes = element_size;
  for (int k = 0; k < rank; ++k) bytes *= static_cast<size_t>(dims[k]);
  state.synchronize("the model's run");
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
  if (bytes == 0) return;
  state.download(static_cast<char*>(out.data), static_cast<const char*>(data),
                 static_cast<int64_t>(bytes));
  state.synchronize("copying an output from the GPU");
}

}  // namespace kiln_cuda
