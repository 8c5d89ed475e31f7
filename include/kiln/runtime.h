/* Kiln runtime C API: load a model library built by `kiln compile` and run it.
 *
 * This header is the whole runtime: it loads the library with dlopen and calls it through a
 * table of functions the library exports (kiln_model_entry). Nothing else from Kiln is needed
 * at run time; link with nothing more than the C library (dlopen is in glibc 2.34+, -ldl
 * before).
 *
 *   kiln_model* model = NULL;
 *   kiln_options options = kiln_default_options();
 *   options.threads = 4;
 *   kiln_status* status = kiln_model_load("resnet.so", &options, &model);
 *   if (status) { fprintf(stderr, "%s\n", kiln_status_message(status)); kiln_status_free(status); }
 *   ...
 *   kiln_tensor in = {data, 0, KILN_FLOAT32, 4, {1, 3, 224, 224}};
 *   kiln_tensor out = {0};                       // data NULL: the library allocates it
 *   status = kiln_model_run(model, &in, 1, &out, 1);
 *   ... use out.data, out.dims ...; kiln_free(out.data);
 *   kiln_model_free(model);
 *
 * Every call that can fail returns a kiln_status*: NULL on success, else an error with a code
 * and a message (free it with kiln_status_free). No C++ exception crosses this API.
 *
 * One loaded model serves concurrent kiln_model_run calls from any number of threads: each run
 * takes its own memory arena and library state from a pool. kiln_model_free must not race with
 * runs of the same model.
 *
 * A library compiled with `kiln compile --device cuda` runs on an NVIDIA GPU. It needs the CUDA
 * driver (libcuda.so.1), and cuBLASLt and cuDNN 9 when the model has matrix products or
 * convolutions (all loaded with dlopen, so ldd does not list them); kiln_model_load checks them,
 * the GPU's compute capability and the driver's version, and fails with KILN_ERROR_DEVICE and a
 * message saying what is missing. kiln_model_run works as above (host buffers in and out; it
 * returns once the outputs are on the host). kiln_model_run_cuda (below) also takes device
 * buffers and the caller's CUDA stream. Each concurrent run takes its own stream, arena and
 * cuBLASLt/cuDNN handles from the pool; the weights are uploaded once per pooled run state.
 * From the second run with given input sizes, a run state replays its device work as a CUDA
 * graph (README, "CUDA graphs"; KILN_CUDA_GRAPHS=0 turns that off).
 */
#ifndef KILN_RUNTIME_H_
#define KILN_RUNTIME_H_

#include <dlfcn.h>
#include <elf.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this ABI: the layout of the structs below and of kiln_model_api. A library
 * records the version it was built for; loading it with a different one is refused. */
#ifndef KILN_ABI_VERSION
#define KILN_ABI_VERSION 2u
#endif

#define KILN_MAX_RANK 16

typedef enum kiln_status_code {
  KILN_OK = 0,
  KILN_ERROR_INVALID_ARGUMENT = 1, /* a bad call: null pointer, wrong count, index out of range */
  KILN_ERROR_BAD_INPUT = 2,        /* an input's dtype, shape or values; an output buffer size */
  KILN_ERROR_LOAD = 3,             /* the library or its weights file cannot be loaded */
  KILN_ERROR_ABI = 4,              /* the library was built for another version of this API */
  KILN_ERROR_UNSUPPORTED_CPU = 5,  /* this CPU lacks an instruction set the library needs */
  KILN_ERROR_OUT_OF_MEMORY = 6,
  KILN_ERROR_INTERNAL = 7, /* a bug in Kiln or in a library it calls */
  /* a CUDA library on a machine that cannot run it: no driver or one too old for the CUDA that
   * compiled it, no GPU, a GPU none of its kernels runs on, cuBLASLt or cuDNN missing */
  KILN_ERROR_DEVICE = 8
} kiln_status_code;

typedef struct kiln_status {
  kiln_status_code code;
  char message[1]; /* NUL-terminated, allocated with the struct */
} kiln_status;

