#pragma once
// Kiln runtime: what generated wrappers use. Header-only, compiled into each generated library;
// it never includes Kiln compiler headers. The C-facing types here (TensorArg) are the calling
// convention of a compiled model's entry point `kiln_run`.

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln_rt_pool.h"

namespace kiln_rt {

inline constexpr int kMaxRank = 16;
inline constexpr size_t kAlignBytes = 64;

/// A tensor crossing the entry point: data pointer, ONNX dtype code, rank and dims. A model
/// output the caller gives storage for has `data` set and `capacity` its size in bytes; with
/// `data` null the model allocates it (malloc).
struct TensorArg {
  void* data;
  int32_t dtype;
  int32_t rank;
  int64_t dims[kMaxRank];
  size_t capacity;
};

/// A strided view handed to a library call (sizes and strides in elements).
struct View {
  const void* data;
  int32_t rank;
  int64_t sizes[kMaxRank];
  int64_t strides[kMaxRank];
};

/// An error of the model's run (bad input, out-of-range index): reported by kiln_run.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] inline void fail(const char* format, Args... args) {
  char message[1024];
  std::snprintf(message, sizeof(message), format, args...);
  throw Error(message);
}

inline void* aligned_alloc_bytes(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  void* p = std::aligned_alloc(kAlignBytes, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

/// Rounds a byte count up to the 64-byte alignment of every buffer.
inline constexpr int64_t align_bytes(int64_t bytes) {
  return (bytes + int64_t{kAlignBytes} - 1) / int64_t{kAlignBytes} * int64_t{kAlignBytes};
}

/// The intermediates of one run, in one block at offsets the compiler planned (Inductor's wrapper
/// memory_plan with a pool): reserve() grows the block when a run needs more (larger dynamic
/// sizes) and keeps it for the next run.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() { std::free(data_); }
  char* reserve(int64_t bytes) {
    const size_t want = static_cast<size_t>(std::max<int64_t>(bytes, 0));
    if (want > capacity_) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = 0;
      data_ = static_cast<char*>(aligned_alloc_bytes(want));
      capacity_ = want;
    }
    return data_;
  }
  size_t capacity() const { return capacity_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

/// One kernel or library call of a profiled run.
struct ProfileEvent {
  const char* name;
  const char* kind;  // "kernel" or "call"
  int64_t start_ns;
  int64_t duration_ns;
};

/// Where a profiled run records its events (null when the run is not profiled).
struct Profile {
  std::chrono::steady_clock::time_point origin;
  std::vector<ProfileEvent> events;
};

/// Times the enclosing call when the run is profiled; costs one null test otherwise.
class ProfileScope {
 public:
  ProfileScope(Profile* profile, const char* name, const char* kind)
      : profile_(profile), name_(name), kind_(kind) {
    if (profile_ != nullptr) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (profile_ == nullptr) return;
    auto end = std::chrono::steady_clock::now();
    auto ns = [](auto d) {
      return static_cast<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
    };
    profile_->events.push_back({name_, kind_, ns(start_ - profile_->origin), ns(end - start_)});
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profile* profile_;
  const char* name_;
  const char* kind_;
  std::chrono::steady_clock::time_point start_;
};

/// Objects handed to one run at a time (a run's arena and library state), so that concurrent
/// runs of one model never share them: acquire() takes a free one or makes a new one, and the
/// lease gives it back.
template <typename T>
class Pool {
 public:
  struct Release {
    Pool* pool;
    void operator()(T* item) const { pool->give_back(item); }
  };
  using Lease = std::unique_ptr<T, Release>;

  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() {
    for (T* item : free_) delete item;
  }
  Lease acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        T* item = free_.back();
        free_.pop_back();
        return Lease(item, Release{this});
      }
    }
    return Lease(new T(), Release{this});
  }

 private:
  void give_back(T* item) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(item);
  }
  std::mutex mutex_;
  std::vector<T*> free_;
};

/// Host memory for a Workspace: 64-byte aligned, released with free().
struct HostMemory {
  void* alloc(size_t bytes) const { return aligned_alloc_bytes(bytes); }
  void free(void* p) const { std::free(p); }
};

