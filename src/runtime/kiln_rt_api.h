#pragma once
// Kiln runtime: the C API (include/kiln/runtime.h) of a model library built by `kiln compile`.
// Included by the library's generated model_api.cpp, which defines KILN_MODEL_TARGET and
// KILN_MODEL_VERSION before it, then model_info() (the inputs, outputs, weights and variants of
// the model). No exception leaves these functions: each failure becomes a kiln_status.
//
// The work is done by a variant: the model's wrapper and kernels built for one ISA level
// (x86-64-v4, x86-64-v3, ...), a complete shared library of its own embedded in this one's
// read-only data. Each load takes the first variant whose CPU features this CPU has (variants
// are listed best first); at its first use in a process, that variant is written to an
// anonymous memory file (memfd) and dlopen'ed from it with RTLD_LOCAL, so each variant's code,
// inline functions included, stays apart from the others'. Not so inline variables (and static
// locals of inline functions): GCC makes them GNU unique symbols, which the loader binds to one
// definition per process whatever RTLD_LOCAL says, so a runtime header's constant that differs
// between ISA levels must be plain constexpr (internal linkage), never inline constexpr. This
// library's own code is built for the baseline x86-64, so that it runs on any CPU and can say
// which features a CPU lacks.

#include <dlfcn.h>
#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "kiln/runtime.h"
#include "kiln_rt.h"
#include "kiln_rt_profile.h"
#include "kiln_rt_weights.h"