/* ONNX TensorProto data type codes. */
typedef enum kiln_dtype {
  KILN_UNDEFINED = 0, /* an output's dtype known only after a run (kiln_value_info) */
  KILN_FLOAT32 = 1,
  KILN_UINT8 = 2,
  KILN_INT8 = 3,
  KILN_UINT16 = 4,
  KILN_INT16 = 5,
  KILN_INT32 = 6,
  KILN_INT64 = 7,
  KILN_BOOL = 9,
  KILN_FLOAT16 = 10,
  KILN_FLOAT64 = 11,
  KILN_UINT32 = 12,
  KILN_UINT64 = 13,
  KILN_BFLOAT16 = 16,
  /* ONNX 1.14-1.23's small types. Each element takes one byte here, also the 4- and 2-bit ones
   * (not ONNX's packing): float8 codes as they are, the float4e2m1 code in the low nibble,
   * int4/int2 sign-extended to int8, uint4/uint2 zero-extended to uint8. */
  KILN_FLOAT8E4M3FN = 17,
  KILN_FLOAT8E4M3FNUZ = 18,
  KILN_FLOAT8E5M2 = 19,
  KILN_FLOAT8E5M2FNUZ = 20,
  KILN_UINT4 = 21,
  KILN_INT4 = 22,
  KILN_FLOAT4E2M1 = 23,
  KILN_FLOAT8E8M0 = 24,
  KILN_UINT2 = 25,
  KILN_INT2 = 26
} kiln_dtype;

/* A dense row-major tensor. As an input: `data` holds it (`capacity` is ignored). As an
 * output: `data` NULL asks the library to allocate it (release it with kiln_free), or `data`
 * points to `capacity` bytes the caller owns, which the output must fit. The library sets
 * dtype, rank and dims of outputs. */
typedef struct kiln_tensor {
  void* data;
  size_t capacity;
  int32_t dtype;
  int32_t rank;
  int64_t dims[KILN_MAX_RANK];
} kiln_tensor;

/* An input or output as compiled: dims[k] is -1 where the dim is symbolic, and dim_names[k]
 * names that symbol ("batch"); dim_names[k] is NULL for a fixed dim. The pointers stay valid
 * while the model is loaded.
 *
 * rank is -1 for an output whose rank is known only after a run: it comes from an If whose
 * branches give outputs of different ranks (or dtypes), and each run sets the output tensor's
 * dtype, rank and dims to those of the branch taken. dtype is then the one dtype both branches
 * give, or KILN_UNDEFINED when they differ. A caller's buffer for such an output must fit the
 * largest branch. */
typedef struct kiln_value_info {
  const char* name;
  int32_t dtype;
  int32_t rank;
  const int64_t* dims;
  const char* const* dim_names;
} kiln_value_info;

typedef struct kiln_options {
  uint32_t struct_size; /* sizeof(kiln_options) */
  int32_t threads;      /* OpenMP threads of each run; 0: the OpenMP default (OMP_NUM_THREADS) */
} kiln_options;

/* One kernel or library call of a profiled run, in Chrome trace terms. */
typedef struct kiln_profile_event {
  const char* name; /* the kernel or the call ("cpp_fused_add_relu_3", "conv (node 'c1')") */
  const char* kind; /* "kernel" or "call" */
  int64_t start_ns; /* since the model was loaded */
  int64_t duration_ns;
  uint64_t run;    /* the run's sequence number */
  uint32_t thread; /* the calling thread, numbered from 0 in order of first use */
} kiln_profile_event;

/* What a model library exports: `kiln_model_entry()` returns this table. Loaders check
 * abi_version before touching anything else. */
typedef struct kiln_model_api {
  uint32_t abi_version;
  const char* kiln_version; /* of the compiler that built the library */
  const char* target;       /* its --target: "auto" (a variant per ISA level), "x86-64-v3", ... */
  /* Checks that one of its variants runs on this CPU, without running any code built for one;
   * NULL when fine. */
  kiln_status* (*check_cpu)(void);
  kiln_status* (*create)(const char* library_path, const kiln_options* options, void** instance);
  void (*destroy)(void* instance);
  size_t (*input_count)(void* instance);
  size_t (*output_count)(void* instance);
  kiln_status* (*input_info)(void* instance, size_t index, kiln_value_info* info);
  kiln_status* (*output_info)(void* instance, size_t index, kiln_value_info* info);
  kiln_status* (*run)(void* instance, const kiln_tensor* inputs, size_t input_count,
                      kiln_tensor* outputs, size_t output_count);
  kiln_status* (*set_profiling)(void* instance, int enabled);
  /* The events recorded since profiling was enabled (valid until the next call that changes
   * them: set_profiling, clear_profile, a profiled run). */
  size_t (*profile_events)(void* instance, const kiln_profile_event** events);
  void (*clear_profile)(void* instance);
  /* The variant this process loaded: the ISA level its code was built for ("x86-64-v4"). */
  const char* (*variant)(void* instance);
} kiln_model_api;

