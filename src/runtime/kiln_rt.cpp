// Kiln runtime: the out-of-line part of kiln_rt.h (why it is out of line is said there). Compiled
// once per compiler and flags into an object of the code cache and linked into every generated
// library; the header's declarations make them hidden, so each library has its own copy.

#include "kiln_rt.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "kiln_rt_error.h"
#include "kiln_rt_profile.h"

namespace kiln_rt {

void fail(const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  throw Error(message);
}

void* aligned_alloc_bytes(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  void* p = std::aligned_alloc(kAlignBytes, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void free_bytes(void* p) { std::free(p); }

char* Arena::reserve(int64_t bytes) {
  const size_t want = static_cast<size_t>(std::max<int64_t>(bytes, 0));
  if (want > capacity_) {
    free_bytes(data_);
    data_ = nullptr;
    capacity_ = 0;
    data_ = static_cast<char*>(aligned_alloc_bytes(want));
    capacity_ = want;
  }
  return data_;
}

int64_t profile_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void profile_record(Profile* profile, const char* name, const char* kind, int64_t start_ns) {
  const int64_t end_ns = profile_now_ns();
  const int64_t origin_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(profile->origin.time_since_epoch())
          .count();
  profile->events.push_back({name, kind, start_ns - origin_ns, end_ns - start_ns});
}

namespace {

struct FreeItems {
  std::mutex mutex;
  std::vector<void*> items;
};

}  // namespace

FreeList::FreeList() : impl_(new FreeItems()) {}

FreeList::~FreeList() { delete static_cast<FreeItems*>(impl_); }

void* FreeList::take() {
  auto& list = *static_cast<FreeItems*>(impl_);
  std::lock_guard<std::mutex> lock(list.mutex);
  if (list.items.empty()) return nullptr;
  void* item = list.items.back();
  list.items.pop_back();
  return item;
}

void FreeList::put(void* item) {
  auto& list = *static_cast<FreeItems*>(impl_);
  std::lock_guard<std::mutex> lock(list.mutex);
  list.items.push_back(item);
}

void FreeList::drain(void (*destroy)(void*)) {
  auto& list = *static_cast<FreeItems*>(impl_);
  for (void* item : list.items) destroy(item);
  list.items.clear();
}

LiveSet::~LiveSet() { delete static_cast<std::vector<void*>*>(items_); }

void LiveSet::add(void* p) {
  if (items_ == nullptr) items_ = new std::vector<void*>();
  static_cast<std::vector<void*>*>(items_)->push_back(p);
}

bool LiveSet::remove(const void* p) {
  if (items_ == nullptr) return false;
  auto& items = *static_cast<std::vector<void*>*>(items_);
  auto it = std::find(items.begin(), items.end(), p);
  if (it == items.end()) return false;
  items.erase(it);
  return true;
}

void LiveSet::release_all(void (*release)(void* context, void* p), void* context) {
  if (items_ == nullptr) return;
  auto& items = *static_cast<std::vector<void*>*>(items_);
  for (void* p : items) release(context, p);
  items.clear();
}

void* output_storage_bytes(const TensorArg& out, size_t bytes, const char* name, Workspace& ws) {
  if (out.data == nullptr) return ws.alloc<char>(static_cast<int64_t>(bytes));
  if (out.capacity < bytes) {
    fail("output '%s': the buffer given holds %zu bytes, the output needs %zu", name, out.capacity,
         bytes);
  }
  return out.data;
}

void finish_output(TensorArg& out, const void* data, int32_t dtype, int rank, const int64_t* dims,
                   size_t element_size, const char* name, Workspace& ws) {
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

const char* dtype_name(int32_t code) {
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

std::string dims_str(const int64_t* dims, int rank) {
  std::string s = "[";
  for (int k = 0; k < rank; ++k) {
    if (k) s += ", ";
    s += std::to_string(dims[k]);
  }
  return s + "]";
}

void check_dtype(const TensorArg& t, const char* name, int32_t dtype) {
  if (t.dtype != dtype) {
    fail("input '%s': expected dtype %s, got %s", name, dtype_name(dtype), dtype_name(t.dtype));
  }
}

void check_input(const TensorArg& t, const char* name, int32_t dtype, int rank,
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

void check_dim(const TensorArg& t, const char* name, int dim, int64_t expected,
               const char* expected_shape, const char* why) {
  if (t.dims[dim] != expected) {
    fail("input '%s': expected shape %s, got %s: dim %d must be %lld%s", name, expected_shape,
         dims_str(t.dims, t.rank).c_str(), dim, static_cast<long long>(expected), why);
  }
}

void check_extent(int64_t extent, int64_t outputs, const char* node) {
  if (extent == 0 && outputs > 0) {
    fail("%s: the reduced axis is empty (size 0), so there is no index to return for %lld outputs",
         node, static_cast<long long>(outputs));
  }
}

void values_changed(const void* data, double (*read)(const void*, int64_t), const double* expected,
                    int64_t count, const char* name) {
  // The values as "1, 2, 3".
  auto list = [count](auto value) {
    std::string text;
    for (int64_t j = 0; j < count; ++j) {
      char buffer[40];
      std::snprintf(buffer, sizeof(buffer), j ? ", %.9g" : "%.9g", value(j));
      text += buffer;
    }
    return text;
  };
  const std::string want = list([&](int64_t j) { return expected[j]; });
  const std::string got = list([&](int64_t j) { return read(data, j); });
  fail(
      "input '%s': the model was compiled for the values [%s] of this input (it sets a shape "
      "or a mode); got [%s]: compile again with these values",
      name, want.c_str(), got.c_str());
}

int run_guarded(void (*body)(void* context), void* context, char* error, int64_t error_size) {
  auto report = [&](const char* message) {
    if (error != nullptr && error_size > 0) {
      std::snprintf(error, static_cast<size_t>(error_size), "%s", message);
    }
  };
  try {
    body(context);
    return 0;
  } catch (const Error& e) {
    report(e.what());
    return 2;
  } catch (const std::exception& e) {
    report(e.what());
    return 3;
  } catch (...) {
    report("unknown failure");
    return 3;
  }
}

}  // namespace kiln_rt