namespace kiln_rt::api {

/// One build of the model's wrapper and kernels for an ISA level; a library holds at most
/// kMaxVariants.
inline constexpr size_t kMaxVariants = 8;
struct Variant {
  const char* name;            // "x86-64-v4"
  const char* features;        // the CPU features it needs, comma-separated ("avx2,fma,bmi2,f16c")
  const unsigned char* image;  // the shared library's bytes
  uint64_t image_bytes;
  const uint64_t* constant_offsets;  // its constants' offsets in the weights payload, in order
  size_t constant_count;
};

/// What the generated model_api.cpp says about its model.
struct ModelInfo {
  const kiln_value_info* inputs;
  size_t input_count;
  const kiln_value_info* outputs;
  size_t output_count;
  const Variant* variants;  // best first
  size_t variant_count;
  uint64_t weights_bytes;                 // the payload
  uint64_t weights_checksum;              // weights_checksum() of the payload
  const unsigned char* embedded_weights;  // the payload in read-only data; null: external file
};

const ModelInfo& model_info();

/// A loaded variant's entry points (codegen/wrapper/wrapper.h).
struct Entry {
  const Variant* variant = nullptr;
  void* handle = nullptr;
  void* (*create_state)() = nullptr;
  void (*destroy_state)(void* state) = nullptr;
  int (*run)(const TensorArg* inputs, TensorArg* outputs, const void* const* constants, void* state,
             Profile* profile, char* error, int64_t error_size) = nullptr;
  // A CUDA variant's (codegen/cuda/cuda_wrapper_ops.cpp's write_entry_points); null otherwise.
  int (*check_device)(char* error, int64_t error_size) = nullptr;
  int (*run_cuda)(const TensorArg* inputs, TensorArg* outputs, const void* const* constants,
                  void* state, Profile* profile, char* error, int64_t error_size, void* stream,
                  int inputs_on_device, int outputs_on_device) = nullptr;
  int (*host_alloc)(size_t bytes, void** p, char* error, int64_t error_size) = nullptr;
  void (*host_free)(void* p) = nullptr;
  void (*device_free)(void* p) = nullptr;
};

namespace {

/// Does this CPU have `feature`? KILN_CPU_FEATURES, when set, replaces what the CPU reports with
/// its comma-separated list (to see how a library behaves on an older CPU). Built for the
/// baseline x86-64 so that it runs on any CPU, like everything check_cpu calls.
__attribute__((target("arch=x86-64"))) bool cpu_has(const char* feature, size_t length) {
  if (const char* assumed = std::getenv("KILN_CPU_FEATURES")) {
    for (const char* p = assumed; *p != '\0';) {
      const char* end = p;
      while (*end != '\0' && *end != ',') ++end;
      if (static_cast<size_t>(end - p) == length && std::strncmp(p, feature, length) == 0)
        return true;
      p = *end == ',' ? end + 1 : end;
    }
    return false;
  }
  __builtin_cpu_init();
  auto is = [&](const char* name) {
    return std::strlen(name) == length && std::strncmp(name, feature, length) == 0;
  };
  if (is("avx")) return __builtin_cpu_supports("avx");
  if (is("avx2")) return __builtin_cpu_supports("avx2");
  if (is("fma")) return __builtin_cpu_supports("fma");
  if (is("bmi")) return __builtin_cpu_supports("bmi");
  if (is("bmi2")) return __builtin_cpu_supports("bmi2");
  if (is("f16c")) return __builtin_cpu_supports("f16c");
  if (is("avx512f")) return __builtin_cpu_supports("avx512f");
  if (is("avx512bw")) return __builtin_cpu_supports("avx512bw");
  if (is("avx512cd")) return __builtin_cpu_supports("avx512cd");
  if (is("avx512vl")) return __builtin_cpu_supports("avx512vl");
  if (is("avx512dq")) return __builtin_cpu_supports("avx512dq");
  return false;
}

/// The features of `variant` this CPU lacks, space-separated, in `missing` ("" when none).
__attribute__((target("arch=x86-64"))) void missing_features(const Variant& variant, char* missing,
                                                             size_t size) {
  size_t used = 0;
  missing[0] = '\0';
  for (const char* p = variant.features; *p != '\0';) {
    const char* end = p;
    while (*end != '\0' && *end != ',') ++end;
    const size_t length = static_cast<size_t>(end - p);
    if (!cpu_has(p, length) && used + length + 2 < size) {
      if (used != 0) missing[used++] = ' ';
      std::memcpy(missing + used, p, length);
      used += length;
      missing[used] = '\0';
    }
    p = *end == ',' ? end + 1 : end;
  }
}

/// The best variant this CPU runs, or null.
__attribute__((target("arch=x86-64"))) const Variant* chosen_variant() {
  const ModelInfo& info = model_info();
  char missing[256];
  for (size_t k = 0; k < info.variant_count; ++k) {
    missing_features(info.variants[k], missing, sizeof(missing));
    if (missing[0] == '\0') return &info.variants[k];
  }
  return nullptr;
}

__attribute__((target("arch=x86-64"))) kiln_status* check_cpu() {
  if (chosen_variant() != nullptr) return nullptr;
  const ModelInfo& info = model_info();
  const Variant& least = info.variants[info.variant_count - 1];
  char missing[256];
  missing_features(least, missing, sizeof(missing));
  char text[512];
  std::snprintf(text, sizeof(text),
                "this CPU lacks %s, which the model library needs (it was compiled for %s; its "
                "least demanding variant is %s): compile it again with --target native on this "
                "machine",
                missing, KILN_MODEL_TARGET, least.name);
  const size_t length = std::strlen(text);
  auto* status = static_cast<kiln_status*>(std::malloc(sizeof(kiln_status) + length));
  if (status == nullptr) return nullptr;
  status->code = KILN_ERROR_UNSUPPORTED_CPU;
  std::memcpy(status->message, text, length + 1);
  return status;
}

/// dlopen's `variant`'s image from an anonymous memory file (a temporary file, removed once
/// loaded, where memfd is not available). The memory file stays open for the life of the process:
/// the loader knows a library by its path, and /proc/self/fd/N must never name another image.
void* open_image(const Variant& variant, std::string& error) {
  int fd = memfd_create(variant.name, MFD_CLOEXEC);
  char path[4096];
  const bool temporary = fd < 0;
  if (temporary) {
    const char* dir = std::getenv("TMPDIR");
    std::snprintf(path, sizeof(path), "%s/kiln-variant-XXXXXX", dir && *dir ? dir : "/tmp");
    fd = mkstemp(path);
  } else {
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  }
  if (fd < 0) {
    error = std::string("cannot create a file for the variant: ") + std::strerror(errno);
    return nullptr;
  }
  const unsigned char* data = variant.image;
  for (uint64_t left = variant.image_bytes; left > 0;) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = std::string("cannot write the variant's code: ") + std::strerror(errno);
      left = 0;
      data = nullptr;
    } else {
      data += n;
      left -= static_cast<uint64_t>(n);
    }
  }
  void* handle = nullptr;
  if (data != nullptr) {
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      error = std::string("cannot load the variant: ") + (why ? why : "unknown error");
    }
  }
  if (temporary) {
    ::close(fd);
    ::unlink(path);
  } else if (handle == nullptr) {
    ::close(fd);
  }
  return handle;
}