/* How kiln_model_run_cuda runs (set struct_size to sizeof(kiln_cuda_run_options)). */
typedef struct kiln_cuda_run_options {
  uint32_t struct_size;
  /* A CUstream (cudaStream_t) of the current device's primary context (the CUDA runtime's
   * context): the run is queued on it and kiln_model_run_cuda returns without waiting for the
   * GPU, so the caller synchronizes the stream before reading the outputs, and keeps the inputs
   * (pinned host inputs included) alive until then. NULL: the run takes a stream of its own and
   * returns once the outputs are ready. A run that needs data on the host midway (an op on the
   * host fallback list, a size read from data) waits for the stream there. Index checks of a
   * queued run are not reported (their kernels skip an index out of range); run on the run's
   * own stream (NULL) to have them reported. */
  void* stream;
  /* Non-zero: every input's data is device memory (else host memory, pageable or from
   * kiln_cuda_host_alloc). */
  int32_t inputs_on_device;
  /* Non-zero: outputs go to device memory: the caller's buffer (data and capacity) or, with
   * data NULL, memory the run allocates (release it with kiln_cuda_free). Else host memory as
   * kiln_model_run gives it. */
  int32_t outputs_on_device;
} kiln_cuda_run_options;

/* What a CUDA model library exports beside kiln_model_api: `kiln_model_cuda_entry()` returns
 * this table (a CPU library has no such symbol). */
typedef struct kiln_cuda_api {
  uint32_t abi_version;
  kiln_status* (*run)(void* instance, const kiln_tensor* inputs, size_t input_count,
                      kiln_tensor* outputs, size_t output_count,
                      const kiln_cuda_run_options* options);
  kiln_status* (*host_alloc)(void* instance, size_t bytes, void** data);
  void (*host_free)(void* instance, void* data);
  void (*device_free)(void* instance, void* data);
} kiln_cuda_api;

typedef struct kiln_model {
  void* handle; /* dlopen handle */
  const kiln_model_api* api;
  void* instance;
} kiln_model;

/* ---- Status ---- */