/// Owns the intermediates of one run: freed when the run ends, also when it fails midway.
/// `Memory` says where they live (alloc(bytes), free(pointer)): the host's (Workspace), or a
/// device's (kiln_rt_cuda.h's DeviceWorkspace).
template <typename Memory>
class BasicWorkspace {
 public:
  explicit BasicWorkspace(Memory memory = Memory()) : memory_(memory) {}
  BasicWorkspace(const BasicWorkspace&) = delete;
  BasicWorkspace& operator=(const BasicWorkspace&) = delete;
  ~BasicWorkspace() {
    for (void* p : live_) memory_.free(p);
  }
  template <typename T>
  T* alloc(int64_t numel) {
    void* p = memory_.alloc(static_cast<size_t>(std::max<int64_t>(numel, 0)) * sizeof(T));
    live_.push_back(p);
    return static_cast<T*>(p);
  }
  void release(const void* p) {
    auto it = std::find(live_.begin(), live_.end(), p);
    if (it == live_.end()) return;
    memory_.free(*it);
    live_.erase(it);
  }
  /// Takes ownership of storage allocated elsewhere (a control-flow result).
  void adopt(void* p) { live_.push_back(p); }
  /// Hands a buffer to the caller (a model output): no longer freed here.
  bool detach(const void* p) {
    auto it = std::find(live_.begin(), live_.end(), p);
    if (it == live_.end()) return false;
    live_.erase(it);
    return true;
  }

 private:
  Memory memory_;
  std::vector<void*> live_;
};

using Workspace = BasicWorkspace<HostMemory>;

/// Storage for a model output: the caller's buffer when it gave one (which must hold the
/// output), else storage of the run that finish_output hands to the caller.
template <typename T>
inline T* output_storage(const TensorArg& out, int64_t numel, const char* name, Workspace& ws) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(numel, 0)) * sizeof(T);
  if (out.data == nullptr) return ws.alloc<T>(numel);
  if (out.capacity < bytes) {
    fail("output '%s': the buffer given holds %zu bytes, the output needs %zu", name, out.capacity,
         bytes);
  }
  return static_cast<T*>(out.data);
}

/// Hands a model output to the caller: sets its dtype and shape; a result computed outside the
/// caller's buffer is copied into it; without a caller's buffer, storage of the run is handed
/// over and anything else (an input or a constant passed through) is copied into fresh storage.
inline void finish_output(TensorArg& out, const void* data, int32_t dtype, int rank,
                          const int64_t* dims, size_t element_size, const char* name,
                          Workspace& ws) {
  size_t bytes = element_size;
  for (int k = 0; k < rank; ++k) bytes *= static_cast<size_t>(dims[k]);
  out.dtype = dtype;
  out.rank = rank;
  for (int k = 0; k < rank; ++k) out.dims[k] = dims[k];
  if (out.data != nullptr) {
    if (out.data == data) return;
    if (out.capacity < bytes) {
      fail("output '%s': the buffer given holds %zu bytes, the output needs %zu", name,
           out.capacity, bytes);
    }
    if (bytes != 0) std::memcpy(out.data, data, bytes);
    return;
  }
  if (ws.detach(data)) {
    out.data = const_cast<void*>(data);
    return;
  }
  out.data = aligned_alloc_bytes(bytes);
  if (bytes != 0) std::memcpy(out.data, data, bytes);
}

inline const char* dtype_name(int32_t code) {
  switch (code) {
    case 1:
      return "float32";
    case 2:
      return "uint8";
    case 3:
      return "int8";
    case 4:
      return "uint16";
    case 5:
      return "int16";
    case 6:
      return "int32";
    case 7:
      return "int64";
    case 8:
      return "string";
    case 9:
      return "bool";
    case 10:
      return "float16";
    case 11:
      return "float64";
    case 12:
      return "uint32";
    case 13:
      return "uint64";
    case 16:
      return "bfloat16";
    default:
      return "unknown";
  }
}

inline std::string dims_str(const int64_t* dims, int rank) {
  std::string s = "[";
  for (int k = 0; k < rank; ++k) {
    if (k) s += ", ";
    s += std::to_string(dims[k]);
  }
  return s + "]";
}