/// The variants this process loaded (each at its first use), kept for the life of the process.
struct LoadedVariants {
  std::mutex mutex;
  Entry entries[kMaxVariants];
};

LoadedVariants& loaded_variants() {
  static LoadedVariants* loaded = new LoadedVariants();  // never destroyed: see open_image
  return *loaded;
}

/// The entry points of the best variant this CPU runs, loading it first if needed.
kiln_status* load_variant(const Entry** result) {
  const Variant* variant = chosen_variant();
  if (variant == nullptr) return check_cpu();
  LoadedVariants& loaded = loaded_variants();
  std::lock_guard<std::mutex> lock(loaded.mutex);
  Entry& entry = loaded.entries[variant - model_info().variants];
  if (entry.handle == nullptr) {
    std::string error;
    void* handle = open_image(*variant, error);
    if (handle == nullptr)
      return kiln_status_make(KILN_ERROR_LOAD, "variant %s: %s", variant->name, error.c_str());
    Entry e;
    e.variant = variant;
    e.handle = handle;
    e.create_state = reinterpret_cast<void* (*)()>(dlsym(handle, "kiln_create_state"));
    e.destroy_state = reinterpret_cast<void (*)(void*)>(dlsym(handle, "kiln_destroy_state"));
    e.run = reinterpret_cast<decltype(e.run)>(dlsym(handle, "kiln_run"));
    if (e.create_state == nullptr || e.destroy_state == nullptr || e.run == nullptr) {
      return kiln_status_make(KILN_ERROR_LOAD, "variant %s lacks the wrapper's entry points",
                              variant->name);
    }
    e.check_device = reinterpret_cast<decltype(e.check_device)>(dlsym(handle, "kiln_check_device"));
    e.run_cuda = reinterpret_cast<decltype(e.run_cuda)>(dlsym(handle, "kiln_run_cuda"));
    e.host_alloc = reinterpret_cast<decltype(e.host_alloc)>(dlsym(handle, "kiln_cuda_host_alloc"));
    e.host_free = reinterpret_cast<decltype(e.host_free)>(dlsym(handle, "kiln_cuda_host_free"));
    e.device_free =
        reinterpret_cast<decltype(e.device_free)>(dlsym(handle, "kiln_cuda_device_free"));
    entry = e;
  }
  *result = &entry;
  return nullptr;
}

struct Instance {
  const ModelInfo* info = nullptr;
  const Entry* entry = nullptr;
  std::vector<const void*> constants;
  void* state = nullptr;
  void* mapping = nullptr;  // the weights file, memory-mapped
  size_t mapping_bytes = 0;
  int threads = 0;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
  std::atomic<bool> profiling{false};
  std::atomic<uint64_t> runs{0};
  std::mutex mutex;  // guards the profile
  std::vector<kiln_profile_event> events;
  std::map<std::thread::id, uint32_t> thread_numbers;