static inline kiln_status* kiln_status_make(kiln_status_code code, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

static inline kiln_status* kiln_status_make(kiln_status_code code, const char* format, ...) {
  va_list args;
  va_start(args, format);
  char buffer[2048];
  vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  size_t length = strlen(buffer);
  kiln_status* status = (kiln_status*)malloc(sizeof(kiln_status) + length);
  if (status == NULL) return NULL; /* out of memory while failing: nothing better to do */
  status->code = code;
  memcpy(status->message, buffer, length + 1);
  return status;
}

static inline kiln_status_code kiln_status_get_code(const kiln_status* status) {
  return status == NULL ? KILN_OK : status->code;
}

static inline const char* kiln_status_message(const kiln_status* status) {
  return status == NULL ? "ok" : status->message;
}

static inline void kiln_status_free(kiln_status* status) { free(status); }

/* Releases an output the library allocated. */
static inline void kiln_free(void* data) { free(data); }

static inline kiln_options kiln_default_options(void) {
  kiln_options options;
  options.struct_size = (uint32_t)sizeof(kiln_options);
  options.threads = 0;
  return options;
}

/* ---- Model ---- */

/* Checks that `file` holds a whole 64-bit ELF shared object: dlopen maps a truncated file
 * without complaint and the process dies of SIGBUS when it touches the missing pages. */
static inline kiln_status* kiln_check_library_file(const char* path, FILE* file) {
  Elf64_Ehdr header;
  if (fseek(file, 0, SEEK_END) != 0) {
    return kiln_status_make(KILN_ERROR_LOAD, "%s: cannot read the model library", path);
  }
  const long size = ftell(file);
  rewind(file);
  if (size < (long)sizeof(header) || fread(&header, sizeof(header), 1, file) != 1 ||
      memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
      header.e_type != ET_DYN) {
    return kiln_status_make(KILN_ERROR_LOAD,
                            "%s: not a model library (not a 64-bit ELF shared object)", path);
  }
  unsigned long long needed =
      header.e_shoff + (unsigned long long)header.e_shnum * header.e_shentsize;
  for (unsigned k = 0; k < header.e_phnum; ++k) {
    Elf64_Phdr segment;
    if (fseek(file, (long)(header.e_phoff + (unsigned long long)k * header.e_phentsize),
              SEEK_SET) != 0 ||
        fread(&segment, sizeof(segment), 1, file) != 1) {
      needed = (unsigned long long)size + 1;
      break;
    }
    if (segment.p_offset + segment.p_filesz > needed) needed = segment.p_offset + segment.p_filesz;
  }
  if (needed > (unsigned long long)size) {
    return kiln_status_make(KILN_ERROR_LOAD,
                            "%s: cannot load the model library: it is truncated (%ld bytes, its "
                            "headers need %llu)",
                            path, size, needed);
  }
  return NULL;
}

/* Loads the model library at `path` (and its weights file, when it was compiled with external
 * weights). `options` may be NULL. On success *model is set; free it with kiln_model_free. */
static inline kiln_status* kiln_model_load(const char* path, const kiln_options* options,
                                           kiln_model** model) {
  if (path == NULL || model == NULL) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT, "kiln_model_load: null argument");
  }
  *model = NULL;
  FILE* file = fopen(path, "rb");
  if (file == NULL) {
    return kiln_status_make(KILN_ERROR_LOAD, "%s: cannot open the model library", path);
  }
  kiln_status* truncated = kiln_check_library_file(path, file);
  fclose(file);
  if (truncated != NULL) return truncated;
  /* dlopen searches the library path for a name without a slash: name the file itself. */
  char local[4096];
  const char* file_name = path;
  if (strchr(path, '/') == NULL &&
      snprintf(local, sizeof(local), "./%s", path) < (int)sizeof(local))
    file_name = local;
  void* handle = dlopen(file_name, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    const char* why = dlerror();
    return kiln_status_make(KILN_ERROR_LOAD,
                            "%s: cannot load the model library (truncated or not a shared "
                            "library?): %s",
                            path, why ? why : "unknown error");
  }
  typedef const kiln_model_api* (*entry_fn)(void);
  entry_fn entry = (entry_fn)dlsym(handle, "kiln_model_entry");
  if (entry == NULL) {
    dlclose(handle);
    return kiln_status_make(KILN_ERROR_LOAD,
                            "%s: not a Kiln model library (it has no kiln_model_entry)", path);
  }
  const kiln_model_api* api = entry();
  if (api == NULL || api->abi_version != KILN_ABI_VERSION) {
    unsigned found = api ? api->abi_version : 0u;
    dlclose(handle);
    return kiln_status_make(KILN_ERROR_ABI,
                            "%s: the library was built for Kiln C ABI version %u, this program "
                            "for version %u (include/kiln/runtime.h): rebuild one of them with "
                            "the same Kiln",
                            path, found, (unsigned)KILN_ABI_VERSION);
  }
  kiln_status* status = api->check_cpu();
  void* instance = NULL;
  if (status == NULL) status = api->create(path, options, &instance);
  if (status != NULL) {
    dlclose(handle);
    return status;
  }
  kiln_model* result = (kiln_model*)malloc(sizeof(kiln_model));
  if (result == NULL) {
    api->destroy(instance);
    dlclose(handle);
    return kiln_status_make(KILN_ERROR_OUT_OF_MEMORY, "kiln_model_load: out of memory");
  }
  result->handle = handle;
  result->api = api;
  result->instance = instance;
  *model = result;
  return NULL;
}

static inline void kiln_model_free(kiln_model* model) {
  if (model == NULL) return;
  model->api->destroy(model->instance);
  /* The library stays mapped: OpenMP and oneDNN keep threads and caches that point into it,
   * and unloading under them crashes the process at exit. */
  free(model);
}

static inline size_t kiln_model_input_count(const kiln_model* model) {
  return model->api->input_count(model->instance);
}

static inline size_t kiln_model_output_count(const kiln_model* model) {
  return model->api->output_count(model->instance);
}

static inline kiln_status* kiln_model_input_info(const kiln_model* model, size_t index,
                                                 kiln_value_info* info) {
  return model->api->input_info(model->instance, index, info);
}

static inline kiln_status* kiln_model_output_info(const kiln_model* model, size_t index,
                                                  kiln_value_info* info) {
  return model->api->output_info(model->instance, index, info);
}

/* Runs the model: inputs in the model's input order, outputs in its output order (see
 * kiln_tensor for the two ways to receive outputs). Safe to call from many threads at once. */
static inline kiln_status* kiln_model_run(kiln_model* model, const kiln_tensor* inputs,
                                          size_t input_count, kiln_tensor* outputs,
                                          size_t output_count) {
  return model->api->run(model->instance, inputs, input_count, outputs, output_count);
}

/* Profiling: while enabled, each run records one event per kernel or library call. */
static inline kiln_status* kiln_model_set_profiling(kiln_model* model, int enabled) {
  return model->api->set_profiling(model->instance, enabled);
}

static inline size_t kiln_model_profile_events(kiln_model* model,
                                               const kiln_profile_event** events) {
  return model->api->profile_events(model->instance, events);
}

static inline void kiln_model_clear_profile(kiln_model* model) {
  model->api->clear_profile(model->instance);
}

