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
///
/// Matrix products run through cuBLASLt (RunState::matmul), loaded at the first product with
/// dlopen like the driver, so a model without one never needs it. Each call site keeps a plan
/// (descriptors and the heuristic's algorithm) for the shapes it last saw; its workspace is the
/// end of the run state's arena.
///
/// Convolutions run through cuDNN 9's graph (backend) API (RunState::conv), loaded the same way:
/// a one-operation graph per call site, the heuristic's engines tried in order (without tensor
/// cores at fp32) until one finalizes with a workspace that fits the arena's.

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln_rt.h"
#include "kiln_rt_control.h"
#include "kiln_rt_error.h"
#include "kiln_rt_profile.h"

namespace kiln_cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;
using CUevent = void*;
using CUgraph = void*;
using CUgraphExec = void*;

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
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuStreamBeginCapture)(CUstream, int);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuGraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
  CUcontext context = nullptr;
  int arch = 0;               // compute capability as 10 * major + minor
  char name[128] = {};        // cuDeviceGetName's, for the autotune report
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
  find_symbol(lib, "cuMemcpyDtoDAsync_v2", r.cuMemcpyDtoDAsync);
  find_symbol(lib, "cuEventCreate", r.cuEventCreate);
  find_symbol(lib, "cuEventRecord", r.cuEventRecord);
  find_symbol(lib, "cuEventDestroy_v2", r.cuEventDestroy);
  find_symbol(lib, "cuEventSynchronize", r.cuEventSynchronize);
  find_symbol(lib, "cuEventElapsedTime", r.cuEventElapsedTime);
  find_symbol(lib, "cuStreamWaitEvent", r.cuStreamWaitEvent);
  find_symbol(lib, "cuMemHostAlloc", r.cuMemHostAlloc);
  find_symbol(lib, "cuMemFreeHost", r.cuMemFreeHost);
  find_symbol(lib, "cuStreamBeginCapture_v2", r.cuStreamBeginCapture);
  find_symbol(lib, "cuStreamIsCapturing", r.cuStreamIsCapturing);
  find_symbol(lib, "cuStreamEndCapture", r.cuStreamEndCapture);
  find_symbol(lib, "cuGraphInstantiateWithFlags", r.cuGraphInstantiate);
  find_symbol(lib, "cuGraphLaunch", r.cuGraphLaunch);
  find_symbol(lib, "cuGraphExecDestroy", r.cuGraphExecDestroy);
  find_symbol(lib, "cuGraphDestroy", r.cuGraphDestroy);
}