  ~Instance() {
    if (state != nullptr) entry->destroy_state(state);
    if (mapping != nullptr) munmap(mapping, mapping_bytes);
  }
};

/// `<stem>.weights` beside the library `<stem>.so`.
std::string weights_path(const char* library_path) {
  std::string path = library_path;
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".so") == 0) path.resize(path.size() - 3);
  return path + ".weights";
}

/// Maps the weights file and checks it against what the library was built with.
kiln_status* map_weights(Instance& instance, const char* library_path, const unsigned char** out) {
  const ModelInfo& info = *instance.info;
  const std::string path = weights_path(library_path);
  WeightsFile file;
  char error[1024];
  if (!map_weights_file(path.c_str(), library_path, info.weights_bytes, info.weights_checksum, file,
                        error, sizeof(error))) {
    return kiln_status_make(KILN_ERROR_LOAD, "%s", error);
  }
  instance.mapping = file.mapping;
  instance.mapping_bytes = file.mapping_bytes;
  *out = file.payload;
  return nullptr;
}

kiln_status* create(const char* library_path, const kiln_options* options, void** result) {
  if (library_path == nullptr || result == nullptr) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT, "create: null argument");
  }
  try {
    auto instance = std::make_unique<Instance>();
    instance->info = &model_info();
    if (options != nullptr && options->struct_size >= sizeof(uint32_t) + sizeof(int32_t)) {
      if (options->threads < 0) {
        return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT,
                                "options.threads must be 0 (the OpenMP default) or positive, "
                                "got %d",
                                options->threads);
      }
      instance->threads = options->threads;
    }
    if (kiln_status* status = load_variant(&instance->entry)) return status;
    if (instance->entry->check_device != nullptr) {
      char error[1024] = "";
      if (instance->entry->check_device(error, sizeof(error)) != 0)
        return kiln_status_make(KILN_ERROR_DEVICE, "%s: %s", library_path, error);
    }
    const Variant& variant = *instance->entry->variant;
    const unsigned char* weights = instance->info->embedded_weights;
    if (weights == nullptr && instance->info->weights_bytes > 0) {
      if (kiln_status* status = map_weights(*instance, library_path, &weights)) return status;
    }
    for (size_t k = 0; k < variant.constant_count; ++k)
      instance->constants.push_back(weights + variant.constant_offsets[k]);
    instance->state = instance->entry->create_state();
    if (instance->state == nullptr) {
      return kiln_status_make(KILN_ERROR_OUT_OF_MEMORY, "create: out of memory");
    }
    *result = instance.release();
    return nullptr;
  } catch (const std::bad_alloc&) {
    return kiln_status_make(KILN_ERROR_OUT_OF_MEMORY, "create: out of memory");
  } catch (const std::exception& e) {
    return kiln_status_make(KILN_ERROR_INTERNAL, "create: %s", e.what());
  }
}

void destroy(void* instance) { delete static_cast<Instance*>(instance); }

size_t input_count(void*) { return model_info().input_count; }
size_t output_count(void*) { return model_info().output_count; }

kiln_status* value_info(const kiln_value_info* values, size_t count, const char* what, size_t index,
                        kiln_value_info* info) {
  if (info == nullptr) return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT, "info is null");
  if (index >= count) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT,
                            "%s %zu does not exist: the model has %zu %ss", what, index, count,
                            what);
  }
  *info = values[index];
  return nullptr;
}

kiln_status* input_info(void*, size_t index, kiln_value_info* info) {
  return value_info(model_info().inputs, model_info().input_count, "input", index, info);
}

kiln_status* output_info(void*, size_t index, kiln_value_info* info) {
  return value_info(model_info().outputs, model_info().output_count, "output", index, info);
}