/// Checks an input's dtype (alone for an input whose data the model never reads).
inline void check_dtype(const TensorArg& t, const char* name, int32_t dtype) {
  if (t.dtype != dtype) {
    fail("input '%s': expected dtype %s, got %s", name, dtype_name(dtype), dtype_name(t.dtype));
  }
}

/// Checks an input's dtype and rank; dims are checked one by one by the wrapper (check_dim).
inline void check_input(const TensorArg& t, const char* name, int32_t dtype, int rank,
                        const char* expected_shape) {
  check_dtype(t, name, dtype);
  if (t.rank != rank) {
    fail("input '%s': expected shape %s (rank %d), got %s (rank %d)", name, expected_shape, rank,
         dims_str(t.dims, t.rank).c_str(), t.rank);
  }
  if (t.data == nullptr) {
    int64_t numel = 1;
    for (int k = 0; k < rank; ++k) numel *= t.dims[k];
    if (numel != 0) fail("input '%s': data pointer is null", name);
  }
}

/// Checks one dim of an input against the value the model requires.
inline void check_dim(const TensorArg& t, const char* name, int dim, int64_t expected,
                      const char* expected_shape, const char* why) {
  if (t.dims[dim] != expected) {
    fail("input '%s': expected shape %s, got %s: dim %d must be %lld%s", name, expected_shape,
         dims_str(t.dims, t.rank).c_str(), dim, static_cast<long long>(expected), why);
  }
}

/// Checks that every index lies in [-size, size) (or equals `ignored`, when `has_ignored`) before
/// a kernel uses it (the kernel then wraps negative values without checking in its hot loop).
template <typename T>
inline void check_indices(const T* indices, int64_t count, int64_t size, bool has_ignored,
                          int64_t ignored, const char* node) {
  for (int64_t i = 0; i < count; ++i) {
    int64_t v = static_cast<int64_t>(indices[i]);
    if (has_ignored && v == ignored) continue;
    if (v < -size || v >= size) {
      fail("%s: index %lld is out of range for an axis of size %lld (valid: %lld to %lld)", node,
           static_cast<long long>(v), static_cast<long long>(size), static_cast<long long>(-size),
           static_cast<long long>(size - 1));
    }
  }
}

/// Checks that a reduction without an identity (ArgMax, ArgMin) has something to reduce: an empty
/// axis has no answer unless the output is empty too.
inline void check_extent(int64_t extent, int64_t outputs, const char* node) {
  if (extent == 0 && outputs > 0) {
    fail("%s: the reduced axis is empty (size 0), so there is no index to return for %lld outputs",
         node, static_cast<long long>(outputs));
  }
}

/// Checks that an input the model was specialized on (a shape argument or a flag given as an
/// input) still holds the values it was compiled for.
template <typename T>
inline void check_values(const T* data, const double* expected, int64_t count, const char* name) {
  for (int64_t i = 0; i < count; ++i) {
    if (static_cast<double>(data[i]) == expected[i]) continue;
    auto text = [](double v) {
      char buffer[32];
      std::snprintf(buffer, sizeof(buffer), "%.9g", v);
      return std::string(buffer);
    };
    std::string want, got;
    for (int64_t j = 0; j < count; ++j) {
      want += (j ? ", " : "") + text(expected[j]);
      got += (j ? ", " : "") + text(static_cast<double>(data[j]));
    }
    fail(
        "input '%s': the model was compiled for the values [%s] of this input (it sets a shape "
        "or a mode); got [%s]: compile again with these values",
        name, want.c_str(), got.c_str());
  }
}

/// Copies a strided view into contiguous memory (row-major over its sizes).
template <typename T>
inline void copy_to_contiguous(const View& v, T* out) {
  int64_t numel = 1;
  for (int k = 0; k < v.rank; ++k) numel *= v.sizes[k];
  const T* base = static_cast<const T*>(v.data);
  for (int64_t flat = 0; flat < numel; ++flat) {
    int64_t rest = flat, offset = 0;
    for (int k = v.rank - 1; k >= 0; --k) {
      offset += (rest % v.sizes[k]) * v.strides[k];
      rest /= v.sizes[k];
    }
    out[flat] = base[offset];
  }
}

}  // namespace kiln_rt