/* The --target the library was compiled with ("auto", "x86-64-v3", ...). */
static inline const char* kiln_model_target(const kiln_model* model) { return model->api->target; }

/* The variant of the model's code this CPU runs ("x86-64-v4"), chosen at the first load. */
static inline const char* kiln_model_variant(const kiln_model* model) {
  return model->api->variant(model->instance);
}

/* ---- CUDA libraries (kiln compile --device cuda) ---- */

/* The CUDA functions of a CUDA model library; NULL for a CPU library. */
static inline const kiln_cuda_api* kiln_model_cuda_api(const kiln_model* model) {
  typedef const kiln_cuda_api* (*cuda_entry_fn)(void);
  cuda_entry_fn entry = (cuda_entry_fn)dlsym(model->handle, "kiln_model_cuda_entry");
  const kiln_cuda_api* api = entry == NULL ? NULL : entry();
  return api != NULL && api->abi_version == KILN_ABI_VERSION ? api : NULL;
}

/* "cuda" for a library compiled with --device cuda, else "cpu". */
static inline const char* kiln_model_device(const kiln_model* model) {
  return kiln_model_cuda_api(model) != NULL ? "cuda" : "cpu";
}

/* Runs a CUDA model with device or host buffers, on the caller's stream or its own (see
 * kiln_cuda_run_options; `options` NULL: host buffers, its own stream, as kiln_model_run).
 * Safe to call from many threads at once, each with its own stream or the same one. */
static inline kiln_status* kiln_model_run_cuda(kiln_model* model, const kiln_tensor* inputs,
                                               size_t input_count, kiln_tensor* outputs,
                                               size_t output_count,
                                               const kiln_cuda_run_options* options) {
  const kiln_cuda_api* api = kiln_model_cuda_api(model);
  if (api == NULL) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT,
                            "kiln_model_run_cuda: the model library was not compiled for CUDA");
  }
  return api->run(model->instance, inputs, input_count, outputs, output_count, options);
}

static inline kiln_cuda_run_options kiln_default_cuda_run_options(void) {
  kiln_cuda_run_options options;
  memset(&options, 0, sizeof(options));
  options.struct_size = (uint32_t)sizeof(kiln_cuda_run_options);
  return options;
}

/* Page-locked host memory for inputs and outputs: copies between it and the GPU run at full
 * speed and overlap the GPU's work. Release it with kiln_cuda_host_free, before kiln_model_free
 * (the model's driver context owns it). */
static inline kiln_status* kiln_cuda_host_alloc(kiln_model* model, size_t bytes, void** data) {
  const kiln_cuda_api* api = kiln_model_cuda_api(model);
  if (api == NULL) {
    return kiln_status_make(KILN_ERROR_INVALID_ARGUMENT,
                            "kiln_cuda_host_alloc: the model library was not compiled for CUDA");
  }
  return api->host_alloc(model->instance, bytes, data);
}

static inline void kiln_cuda_host_free(kiln_model* model, void* data) {
  const kiln_cuda_api* api = kiln_model_cuda_api(model);
  if (api != NULL) api->host_free(model->instance, data);
}

/* Releases an output a run allocated in device memory. */
static inline void kiln_cuda_free(kiln_model* model, void* data) {
  const kiln_cuda_api* api = kiln_model_cuda_api(model);
  if (api != NULL) api->device_free(model->instance, data);
}

/* Bytes of one element of `dtype`; 0 for an unknown code. */
static inline size_t kiln_dtype_size(int32_t dtype) {
  switch (dtype) {
    case KILN_FLOAT32:
    case KILN_INT32:
    case KILN_UINT32:
      return 4;
    case KILN_UINT8:
    case KILN_INT8:
    case KILN_BOOL:
    case KILN_FLOAT8E4M3FN:
    case KILN_FLOAT8E4M3FNUZ:
    case KILN_FLOAT8E5M2:
    case KILN_FLOAT8E5M2FNUZ:
    case KILN_UINT4:
    case KILN_INT4:
    case KILN_FLOAT4E2M1:
    case KILN_FLOAT8E8M0:
    case KILN_UINT2:
    case KILN_INT2:
      return 1;
    case KILN_UINT16:
    case KILN_INT16:
    case KILN_FLOAT16:
    case KILN_BFLOAT16:
      return 2;
    case KILN_INT64:
    case KILN_FLOAT64:
    case KILN_UINT64:
      return 8;
    default:
      return 0;
  }
}

#ifdef __cplusplus
}
#endif

#endif /* KILN_RUNTIME_H_ */