/// A run through kiln_run, or with `cuda` through the CUDA variant's kiln_run_cuda.
kiln_status* run_with(void* handle, const kiln_tensor* inputs, size_t input_count,
                      kiln_tensor* outputs, size_t output_count,
                      const kiln_cuda_run_options* cuda) {
  auto& instance = *static_cast<Instance*>(handle);
  const ModelInfo& info = *instance.info;
  if (input_count != info.input_count || output_count != info.output_count) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT,
                            "run: the model takes %zu inputs and %zu outputs, %zu and %zu were "
                            "given",
                            info.input_count, info.output_count, input_count, output_count);
  }
  if ((input_count > 0 && inputs == nullptr) || (output_count > 0 && outputs == nullptr)) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT, "run: null inputs or outputs");
  }
  try {
    std::vector<TensorArg> in(input_count), out(output_count);
    for (size_t k = 0; k < input_count; ++k) {
      const kiln_tensor& t = inputs[k];
      if (t.rank < 0 || t.rank > KILN_MAX_RANK) {
        return kiln_status_make(KILN_ERROR_BAD_INPUT, "input '%s': rank %d is not in 0..%d",
                                info.inputs[k].name, t.rank, KILN_MAX_RANK);
      }
      in[k] = TensorArg{t.data, t.dtype, t.rank, {}, 0};
      std::copy(t.dims, t.dims + t.rank, in[k].dims);
    }
    for (size_t k = 0; k < output_count; ++k) {
      out[k] = TensorArg{outputs[k].data, 0, 0, {}, outputs[k].data ? outputs[k].capacity : 0};
    }
    if (instance.threads > 0) omp_set_num_threads(instance.threads);
    Profile profile;
    profile.origin = instance.origin;
    const bool profiled = instance.profiling.load();
    char error[2048] = "";
    const int code =
        cuda == nullptr
            ? instance.entry->run(in.data(), out.data(), instance.constants.data(), instance.state,
                                  profiled ? &profile : nullptr, error, sizeof(error))
            : instance.entry->run_cuda(in.data(), out.data(), instance.constants.data(),
                                       instance.state, profiled ? &profile : nullptr, error,
                                       sizeof(error), cuda->stream, cuda->inputs_on_device,
                                       cuda->outputs_on_device);
    if (code != 0) {
      return kiln_status_make(code == 2 ? KILN_ERROR_BAD_INPUT : KILN_ERROR_INTERNAL, "%s", error);
    }
    for (size_t k = 0; k < output_count; ++k) {
      outputs[k].data = out[k].data;
      outputs[k].dtype = out[k].dtype;
      outputs[k].rank = out[k].rank;
      std::copy(out[k].dims, out[k].dims + out[k].rank, outputs[k].dims);
    }
    if (profiled) {
      const uint64_t number = instance.runs.fetch_add(1);
      std::lock_guard<std::mutex> lock(instance.mutex);
      auto [it, fresh] = instance.thread_numbers.emplace(
          std::this_thread::get_id(), static_cast<uint32_t>(instance.thread_numbers.size()));
      for (const ProfileEvent& e : profile.events) {
        instance.events.push_back({e.name, e.kind, e.start_ns, e.duration_ns, number, it->second});
      }
    }
    return nullptr;
  } catch (const std::bad_alloc&) {
    return kiln_status_make(KILN_ERROR_OUT_OF_MEMORY, "run: out of memory");
  } catch (const std::exception& e) {
    return kiln_status_make(KILN_ERROR_INTERNAL, "run: %s", e.what());
  }
}

kiln_status* run(void* handle, const kiln_tensor* inputs, size_t input_count, kiln_tensor* outputs,
                 size_t output_count) {
  return run_with(handle, inputs, input_count, outputs, output_count, nullptr);
}