/// The driver with device 0's primary context, loaded on first use; fails with a clear message
/// when the machine has no driver or no GPU. Hidden, like every function of this header that
/// has a static local: with default visibility GCC makes such a static a GNU unique symbol, which
/// the dynamic linker binds across model libraries, so a library loaded after another was
/// unloaded would use the unloaded one's destroyed objects (a process that ran two models with
/// unfused convolutions, one after the other, freed note_unfused's list twice).
__attribute__((visibility("hidden"))) inline Driver& driver() {
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
    using GetName = CUresult (*)(char*, int, CUdevice);
    if (auto get_name = reinterpret_cast<GetName>(dlsym(lib, "cuDeviceGetName")))
      get_name(r.name, static_cast<int>(sizeof r.name) - 1, dev);
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

/// A run replaying a CUDA graph finds that it differs from the run that captured it (an
/// allocation of another size, a size read from data of another value, a segment more): the
/// run is done again without a graph (run_retrying), and its input sizes get none from then on.
struct GraphMiss : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The device memory of the runs of one CUDA graph (RunState::Graph): what the run that
/// captured it allocated, in order, handed out again in that order to each run that replays it
/// (the graph's kernels read and write those addresses), and freed with the graph.
struct GraphMemory {
  std::vector<std::pair<void*, size_t>> blocks;
  size_t next = 0;      // replay: the next block to hand out
  bool replay = false;  // hand out the recorded blocks (else allocate and record)
  void* take(size_t bytes) {
    if (!replay) {
      void* p = alloc_device(bytes);
      blocks.emplace_back(p, bytes);
      return p;
    }
    if (next >= blocks.size() || blocks[next].second != bytes)
      throw GraphMiss("CUDA graph replay: an allocation differs from the capture's");
    return blocks[next++].first;
  }
  void release() {
    for (const auto& b : blocks) driver().cuMemFree(reinterpret_cast<CUdeviceptr>(b.first));
    blocks.clear();
  }
};

/// Stream-ordered device memory for a run's workspace (kiln_rt::BasicWorkspace): allocated and
/// freed in the order of the run's stream, so neither waits for the GPU. Without memory pools
/// on the device, plain allocations. A run that captures or replays a CUDA graph takes the
/// graph's memory instead (`graph`), freed only with the graph.
struct DeviceMemory {
  CUstream stream = nullptr;
  GraphMemory* graph = nullptr;
  void* alloc(size_t bytes) const {
    if (graph != nullptr) return graph->take(bytes == 0 ? 1 : bytes);
    Driver& d = driver();
    if (!d.memory_pools) return alloc_device(bytes);
    CUdeviceptr p = 0;
    check(d.cuMemAllocAsync(&p, bytes == 0 ? 1 : bytes, stream), "cuMemAllocAsync");
    return reinterpret_cast<void*>(p);
  }
  void free(void* p) const {
    if (graph != nullptr) return;
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

/// cuBLASLt's entry points (cublasLt.h; its handles and descriptors are opaque pointers, its
/// enums ints), found by name once per process: KILN_CUBLASLT_LIBRARY, else the library of
/// CUDA 13, else of CUDA 12 (the API used here is the same in both).
struct BlasLt {
  using Status = int;
  /// cublasLtMatmulHeuristicResult_t.
  struct Heuristic {
    uint64_t algo[8];
    size_t workspace_bytes;
    Status state;
    float waves;
    int reserved[4];
  };
  Status (*Create)(void**);
  Status (*Destroy)(void*);
  const char* (*GetStatusString)(Status);
  Status (*MatmulDescCreate)(void**, int, int);
  Status (*MatmulDescDestroy)(void*);
  Status (*MatmulDescSetAttribute)(void*, int, const void*, size_t);
  Status (*MatrixLayoutCreate)(void**, int, uint64_t, uint64_t, int64_t);
  Status (*MatrixLayoutDestroy)(void*);
  Status (*MatrixLayoutSetAttribute)(void*, int, const void*, size_t);
  Status (*MatmulPreferenceCreate)(void**);
  Status (*MatmulPreferenceDestroy)(void*);
  Status (*MatmulPreferenceSetAttribute)(void*, int, const void*, size_t);
  Status (*MatmulAlgoGetHeuristic)(void*, void*, void*, void*, void*, void*, void*, int, Heuristic*,
                                   int*);
  Status (*Matmul)(void*, void*, const void*, const void*, void*, const void*, void*, const void*,
                   const void*, void*, void*, void*, const void*, void*, size_t, CUstream);
  size_t version = 0;  // cublasLtGetVersion's: what a cached algorithm index is valid for
};

// The values of cublasLt.h, cublas_api.h and library_types.h used here.
constexpr int kBlasOpN = 0, kBlasOpT = 1;                                    // cublasOperation_t
constexpr int kBlasR32F = 0, kBlasR64F = 1, kBlasR16F = 2, kBlasR16BF = 14;  // cudaDataType_t
constexpr int kBlasCompute32F = 68, kBlasCompute32FFastTf32 = 77;            // cublasComputeType_t
constexpr int kBlasCompute64F = 70;
constexpr int kBlasDescTransA = 3, kBlasDescTransB = 4, kBlasDescEpilogue = 7,
              kBlasDescBiasPointer = 8;  // cublasLtMatmulDescAttributes_t
constexpr int kBlasLayoutBatchCount = 5,
              kBlasLayoutBatchStride = 6;  // cublasLtMatrixLayoutAttribute_t
constexpr int kBlasPrefWorkspace = 1, kBlasPrefAlignA = 5, kBlasPrefAlignB = 6, kBlasPrefAlignC = 7,
              kBlasPrefAlignD = 8;  // cublasLtMatmulPreferenceAttributes_t

/// The epilogue a matrix product applies (cublasLtEpilogue_t's values): a bias vector added to
/// each row of the (row-major) result, then Relu or the tanh form of Gelu.
enum class Epilogue : uint32_t {
  kNone = 1,
  kRelu = 2,
  kBias = 4,
  kReluBias = 6,
  kGelu = 32,
  kGeluBias = 36,
};

/// The workspace a cuBLASLt product or cuDNN convolution may use (cuBLASLt's recommendation on
/// Hopper), at the end of the arena.
constexpr size_t kLibraryWorkspaceBytes = 32u << 20;

__attribute__((visibility("hidden"))) inline BlasLt& blas() {
  static BlasLt b = [] {
    BlasLt r{};
    const char* chosen = std::getenv("KILN_CUBLASLT_LIBRARY");
    void* lib = nullptr;
    if (chosen != nullptr && *chosen != '\0') {
      lib = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) kiln_rt::fail("KILN_CUBLASLT_LIBRARY=%s cannot be loaded", chosen);
    } else {
      for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12"}) {
        lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (lib != nullptr) break;
      }
      if (lib == nullptr) {
        kiln_rt::fail("%s",
                      "this model's matrix products run on cuBLASLt, but libcublasLt.so.13 (or "
                      ".12) is not found (set KILN_CUBLASLT_LIBRARY to its path)");
      }
    }
    auto get = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
      if (f == nullptr) kiln_rt::fail("cuBLASLt has no %s", name);
    };
    get(r.Create, "cublasLtCreate");
    get(r.Destroy, "cublasLtDestroy");
    get(r.GetStatusString, "cublasLtGetStatusString");
    get(r.MatmulDescCreate, "cublasLtMatmulDescCreate");
    get(r.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    get(r.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    get(r.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    get(r.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    get(r.MatrixLayoutSetAttribute, "cublasLtMatrixLayoutSetAttribute");
    get(r.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    get(r.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    get(r.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    get(r.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    get(r.Matmul, "cublasLtMatmul");
    if (auto v = reinterpret_cast<size_t (*)()>(dlsym(lib, "cublasLtGetVersion"))) r.version = v();
    return r;
  }();
  return b;
}

inline void check_blas(int status, const char* what) {
  if (status != 0) kiln_rt::fail("cuBLASLt: %s: %s", what, blas().GetStatusString(status));
}

/// One operand of cublasLtMatmul in its column-major terms: the op applied (N or T) and the
/// stored matrix's rows, columns and leading dimension.
struct BlasMatrix {
  int op = kBlasOpN;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
};

/// How cuBLASLt reads the rows x cols matrix W whose element (i, j) is at i * si + j * sj: as
/// stored column-major (op N) or as the transpose of a column-major matrix (op T). False when
/// neither (lower/nn.cpp makes such operands contiguous first; this checks again). A dim of
/// size 1 takes any stride.
inline bool blas_matrix(int64_t rows, int64_t cols, int64_t si, int64_t sj, BlasMatrix& m) {
  const int64_t r = rows > 1 ? rows : 1, c = cols > 1 ? cols : 1;
  if (si == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? r : sj;
    if (ld >= r) {
      m = {kBlasOpN, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld};
      return true;
    }
  }
  if (sj == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? c : si;
    if (ld >= c) {
      m = {kBlasOpT, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), ld};
      return true;
    }
  }
  return false;
}

/// The shape of a batched product out[..., M, N] = A[..., M, K] @ B[..., K, N]: the output's
/// rank and sizes, K, and the strides of A, B (broadcast batch dims have stride 0) and the
/// output, each over the output's rank (A's last two dims are M, K; B's K, N).
struct MatMulShape {
  int rank;
  const int64_t* sizes;
  int64_t k;
  const int64_t* a_strides;
  const int64_t* b_strides;
  const int64_t* out_strides;
};

/// The operands of the fused attention kernel (codegen/cuda/cuda_attention.cpp writes the
/// kernels, kiln_attention_f32_d<D>_v<Dv>, with the same struct on the device side; it is passed by
/// value): out[b, i, :] = sum_j softmax_j(s[b, i, j]) V[b, j, :], s = mask(scale * (Q K^T)[b, i,
/// j]). Views of rank batch_rank + 2 with their strides in elements (broadcast dims: 0): q [.., Lq,
/// D], kt [.., D, Lk], v [.., Lk, Dv], mask [.., Lq, Lk] (bool bytes or float32, by mask_kind,
/// ir::AttentionMask's numbering); out contiguous [.., Lq, Dv]. D and Dv are at most 128.
struct AttentionParams {
  static constexpr int kMaxBatchRank = 6;
  const float* q;
  const float* kt;
  const float* v;
  const void* mask;
  float* out;
  int64_t lq, lk, d, dv;
  int64_t batch[kMaxBatchRank];
  int64_t q_strides[kMaxBatchRank + 2];
  int64_t kt_strides[kMaxBatchRank + 2];
  int64_t v_strides[kMaxBatchRank + 2];
  int64_t mask_strides[kMaxBatchRank + 2];
  int32_t batch_rank;
  int32_t mask_kind;
  float scale;
  float fill;
};

/// What one call site of cublasLtMatmul keeps between runs: the descriptors and algorithm for
/// the shape, strides, alignments, precision and epilogue it was made for (`key`).
struct MatMulPlan {
  using Key = std::array<int64_t, 21>;
  Key key{};  // all zero: no plan yet (a real key has a compute type)
  void* desc = nullptr;
  void* layouts[3] = {nullptr, nullptr, nullptr};  // cuBLASLt's A (our B), B (our A), C = D
  BlasLt::Heuristic choice{};
  /// With tuning (--autotune max): the heuristic's first algorithms, timed at the first run.
  std::vector<BlasLt::Heuristic> candidates;
  bool tune = false;  // time the candidates (and the GEMM template's) at the next call
  int kiln = -1;      // the GEMM template's choice that runs instead of cuBLASLt, or -1
  void release() {
    if (desc != nullptr) blas().MatmulDescDestroy(desc);
    for (void*& l : layouts) {
      if (l != nullptr) blas().MatrixLayoutDestroy(l);
      l = nullptr;
    }
    desc = nullptr;
  }
};

/// The largest power of two (at most 256) that divides every value: the alignment in bytes of
/// an operand's pointers over all its batches.
inline uint32_t alignment_of(std::initializer_list<uint64_t> values) {
  uint64_t bits = 256;
  for (uint64_t v : values) bits |= v;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

/// cuDNN's entry points (cudnn_graph.h; descriptors and the handle are opaque pointers, enums
/// ints), found by name once per process: KILN_CUDNN_LIBRARY, else libcudnn.so.9.
struct Dnn {
  using Status = int;
  Status (*Create)(void**);
  Status (*Destroy)(void*);
  Status (*SetStream)(void*, CUstream);
  const char* (*GetErrorString)(Status);
  Status (*CreateDescriptor)(int, void**);
  Status (*DestroyDescriptor)(void*);
  Status (*Finalize)(void*);
  Status (*SetAttribute)(void*, int, int, int64_t, const void*);
  Status (*GetAttribute)(void*, int, int, int64_t, int64_t*, void*);
  Status (*Execute)(void*, void*, void*);
  size_t version = 0;  // cudnnGetVersion's: what a cached engine index is valid for
};

// The values of cudnn_graph.h used here.
namespace dnn {
constexpr int kTensor = 17, kConvolution = 1, kConvForward = 10, kGraph = 15, kHeuristics = 4,
              kEngineConfig = 3, kEngine = 2, kPlan = 5, kVariantPack = 16, kPointwise = 0,
              kPointwiseOp = 13;  // descriptor types
constexpr int kTypeHandle = 0, kTypeDataType = 1, kTypeBoolean = 2, kTypeInt64 = 3, kTypeFloat = 4,
              kTypeDouble = 5, kTypeVoidPtr = 6, kTypeConvMode = 7, kTypeHeurMode = 8,
              kTypeNumericalNote = 11, kTypePointwiseMode = 14,
              kTypeDescriptor = 15;  // attribute types
constexpr int kPointwiseAdd = 0, kPointwiseReluFwd = 100, kPointwiseTanhFwd = 101,
              kPointwiseSigmoidFwd = 102, kPointwiseEluFwd = 103, kPointwiseGeluFwd = 104,
              kPointwiseSwishFwd = 106, kPointwiseGeluTanhFwd = 107;  // pointwise modes
constexpr int kPointwiseMode = 0, kPointwiseMathPrec = 1, kPointwiseReluLowerClip = 3,
              kPointwiseReluUpperClip = 4, kPointwiseReluLowerClipSlope = 5, kPointwiseEluAlpha = 6,
              kPointwiseSwishBeta = 8;
constexpr int kPwOpDesc = 750, kPwOpX = 751, kPwOpB = 752, kPwOpY = 753;
constexpr int kTensorIsVirtual = 907;
constexpr int kDataFloat = 0, kDataDouble = 1, kDataHalf = 2, kDataBf16 = 9;  // cudnnDataType_t
constexpr int kCrossCorrelation = 1, kHeurModeA = 3, kHeurModeFallback = 2;
constexpr int kNoteTensorCore = 0, kNoteDownConvertInputs = 1;
constexpr int kTensorByteAlignment = 900, kTensorDataType = 901, kTensorDims = 902,
              kTensorStrides = 903, kTensorUid = 906;
constexpr int kConvCompType = 100, kConvMode = 101, kConvDilations = 102, kConvStrides = 103,
              kConvPostPad = 104, kConvPrePad = 105, kConvSpatialDims = 106;
constexpr int kOpAlpha = 700, kOpBeta = 701, kOpConvDesc = 702, kOpW = 703, kOpX = 704, kOpY = 705;
constexpr int kGraphHandle = 800, kGraphOps = 801;
constexpr int kHeurMode = 200, kHeurGraph = 201, kHeurResults = 202;
constexpr int kConfigEngine = 300, kEngineNotes = 1303;
constexpr int kPlanHandle = 400, kPlanConfig = 401, kPlanWorkspace = 402;
constexpr int kPackUids = 1000, kPackPointers = 1001, kPackWorkspace = 1003;
}  // namespace dnn

__attribute__((visibility("hidden"))) inline Dnn& dnn_api() {
  static Dnn d = [] {
    Dnn r{};
    const char* chosen = std::getenv("KILN_CUDNN_LIBRARY");
    const char* name = chosen != nullptr && *chosen != '\0' ? chosen : "libcudnn.so.9";
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      kiln_rt::fail(
          "this model's convolutions run on cuDNN, but %s cannot be loaded (set "
          "KILN_CUDNN_LIBRARY to its path)",
          name);
    }
    auto get = [&](auto& f, const char* symbol) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, symbol));
      if (f == nullptr) kiln_rt::fail("cuDNN has no %s", symbol);
    };
    get(r.Create, "cudnnCreate");
    if (auto v = reinterpret_cast<size_t (*)()>(dlsym(lib, "cudnnGetVersion"))) r.version = v();
    get(r.Destroy, "cudnnDestroy");
    get(r.SetStream, "cudnnSetStream");
    get(r.GetErrorString, "cudnnGetErrorString");
    get(r.CreateDescriptor, "cudnnBackendCreateDescriptor");
    get(r.DestroyDescriptor, "cudnnBackendDestroyDescriptor");
    get(r.Finalize, "cudnnBackendFinalize");
    get(r.SetAttribute, "cudnnBackendSetAttribute");
    get(r.GetAttribute, "cudnnBackendGetAttribute");
    get(r.Execute, "cudnnBackendExecute");
    return r;
  }();
  return d;
}

inline void check_dnn(int status, const char* what) {
  if (status != 0) kiln_rt::fail("cuDNN: %s: %s", what, dnn_api().GetErrorString(status));
}

/// A convolution's shape: `spatial` (1 to 3) spatial dims; X [N, C, ...], W [K, C / group,
/// ...] and Y [N, K, ...] in that order; per spatial dim its stride, padding before and after,
/// and dilation. The buffers are contiguous in that order, or with `channels_last` (2-D) as
/// [N, H, W, C], [K, KH, KW, C / group] and [N, OH, OW, K].
struct ConvShape {
  int spatial;
  const int64_t* x;
  const int64_t* w;
  const int64_t* y;
  const int64_t* strides;
  const int64_t* pads_begin;
  const int64_t* pads_end;
  const int64_t* dilations;
  bool channels_last;
};

/// What one call site of a cuDNN convolution keeps between runs: every descriptor of its graph
/// and the execution plan, for the shape, alignment and precision in `key`.
struct ConvPlan {
  std::vector<int64_t> key;
  std::vector<void*> descriptors;  // destroyed in reverse order; none in a borrowed plan
  void* plan = nullptr;
  int64_t workspace = 0;
  /// The graph is the convolution alone although the call has an epilogue (cuDNN had no engine
  /// for them fused): the epilogue runs as kiln_conv_epilogue after it.
  bool unfused = false;
  /// With tuning (KILN_CUDNN_TUNE=1): the finalized engines to time at the first run, (plan,
  /// workspace) each; the plan of the fastest becomes `plan`.
  std::vector<std::pair<void*, int64_t>> candidates;
  void release() {
    for (size_t k = descriptors.size(); k-- > 0;) dnn_api().DestroyDescriptor(descriptors[k]);
    descriptors.clear();
    plan = nullptr;
  }
};

/// The activation a convolution call applies last (ir::ConvActivation's numbers, which
/// kiln_conv_epilogue's kernel also takes): 0 none, 1 Relu, 2 Sigmoid, 3 Tanh, 4 Clip to
/// [alpha, beta], 5 LeakyRelu (slope alpha), 6 Elu (alpha), 7 Gelu, 8 Gelu's tanh form, 9 Swish
/// x sigmoid(alpha x).
struct ConvActivation {
  int kind = 0;
  double alpha = 0, beta = 0;
};

/// What a convolution call applies after the convolution, in this order: + bias (broadcast over
/// all dims but the channel), + residual, the activation.
struct ConvEpilogue {
  bool bias = false;
  bool residual = false;
  ConvActivation act;
};

/// A convolution's dims as cuDNN takes them (NCHW order, at least 2 spatial dims) and whether
/// its activations and weight are channels-last in memory.
struct ConvDims {
  std::vector<int64_t> x, w, y, stride, pre, post, dilation;
  bool last;
};

/// A library call site's choice, baked into the wrapper from the autotune cache
/// (RunState::library_choice): the index of the algorithm among cuBLASLt's heuristic results,
/// or of the engine among the cuDNN engines make_conv_plan accepts (both listed in the same
/// order for the same problem, GPU and library version), and the library version
/// (cublasLtGetVersion / cudnnGetVersion) it was timed with. Index -1: the heuristic's first.
struct LibraryChoice {
  int index = -1;
  int64_t version = 0;
};

/// Kiln's tensor-core GEMM template (codegen/cuda/cuda_gemm_template.h), an autotune choice
/// beside cuBLASLt's algorithms: one launch's operands, kiln_gemm::Params on the device, field
/// for field (passed by value).
struct GemmParams {
  const void* a;
  const void* b;
  void* out;
  const void* bias;
  const void* residual;
  float* partial;
  int64_t m, n, k;
  int64_t lda, ldb, ldo;
  int64_t a_batch, b_batch, o_batch;
  int64_t k_piece;
  int32_t batches;
  int32_t splits;
  int32_t act;
  int32_t vec;
  float alpha;
  int32_t unused;
};

/// The template's tile configurations: cuda_gemm_template.cpp's cuda_gemm_configs(), row for
/// row (tests/unit/driver/cuda_gemm_template_test.cpp compares them).
struct GemmConfig {
  int bm, bn, bk, warps_m, warps_n, stages;
};
inline constexpr GemmConfig kGemmConfigs[] = {
    {128, 128, 32, 2, 4, 3}, {64, 128, 32, 2, 2, 3}, {64, 64, 32, 2, 2, 4}, {32, 64, 32, 1, 4, 4}};
inline constexpr int kGemmConfigCount = sizeof kGemmConfigs / sizeof kGemmConfigs[0];
/// The template's choices: 2 * config + 1 with split-K, 2 * config without.
inline constexpr int kGemmTemplateChoices = 2 * kGemmConfigCount;
/// The version of the template a cached choice was timed with (the autotune cache's
/// "library_version" of its "kiln_gemm" entries): a choice of another version is not baked.
inline constexpr int64_t kGemmTemplateVersion = 1;

/// Dynamic shared memory of configuration `c` for `element`-byte operands, B as [N][K] when
/// `b_nk`: `stages` buffers of the A and B tiles with the template's row padding.
inline int64_t gemm_shared_bytes(const GemmConfig& c, int64_t element, bool b_nk) {
  const int64_t pad = 16 / element;
  const int64_t a = c.bm * (c.bk + pad);
  const int64_t b = b_nk ? c.bn * (c.bk + pad) : c.bk * (c.bn + 8);
  return c.stages * (a + b) * element;
}

/// The split-K pieces of an M x N x K product (`batches` of them) with configuration `c`:
/// doubled while the tiles are fewer than 128 and each piece keeps at least 4 slices of K, at
/// most 16, and within `workspace` bytes of float32 partial sums. A function of the shape only,
/// so that a baked choice splits the same way on every GPU.
inline int64_t gemm_splits(int64_t m, int64_t n, int64_t k, int64_t batches, const GemmConfig& c,
                           size_t workspace) {
  const int64_t tiles = (m + c.bm - 1) / c.bm * ((n + c.bn - 1) / c.bn) * batches;
  const int64_t slices = (k + c.bk - 1) / c.bk;
  int64_t splits = 1;
  while (splits < 16 && tiles * splits < 128 && slices >= 8 * splits) splits *= 2;
  while (splits > 1 && static_cast<size_t>(splits * batches * m * n) * sizeof(float) > workspace)
    splits /= 2;
  return splits;
}

/// A product's operands in the template's terms: A row-major (rows lda apart), B as [K][N]
/// (`b_nk` false) or [N][K] (rows ldb apart), out row-major (rows ldo apart); false when an
/// operand is neither (cuBLASLt runs it). `as`, `bs`, `os` are the strides over the rank `r`.
struct GemmForm {
  int64_t lda = 0, ldb = 0, ldo = 0;
  bool b_nk = false;
};
inline bool gemm_form(int64_t m, int64_t n, int64_t k, const int64_t* as, const int64_t* bs,
                      const int64_t* os, int r, GemmForm& f) {
  if (!(as[r - 1] == 1 || k == 1) || !(os[r - 1] == 1 || n == 1)) return false;
  f.lda = m == 1 ? 0 : as[r - 2];
  f.ldo = m == 1 ? 0 : os[r - 2];
  if (bs[r - 1] == 1 || n == 1) {
    f.b_nk = false;
    f.ldb = k == 1 ? 0 : bs[r - 2];
  } else if (bs[r - 2] == 1 || k == 1) {
    f.b_nk = true;
    f.ldb = bs[r - 1];
  } else {
    return false;
  }
  return f.lda >= 0 && f.ldb >= 0 && f.ldo >= 0;
}

/// "1,128,768": `n` values joined for a problem text.
inline std::string join_dims(const int64_t* v, int n) {
  std::string s;
  for (int k = 0; k < n; ++k) {
    if (k > 0) s += ',';
    s += std::to_string(v[k]);
  }
  return s;
}

/// A problem text's name of element type T (uint16_t: bfloat16 when `bf16`, else float16).
template <typename T>
inline const char* element_name(bool bf16) {
  if constexpr (std::is_same_v<T, double>) return "f64";
  if constexpr (std::is_same_v<T, uint16_t>) return bf16 ? "bf16" : "f16";
  return "f32";
}

/// The element type (f32, f64, f16 or bf16) and compute type of a problem text: half types
/// accumulate in float32, float32 uses TF32 where allowed.
inline std::string element_text(const char* type, bool tf32) {
  std::string text = type;
  if (text == "f64") {
    text.append(" fp64");
  } else {
    text.append(text == "f32" && tf32 ? " tf32" : " fp32");
  }
  return text;
}

/// The text that names a product's problem in the autotune cache: element type, compute type,
/// epilogue (cublasLtEpilogue_t's value), residual or not, the output's sizes, K and the strides.
/// codegen/cuda/cuda_matmul.cpp's cuda_matmul_problem writes the same text from the IR.
inline std::string matmul_problem_text(const MatMulShape& s, const char* type, bool tf32,
                                       Epilogue epilogue, bool residual) {
  return element_text(type, tf32) + " epilogue " + std::to_string(static_cast<uint32_t>(epilogue)) +
         " residual " + (residual ? "1" : "0") + " sizes " + join_dims(s.sizes, s.rank) + " k " +
         std::to_string(s.k) + " a " + join_dims(s.a_strides, s.rank) + " b " +
         join_dims(s.b_strides, s.rank) + " out " + join_dims(s.out_strides, s.rank);
}

/// The same for a convolution (dims in NCHW order, as ConvShape holds them; the activation's
/// kind and parameters as the wrapper passes them); written from the IR by
/// codegen/cuda/cuda_conv.cpp's cuda_conv_problem.
inline std::string conv_problem_text(const ConvShape& s, const char* type, bool tf32, bool bias,
                                     bool residual, const ConvActivation& act) {
  const int r = s.spatial + 2;
  char params[64];
  std::snprintf(params, sizeof params, " alpha %.17g beta %.17g", act.alpha, act.beta);
  return element_text(type, tf32) + (s.channels_last ? " nhwc" : " nchw") + " bias " +
         (bias ? "1" : "0") + " residual " + (residual ? "1" : "0") + " act " +
         std::to_string(act.kind) + params + " x " + join_dims(s.x, r) + " w " + join_dims(s.w, r) +
         " y " + join_dims(s.y, r) + " strides " + join_dims(s.strides, s.spatial) + " pads " +
         join_dims(s.pads_begin, s.spatial) + "," + join_dims(s.pads_end, s.spatial) +
         " dilations " + join_dims(s.dilations, s.spatial);
}

/// The kernels of one model: cubins for one or more architectures (`arch` 80 for sm_80 ...),
/// and with `ptx` set the PTX text for the virtual architecture compute_<arch>, which the driver
/// compiles for any GPU of that compute capability or newer.
struct Cubin {
  int arch;
  const unsigned char* data;
  int ptx = 0;
};

/// The module for a GPU of compute capability `arch` (10 * major + minor): the cubin built for
/// it, else the newest cubin of the same major version built for an older minor one (binary
/// compatible), else the PTX when it is for `arch` or older; null when none runs there.
inline const Cubin* choose_module(const Cubin* cubins, size_t n, int arch) {
  const Cubin* best = nullptr;
  for (size_t k = 0; k < n; ++k) {
    const Cubin& c = cubins[k];
    if (c.ptx || c.data == nullptr || c.arch / 10 != arch / 10 || c.arch > arch) continue;
    if (best == nullptr || c.arch > best->arch) best = &c;
  }
  if (best != nullptr) return best;
  for (size_t k = 0; k < n; ++k) {
    if (cubins[k].ptx && cubins[k].data != nullptr && cubins[k].arch <= arch) return &cubins[k];
  }
  return nullptr;
}

/// "sm_80, sm_90 and PTX for compute_80": what `cubins` hold, for messages.
inline std::string modules_text(const Cubin* cubins, size_t n) {
  std::string text, ptx;
  for (size_t k = 0; k < n; ++k) {
    if (cubins[k].data == nullptr) continue;
    if (cubins[k].ptx) {
      ptx = " and PTX for compute_" + std::to_string(cubins[k].arch);
    } else {
      text += (text.empty() ? "sm_" : ", sm_") + std::to_string(cubins[k].arch);
    }
  }
  return (text.empty() ? std::string("no cubin") : text) + ptx;
}

/// What a model library needs of the machine, checked when it is loaded (check_device).
struct DeviceNeeds {
  const Cubin* cubins;
  size_t cubin_count;
  int min_driver;  // cuDriverGetVersion's form: 1000 * major + 10 * minor (13000: CUDA 13.0)
  bool blas;       // it runs matrix products on cuBLASLt
  bool dnn;        // it runs convolutions on cuDNN
};

/// What the CUDA driver reports, or what KILN_CUDA_FAKE_DRIVER says it reports (to see how a
/// library behaves on another machine, as KILN_CPU_FEATURES does for the CPU): "none" (no
/// driver library), or comma-separated fields "driver=13000,devices=1,cc=9.0,cublaslt=130100,
/// cudnn=91400", any of them left out taking a value that passes the checks (cublaslt and cudnn
/// left out: the libraries' own). A fake driver serves the load-time checks only: a run needs a
/// real one.
struct DriverReport {
  bool found = false;
  std::string why_missing;  // when !found
  int version = 0;
  int devices = 0;
  int arch = 0;
  long long blas_version = -1;  // faked, else -1 (ask the library)
  long long dnn_version = -1;
};

inline int fake_field(const char* spec, const char* name, int otherwise) {
  const size_t n = std::strlen(name);
  for (const char* p = spec; p != nullptr;
       p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : nullptr) {
    if (std::strncmp(p, name, n) != 0 || p[n] != '=') continue;
    char* end = nullptr;
    const long value = std::strtol(p + n + 1, &end, 10);
    if (std::strcmp(name, "cc") != 0) return static_cast<int>(value);
    // A compute capability "9.0": 10 * major + minor.
    const long minor = *end == '.' ? std::strtol(end + 1, nullptr, 10) : 0;
    return static_cast<int>(10 * value + minor);
  }
  return otherwise;
}

inline DriverReport report_driver(const DeviceNeeds& needs) {
  DriverReport r;
  if (const char* fake = std::getenv("KILN_CUDA_FAKE_DRIVER"); fake != nullptr && *fake != '\0') {
    if (std::strcmp(fake, "none") == 0) {
      r.why_missing = "KILN_CUDA_FAKE_DRIVER=none";
      return r;
    }
    r.found = true;
    r.version = fake_field(fake, "driver", needs.min_driver);
    r.devices = fake_field(fake, "devices", 1);
    r.arch = fake_field(fake, "cc", 90);
    r.blas_version = fake_field(fake, "cublaslt", -1);
    r.dnn_version = fake_field(fake, "cudnn", -1);
    return r;
  }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    r.why_missing = why != nullptr ? why : "not found";
    return r;
  }
  r.found = true;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*version)(int*) = nullptr;
  CUresult (*count)(int*) = nullptr;
  CUresult (*get)(CUdevice*, int) = nullptr;
  CUresult (*attribute)(int*, int, CUdevice) = nullptr;
  find_symbol(lib, "cuInit", init);
  find_symbol(lib, "cuDriverGetVersion", version);
  find_symbol(lib, "cuDeviceGetCount", count);
  find_symbol(lib, "cuDeviceGet", get);
  find_symbol(lib, "cuDeviceGetAttribute", attribute);
  version(&r.version);
  // cuInit fails with CUDA_ERROR_NO_DEVICE (100) on a machine with a driver and no GPU.
  if (init(0) != 0 || count(&r.devices) != 0) r.devices = 0;
  CUdevice dev = 0;
  int major = 0, minor = 0;
  if (r.devices > 0 && get(&dev, 0) == 0 && attribute(&major, 75, dev) == 0 &&
      attribute(&minor, 76, dev) == 0) {
    r.arch = 10 * major + minor;
  }
  return r;
}

inline std::string version_text(int driver) {
  return std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
}

/// Checks, when a model library is loaded, that this machine runs it: a CUDA driver at least as
/// new as the toolkit that compiled it, a GPU, a module for its compute capability, and
/// cuBLASLt (12 or 13) and cuDNN (9) where the model uses them. Returns "" when it does, else
/// why not, in words.
inline std::string check_device(const DeviceNeeds& needs) {
  const DriverReport r = report_driver(needs);
  if (!r.found) {
    return "this model runs on CUDA, but the CUDA driver (libcuda.so.1) is not found (" +
           r.why_missing + "): install the NVIDIA driver";
  }
  if (r.version < needs.min_driver) {
    return "the CUDA driver is too old: it supports CUDA " + version_text(r.version) +
           ", the model library was compiled with CUDA " + version_text(needs.min_driver) +
           " and needs a driver for CUDA " + version_text(needs.min_driver) +
           " or newer: update the NVIDIA driver";
  }
  if (r.devices <= 0) return "this model runs on CUDA, but the driver finds no CUDA device";
  const bool has_kernels = needs.cubin_count > 0 && needs.cubins[0].data != nullptr;
  if (has_kernels && choose_module(needs.cubins, needs.cubin_count, r.arch) == nullptr) {
    return "the GPU (compute capability " + std::to_string(r.arch / 10) + "." +
           std::to_string(r.arch % 10) + ") runs none of the model's kernels, compiled for " +
           modules_text(needs.cubins, needs.cubin_count) +
           ": compile it again with KILN_CUDA_ARCHS naming this GPU's architecture";
  }
  if (needs.blas) {
    long long v = r.blas_version;
    if (v < 0) {
      void* lib = nullptr;
      const char* chosen = std::getenv("KILN_CUBLASLT_LIBRARY");
      if (chosen != nullptr && *chosen != '\0') {
        lib = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
      } else {
        for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12"}) {
          if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
        }
      }
      if (lib == nullptr) {
        return "the model's matrix products run on cuBLASLt, but libcublasLt.so.13 (or .12) is "
               "not found: install cuBLAS (or set KILN_CUBLASLT_LIBRARY to its path)";
      }
      auto get_version = reinterpret_cast<size_t (*)()>(dlsym(lib, "cublasLtGetVersion"));
      v = get_version != nullptr ? static_cast<long long>(get_version()) : 0;
    }
    if (v < 120000) {
      return "cuBLASLt " + std::to_string(v) +
             " is too old: the model's matrix products need cuBLASLt 12.0 or newer";
    }
  }
  if (needs.dnn) {
    long long v = r.dnn_version;
    if (v < 0) {
      const char* chosen = std::getenv("KILN_CUDNN_LIBRARY");
      void* lib = dlopen(chosen != nullptr && *chosen != '\0' ? chosen : "libcudnn.so.9",
                         RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        return "the model's convolutions run on cuDNN, but libcudnn.so.9 is not found: install "
               "cuDNN 9 (or set KILN_CUDNN_LIBRARY to its path)";
      }
      auto get_version = reinterpret_cast<size_t (*)()>(dlsym(lib, "cudnnGetVersion"));
      v = get_version != nullptr ? static_cast<long long>(get_version()) : 0;
    }
    if (v < 90000) {
      return "cuDNN " + std::to_string(v) +
             " is too old: the model's convolutions need cuDNN 9.0 or newer";
    }
  }
  return "";
}

/// How a run takes its inputs and gives its outputs (the C API's kiln_model_run_cuda): on the
/// caller's `stream` (null: the run state's own, waited for at the end), inputs and outputs in
/// device memory or in host memory.
struct RunMode {
  CUstream stream = nullptr;
  bool inputs_on_device = false;
  bool outputs_on_device = false;
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

/// The constants (weights) of a loaded model in device memory, one copy shared by all its run
/// states (ModelState::cuda_constants): concurrent runs each have their own stream and arena,
/// not their own weights. A constant is uploaded at its first use by any run state; destroyed
/// with the model, after its run states (which wait for their streams).
class SharedConstants {
 public:
  SharedConstants() = default;
  SharedConstants(const SharedConstants&) = delete;
  SharedConstants& operator=(const SharedConstants&) = delete;
  ~SharedConstants() {
    for (void* p : device_) {
      if (p != nullptr) driver().cuMemFree(device_ptr(p));
    }
  }

  /// Constant `k` (host data of `bytes`) in device memory. The first use uploads it on `stream`
  /// and waits for the copy, so that runs on other streams may read it at once; null when
  /// `stream` is being captured into a CUDA graph (no wait is possible there: the caller keeps
  /// a copy of its own, uploaded by the capture).
  const void* get(size_t k, const void* host, size_t bytes, CUstream stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device_.size() <= k) device_.resize(k + 1, nullptr);
    if (device_[k] != nullptr) return device_[k];
    int capturing = 0;
    check(driver().cuStreamIsCapturing(stream, &capturing), "querying a stream's capture");
    if (capturing != 0) return nullptr;
    void* p = alloc_device(bytes);
    Driver& d = driver();
    CUresult e = bytes == 0 ? 0 : d.cuMemcpyHtoDAsync(device_ptr(p), host, bytes, stream);
    if (e == 0) e = d.cuStreamSynchronize(stream);
    if (e != 0) {
      d.cuMemFree(device_ptr(p));
      check(e, "copying a constant to the GPU");
    }
    device_[k] = p;
    return p;
  }

 private:
  std::mutex mutex_;
  std::vector<void*> device_;
};

/// Graph segments captured and launched by the runs of a model (ModelState::cuda_graph_stats,
/// read through the wrapper's kiln_cuda_graph_stats by tests and benchmarks).
struct GraphStats {
  std::atomic<int64_t> captured{0};
  std::atomic<int64_t> launched{0};
};

/// What one run state keeps on the GPU: its stream, the loaded module and its kernels, the
/// arena of the intermediates, the constants, and the index checks of the current run.
class RunState {
 public:
  RunState() = default;
  RunState(const RunState&) = delete;
  RunState& operator=(const RunState&) = delete;
  ~RunState() {
    if (own_stream_ == nullptr) return;
    Driver& d = driver();
    // Between runs stream_ is the state's own (end_run): a caller's stream may be gone by now;
    // the last run queued on one is waited for through its event.
    if (pending_) d.cuEventSynchronize(done_);
    d.cuStreamSynchronize(own_stream_);
    drop_graphs();
    if (done_ != nullptr) d.cuEventDestroy(done_);
    if (side_stream_ != nullptr) {
      d.cuStreamSynchronize(side_stream_);
      d.cuEventDestroy(fork_event_);
      d.cuEventDestroy(join_event_);
      d.cuStreamDestroy(side_stream_);
    }
    if (arena_ != nullptr) d.cuMemFree(device_ptr(arena_));
    for (void* c : own_constants_) d.cuMemFree(device_ptr(c));
    if (module_ != nullptr) d.cuModuleUnload(module_);
    for (MatMulPlan& p : plans_) p.release();
    if (blas_handle_ != nullptr) blas().Destroy(blas_handle_);
    for (ConvPlan& p : conv_plans_) p.release();
    for (size_t k = retired_conv_descriptors_.size(); k-- > 0;)
      dnn_api().DestroyDescriptor(retired_conv_descriptors_[k]);
    if (dnn_handle_ != nullptr) {
      dnn_api().SetStream(dnn_handle_, own_stream_);  // not a caller's stream, which may be gone
      dnn_api().Destroy(dnn_handle_);
    }
    d.cuStreamDestroy(own_stream_);
  }

  /// How the next run takes its inputs and gives its outputs (the default RunMode until
  /// end_run()).
  void set_mode(const RunMode& mode) { mode_ = mode; }
  const RunMode& mode() const { return mode_; }
  /// The run was queued on the caller's stream: it returns without waiting for the GPU.
  bool enqueued() const { return mode_.stream != nullptr; }

  /// Starts a run: creates the state's own stream and loads the module for this GPU's
  /// architecture the first time (`names` are the kernels, in the order launch() numbers them),
  /// takes the stream of the run's mode (made to wait for the state's previous run, which may
  /// still be queued on another stream: it used the same arena), then clears the error word.
  ///
  /// With `graphs` (no profile), the run's device work becomes CUDA graphs per set of input
  /// sizes and dtypes (`inputs`): the first run with them runs directly (the libraries make
  /// their plans, the constants are uploaded), the second captures each stretch of its device
  /// work between two waits for the GPU (host fallbacks, sizes read from data, copies out) into
  /// a graph of its own, segment k of the run, and launches it where the stretch ends; the next
  /// ones run the host code alone (host fallbacks included) and launch the segments. A segment
  /// is keyed by the sizes known before it (size_known): a replay that finds another value, or
  /// another allocation, is done again without graphs (GraphMiss). Eight sets of segments are
  /// kept, the least recently used dropped first; a run that cannot be captured (a library call
  /// that refuses) runs again without graphs (run_retrying), and its sizes never get them.
  /// KILN_CUDA_GRAPHS=0 turns graphs off.
  void begin_run(const Cubin* cubins, size_t n_cubins, const char* const* names, size_t n_names,
                 const kiln_rt::TensorArg* inputs = nullptr, size_t n_inputs = 0,
                 bool graphs = false) {
    Driver& d = driver();
    if (own_stream_ == nullptr) {
      check(d.cuStreamCreate(&own_stream_, 1 /* CU_STREAM_NON_BLOCKING */), "creating a stream");
      check(d.cuEventCreate(&done_, 2 /* CU_EVENT_DISABLE_TIMING */), "creating an event");
      stream_ = own_stream_;
      load(cubins, n_cubins, names, n_names);
    }
    CUstream next = mode_.stream != nullptr ? mode_.stream : own_stream_;
    // After a run queued by kiln_run_cuda (on whatever stream): this one starts after it.
    if (pending_) check(d.cuStreamWaitEvent(next, done_, 0), "ordering after the last run");
    if (dnn_handle_ != nullptr && dnn_stream_ != next) {
      check_dnn(dnn_api().SetStream(dnn_handle_, next), "its stream");
      dnn_stream_ = next;
    }
    stream_ = next;
    pending_ = false;
    host_inputs_.clear();
    checks_.clear();
    graph_ = nullptr;
    graph_mode_ = GraphMode::kNone;
    capturing_ = false;
    segment_ = 0;
    segment_open_ = false;
    sizes_known_.clear();
    on_side_ = false;
    if (graphs && module_ != nullptr && graphs_enabled()) choose_graph(inputs, n_inputs);
    if (error_ != 0)
      check(d.cuMemsetD8Async(error_, 0, sizeof(DeviceError), stream_), "clearing the error word");
  }

  /// Ends a run: marks where its work ends on its stream, so that the state's next run, on
  /// whatever stream, starts after it; the mode goes back to the default.
  /// Never throws (it also ends a failed run); the stream goes back to the state's own, so that
  /// nothing refers to a caller's stream between runs.
  void end_run() {
    mode_ = RunMode{};
    if (done_ == nullptr) return;  // the run failed before it had a stream
    pending_ = driver().cuEventRecord(done_, stream_) == 0;
    stream_ = own_stream_;
  }

  CUstream stream() const { return stream_; }
  DeviceMemory memory() {
    return DeviceMemory{stream_, graph_mode_ != GraphMode::kNone ? &graph_->memory : nullptr};
  }

  /// Called before each kernel or library call a run queues: the first one after a wait opens
  /// a graph segment (a capture begins; a replay checks that the segment was captured after the
  /// same sizes); true when the run replays its graph, which holds the call (the caller queues
  /// nothing).
  bool replaying() {
    if (graph_mode_ == GraphMode::kNone) return false;
    if (!segment_open_) {
      if (graph_mode_ == GraphMode::kCapture) {
        check(driver().cuStreamBeginCapture(on_side_ ? main_stream_ : stream_,
                                            2 /* CU_STREAM_CAPTURE_MODE_RELAXED */),
              "beginning a CUDA graph capture");
        capturing_ = true;
      } else if (segment_ >= graph_->segments.size() ||
                 graph_->segments[segment_].sizes != sizes_known_) {
        throw GraphMiss("CUDA graph replay: the run's sizes differ from the capture's");
      }
      segment_open_ = true;
    }
    return graph_mode_ == GraphMode::kReplay;
  }

  /// Where the run waits for the GPU or copies a result out: ends the open segment (a capture
  /// ends and its graph is instantiated), then launches it. Work queued between segments (copies
  /// of a host fallback's results to the GPU) runs directly, in the capture and its replays.
  void flush_graph() {
    if (graph_mode_ == GraphMode::kNone || !segment_open_) return;
    Driver& d = driver();
    if (capturing_) {
      CUgraph g = nullptr;
      check(d.cuStreamEndCapture(stream_, &g), "ending the CUDA graph capture");
      capturing_ = false;
      CUgraphExec exec = nullptr;
      const CUresult e = d.cuGraphInstantiate(&exec, g, 0);
      d.cuGraphDestroy(g);
      check(e, "instantiating the CUDA graph");
      graph_->segments.push_back({exec, sizes_known_});
      graph_->checks = checks_;
    }
    check(d.cuGraphLaunch(graph_->segments.at(segment_).exec, stream_), "launching the CUDA graph");
    ++segment_;
    segment_open_ = false;
    if (graph_stats_ != nullptr) {
      if (graph_mode_ == GraphMode::kCapture) graph_stats_->captured++;
      graph_stats_->launched++;
    }
  }

  /// A size known only mid-run (read from data or from an input's values): the graph segments
  /// after it are keyed by it.
  void size_known(int64_t value) { sizes_known_.push_back(value); }

  /// After a failure: when the run was capturing a graph segment, ends the capture, forgets the
  /// run's graphs (its sizes run without them from now on) and returns true, so that the run can
  /// be done again directly; false otherwise (the run's own failure: segments captured before it
  /// are dropped, and a later run captures again).
  /// A replay that found other sizes or allocations than its capture (`why`): says so once per
  /// process, then drops the graphs of the run's input sizes, which run without from now on.
  void miss_graph(const char* why) {
    note_once("graph", "CUDA graphs", std::string(why) + "; these input sizes run without graphs");
    abandon_graph();
  }

  /// A capture that failed (`why`: a library call that cannot be captured): says so once per
  /// process; then as abandon_capture().
  bool abandon_capture(const char* why) {
    const bool abandoned = abandon_capture();
    if (abandoned) {
      note_once("graph", "CUDA graph capture",
                std::string(why) + "; these input sizes run without graphs");
    }
    return abandoned;
  }

  bool abandon_capture() {
    if (graph_mode_ != GraphMode::kCapture) return false;
    const bool in_capture = capturing_;
    abandon_graph(in_capture);
    return in_capture;
  }

  /// Ends the run's use of its graphs (a capture under way ends), waits for its streams and
  /// frees the graphs of its input sizes; `failed`: they get none from now on. The run, done
  /// again, runs directly.
  void abandon_graph(bool failed = true) {
    if (graph_mode_ == GraphMode::kNone) return;
    Driver& d = driver();
    if (on_side_) side(true, false);
    if (capturing_) {
      // Join the side stream first, so that the capture can end (errors here mean the capture
      // was invalidated already).
      if (side_stream_ != nullptr) {
        d.cuEventRecord(join_event_, side_stream_);
        d.cuStreamWaitEvent(stream_, join_event_, 0);
      }
      CUgraph g = nullptr;
      d.cuStreamEndCapture(stream_, &g);
      if (g != nullptr) d.cuGraphDestroy(g);
      capturing_ = false;
    }
    d.cuStreamSynchronize(stream_);
    if (side_stream_ != nullptr) d.cuStreamSynchronize(side_stream_);
    release(*graph_);
    graph_->failed = failed;
    graph_mode_ = GraphMode::kNone;
    graph_ = nullptr;
    segment_open_ = false;
  }

  /// Concurrent streams (codegen/wrapper/stream_plan.h): forks the run onto the state's side
  /// stream, which waits for what the run queued so far; false (one stream) when not `allowed`
  /// (a profiled run), with KILN_CUDA_STREAMS=1, or in a direct run of a state that times
  /// library plans (--autotune max, KILN_CUDNN_TUNE=1: new plans are timed in such runs, each
  /// call alone; a run that captures or replays a graph makes no new plans).
  bool fork(bool allowed) {
    if (!allowed || !streams_enabled()) return false;
    if ((tune_convs_ || tune_blas_) && graph_mode_ == GraphMode::kNone) return false;
    Driver& d = driver();
    if (side_stream_ == nullptr) {
      check(d.cuStreamCreate(&side_stream_, 1 /* CU_STREAM_NON_BLOCKING */),
            "creating the side stream");
      check(d.cuEventCreate(&fork_event_, 2 /* CU_EVENT_DISABLE_TIMING */), "creating an event");
      check(d.cuEventCreate(&join_event_, 2 /* CU_EVENT_DISABLE_TIMING */), "creating an event");
    }
    if (replaying()) return true;  // the graph holds the fork
    check(d.cuEventRecord(fork_event_, stream_), "forking the side stream");
    check(d.cuStreamWaitEvent(side_stream_, fork_event_, 0), "forking the side stream");
    return true;
  }

  /// The calls queued next go to the side stream (`enter`) or back to the run's stream; nothing
  /// when the run did not fork.
  void side(bool forked, bool enter) {
    if (!forked || enter == on_side_) return;
    if (enter) {
      main_stream_ = stream_;
      stream_ = side_stream_;
    } else {
      stream_ = main_stream_;
    }
    on_side_ = enter;
  }

  /// The run's stream waits for what the side stream queued since the fork.
  void join(bool forked) {
    if (!forked || replaying()) return;
    Driver& d = driver();
    check(d.cuEventRecord(join_event_, side_stream_), "joining the side stream");
    check(d.cuStreamWaitEvent(stream_, join_event_, 0), "joining the side stream");
  }

  /// Where the state counts the graph segments its runs capture and launch (the model's, shared
  /// by its run states; kiln_cuda_graph_stats).
  void count_graphs(GraphStats* stats) { graph_stats_ = stats; }

  /// Kernel `k` of the module, launched on the run's stream.
  template <typename... Args>
  void launch(int k, const char* name, Args... args) {
    if (replaying()) return;
    launch_function(functions_[static_cast<size_t>(k)], stream_, name, args...);
  }

  /// --autotune max: kernel `what` generated with `count` launch configurations
  /// (codegen/cuda/cuda_kernel.h); `launch(c)` queues configuration c (0: the heuristic's). The
  /// first run of each `sizes` (the kernel's size arguments) in this process times every
  /// configuration (time_candidates: a warm-up, then the median of kTuneRuns; reported as library
  /// "kiln" with `problem`, and the sizes when there are any) and queues the fastest last, so
  /// the outputs are its; later runs, and runs captured into a CUDA graph, queue that one
  /// (the heuristic's when a capture comes first). Every configuration reads the same inputs and
  /// writes every element of the same outputs (such kernels do not work in place).
  template <typename Launch>
  void launch_tuned(const char* what, const char* problem, int64_t version,
                    std::initializer_list<int64_t> sizes, int count, const Launch& launch) {
    if (replaying()) return;
    const std::vector<int64_t> key(sizes);
    std::string text = problem;
    for (size_t k = 0; k < key.size(); ++k)
      text += (k == 0 ? " sizes " : ",") + std::to_string(key[k]);
    size_t chosen = 0;
    if (capturing_) {
      TunedChoices& tuned = tuned_choices();
      std::lock_guard<std::mutex> lock(tuned.mutex);
      auto it = tuned.chosen.find(std::make_pair("kiln\t" + text, key));
      if (it != tuned.chosen.end()) chosen = it->second;
    } else {
      std::vector<std::function<int()>> runs;
      for (int c = 0; c < count; ++c) {
        runs.emplace_back([&launch, c] {
          launch(c);
          return 0;
        });
      }
      chosen = time_candidates(runs, key, "kiln", text, static_cast<size_t>(version), what);
    }
    launch(static_cast<int>(chosen));
  }

  /// --autotune max: each new convolution plan times up to kConvTuneCandidates engines at its
  /// first run (as KILN_CUDNN_TUNE=1 does for any model), and each new product plan the first
  /// kBlasTuneCandidates algorithms of cuBLASLt's heuristic; with KILN_CUDA_TUNE_REPORT set, the
  /// times go to that file (report_tuning) for the compiler to keep in the autotune cache.
  void tune_convolutions() { tune_convs_ = tune_blas_ = true; }

  /// The autotune cache's choice for matrix product (`conv` false) or convolution call `site`
  /// (LibraryChoice); such a site is not timed again.
  void library_choice(bool conv, int site, int index, int64_t version) {
    std::vector<LibraryChoice>& v = conv ? conv_choices_ : blas_choices_;
    if (v.size() <= static_cast<size_t>(site)) v.resize(static_cast<size_t>(site) + 1);
    v[static_cast<size_t>(site)] = {index, version};
  }

  /// The autotune cache's choice for matrix product call `site`: Kiln's GEMM template with
  /// choice `index` (kGemmTemplateChoices), timed faster than cuBLASLt with template version
  /// `version`; such a site is not timed again.
  void gemm_template_choice(int site, int index, int64_t version) {
    if (gemm_choices_.size() <= static_cast<size_t>(site))
      gemm_choices_.resize(static_cast<size_t>(site) + 1);
    gemm_choices_[static_cast<size_t>(site)] = {index, version};
  }

  /// The GEMM template's choice that ran call `site`'s last product, or -1 (cuBLASLt ran it).
  int gemm_template_ran(int site) const {
    return static_cast<size_t>(site) < plans_.size() ? plans_[static_cast<size_t>(site)].kiln : -1;
  }

  /// Queues the fused attention of `p` (kernel `k` of the module: one
  /// kiln_attention_f32_d<D>_v<Dv>, 8 query rows per block of 128 threads) on the run's stream,
  /// without waiting.
  void attention(int k, const AttentionParams& p, const char* what) {
    if (p.d > 128 || p.dv > 128 || p.batch_rank > AttentionParams::kMaxBatchRank)
      kiln_rt::fail("%s: the fused attention kernel takes heads of up to 128 and 6 batch dims",
                    what);
    int64_t batches = 1;
    for (int b = 0; b < p.batch_rank; ++b) batches *= p.batch[b];
    const int64_t blocks = batches * ((p.lq + 7) / 8);
    if (blocks == 0 || p.dv == 0) return;
    launch(k, what, blocks, 1, 1, 128, 1, 1, 0, p);
  }

  /// The model runs matrix products or convolutions: the arena keeps the libraries' workspace
  /// after the intermediates, `copies` of it (one per stream that runs them; called before
  /// arena()).
  void reserve_library_workspace(size_t copies = 1) {
    library_workspace_bytes_ = kLibraryWorkspaceBytes;
    library_workspaces_ = copies;
  }

  /// cuBLASLt's and cuDNN's workspace (one call at a time uses each): the end of the arena, the
  /// side stream's after the run's stream's.
  char* library_workspace() {
    if (arena_ == nullptr) arena(0);
    if (on_side_ && library_workspaces_ < 2)
      kiln_rt::fail("CUDA: a library call on the side stream without a workspace of its own");
    return arena_ + library_offset_ + (on_side_ ? library_workspace_bytes_ : 0);
  }

  /// The arena, grown to `bytes` plus cuBLASLt's workspace (the old one is freed once the GPU is
  /// done with it).
  char* arena(int64_t bytes) {
    const size_t data = (static_cast<size_t>(bytes > 0 ? bytes : 0) + 255) / 256 * 256;
    if (data > library_offset_) library_offset_ = data;
    const size_t want = library_offset_ + library_workspace_bytes_ * library_workspaces_;
    if (arena_ == nullptr || want > arena_bytes_) {
      Driver& d = driver();
      // The graphs read and write the old arena: dropped (runs of their sizes capture anew). A
      // graph's own run never grows it: the run before its capture sized it. The first arena
      // drops nothing: no graph was captured without one, and the sizes a first run warmed
      // (choose_graph) capture at their next run.
      if (graph_mode_ != GraphMode::kNone)
        kiln_rt::fail("CUDA graph: the arena grows in a run that captures or replays a graph");
      if (arena_ != nullptr) drop_graphs();
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

  /// The model's constants in device memory that this state's runs read (set before its first
  /// run; without it, the state keeps copies of its own).
  void share_constants(SharedConstants* shared) { shared_constants_ = shared; }

  /// Constant `k` (host data of `bytes`, alive as long as the model) in device memory: the
  /// model's shared copy, or where that cannot be made now (a run being captured into a graph),
  /// a copy of this state's own, uploaded in the order of the run's stream.
  const void* constant(size_t k, const void* host, size_t bytes) {
    if (constants_.size() <= k) constants_.resize(k + 1, nullptr);
    if (constants_[k] == nullptr && shared_constants_ != nullptr)
      constants_[k] = shared_constants_->get(k, host, bytes, stream_);
    if (constants_[k] == nullptr) {
      void* p = alloc_device(bytes);
      own_constants_.push_back(p);
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
    if (mode_.inputs_on_device) {
      // The caller's, read in place; a graph reads its own copy (its address is in the graph).
      if (graph_mode_ == GraphMode::kNone) return static_cast<const T*>(in.data);
      T* p = ws.alloc<T>(static_cast<int64_t>(n));
      if (n > 0) {
        check(
            driver().cuMemcpyDtoDAsync(device_ptr(p), device_ptr(in.data), n * sizeof(T), stream_),
            "copying an input on the GPU");
      }
      return p;
    }
    T* p = ws.alloc<T>(static_cast<int64_t>(n));
    upload(p, static_cast<const T*>(in.data), static_cast<int64_t>(n));
    return p;
  }

  /// Model input `in` where the host reads it (value guards, sizes read from an input): the
  /// caller's host data, or a copy of the caller's device data (waits for the GPU).
  template <typename T>
  const T* host_input(const kiln_rt::TensorArg& in) {
    if (!mode_.inputs_on_device) return static_cast<const T*>(in.data);
    size_t n = 1;
    for (int k = 0; k < in.rank; ++k) n *= static_cast<size_t>(in.dims[k]);
    std::vector<char>& copy = host_inputs_.emplace_back(n * sizeof(T) + 1);
    download(reinterpret_cast<T*>(copy.data()), static_cast<const T*>(in.data),
             static_cast<int64_t>(n));
    synchronize("reading an input on the host");
    return reinterpret_cast<const T*>(copy.data());
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
    flush_graph();
    if (numel <= 0) return;
    check(driver().cuMemcpyDtoHAsync(host, device_ptr(device),
                                     static_cast<size_t>(numel) * sizeof(T), stream_),
          "copying from the GPU");
  }

  /// Waits for everything queued on the run's stream (`what` names the reason in errors), then
  /// fails if an index check failed.
  void synchronize(const char* what) {
    flush_graph();
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

  /// Queues out = act(alpha * A @ B + residual + bias) (shape and strides in `s`; `bias` a
  /// vector of N elements added to each row, or null; `residual` a matrix laid out as `out` is,
  /// cuBLASLt's C with beta 1, or null; `tf32`: float32 products may round their inputs to
  /// TF32 on the tensor cores) through cuBLASLt on the run's stream, without waiting. The
  /// row-major product is the column-major out^T = B^T @ A^T, so cuBLASLt's A is our B and its
  /// B our A; transposed operands are the op flags. Batch dims that are one strided batch for
  /// all three go in one call; the others are looped here. `site` numbers the call in the
  /// wrapper; its plan is remade only when the shape, strides or alignment change. uint16_t
  /// elements are float16, or bfloat16 when `bf16` (--precision fp16|bf16): A, B, C, D and the
  /// bias in that type, products accumulated and the epilogue computed in float32.
  template <typename T>
  void matmul(int site, const MatMulShape& s, const T* a, const T* b, T* out, double alpha,
              Epilogue epilogue, const T* bias, const T* residual, bool tf32, const char* what,
              bool bf16 = false) {
    static_assert(
        std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, uint16_t>,
        "cuBLASLt products are float32, float64, float16 or bfloat16 here");
    const int r = s.rank;
    const int64_t m = s.sizes[r - 2], n = s.sizes[r - 1], k = s.k;
    int64_t batches = 1;
    for (int d = 0; d < r - 2; ++d) batches *= s.sizes[d];
    if (m == 0 || n == 0 || batches == 0) return;
    if (s.out_strides[r - 1] != 1 && n > 1)
      kiln_rt::fail("%s: cuBLASLt writes rows of contiguous elements", what);
    if (replaying()) return;
    if (k == 0) {  // an empty sum: zeros (no epilogue is fused where K may be 0)
      if (epilogue != Epilogue::kNone || residual != nullptr)
        kiln_rt::fail("%s: an epilogue over K = 0", what);
      check(driver().cuMemsetD8Async(device_ptr(out), 0,
                                     static_cast<size_t>(batches * m * n) * sizeof(T), stream_),
            what);
      return;
    }
    // Column-major: cuBLASLt's A is B^T (N x K), its B is A^T (K x M), its D is out^T (N x M).
    BlasMatrix x, y, z;
    const int64_t *as = s.a_strides, *bs = s.b_strides, *ds = s.out_strides;
    if (!blas_matrix(n, k, bs[r - 1], bs[r - 2], x) ||
        !blas_matrix(k, m, as[r - 1], as[r - 2], y) ||
        !blas_matrix(n, m, ds[r - 1], ds[r - 2], z) || z.op != kBlasOpN) {
      kiln_rt::fail("%s: an operand's matrix is not one cuBLASLt reads as a view", what);
    }
    // Batch dims of size > 1, merged where one stride steps over the next for all three; the
    // innermost is cuBLASLt's strided batch, the rest are looped.
    struct Dim {
      int64_t size, a, b, d;
    };
    std::vector<Dim> dims;
    for (int d = 0; d < r - 2; ++d) {
      if (s.sizes[d] == 1) continue;
      Dim next{s.sizes[d], as[d], bs[d], ds[d]};
      if (!dims.empty()) {
        Dim& last = dims.back();
        if (last.a == next.a * next.size && last.b == next.b * next.size &&
            last.d == next.d * next.size) {
          last = {last.size * next.size, next.a, next.b, next.d};
          continue;
        }
      }
      dims.push_back(next);
    }
    const Dim inner = dims.empty() ? Dim{1, 0, 0, 0} : dims.back();
    if (!dims.empty()) dims.pop_back();
    const uint64_t e = sizeof(T);
    uint64_t a_steps = 0, b_steps = 0, d_steps = 0;  // strides of the looped dims, or-ed
    for (const Dim& d : dims) {
      a_steps |= static_cast<uint64_t>(d.a) * e;
      b_steps |= static_cast<uint64_t>(d.b) * e;
      d_steps |= static_cast<uint64_t>(d.d) * e;
    }
    const uint32_t align_b = alignment_of({reinterpret_cast<uint64_t>(b), b_steps,
                                           static_cast<uint64_t>(inner.b) * e}),
                   align_a = alignment_of({reinterpret_cast<uint64_t>(a), a_steps,
                                           static_cast<uint64_t>(inner.a) * e}),
                   align_d = alignment_of({reinterpret_cast<uint64_t>(out), d_steps,
                                           static_cast<uint64_t>(inner.d) * e}),
                   // C is the residual when there is one (laid out as D), else D itself.
        align_c = residual == nullptr ? align_d
                                      : alignment_of({reinterpret_cast<uint64_t>(residual), d_steps,
                                                      static_cast<uint64_t>(inner.d) * e});
    constexpr bool f64 = std::is_same_v<T, double>, half = std::is_same_v<T, uint16_t>;
    // Half types accumulate in float32 (CUBLAS_COMPUTE_32F) on the tensor cores.
    const int compute = f64             ? kBlasCompute64F
                        : tf32 && !half ? kBlasCompute32FFastTf32
                                        : kBlasCompute32F;
    const int type = f64 ? kBlasR64F : !half ? kBlasR32F : bf16 ? kBlasR16BF : kBlasR16F;
    const MatMulPlan::Key key = {compute * 64 + type,
                                 static_cast<int64_t>(epilogue),
                                 x.op,
                                 static_cast<int64_t>(x.rows),
                                 static_cast<int64_t>(x.cols),
                                 x.ld,
                                 y.op,
                                 static_cast<int64_t>(y.rows),
                                 static_cast<int64_t>(y.cols),
                                 y.ld,
                                 z.ld,
                                 n,
                                 m,
                                 inner.size,
                                 inner.a,
                                 inner.b,
                                 inner.d,
                                 align_a,
                                 align_b,
                                 align_c,
                                 align_d};
    if (blas_handle_ == nullptr) check_blas(blas().Create(&blas_handle_), "creating a handle");
    if (plans_.size() <= static_cast<size_t>(site)) plans_.resize(static_cast<size_t>(site) + 1);
    MatMulPlan& plan = plans_[static_cast<size_t>(site)];
    const size_t workspace = library_workspace_bytes_;
    const LibraryChoice choice = choice_of(blas_choices_, site);
    const LibraryChoice template_choice = choice_of(gemm_choices_, site);
    if (plan.key != key) {
      plan.release();
      plan.key = {};
      // Timing runs the product again: not where it accumulates into its own output.
      plan.tune = tune_blas_ && choice.index < 0 && template_choice.index < 0 && residual != out;
      make_plan(plan, compute, f64 ? kBlasR64F : kBlasR32F, type, epilogue, x, y, z, inner.size,
                inner.b, inner.a, inner.d, align_b, align_a, align_c, align_d, workspace, what,
                choice, plan.tune);
      plan.kiln = -1;
      if (template_choice.index >= 0) {
        if (template_choice.version == kGemmTemplateVersion &&
            template_choice.index < kGemmTemplateChoices) {
          plan.kiln = template_choice.index;
        } else {
          note_once("choice", what,
                    "the autotune cache's GEMM template choice #" +
                        std::to_string(template_choice.index) + " (template version " +
                        std::to_string(template_choice.version) +
                        ") is not one of this Kiln's; cuBLASLt runs instead");
        }
      }
      plan.key = key;
    }
    if (epilogue == Epilogue::kBias || epilogue == Epilogue::kReluBias ||
        epilogue == Epilogue::kGeluBias) {
      check_blas(blas().MatmulDescSetAttribute(plan.desc, kBlasDescBiasPointer, &bias, sizeof bias),
                 what);
    }
    // The scale type: the compute type's (float for the half types too).
    using Scale = std::conditional_t<f64, double, float>;
    const Scale alpha_t = static_cast<Scale>(alpha), beta_t = residual != nullptr ? 1 : 0;
    char* ws = workspace > 0 ? library_workspace() : nullptr;
    // Calls f(oa, ob, od) with the offsets of A, B and out of every looped batch (odometer
    // order) until one returns nonzero; returns that status, or 0.
    auto each_batch = [&dims](auto&& f) -> int {
      std::vector<int64_t> at(dims.size(), 0);
      for (;;) {
        int64_t oa = 0, ob = 0, od = 0;
        for (size_t d = 0; d < dims.size(); ++d) {
          oa += at[d] * dims[d].a;
          ob += at[d] * dims[d].b;
          od += at[d] * dims[d].d;
        }
        if (const int status = f(oa, ob, od); status != 0) return status;
        size_t d = dims.size();
        while (d > 0 && ++at[d - 1] == dims[d - 1].size) at[--d] = 0;
        if (d == 0) return 0;
      }
    };
    // The product with algorithm `algo`, every looped batch; cuBLASLt's status.
    auto execute = [&](const void* algo) {
      return each_batch([&](int64_t oa, int64_t ob, int64_t od) {
        T* dst = out + od;
        const T* c = residual != nullptr ? residual + od : dst;
        return blas().Matmul(blas_handle_, plan.desc, &alpha_t, b + ob, plan.layouts[0], a + oa,
                             plan.layouts[1], &beta_t, c, plan.layouts[2], dst, plan.layouts[2],
                             algo, ws, workspace, stream_);
      });
    };
    // Kiln's GEMM template (kiln_gemm_*, in the module when the model was compiled with
    // --autotune max or a cached template choice): TF32 float32 products and the half types.
    // Looked up only where it may run (timed, or chosen for this site), so that a module
    // without it is never asked for it.
    const int precision = half ? (bf16 ? 2 : 1) : std::is_same_v<T, float> && tf32 ? 0 : -1;
    GemmForm form;
    const bool templated = precision >= 0 && (plan.tune || plan.kiln >= 0) &&
                           gemm_form(m, n, k, as, bs, ds, r, form) &&
                           gemm_function(precision, 0, form.b_nk) != nullptr;
    // The template with choice `index`, every looped batch; nonzero when it does not apply.
    auto run_template = [&](int index) -> int {
      if (!templated || index < 0 || index >= kGemmTemplateChoices) return 1;
      const GemmConfig& c = kGemmConfigs[index / 2];
      const CUfunction f = gemm_function(precision, index / 2, form.b_nk);
      const CUfunction reduce = gemm_function(precision, -1, false);
      if (f == nullptr || reduce == nullptr) return 1;
      int64_t splits = 1, piece = (k + c.bk - 1) / c.bk * c.bk;
      if (index % 2 == 1) {  // split-K: a choice only where the shape splits
        const int64_t wanted = gemm_splits(m, n, k, inner.size, c, workspace);
        if (wanted < 2) return 1;
        piece = ((k + c.bk - 1) / c.bk + wanted - 1) / wanted * c.bk;
        splits = (k + piece - 1) / piece;
      }
      const int64_t gx = (n + c.bn - 1) / c.bn, gy = (m + c.bm - 1) / c.bm;
      if (inner.size * splits > 65535 || gy > 65535) return 1;
      GemmParams p{};
      p.bias = epilogue == Epilogue::kBias || epilogue == Epilogue::kReluBias ||
                       epilogue == Epilogue::kGeluBias
                   ? bias
                   : nullptr;
      p.partial = splits > 1 ? reinterpret_cast<float*>(ws) : nullptr;
      p.m = m;
      p.n = n;
      p.k = k;
      p.lda = form.lda;
      p.ldb = form.ldb;
      p.ldo = form.ldo;
      p.a_batch = inner.a;
      p.b_batch = inner.b;
      p.o_batch = inner.d;
      p.k_piece = piece;
      p.batches = static_cast<int32_t>(inner.size);
      p.splits = static_cast<int32_t>(splits);
      p.act = epilogue == Epilogue::kRelu || epilogue == Epilogue::kReluBias   ? 1
              : epilogue == Epilogue::kGelu || epilogue == Epilogue::kGeluBias ? 2
                                                                               : 0;
      // 16-byte copies when every row and batch of A and B starts 16-byte aligned.
      p.vec = align_a >= 16 && align_b >= 16 && form.lda * static_cast<int64_t>(e) % 16 == 0 &&
              form.ldb * static_cast<int64_t>(e) % 16 == 0;
      p.alpha = static_cast<float>(alpha);
      const int64_t threads = 32 * c.warps_m * c.warps_n;
      const int64_t shared = gemm_shared_bytes(c, static_cast<int64_t>(e), form.b_nk);
      const int64_t total = inner.size * m * n;
      return each_batch([&](int64_t oa, int64_t ob, int64_t od) {
        p.a = a + oa;
        p.b = b + ob;
        p.out = out + od;
        p.residual = residual != nullptr ? residual + od : nullptr;
        launch_function(f, stream_, what, gx, gy, inner.size * splits, threads, 1, 1, shared, p);
        if (splits > 1) {
          launch_function(reduce, stream_, what, std::min<int64_t>((total + 255) / 256, 65535), 1,
                          1, 256, 1, 1, 0, p);
        }
        return 0;
      });
    };
    const size_t algos = std::max<size_t>(plan.candidates.size(), 1);
    if (plan.tune && !capturing_ && (algos > 1 || templated)) {
      const std::string problem =
          matmul_problem_text(s, element_name<T>(bf16), tf32, epilogue, residual != nullptr);
      std::vector<std::function<int()>> runs;
      if (plan.candidates.empty()) plan.candidates.push_back(plan.choice);
      for (const BlasLt::Heuristic& h : plan.candidates)
        runs.emplace_back([&execute, &h] { return execute(h.algo); });
      // The template's choices after cuBLASLt's algorithms, all of them (one that does not apply
      // to this shape is reported as failed), timed the same way.
      for (int index = 0; templated && index < kGemmTemplateChoices; ++index)
        runs.emplace_back([&run_template, index] { return run_template(index); });
      const size_t chosen =
          time_candidates(runs, plan.key, "cublaslt", problem, blas().version, what, algos);
      if (chosen < algos) {
        plan.choice = plan.candidates[chosen];
      } else {
        plan.kiln = static_cast<int>(chosen - algos);
      }
    }
    plan.tune = false;
    plan.candidates.clear();
    if (plan.kiln >= 0) {
      if (run_template(plan.kiln) == 0) return;
      note_once("template", what,
                "the GEMM template's choice #" + std::to_string(plan.kiln) +
                    " does not apply to this product (its kernels are not in the module, an "
                    "operand's layout, or a split-K choice for a shape that does not split); "
                    "cuBLASLt runs instead");
      plan.kiln = -1;
    }
    check_blas(execute(plan.choice.algo), what);
  }

  /// The GEMM template's kernel of configuration `config` at `precision` (0: TF32, 1: float16,
  /// 2: bfloat16) for B as [N][K] (`b_nk`) or [K][N], or with `config` -1 its split-K
  /// reduction; null when the module has none (looked up once).
  CUfunction gemm_function(int precision, int config, bool b_nk) {
    static const char* const kPrecisions[] = {"tf32", "f16", "bf16"};
    const size_t slot = static_cast<size_t>(precision) * (2 * kGemmConfigCount + 1) +
                        (config < 0 ? 2 * kGemmConfigCount : 2 * config + (b_nk ? 1 : 0));
    if (gemm_functions_.empty()) gemm_functions_.assign(3 * (2 * kGemmConfigCount + 1), nullptr);
    if (gemm_looked_up_.empty()) gemm_looked_up_.assign(gemm_functions_.size(), false);
    if (!gemm_looked_up_[slot] && module_ != nullptr) {
      gemm_looked_up_[slot] = true;
      const std::string name = config < 0
                                   ? std::string("kiln_gemm_reduce_") + kPrecisions[precision]
                                   : std::string("kiln_gemm_") + kPrecisions[precision] + "_c" +
                                         std::to_string(config) + (b_nk ? "_nk" : "_kn");
      CUfunction f = nullptr;
      if (driver().cuModuleGetFunction(&f, module_, name.c_str()) == 0) gemm_functions_[slot] = f;
    }
    return gemm_functions_[slot];
  }

  /// Queues Y = conv(X, W) [+ bias[k]] [+ residual] [then `act`] through cuDNN on the run's
  /// stream, without waiting: one cuDNN graph, the convolution then pointwise nodes for the
  /// epilogue, or where cuDNN has no engine for that graph the convolution alone and the
  /// epilogue as kiln_conv_epilogue (decided when the call site's plan is made, said once on
  /// stderr). A 1-D convolution is a 2-D one of height 1. `tf32`: float32 convolutions may use
  /// TF32 tensor cores (else engines that use them are skipped). `site` numbers the call in the
  /// wrapper; its plan is remade only when the shape, layout, epilogue, alignment or precision
  /// change.
  /// uint16_t elements are float16, or bfloat16 when `bf16` (--precision fp16|bf16): X, W, Y,
  /// bias and residual in that type, computed in float32 on the tensor cores (the convolution
  /// and the epilogue's pointwise nodes; the values between them float32, rounded once into Y).
  template <typename T>
  void conv(int site, const ConvShape& s, const T* x, const T* w, T* y, const T* bias,
            const T* residual, ConvActivation act, bool tf32, const char* what, bool bf16 = false) {
    static_assert(
        std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, uint16_t>,
        "cuDNN convolutions are float32, float64, float16 or bfloat16 here");
    constexpr bool half = std::is_same_v<T, uint16_t>;
    int64_t y_numel = 1, x_numel = 1, w_numel = 1;
    for (int d = 0; d < s.spatial + 2; ++d) {
      y_numel *= s.y[d];
      x_numel *= s.x[d];
      w_numel *= s.w[d];
    }
    if (y_numel == 0) return;
    if (replaying()) return;
    const int64_t channels = s.y[1];
    int64_t inner = 1;  // the elements of one channel of Y that follow each other in memory
    if (!s.channels_last) {
      for (int d = 2; d < s.spatial + 2; ++d) inner *= s.y[d];
    }
    if (act.kind < 0 || act.kind > 9) kiln_rt::fail("%s: activation %d unknown", what, act.kind);
    const bool epilogue = bias != nullptr || residual != nullptr || act.kind != 0;
    if (x_numel == 0 || w_numel == 0) {  // an empty sum over channels: zeros, then the epilogue
      check(driver().cuMemsetD8Async(device_ptr(y), 0, static_cast<size_t>(y_numel) * sizeof(T),
                                     stream_),
            what);
      if (epilogue) conv_epilogue(y, bias, residual, act, y_numel, channels, inner, what, bf16);
      return;
    }
    // Dims as cuDNN takes them (at least 2 spatial: a 1-D convolution gets height 1).
    const int spatial = s.spatial < 2 ? 2 : s.spatial;
    const int pad = spatial - s.spatial;
    std::vector<int64_t> xd, wd, yd, stride, pre, post, dilation;
    for (int d = 0; d < 2; ++d) {
      xd.push_back(s.x[d]);
      wd.push_back(s.w[d]);
      yd.push_back(s.y[d]);
    }
    for (int d = 0; d < pad; ++d) {
      xd.push_back(1);
      wd.push_back(1);
      yd.push_back(1);
      stride.push_back(1);
      pre.push_back(0);
      post.push_back(0);
      dilation.push_back(1);
    }
    for (int d = 0; d < s.spatial; ++d) {
      xd.push_back(s.x[2 + d]);
      wd.push_back(s.w[2 + d]);
      yd.push_back(s.y[2 + d]);
      stride.push_back(s.strides[d]);
      pre.push_back(s.pads_begin[d]);
      post.push_back(s.pads_end[d]);
      dilation.push_back(s.dilations[d]);
    }
    const int64_t align = std::min<int64_t>(
        16, alignment_of({reinterpret_cast<uint64_t>(x), reinterpret_cast<uint64_t>(w),
                          reinterpret_cast<uint64_t>(y), reinterpret_cast<uint64_t>(bias),
                          reinterpret_cast<uint64_t>(residual)}));
    const bool f64 = std::is_same_v<T, double>;
    const int data = f64     ? dnn::kDataDouble
                     : !half ? dnn::kDataFloat
                     : bf16  ? dnn::kDataBf16
                             : dnn::kDataHalf;
    // Half types take the tensor cores whatever --precision says of float32.
    if (half) tf32 = true;
    const ConvEpilogue wanted{bias != nullptr, residual != nullptr, act};
    int64_t alpha_bits = 0, beta_bits = 0;  // the parameters' bits, for the key
    std::memcpy(&alpha_bits, &act.alpha, sizeof alpha_bits);
    std::memcpy(&beta_bits, &act.beta, sizeof beta_bits);
    std::vector<int64_t> key = {data,        tf32 ? 1 : 0,    align,    spatial,    s.channels_last,
                                wanted.bias, wanted.residual, act.kind, alpha_bits, beta_bits};
    for (const std::vector<int64_t>* v : {&xd, &wd, &yd, &stride, &pre, &post, &dilation})
      key.insert(key.end(), v->begin(), v->end());
    // Sites of one problem share a plan only when the autotune cache chose the same engine.
    const LibraryChoice choice = choice_of(conv_choices_, site);
    key.push_back(choice.index);
    if (dnn_handle_ == nullptr) {
      check_dnn(dnn_api().Create(&dnn_handle_), "creating a handle");
      check_dnn(dnn_api().SetStream(dnn_handle_, stream_), "setting its stream");
      dnn_stream_ = stream_;
    }
    if (conv_plans_.size() <= static_cast<size_t>(site))
      conv_plans_.resize(static_cast<size_t>(site) + 1);
    ConvPlan& plan = conv_plans_[static_cast<size_t>(site)];
    if (plan.key != key) {
      retire_conv_plan(plan);
      plan.unfused = false;
      // A call site of the same convolution (ResNet's repeated blocks) lends its plan: cuDNN
      // finalizes each engine once (a runtime-compiled fusion engine takes up to seconds).
      for (const ConvPlan& other : conv_plans_) {
        if (&other == &plan || other.key != key || other.plan == nullptr) continue;
        plan.plan = other.plan;
        plan.workspace = other.workspace;
        plan.unfused = other.unfused;
        plan.key = key;
        break;
      }
    }
    if (plan.key != key) {
      const ConvDims dims{xd, wd, yd, stride, pre, post, dilation, s.channels_last};
      bool made = false;
      std::string why;
      if (epilogue) {
        // KILN_CUDNN_UNFUSED=1 (the tests of kiln_conv_epilogue): the convolution alone and the
        // epilogue's kernel after it, as where cuDNN has no engine for the fused graph.
        const char* unfused = std::getenv("KILN_CUDNN_UNFUSED");
        if (unfused != nullptr && std::strcmp(unfused, "1") == 0) {
          why = "KILN_CUDNN_UNFUSED=1";
        } else {
          try {
            made = make_conv_plan(plan, data, tf32, align, dims, wanted, what, false, choice);
          } catch (const kiln_rt::Error& e) {
            why = e.what();
          }
        }
        if (!made) {
          plan.release();
          plan.unfused = true;
          note_unfused(what, why);
        }
      }
      if (!made) make_conv_plan(plan, data, tf32, align, dims, ConvEpilogue{}, what, true, choice);
      plan.key = key;
    }
    // The handle queues on the stream of this call (the side stream's, or the run's).
    if (dnn_stream_ != stream_) {
      check_dnn(dnn_api().SetStream(dnn_handle_, stream_), "setting its stream");
      dnn_stream_ = stream_;
    }
    // Queues `which` (a plan of this call's graph) with this call's pointers; cuDNN's status.
    auto execute = [&](void* which, int64_t workspace_bytes) {
      Dnn& api = dnn_api();
      void* pack = nullptr;
      check_dnn(api.CreateDescriptor(dnn::kVariantPack, &pack), what);
      // Unique ids as make_conv_plan numbers them: X 1, W 2, Y 3, bias 4, residual 5.
      int64_t uids[5] = {1, 2, 3, 4, 5};
      void* pointers[5] = {const_cast<T*>(x), const_cast<T*>(w), y, const_cast<T*>(bias),
                           const_cast<T*>(residual)};
      int64_t count = 3;
      if (!plan.unfused) {
        if (bias != nullptr) {
          uids[count] = 4;
          pointers[count++] = const_cast<T*>(bias);
        }
        if (residual != nullptr) {
          uids[count] = 5;
          pointers[count++] = const_cast<T*>(residual);
        }
      }
      void* workspace = workspace_bytes > 0 ? library_workspace() : nullptr;
      int status = api.SetAttribute(pack, dnn::kPackUids, dnn::kTypeInt64, count, uids);
      if (status == 0)
        status = api.SetAttribute(pack, dnn::kPackPointers, dnn::kTypeVoidPtr, count, pointers);
      if (status == 0)
        status = api.SetAttribute(pack, dnn::kPackWorkspace, dnn::kTypeVoidPtr, 1, &workspace);
      if (status == 0) status = api.Finalize(pack);
      if (status == 0) status = api.Execute(dnn_handle_, which, pack);
      api.DestroyDescriptor(pack);
      return status;
    };
    if (plan.candidates.size() > 1 && !capturing_) {
      std::vector<std::function<int()>> runs;
      for (const auto& [candidate, workspace_bytes] : plan.candidates)
        runs.emplace_back([&execute, c = candidate, b = workspace_bytes] { return execute(c, b); });
      const size_t chosen =
          time_candidates(runs, plan.key, "cudnn",
                          conv_problem_text(s, element_name<T>(bf16), tf32, bias != nullptr,
                                            residual != nullptr, act),
                          dnn_api().version, what);
      std::tie(plan.plan, plan.workspace) = plan.candidates[chosen];
    }
    plan.candidates.clear();
    check_dnn(execute(plan.plan, plan.workspace), what);
    if (plan.unfused) conv_epilogue(y, bias, residual, act, y_numel, channels, inner, what, bf16);
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
    if (replaying()) return;  // the graph's checks are the capture's (checks_)
    checks_.push_back({node, size});
    launch_function(f, stream_, "kiln_check_indices", 1, 1, 1, 256, 1, 1, 0, indices, count, size,
                    has_ignored ? 1 : 0, ignored, static_cast<int64_t>(checks_.size() - 1));
  }

 private:
  struct Check {
    std::string node;
    int64_t size;
  };

  /// The CUDA graph of one set of input sizes and dtypes (`key`), with the memory its runs use.
  struct Segment {
    CUgraphExec exec = nullptr;
    std::vector<int64_t> sizes;  // the sizes known mid-run before it (size_known)
  };
  struct Graph {
    std::vector<int64_t> key;
    GraphMemory memory;
    std::vector<Segment> segments;  // empty until captured
    std::vector<Check> checks;      // the index checks its kernels report, numbered
    bool warm = false;              // a run of these sizes ran directly: the next one captures
    bool failed = false;            // its capture failed: these sizes run without a graph
    uint64_t last_use = 0;
  };
  enum class GraphMode { kNone, kCapture, kReplay };
  static constexpr size_t kMaxGraphs = 8;

  /// KILN_CUDA_STREAMS=1: every call on the run's one stream (no forks). Read at each fork, as
  /// KILN_CUDA_GRAPHS at each run, so that a process (a test, an A/B benchmark) can switch.
  static bool streams_enabled() {
    const char* v = std::getenv("KILN_CUDA_STREAMS");
    return v == nullptr || std::strcmp(v, "1") != 0;
  }

  static bool graphs_enabled() {
    const char* v = std::getenv("KILN_CUDA_GRAPHS");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }

  /// The graph of the run's inputs: found (replayed), warm (captured now) or new (this run
  /// runs directly and warms it).
  void choose_graph(const kiln_rt::TensorArg* inputs, size_t n_inputs) {
    std::vector<int64_t> key;
    for (size_t k = 0; k < n_inputs; ++k) {
      key.push_back(inputs[k].dtype);
      key.push_back(inputs[k].rank);
      key.insert(key.end(), inputs[k].dims, inputs[k].dims + inputs[k].rank);
    }
    Graph* g = nullptr;
    for (const auto& candidate : graphs_) {
      if (candidate->key == key) g = candidate.get();
    }
    if (g == nullptr) {
      if (graphs_.size() >= kMaxGraphs) {
        size_t oldest = 0;
        for (size_t k = 1; k < graphs_.size(); ++k) {
          if (graphs_[k]->last_use < graphs_[oldest]->last_use) oldest = k;
        }
        check(driver().cuStreamSynchronize(stream_), "dropping a CUDA graph");
        release(*graphs_[oldest]);
        graphs_.erase(graphs_.begin() + static_cast<std::ptrdiff_t>(oldest));
      }
      graphs_.push_back(std::make_unique<Graph>());
      g = graphs_.back().get();
      g->key = std::move(key);
      g->warm = true;
      g->last_use = ++uses_;
      return;  // this run runs directly
    }
    g->last_use = ++uses_;
    if (g->failed) return;
    graph_ = g;
    if (g->segments.empty()) {
      graph_mode_ = GraphMode::kCapture;
      g->memory.release();
      g->memory.replay = false;
    } else {
      graph_mode_ = GraphMode::kReplay;
      g->memory.replay = true;
      g->memory.next = 0;
      checks_ = g->checks;
    }
  }

  static void release(Graph& g) {
    for (const Segment& segment : g.segments) driver().cuGraphExecDestroy(segment.exec);
    g.segments.clear();
    g.memory.release();
  }

  /// Drops every graph once the GPU is done with them.
  void drop_graphs() {
    if (graphs_.empty()) return;
    Driver& d = driver();
    d.cuStreamSynchronize(stream_);
    d.cuStreamSynchronize(own_stream_);
    if (side_stream_ != nullptr) d.cuStreamSynchronize(side_stream_);
    for (auto& g : graphs_) release(*g);
    graphs_.clear();
  }

  void load(const Cubin* cubins, size_t n_cubins, const char* const* names, size_t n_names) {
    if (n_cubins == 0 || cubins[0].data == nullptr) return;
    Driver& d = driver();
    const Cubin* chosen = choose_module(cubins, n_cubins, d.arch);
    if (chosen == nullptr) {
      kiln_rt::fail(
          "CUDA: the model was compiled for other GPUs (%s), not for sm_%d (set "
          "KILN_CUDA_ARCHS when compiling)",
          modules_text(cubins, n_cubins).c_str(), d.arch);
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

  /// Descriptors and the heuristic's best algorithm for one product (matmul's terms: x is
  /// cuBLASLt's A, y its B, an N x M result; batch strides in elements).
  void make_plan(MatMulPlan& plan, int compute, int scale_type, int type, Epilogue epilogue,
                 const BlasMatrix& x, const BlasMatrix& y, const BlasMatrix& d, int64_t batch,
                 int64_t x_stride, int64_t y_stride, int64_t d_stride, uint32_t align_x,
                 uint32_t align_y, uint32_t align_c, uint32_t align_d, size_t workspace,
                 const char* what, const LibraryChoice& choice, bool tune) {
    BlasLt& api = blas();
    check_blas(api.MatmulDescCreate(&plan.desc, compute, scale_type), what);
    const int32_t op_x = x.op, op_y = y.op;
    const uint32_t epi = static_cast<uint32_t>(epilogue);
    check_blas(api.MatmulDescSetAttribute(plan.desc, kBlasDescTransA, &op_x, sizeof op_x), what);
    check_blas(api.MatmulDescSetAttribute(plan.desc, kBlasDescTransB, &op_y, sizeof op_y), what);
    check_blas(api.MatmulDescSetAttribute(plan.desc, kBlasDescEpilogue, &epi, sizeof epi), what);
    const BlasMatrix* shapes[3] = {&x, &y, &d};
    const int64_t strides[3] = {x_stride, y_stride, d_stride};
    for (int l = 0; l < 3; ++l) {
      check_blas(api.MatrixLayoutCreate(&plan.layouts[l], type, shapes[l]->rows, shapes[l]->cols,
                                        shapes[l]->ld),
                 what);
      if (batch > 1) {
        const int32_t count = static_cast<int32_t>(batch);
        check_blas(api.MatrixLayoutSetAttribute(plan.layouts[l], kBlasLayoutBatchCount, &count,
                                                sizeof count),
                   what);
        check_blas(api.MatrixLayoutSetAttribute(plan.layouts[l], kBlasLayoutBatchStride,
                                                &strides[l], sizeof strides[l]),
                   what);
      }
    }
    void* pref = nullptr;
    check_blas(api.MatmulPreferenceCreate(&pref), what);
    const uint64_t ws = workspace;
    api.MatmulPreferenceSetAttribute(pref, kBlasPrefWorkspace, &ws, sizeof ws);
    api.MatmulPreferenceSetAttribute(pref, kBlasPrefAlignA, &align_x, sizeof align_x);
    api.MatmulPreferenceSetAttribute(pref, kBlasPrefAlignB, &align_y, sizeof align_y);
    api.MatmulPreferenceSetAttribute(pref, kBlasPrefAlignC, &align_c, sizeof align_c);
    api.MatmulPreferenceSetAttribute(pref, kBlasPrefAlignD, &align_d, sizeof align_d);
    // The heuristic's first result, or the first kBlasTuneCandidates to time, or enough to
    // reach the cached choice.
    const int wanted = tune ? kBlasTuneCandidates : choice.index >= 0 ? choice.index + 1 : 1;
    std::vector<BlasLt::Heuristic> results(static_cast<size_t>(wanted));
    int found = 0;
    const int status = api.MatmulAlgoGetHeuristic(blas_handle_, plan.desc, plan.layouts[0],
                                                  plan.layouts[1], plan.layouts[2], plan.layouts[2],
                                                  pref, wanted, results.data(), &found);
    api.MatmulPreferenceDestroy(pref);
    check_blas(status, what);
    if (found == 0) kiln_rt::fail("%s: cuBLASLt has no algorithm for this product", what);
    plan.choice = results[0];
    if (choice.index >= 0) {
      const bool same_version = static_cast<size_t>(choice.version) == api.version;
      if (choice.index < found && same_version) {
        plan.choice = results[static_cast<size_t>(choice.index)];
      } else {
        note_once("choice", what,
                  "the autotune cache's cuBLASLt algorithm #" + std::to_string(choice.index) +
                      " (timed with cuBLASLt " + std::to_string(choice.version) + ") " +
                      (same_version ? "is not among the " + std::to_string(found) +
                                          " algorithms this cuBLASLt lists"
                                    : "is not valid for cuBLASLt " + std::to_string(api.version)) +
                      "; the heuristic's first algorithm runs instead");
      }
    }
    if (tune && found > 1) plan.candidates.assign(results.begin(), results.begin() + found);
  }

  /// The choice the wrapper gave call `site` (LibraryChoice), or none.
  static LibraryChoice choice_of(const std::vector<LibraryChoice>& choices, int site) {
    return static_cast<size_t>(site) < choices.size() ? choices[static_cast<size_t>(site)]
                                                      : LibraryChoice{};
  }

  /// The choices each tuned product and convolution took in this process, by library ("cublaslt",
  /// "cudnn") and plan key: the first run state to tune a key decides for the whole process, so
  /// that concurrent runs run the same algorithms and give identical outputs.
  struct TunedChoices {
    std::mutex mutex;
    std::map<std::pair<std::string, std::vector<int64_t>>, size_t> chosen;
  };
  __attribute__((visibility("hidden"))) static TunedChoices& tuned_choices() {
    static TunedChoices t;
    return t;
  }

  /// Times each of `runs` (one call of a library with one candidate algorithm or engine; its
  /// status) on the run's stream with CUDA events: one warm-up run, then kTuneRuns runs timed one
  /// by one, their median kept. Returns the index of the fastest (0 when none ran), reports the
  /// times (report_tuning), and remembers the choice for `key` in this process. The first run of
  /// a new shape waits for the GPU here. Runs from `library_count` on are the GEMM template's
  /// choices, reported as library "kiln_gemm".
  template <typename Key>
  size_t time_candidates(const std::vector<std::function<int()>>& runs, const Key& plan_key,
                         const char* library, const std::string& problem, size_t version,
                         const char* what, size_t library_count = SIZE_MAX) {
    TunedChoices& tuned = tuned_choices();
    std::lock_guard<std::mutex> lock(tuned.mutex);
    // Kiln's kernels share a library name: their problem tells them apart.
    const auto key = std::make_pair(
        std::string(library) + (std::string(library) == "kiln" ? "\t" + problem : ""),
        std::vector<int64_t>(plan_key.begin(), plan_key.end()));
    if (auto it = tuned.chosen.find(key); it != tuned.chosen.end() && it->second < runs.size())
      return it->second;
    Driver& d = driver();
    CUevent start = nullptr, stop = nullptr;
    check(d.cuEventCreate(&start, 0), what);
    check(d.cuEventCreate(&stop, 0), what);
    std::vector<double> medians;  // -1: the candidate failed
    size_t chosen = 0;
    for (size_t index = 0; index < runs.size(); ++index) {
      bool ok = runs[index]() == 0;
      std::vector<float> times;
      for (int k = 0; ok && k < kTuneRuns; ++k) {
        check(d.cuEventRecord(start, stream_), what);
        ok = runs[index]() == 0;
        check(d.cuEventRecord(stop, stream_), what);
        check(d.cuEventSynchronize(stop), what);
        float ms = 0;
        ok = ok && d.cuEventElapsedTime(&ms, start, stop) == 0;
        times.push_back(ms);
      }
      if (!ok) {
        medians.push_back(-1);
        continue;
      }
      std::sort(times.begin(), times.end());
      medians.push_back(times[times.size() / 2]);
      if (medians[chosen] < 0 || medians.back() < medians[chosen]) chosen = index;
    }
    d.cuEventDestroy(start);
    d.cuEventDestroy(stop);
    if (medians[chosen] < 0) chosen = 0;
    tuned.chosen[key] = chosen;
    if (library_count >= medians.size()) {
      report_tuning(library, problem, version, chosen, medians);
    } else {
      // Each its own line, with its own fastest as the chosen index.
      const std::vector<double> own(medians.begin(), medians.begin() + library_count),
          kiln(medians.begin() + library_count, medians.end());
      auto fastest = [](const std::vector<double>& v) {
        size_t best = 0;
        for (size_t k = 0; k < v.size(); ++k)
          if (v[k] >= 0 && (v[best] < 0 || v[k] < v[best])) best = k;
        return best;
      };
      report_tuning(library, problem, version, fastest(own), own);
      report_tuning("kiln_gemm", problem, static_cast<size_t>(kGemmTemplateVersion), fastest(kiln),
                    kiln);
    }
    return chosen;
  }

  /// With KILN_CUDA_TUNE_REPORT set: appends one line to that file for the compiler to store in
  /// the autotune cache (autotune/cuda_choice.h reads it): tab-separated, the library, the
  /// problem text, the GPU's name, its compute capability, the library's version, the index
  /// chosen and each candidate's median in ms (-1: it failed).
  void report_tuning(const char* library, const std::string& problem, size_t version, size_t chosen,
                     const std::vector<double>& medians) {
    const char* path = std::getenv("KILN_CUDA_TUNE_REPORT");
    if (path == nullptr || *path == '\0') return;
    std::string line = std::string(library) + "\t" + problem + "\t" + driver().name + "\t" +
                       std::to_string(driver().arch) + "\t" + std::to_string(version) + "\t" +
                       std::to_string(chosen) + "\t";
    for (size_t k = 0; k < medians.size(); ++k) {
      char ms[32];
      std::snprintf(ms, sizeof ms, "%s%.6g", k > 0 ? "," : "", medians[k]);
      line += ms;
    }
    line += "\n";
    if (std::FILE* f = std::fopen(path, "a")) {
      std::fputs(line.c_str(), f);
      std::fclose(f);
    }
  }

  /// Says `message` on stderr once per process per call site `what` and `kind` of note (an
  /// unfused epilogue, a cached choice this library does not offer).
  __attribute__((visibility("hidden"))) static void note_once(const char* kind, const char* what,
                                                              const std::string& message) {
    static std::mutex mutex;
    static std::vector<std::string> said;
    const std::string id = std::string(kind) + "\n" + what;
    std::lock_guard<std::mutex> lock(mutex);
    if (std::find(said.begin(), said.end(), id) != said.end()) return;
    said.push_back(id);
    std::fprintf(stderr, "kiln: %s: %s\n", what, message.c_str());
  }

  /// Empties `plan` before it is remade: its descriptors are destroyed unless another call site
  /// borrowed its plan (kept until the run state goes, then).
  void retire_conv_plan(ConvPlan& plan) {
    bool lent = false;
    for (const ConvPlan& other : conv_plans_) {
      lent = lent || (&other != &plan && other.plan != nullptr && other.plan == plan.plan &&
                      other.descriptors.empty());
    }
    if (lent) {
      retired_conv_descriptors_.insert(retired_conv_descriptors_.end(), plan.descriptors.begin(),
                                       plan.descriptors.end());
      plan.descriptors.clear();
    }
    plan.release();
    plan.key.clear();
  }

  /// Queues `call`'s epilogue after the convolution alone wrote `y` (kiln_conv_epilogue, in the
  /// model's module when a convolution has one).
  /// uint16_t elements are float16, or bfloat16 when `bf16`.
  template <typename T>
  void conv_epilogue(T* y, const T* bias, const T* residual, ConvActivation act, int64_t n,
                     int64_t channels, int64_t inner, const char* what, bool bf16) {
    // Indexed as conv_epilogue_ and kKernels: f32, f64, f16, bf16.
    static constexpr const char* kKernels[] = {"kiln_conv_epilogue_f32", "kiln_conv_epilogue_f64",
                                               "kiln_conv_epilogue_f16", "kiln_conv_epilogue_bf16"};
    const size_t kind = std::is_same_v<T, double>     ? 1
                        : std::is_same_v<T, uint16_t> ? (bf16 ? 3 : 2)
                                                      : 0;
    CUfunction& f = conv_epilogue_[kind];
    const char* name = kKernels[kind];
    if (f == nullptr) {
      if (module_ == nullptr)
        kiln_rt::fail("%s: the model's kernels have no convolution epilogue", what);
      check(driver().cuModuleGetFunction(&f, module_, name), name);
    }
    constexpr int64_t kThreads = 256;
    const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
    launch_function(f, stream_, name, blocks, 1, 1, kThreads, 1, 1, 0, y, bias, residual,
                    static_cast<int64_t>(act.kind), act.alpha, act.beta, n, channels, inner);
  }

  /// Says once per process per call site that its convolution and epilogue run unfused.
  static void note_unfused(const char* what, const std::string& why) {
    note_once("unfused", what,
              "cuDNN has no engine for the convolution fused with its epilogue" +
                  (why.empty() ? std::string() : ": " + why) +
                  "; the epilogue runs as a kernel of its own after it");
  }

  /// The graph of one convolution (tensors X, W, Y with unique ids 1, 2, 3) with the pointwise
  /// nodes of `epilogue` after it (bias 4, broadcast [1, K, 1, 1], then residual 5 of Y's dims,
  /// then the activation; the values between them virtual), and the first of the heuristic's
  /// engines that finalizes, uses no tensor cores at fp32 (PyTorch's filter for TF32 disallowed)
  /// and needs no more workspace than the arena keeps. Returns false when none does, or fails when
  /// `required`.
  bool make_conv_plan(ConvPlan& plan, int tensor_data, bool tf32, int64_t align, const ConvDims& d,
                      const ConvEpilogue& epilogue, const char* what, bool required = false,
                      const LibraryChoice& choice = {}) {
    // With a cached choice: the engines up to it, the chosen one kept (when this cuDNN is the
    // version that was timed and lists that many); with tuning and no choice: up to
    // kConvTuneCandidates to time.
    const bool tune = tune_convs_ && choice.index < 0;
    Dnn& api = dnn_api();
    const bool cached = choice.index >= 0 && static_cast<size_t>(choice.version) == api.version;
    auto make = [&](int type) {
      void* t = nullptr;
      check_dnn(api.CreateDescriptor(type, &t), what);
      plan.descriptors.push_back(t);
      return t;
    };
    auto set = [&](void* t, int attribute, int type, int64_t count, const void* value) {
      check_dnn(api.SetAttribute(t, attribute, type, count, value), what);
    };
    // `data` is the compute type (of the convolution, the pointwise nodes and the virtual
    // tensors between them); `tensor_data` that of X, W, Y, bias and residual.
    const bool f64 = tensor_data == dnn::kDataDouble;
    const int data = f64 ? dnn::kDataDouble : dnn::kDataFloat;
    // Strides of a tensor of NCHW-ordered `dims`: row-major, or channels-last (N, H, W, C in
    // memory) for the activations and weight of a channels-last call.
    auto strides_of = [&](const std::vector<int64_t>& dims, bool last) {
      std::vector<int64_t> st(dims.size(), 1);
      if (last && dims.size() == 4) {
        st = {dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]};
      } else {
        for (size_t k = dims.size() - 1; k-- > 0;) st[k] = st[k + 1] * dims[k + 1];
      }
      return st;
    };
    auto tensor = [&](const std::vector<int64_t>& dims, int64_t uid, bool last, bool is_virtual) {
      const std::vector<int64_t> st = strides_of(dims, last);
      void* t = make(dnn::kTensor);
      set(t, dnn::kTensorDataType, dnn::kTypeDataType, 1, is_virtual ? &data : &tensor_data);
      set(t, dnn::kTensorDims, dnn::kTypeInt64, static_cast<int64_t>(dims.size()), dims.data());
      set(t, dnn::kTensorStrides, dnn::kTypeInt64, static_cast<int64_t>(dims.size()), st.data());
      set(t, dnn::kTensorUid, dnn::kTypeInt64, 1, &uid);
      set(t, dnn::kTensorByteAlignment, dnn::kTypeInt64, 1, &align);
      if (is_virtual) {
        const bool yes = true;
        set(t, dnn::kTensorIsVirtual, dnn::kTypeBoolean, 1, &yes);
      }
      check_dnn(api.Finalize(t), what);
      return t;
    };
    void* tx = tensor(d.x, 1, d.last, false);
    void* tw = tensor(d.w, 2, d.last, false);
    const int stages =
        (epilogue.bias ? 1 : 0) + (epilogue.residual ? 1 : 0) + (epilogue.act.kind != 0 ? 1 : 0);
    int64_t next_virtual = 100;
    // Each node's output: Y itself for the last node, else a virtual tensor of Y's dims.
    auto output = [&](int& left) {
      return --left == 0 ? tensor(d.y, 3, d.last, false)
                         : tensor(d.y, next_virtual++, d.last, true);
    };
    int left = stages + 1;
    void* ty = output(left);
    void* conv = make(dnn::kConvolution);
    const int64_t dims = static_cast<int64_t>(d.stride.size());
    const int mode = dnn::kCrossCorrelation;
    set(conv, dnn::kConvCompType, dnn::kTypeDataType, 1, &data);
    set(conv, dnn::kConvMode, dnn::kTypeConvMode, 1, &mode);
    set(conv, dnn::kConvSpatialDims, dnn::kTypeInt64, 1, &dims);
    set(conv, dnn::kConvDilations, dnn::kTypeInt64, dims, d.dilation.data());
    set(conv, dnn::kConvStrides, dnn::kTypeInt64, dims, d.stride.data());
    set(conv, dnn::kConvPrePad, dnn::kTypeInt64, dims, d.pre.data());
    set(conv, dnn::kConvPostPad, dnn::kTypeInt64, dims, d.post.data());
    check_dnn(api.Finalize(conv), what);
    void* op = make(dnn::kConvForward);
    set(op, dnn::kOpX, dnn::kTypeDescriptor, 1, &tx);
    set(op, dnn::kOpW, dnn::kTypeDescriptor, 1, &tw);
    set(op, dnn::kOpY, dnn::kTypeDescriptor, 1, &ty);
    set(op, dnn::kOpConvDesc, dnn::kTypeDescriptor, 1, &conv);
    const float alpha_f = 1, beta_f = 0;
    const double alpha_d = 1, beta_d = 0;
    if (f64) {
      set(op, dnn::kOpAlpha, dnn::kTypeDouble, 1, &alpha_d);
      set(op, dnn::kOpBeta, dnn::kTypeDouble, 1, &beta_d);
    } else {
      set(op, dnn::kOpAlpha, dnn::kTypeFloat, 1, &alpha_f);
      set(op, dnn::kOpBeta, dnn::kTypeFloat, 1, &beta_f);
    }
    check_dnn(api.Finalize(op), what);
    std::vector<void*> ops = {op};
    // A pointwise node: out = `pw_mode`(in[, b]).
    void* current = ty;
    // `params`: (attribute, value) pairs of the mode, set as float or double as the math
    // precision is.
    auto pointwise = [&](int pw_mode, void* b,
                         std::initializer_list<std::pair<int, double>> params = {}) {
      void* pw = make(dnn::kPointwise);
      set(pw, dnn::kPointwiseMode, dnn::kTypePointwiseMode, 1, &pw_mode);
      set(pw, dnn::kPointwiseMathPrec, dnn::kTypeDataType, 1, &data);
      for (const auto& [attribute, value] : params) {
        const float value_f = static_cast<float>(value);
        if (f64) {
          set(pw, attribute, dnn::kTypeDouble, 1, &value);
        } else {
          set(pw, attribute, dnn::kTypeFloat, 1, &value_f);
        }
      }
      check_dnn(api.Finalize(pw), what);
      void* out = output(left);
      void* node = make(dnn::kPointwiseOp);
      set(node, dnn::kPwOpDesc, dnn::kTypeDescriptor, 1, &pw);
      set(node, dnn::kPwOpX, dnn::kTypeDescriptor, 1, &current);
      if (b != nullptr) set(node, dnn::kPwOpB, dnn::kTypeDescriptor, 1, &b);
      set(node, dnn::kPwOpY, dnn::kTypeDescriptor, 1, &out);
      check_dnn(api.Finalize(node), what);
      ops.push_back(node);
      current = out;
    };
    if (epilogue.bias) {
      std::vector<int64_t> bias_dims(d.y.size(), 1);
      bias_dims[1] = d.y[1];
      pointwise(dnn::kPointwiseAdd, tensor(bias_dims, 4, d.last, false));
    }
    if (epilogue.residual) pointwise(dnn::kPointwiseAdd, tensor(d.y, 5, d.last, false));
    // The activation's pointwise mode (by ConvActivation::kind) and parameters: Clip is Relu
    // clipped to [alpha, beta] (slope 0 below), LeakyRelu Relu clipped below at 0 with slope
    // alpha there.
    const ConvActivation& act = epilogue.act;
    static constexpr int kModes[] = {0,
                                     dnn::kPointwiseReluFwd,
                                     dnn::kPointwiseSigmoidFwd,
                                     dnn::kPointwiseTanhFwd,
                                     dnn::kPointwiseReluFwd,
                                     dnn::kPointwiseReluFwd,
                                     dnn::kPointwiseEluFwd,
                                     dnn::kPointwiseGeluFwd,
                                     dnn::kPointwiseGeluTanhFwd,
                                     dnn::kPointwiseSwishFwd};
    if (act.kind == 4) {
      pointwise(kModes[4], nullptr,
                {{dnn::kPointwiseReluLowerClip, act.alpha},
                 {dnn::kPointwiseReluUpperClip, act.beta},
                 {dnn::kPointwiseReluLowerClipSlope, 0.0}});
    } else if (act.kind == 5) {
      pointwise(
          kModes[5], nullptr,
          {{dnn::kPointwiseReluLowerClip, 0.0}, {dnn::kPointwiseReluLowerClipSlope, act.alpha}});
    } else if (act.kind == 6) {
      pointwise(kModes[6], nullptr, {{dnn::kPointwiseEluAlpha, act.alpha}});
    } else if (act.kind == 9) {
      pointwise(kModes[9], nullptr, {{dnn::kPointwiseSwishBeta, act.alpha}});
    } else if (act.kind != 0) {
      pointwise(kModes[act.kind], nullptr);
    }
    void* graph = make(dnn::kGraph);
    set(graph, dnn::kGraphOps, dnn::kTypeDescriptor, static_cast<int64_t>(ops.size()), ops.data());
    set(graph, dnn::kGraphHandle, dnn::kTypeHandle, 1, &dnn_handle_);
    check_dnn(api.Finalize(graph), what);
    // The heuristic's engines (mode A), then cuDNN's fallback list (runtime-compiled fusion
    // engines among them).
    for (const int heur_mode : {dnn::kHeurModeA, dnn::kHeurModeFallback}) {
      if (plan.plan != nullptr) break;  // candidates enough to tune among
      void* heuristics = make(dnn::kHeuristics);
      set(heuristics, dnn::kHeurGraph, dnn::kTypeDescriptor, 1, &graph);
      set(heuristics, dnn::kHeurMode, dnn::kTypeHeurMode, 1, &heur_mode);
      // A mode that takes no such graph gives no engines, not an error.
      int64_t count = 0;
      if (api.Finalize(heuristics) != 0 ||
          api.GetAttribute(heuristics, dnn::kHeurResults, dnn::kTypeDescriptor, 0, &count,
                           nullptr) != 0) {
        continue;
      }
      std::vector<void*> configs;
      for (int64_t k = 0; k < count; ++k) configs.push_back(make(dnn::kEngineConfig));
      int64_t returned = 0;
      if (api.GetAttribute(heuristics, dnn::kHeurResults, dnn::kTypeDescriptor, count, &returned,
                           configs.data()) != 0) {
        continue;
      }
      for (int64_t k = 0; k < returned; ++k) {
        if (!tf32 && !f64) {
          void* engine = make(dnn::kEngine);
          int64_t got = 0;
          if (api.GetAttribute(configs[static_cast<size_t>(k)], dnn::kConfigEngine,
                               dnn::kTypeDescriptor, 1, &got, &engine) != 0) {
            continue;
          }
          int notes[32] = {};
          int64_t n_notes = 0;
          if (api.GetAttribute(engine, dnn::kEngineNotes, dnn::kTypeNumericalNote, 32, &n_notes,
                               notes) != 0) {
            continue;
          }
          bool tensor_core = false;
          for (int64_t j = 0; j < n_notes; ++j) {
            tensor_core = tensor_core || notes[j] == dnn::kNoteTensorCore ||
                          notes[j] == dnn::kNoteDownConvertInputs;
          }
          if (tensor_core) continue;
        }
        void* candidate = make(dnn::kPlan);
        set(candidate, dnn::kPlanHandle, dnn::kTypeHandle, 1, &dnn_handle_);
        set(candidate, dnn::kPlanConfig, dnn::kTypeDescriptor, 1, &configs[static_cast<size_t>(k)]);
        if (api.Finalize(candidate) != 0) continue;
        int64_t workspace = 0, got = 0;
        check_dnn(
            api.GetAttribute(candidate, dnn::kPlanWorkspace, dnn::kTypeInt64, 1, &got, &workspace),
            what);
        if (workspace > static_cast<int64_t>(library_workspace_bytes_)) continue;
        if (plan.plan == nullptr) {
          plan.plan = candidate;
          plan.workspace = workspace;
        }
        if (!tune && !cached) break;
        plan.candidates.emplace_back(candidate, workspace);
        if (cached && plan.candidates.size() > static_cast<size_t>(choice.index)) {
          std::tie(plan.plan, plan.workspace) = plan.candidates.back();
          plan.candidates.clear();
          return true;
        }
        if (tune && plan.candidates.size() >= kConvTuneCandidates) return true;
      }
    }
    if (plan.plan != nullptr) {
      if (choice.index >= 0) {
        note_once("choice", what,
                  "the autotune cache's cuDNN engine #" + std::to_string(choice.index) +
                      " (timed with cuDNN " + std::to_string(choice.version) + ") " +
                      (cached ? "is not among the " + std::to_string(plan.candidates.size()) +
                                    " engines this cuDNN lists"
                              : "is not valid for cuDNN " + std::to_string(api.version)) +
                      "; the heuristic's first engine runs instead");
        plan.candidates.clear();
      }
      return true;
    }
    if (!required) return false;
    kiln_rt::fail("%s: cuDNN has no engine for this convolution%s", what,
                  tf32 || f64 ? "" : " without tensor cores (--precision fp32)");
  }

  CUstream stream_ = nullptr;      // the current run's: own_stream_ or the caller's
  CUstream own_stream_ = nullptr;  // made at the first run
  CUstream dnn_stream_ = nullptr;  // the stream cuDNN's handle queues on
  CUevent done_ = nullptr;         // recorded where the last run ended (end_run)
  bool pending_ = false;           // done_ marks a run that may still be queued
  RunMode mode_;
  std::vector<std::vector<char>> host_inputs_;  // host_input()'s copies, for one run
  std::vector<std::unique_ptr<Graph>> graphs_;  // at most kMaxGraphs
  uint64_t uses_ = 0;                           // runs that looked for a graph
  Graph* graph_ = nullptr;                      // the current run's, captured or replayed
  GraphMode graph_mode_ = GraphMode::kNone;
  bool capturing_ = false;             // a segment's capture has begun
  size_t segment_ = 0;                 // the run's next graph segment
  bool segment_open_ = false;          // device work queued (or replayed) since the last wait
  std::vector<int64_t> sizes_known_;   // this run's sizes known mid-run (size_known)
  GraphStats* graph_stats_ = nullptr;  // the model's counts (count_graphs)
  CUstream side_stream_ = nullptr;     // forks' (made at the first fork)
  CUstream main_stream_ = nullptr;     // the run's stream while stream_ is the side one
  CUevent fork_event_ = nullptr;       // recorded on the run's stream at a fork
  CUevent join_event_ = nullptr;       // recorded on the side stream at a join
  bool on_side_ = false;               // calls go to the side stream (side())
  CUmodule module_ = nullptr;
  std::vector<CUfunction> functions_;
  CUfunction check_i32_ = nullptr;
  CUfunction check_i64_ = nullptr;
  CUdeviceptr error_ = 0;      // the module's DeviceError
  std::vector<Check> checks_;  // this run's index checks, numbered as the kernel reports them
  char* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  size_t library_offset_ = 0;           // where the libraries' workspace starts in the arena
  size_t library_workspace_bytes_ = 0;  // 0: the model runs no product or convolution
  size_t library_workspaces_ = 1;       // one per stream that runs library calls
  void* blas_handle_ = nullptr;         // cublasLtHandle_t, made at the first product
  std::vector<MatMulPlan> plans_;       // per call site
  void* dnn_handle_ = nullptr;          // cudnnHandle_t, made at the first convolution
  std::vector<ConvPlan> conv_plans_;    // per call site; one may borrow another's plan
  std::vector<void*> retired_conv_descriptors_;  // of remade plans another site borrowed
  /// KILN_CUDNN_TUNE=1: a new convolution plan times up to kConvTuneCandidates of the
  /// heuristic's engines at its first run and keeps the fastest (else the heuristic's first).
  static constexpr size_t kConvTuneCandidates = 4;
  /// --autotune max: the algorithms of cuBLASLt's heuristic timed per new product plan, and the
  /// timed runs per candidate (after one warm-up run) whose median counts.
  static constexpr int kBlasTuneCandidates = 8;
  static constexpr int kTuneRuns = 5;
  bool tune_blas_ = false;
  std::vector<LibraryChoice> blas_choices_;  // per call site (library_choice)
  std::vector<LibraryChoice> gemm_choices_;  // per call site (gemm_template_choice)
  std::vector<CUfunction> gemm_functions_;   // gemm_function's, by precision and kernel
  std::vector<bool> gemm_looked_up_;
  std::vector<LibraryChoice> conv_choices_;
  bool tune_convs_ = [] {
    const char* v = std::getenv("KILN_CUDNN_TUNE");
    return v != nullptr && std::string(v) == "1";
  }();
  CUfunction conv_epilogue_[4] = {};    // kiln_conv_epilogue_*, found when first needed
  std::vector<const void*> constants_;  // by number: shared or own copies
  std::vector<void*> own_constants_;    // freed with the state
  SharedConstants* shared_constants_ = nullptr;
};

/// Runs `body` (a run of the model with run state `state`), again without a CUDA graph when it
/// failed while capturing one (a library call that cannot be captured).
template <typename Body>
inline void run_retrying(RunState& state, Body body) {
  try {
    body();
  } catch (const GraphMiss& e) {
    state.miss_graph(e.what());
    body();
  } catch (const std::exception& e) {
    if (!state.abandon_capture(e.what())) throw;
    body();
  }
}

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

/// finish_output() of a run in another mode: the output copied, in the order of the run's
/// stream, to the caller's buffer or to fresh storage (device memory, released with cuMemFree
/// (kiln_cuda_free), or host memory, released with free()), in device or host memory as the
/// mode says; waits for the GPU only when the run is on the state's own stream.
inline void finish_output_queued(RunState& state, kiln_rt::TensorArg& out, const void* data,
                                 int32_t dtype, int rank, const int64_t* dims, size_t bytes,
                                 const char* name) {
  out.dtype = dtype;
  out.rank = rank;
  for (int k = 0; k < rank; ++k) out.dims[k] = dims[k];
  const bool device = state.mode().outputs_on_device;
  state.flush_graph();
  if (out.data != nullptr) {
    if (out.capacity < bytes) {
      kiln_rt::fail("output '%s': the buffer given holds %zu bytes, the output needs %zu", name,
                    out.capacity, bytes);
    }
  } else {
    out.data = device ? alloc_device(bytes) : kiln_rt::aligned_alloc_bytes(bytes);
    out.capacity = bytes;
  }
  if (bytes > 0) {
    if (device) {
      check(
          driver().cuMemcpyDtoDAsync(device_ptr(out.data), device_ptr(data), bytes, state.stream()),
          "copying an output on the GPU");
    } else {
      state.download(static_cast<char*>(out.data), static_cast<const char*>(data),
                     static_cast<int64_t>(bytes));
    }
  }
  if (!state.enqueued()) state.synchronize("the model's run");
}

/// Moves the `count` results of a control-flow call that ran on the host (host storage its
/// subgraph allocated) to the GPU: each result's data becomes a copy in device memory that the
/// caller's workspace then adopts (the wrapper's take-over), and the host storage is freed.
inline void results_to_device(RunState& state, DeviceWorkspace& ws, kiln_rt::TensorArg* results,
                              int64_t count) {
  for (int64_t r = 0; r < count; ++r) {
    kiln_rt::TensorArg& t = results[r];
    if (t.data == nullptr) continue;
    const auto bytes = static_cast<int64_t>(kiln_rt::nbytes(t));
    char* device = ws.alloc<char>(bytes);
    ws.detach(device);  // the wrapper's take-over adopts it
    // A copy from pageable memory returns once the host data is staged: it may be freed next.
    state.upload(device, static_cast<const char*>(t.data), bytes);
    std::free(t.data);
    t.data = device;
    t.capacity = static_cast<size_t>(bytes);
  }
}

/// Hands model output `out` to the caller in host memory, once the run is done: sets its dtype
/// and shape and copies `data` (on the GPU) into the caller's buffer, or into fresh host
/// storage (released with free()).
inline void finish_output(RunState& state, kiln_rt::TensorArg& out, const void* data, int32_t dtype,
                          int rank, const int64_t* dims, size_t element_size, const char* name) {
  size_t bytes = element_size;
  for (int k = 0; k < rank; ++k) bytes *= static_cast<size_t>(dims[k]);
  if (state.mode().outputs_on_device || state.enqueued()) {
    finish_output_queued(state, out, data, dtype, rank, dims, bytes, name);
    return;
  }
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
