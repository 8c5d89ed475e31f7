#pragma once
// Kiln runtime: what generated wrappers use. Compiled into each generated library; it never
// includes Kiln compiler headers. The C-facing types here (TensorArg) are the calling convention
// of a compiled model's entry point `kiln_run`.
//
// Every wrapper includes this header, so it is kept light: what needs the standard library's
// containers, strings, locks or clocks is defined in kiln_rt.cpp, which the code cache compiles
// once per compiler and flags and links into every generated library (as kiln_rt_pool.cpp), and
// declared here. A one-kernel suite case's wrapper compiled in 0.15 s so, 0.49 s with those
// definitions inline (AMD EPYC). kiln_rt_error.h (Error) and kiln_rt_profile.h (a run's events)
// hold the types that need heavier headers, for the runtime headers and programs that use them.
// The out-of-line functions are hidden (KILN_RT_LOCAL): each library has its own copy.

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>

#include "kiln_rt_pool.h"

/// Hidden: a library's calls bind to its own copy of kiln_rt.cpp, never to another library's.
#define KILN_RT_LOCAL __attribute__((visibility("hidden")))

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

/// Throws kiln_rt::Error (kiln_rt_error.h), an error of the model's run (bad input, out-of-range
/// index) that kiln_run reports, with a printf-style message.
KILN_RT_LOCAL [[noreturn]] void fail(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// `bytes` (at least 1) of 64-byte aligned memory, released with free_bytes (std::free); throws
/// std::bad_alloc when there is none.
KILN_RT_LOCAL void* aligned_alloc_bytes(size_t bytes);
KILN_RT_LOCAL void free_bytes(void* p);

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
  ~Arena() { free_bytes(data_); }
  KILN_RT_LOCAL char* reserve(int64_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

/// Where a profiled run records its events (kiln_rt_profile.h); null when the run is not
/// profiled.
struct Profile;

/// The steady clock in nanoseconds, and the event of a call that began at `start_ns` and ends now.
KILN_RT_LOCAL int64_t profile_now_ns();
KILN_RT_LOCAL void profile_record(Profile* profile, const char* name, const char* kind,
                                  int64_t start_ns);

/// Times the enclosing call when the run is profiled; costs one null test otherwise.
class ProfileScope {
 public:
  ProfileScope(Profile* profile, const char* name, const char* kind)
      : profile_(profile), name_(name), kind_(kind) {
    if (profile_ != nullptr) start_ns_ = profile_now_ns();
  }
  ~ProfileScope() {
    if (profile_ != nullptr) profile_record(profile_, name_, kind_, start_ns_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profile* profile_;
  const char* name_;
  const char* kind_;
  int64_t start_ns_ = 0;
};

/// The free objects of a Pool, under a lock (kiln_rt.cpp).
class FreeList {
 public:
  KILN_RT_LOCAL FreeList();
  KILN_RT_LOCAL ~FreeList();
  FreeList(const FreeList&) = delete;
  FreeList& operator=(const FreeList&) = delete;
  /// A free object, or null when there is none.
  KILN_RT_LOCAL void* take();
  KILN_RT_LOCAL void put(void* item);
  /// Calls destroy on every free object and forgets them.
  KILN_RT_LOCAL void drain(void (*destroy)(void*));

 private:
  void* impl_;
};

/// Objects handed to one run at a time (a run's arena and library state), so that concurrent
/// runs of one model never share them: acquire() takes a free one or makes a new one, and the
/// lease gives it back.
template <typename T>
class Pool {
 public:
  class Lease {
   public:
    Lease(FreeList* list, T* item) : list_(list), item_(item) {}
    Lease(Lease&& other) noexcept : list_(other.list_), item_(other.item_) {
      other.item_ = nullptr;
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (item_ != nullptr) list_->put(item_);
    }
    T& operator*() const { return *item_; }
    T* operator->() const { return item_; }

   private:
    FreeList* list_;
    T* item_;
  };

  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() {
    free_.drain([](void* item) { delete static_cast<T*>(item); });
  }
  Lease acquire() {
    void* item = free_.take();
    return Lease(&free_, item != nullptr ? static_cast<T*>(item) : new T());
  }

 private:
  FreeList free_;
};

/// The buffers a workspace owns (kiln_rt.cpp).
class LiveSet {
 public:
  LiveSet() = default;
  KILN_RT_LOCAL ~LiveSet();
  LiveSet(const LiveSet&) = delete;
  LiveSet& operator=(const LiveSet&) = delete;
  KILN_RT_LOCAL void add(void* p);
  /// Forgets p; false when it is not in the set.
  KILN_RT_LOCAL bool remove(const void* p);
  /// Calls release(context, p) for every buffer and forgets them.
  KILN_RT_LOCAL void release_all(void (*release)(void* context, void* p), void* context);

 private:
  void* items_ = nullptr;
};

/// Host memory for a Workspace: 64-byte aligned, released with free().
struct HostMemory {
  void* alloc(size_t bytes) const { return aligned_alloc_bytes(bytes); }
  void free(void* p) const { free_bytes(p); }
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
    live_.release_all([](void* memory, void* p) { static_cast<Memory*>(memory)->free(p); },
                      &memory_);
  }
  template <typename T>
  T* alloc(int64_t numel) {
    void* p = memory_.alloc(static_cast<size_t>(numel > 0 ? numel : 0) * sizeof(T));
    live_.add(p);
    return static_cast<T*>(p);
  }
  void release(const void* p) {
    if (live_.remove(p)) memory_.free(const_cast<void*>(p));
  }
  /// Takes ownership of storage allocated elsewhere (a control-flow result).
  void adopt(void* p) { live_.add(p); }
  /// Hands a buffer to the caller (a model output): no longer freed here.
  bool detach(const void* p) { return live_.remove(p); }

 private:
  Memory memory_;
  LiveSet live_;
};

using Workspace = BasicWorkspace<HostMemory>;

/// Storage of `bytes` for a model output: the caller's buffer when it gave one (which must hold
/// the output), else storage of the run that finish_output hands to the caller.
KILN_RT_LOCAL void* output_storage_bytes(const TensorArg& out, size_t bytes, const char* name,
                                         Workspace& ws);

template <typename T>
inline T* output_storage(const TensorArg& out, int64_t numel, const char* name, Workspace& ws) {
  return static_cast<T*>(
      output_storage_bytes(out, static_cast<size_t>(numel > 0 ? numel : 0) * sizeof(T), name, ws));
}

/// Hands a model output to the caller: sets its dtype and shape; a result computed outside the
/// caller's buffer is copied into it; without a caller's buffer, storage of the run is handed
/// over and anything else (an input or a constant passed through) is copied into fresh storage.
KILN_RT_LOCAL void finish_output(TensorArg& out, const void* data, int32_t dtype, int rank,
                                 const int64_t* dims, size_t element_size, const char* name,
                                 Workspace& ws);

/// The name of an ONNX dtype code ("float32"; "unknown" for a code Kiln does not know).
KILN_RT_LOCAL const char* dtype_name(int32_t code);

/// Checks an input's dtype (alone for an input whose data the model never reads).
KILN_RT_LOCAL void check_dtype(const TensorArg& t, const char* name, int32_t dtype);

/// Checks an input's dtype and rank; dims are checked one by one by the wrapper (check_dim).
KILN_RT_LOCAL void check_input(const TensorArg& t, const char* name, int32_t dtype, int rank,
                               const char* expected_shape);

/// Checks one dim of an input against the value the model requires.
KILN_RT_LOCAL void check_dim(const TensorArg& t, const char* name, int dim, int64_t expected,
                             const char* expected_shape, const char* why);

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
KILN_RT_LOCAL void check_extent(int64_t extent, int64_t outputs, const char* node);

/// Fails for an input that no longer holds the values the model was compiled for: `read(data, i)`
/// is its i-th value (check_values).
KILN_RT_LOCAL [[noreturn]] void values_changed(const void* data,
                                               double (*read)(const void*, int64_t),
                                               const double* expected, int64_t count,
                                               const char* name);

/// Checks that an input the model was specialized on (a shape argument or a flag given as an
/// input) still holds the values it was compiled for.
template <typename T>
inline void check_values(const T* data, const double* expected, int64_t count, const char* name) {
  for (int64_t i = 0; i < count; ++i) {
    if (static_cast<double>(data[i]) == expected[i]) continue;
    values_changed(
        data,
        [](const void* values, int64_t k) {
          return static_cast<double>(static_cast<const T*>(values)[k]);
        },
        expected, count, name);
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

/// Runs body(context) for kiln_run and turns what it throws into kiln_run's status: 0 when it
/// returns, 2 for a kiln_rt::Error (a bad input, a run-time error), 3 for any other exception, with
/// the message written to error[0, error_size).
KILN_RT_LOCAL int run_guarded(void (*body)(void* context), void* context, char* error,
                              int64_t error_size);

/// run_guarded over a callable.
template <typename F>
inline int guarded(F&& body, char* error, int64_t error_size) {
  using Body = std::remove_reference_t<F>;
  return run_guarded([](void* context) { (*static_cast<Body*>(context))(); },
                     const_cast<void*>(static_cast<const void*>(&body)), error, error_size);
}

}  // namespace kiln_rt