kiln_status* run_cuda(void* handle, const kiln_tensor* inputs, size_t input_count,
                      kiln_tensor* outputs, size_t output_count,
                      const kiln_cuda_run_options* options) {
  const auto& instance = *static_cast<Instance*>(handle);
  if (instance.entry->run_cuda == nullptr) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT,
                            "kiln_model_run_cuda: this model library runs on the CPU");
  }
  kiln_cuda_run_options defaults = {sizeof(kiln_cuda_run_options), nullptr, 0, 0};
  if (options != nullptr) {
    if (options->struct_size < sizeof(kiln_cuda_run_options)) {
      return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT,
                              "kiln_cuda_run_options.struct_size is %u, expected %zu",
                              options->struct_size, sizeof(kiln_cuda_run_options));
    }
    defaults = *options;
  }
  return run_with(handle, inputs, input_count, outputs, output_count, &defaults);
}

kiln_status* cuda_host_alloc(void* handle, size_t bytes, void** p) {
  const auto& instance = *static_cast<Instance*>(handle);
  if (p == nullptr) return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT, "host_alloc: null");
  *p = nullptr;
  if (instance.entry->host_alloc == nullptr) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT,
                            "kiln_cuda_host_alloc: this model library runs on the CPU");
  }
  char error[1024] = "";
  if (instance.entry->host_alloc(bytes, p, error, sizeof(error)) != 0)
    return kiln_status_make(KILN_ERROR_OUT_OF_MEMORY, "kiln_cuda_host_alloc: %s", error);
  return nullptr;
}

void cuda_host_free(void* handle, void* p) {
  const auto& instance = *static_cast<Instance*>(handle);
  if (instance.entry->host_free != nullptr) instance.entry->host_free(p);
}

void cuda_device_free(void* handle, void* p) {
  const auto& instance = *static_cast<Instance*>(handle);
  if (instance.entry->device_free != nullptr) instance.entry->device_free(p);
}

kiln_status* set_profiling(void* handle, int enabled) {
  static_cast<Instance*>(handle)->profiling.store(enabled != 0);
  return nullptr;
}

size_t profile_events(void* handle, const kiln_profile_event** events) {
  auto& instance = *static_cast<Instance*>(handle);
  std::lock_guard<std::mutex> lock(instance.mutex);
  if (events != nullptr) *events = instance.events.data();
  return instance.events.size();
}

void clear_profile(void* handle) {
  auto& instance = *static_cast<Instance*>(handle);
  std::lock_guard<std::mutex> lock(instance.mutex);
  instance.events.clear();
}

const char* variant(void* handle) { return static_cast<Instance*>(handle)->entry->variant->name; }

}  // namespace

}  // namespace kiln_rt::api

/// The library's one exported entry: the table of the C API (include/kiln/runtime.h). Reading it
/// runs no code built for the target, so a loader can check abi_version and call check_cpu first.
extern "C" __attribute__((visibility("default"), target("arch=x86-64"))) const kiln_model_api*
kiln_model_entry() {
  namespace api = kiln_rt::api;
  static const kiln_model_api table = {
      KILN_ABI_VERSION,    KILN_MODEL_VERSION, KILN_MODEL_TARGET, api::check_cpu,
      api::create,         api::destroy,       api::input_count,  api::output_count,
      api::input_info,     api::output_info,   api::run,          api::set_profiling,
      api::profile_events, api::clear_profile, api::variant,
  };
  return &table;
}

#ifdef KILN_MODEL_DEVICE_CUDA
/// A CUDA model library's second entry: the table of include/kiln/runtime.h's CUDA functions
/// (kiln_model_run_cuda and the pinned host memory). A CPU library has no such symbol.
extern "C" __attribute__((visibility("default"), target("arch=x86-64"))) const kiln_cuda_api*
kiln_model_cuda_entry() {
  namespace api = kiln_rt::api;
  static const kiln_cuda_api table = {KILN_ABI_VERSION, api::run_cuda, api::cuda_host_alloc,
                                      api::cuda_host_free, api::cuda_device_free};
  return &table;
}
#endif
