// Checks a model library built by `kiln compile --device cuda` on a machine with an NVIDIA GPU,
// through include/kiln/runtime.h alone (as a user's program would; the driver API for device
// memory and streams is loaded with dlopen like the library does):
//   kiln_cuda_library_check MODEL.so OUT_DIR [NAME=FILE.npy ...] [--threads N] [--runs N]
// 1. one run with host buffers (kiln_model_run): the reference; its inputs (FILE.npy where given,
//    else seeded random values: float32 uniform in [-1, 1], integers and bools 0) and outputs go
//    to OUT_DIR/inputs and OUT_DIR/outputs as .npy, and OUT_DIR/inputs.txt lists NAME=FILE for
//    `kiln run --input` (scripts/device_cudalib_check.sh compares that with `kiln run --device
//    cuda`);
// 2. kiln_model_run_cuda with device inputs and outputs on a stream of the caller's, then with
//    pinned host buffers (kiln_cuda_host_alloc) on that stream: outputs bit-identical to 1;
// 3. N threads (default 8) x N runs (default 100) on the one loaded model, each thread with its
//    own stream and pinned buffers, alternating with plain kiln_model_run calls: every output
//    bit-identical to 1; the device memory they added is printed next to what the first run
//    took (the weights are one copy for all run states, so the threads add arenas alone);
// 4. latency: the median of 50 runs, host buffers and pinned buffers on the caller's stream;
// 5. the side stream of forks against KILN_CUDA_STREAMS=1 (a second load of the library), as a
//    ratio of the pinned runs' medians.
// Prints what it checked; exits 0 when everything holds, 1 otherwise, 77 without a CUDA device.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/runtime.h"

namespace {

// The CUDA driver API used here (cuda.h's values).
struct Cuda {
  int (*Init)(unsigned);
  int (*DeviceGet)(int*, int);
  int (*PrimaryCtxRetain)(void**, int);
  int (*CtxSetCurrent)(void*);
  int (*MemAlloc)(unsigned long long*, size_t);
  int (*MemFree)(unsigned long long);
  int (*MemcpyHtoD)(unsigned long long, const void*, size_t);
  int (*MemcpyDtoH)(void*, unsigned long long, size_t);
  int (*StreamCreate)(void**, unsigned);
  int (*StreamDestroy)(void*);
  int (*StreamSynchronize)(void*);
  int (*MemGetInfo)(size_t*, size_t*);
  void* context = nullptr;
};

bool load_cuda(Cuda& c) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  auto get = [&](auto& f, const char* name) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
    return f != nullptr;
  };
  if (!get(c.Init, "cuInit") || !get(c.DeviceGet, "cuDeviceGet") ||
      !get(c.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain") ||
      !get(c.CtxSetCurrent, "cuCtxSetCurrent") || !get(c.MemAlloc, "cuMemAlloc_v2") ||
      !get(c.MemFree, "cuMemFree_v2") || !get(c.MemcpyHtoD, "cuMemcpyHtoD_v2") ||
      !get(c.MemcpyDtoH, "cuMemcpyDtoH_v2") || !get(c.StreamCreate, "cuStreamCreate") ||
      !get(c.StreamDestroy, "cuStreamDestroy_v2") ||
      !get(c.StreamSynchronize, "cuStreamSynchronize") || !get(c.MemGetInfo, "cuMemGetInfo_v2")) {
    return false;
  }
  int device = 0;
  if (c.Init(0) != 0 || c.DeviceGet(&device, 0) != 0 ||
      c.PrimaryCtxRetain(&c.context, device) != 0) {
    return false;
  }
  return c.CtxSetCurrent(c.context) == 0;
}

bool ok(kiln_status* status, const char* what) {
  if (status == nullptr) return true;
  std::printf("FAILED: %s: %s\n", what, kiln_status_message(status));
  kiln_status_free(status);
  return false;
}

size_t numel(const kiln_tensor& t) {
  size_t n = 1;
  for (int k = 0; k < t.rank; ++k) n *= static_cast<size_t>(t.dims[k]);
  return n;
}

size_t bytes_of(const kiln_tensor& t) { return numel(t) * kiln_dtype_size(t.dtype); }

const char* npy_type(int32_t dtype) {
  switch (dtype) {
    case KILN_FLOAT32:
      return "<f4";
    case KILN_FLOAT64:
      return "<f8";
    case KILN_INT64:
      return "<i8";
    case KILN_INT32:
      return "<i4";
    case KILN_BOOL:
      return "|b1";
    case KILN_UINT8:
      return "|u1";
    case KILN_INT8:
      return "|i1";
    default:
      return nullptr;
  }
}

/// Writes `t` (host data) as a version-1 .npy file.
bool write_npy(const std::string& path, const kiln_tensor& t) {
  const char* type = npy_type(t.dtype);
  if (type == nullptr) return false;
  std::string shape = "(";
  for (int k = 0; k < t.rank; ++k)
    shape += std::to_string(t.dims[k]) + (t.rank == 1 ? "," : (k + 1 < t.rank ? ", " : ""));
  shape += ")";
  std::string header =
      std::string("{'descr': '") + type + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&length), 2);
  out << header;
  out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(bytes_of(t)));
  return static_cast<bool>(out);
}

/// Reads a little-endian, C-order .npy file into `data`, setting dtype and dims of `t`.
bool read_npy(const std::string& path, kiln_tensor& t, std::vector<char>& data) {
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  uint16_t length = 0;
  if (!in.read(magic, 8) || !in.read(reinterpret_cast<char*>(&length), 2)) return false;
  std::string header(length, '\0');
  in.read(header.data(), length);
  const size_t descr = header.find("'descr': '");
  if (descr == std::string::npos) return false;
  const std::string type = header.substr(descr + 10, 3);
  t.dtype = type == "<f4"   ? KILN_FLOAT32
            : type == "<i8" ? KILN_INT64
            : type == "<i4" ? KILN_INT32
            : type == "<f8" ? KILN_FLOAT64
            : type == "|b1" ? KILN_BOOL
                            : 0;
  if (t.dtype == 0 || header.find("'fortran_order': False") == std::string::npos) return false;
  const size_t open = header.find('(', header.find("'shape'"));
  const size_t close = header.find(')', open);
  std::stringstream dims(header.substr(open + 1, close - open - 1));
  t.rank = 0;
  for (std::string item; std::getline(dims, item, ',');) {
    if (item.find_first_not_of(' ') == std::string::npos) continue;
    t.dims[t.rank++] = std::stoll(item);
  }
  data.assign(bytes_of(t), '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  t.data = data.data();
  return static_cast<bool>(in);
}

/// Byte-identical outputs?
bool same(const std::vector<kiln_tensor>& got, const std::vector<std::vector<char>>& want) {
  for (size_t k = 0; k < got.size(); ++k) {
    if (bytes_of(got[k]) != want[k].size() ||
        std::memcmp(got[k].data, want[k].data(), want[k].size()) != 0)
      return false;
  }
  return true;
}

struct Model {
  kiln_model* model = nullptr;
  std::vector<kiln_tensor> inputs;
  std::vector<std::vector<char>> input_data;
  std::vector<kiln_tensor> output_shapes;  // of the reference run
  std::vector<std::vector<char>> reference;
};

/// One run with device inputs and outputs (library-allocated) on `stream`: copies the inputs to
/// the GPU, runs, copies the outputs back into `host`.
bool run_device(Cuda& cuda, Model& m, void* stream, std::vector<std::vector<char>>& host) {
  std::vector<kiln_tensor> in = m.inputs;
  std::vector<unsigned long long> buffers;
  bool good = true;
  for (kiln_tensor& t : in) {
    unsigned long long p = 0;
    if (cuda.MemAlloc(&p, bytes_of(t) + 1) != 0) return false;
    cuda.MemcpyHtoD(p, t.data, bytes_of(t));
    buffers.push_back(p);
    t.data = reinterpret_cast<void*>(p);
  }
  std::vector<kiln_tensor> out(m.output_shapes.size());
  kiln_cuda_run_options options = kiln_default_cuda_run_options();
  options.stream = stream;
  options.inputs_on_device = 1;
  options.outputs_on_device = 1;
  good = ok(kiln_model_run_cuda(m.model, in.data(), in.size(), out.data(), out.size(), &options),
            "kiln_model_run_cuda (device buffers)");
  cuda.StreamSynchronize(stream);
  host.assign(out.size(), {});
  for (size_t k = 0; good && k < out.size(); ++k) {
    host[k].assign(bytes_of(out[k]), '\0');
    cuda.MemcpyDtoH(host[k].data(), reinterpret_cast<unsigned long long>(out[k].data),
                    host[k].size());
    kiln_cuda_free(m.model, out[k].data);
  }
  for (unsigned long long p : buffers) cuda.MemFree(p);
  return good;
}

/// Pinned host inputs and outputs (kiln_cuda_host_alloc) for `m`.
struct Pinned {
  kiln_model* model = nullptr;
  std::vector<kiln_tensor> in, out;
  std::vector<void*> blocks;
  bool make(Model& m) {
    model = m.model;
    in = m.inputs;
    for (kiln_tensor& t : in) {
      void* p = nullptr;
      if (!ok(kiln_cuda_host_alloc(model, bytes_of(t) + 1, &p), "kiln_cuda_host_alloc"))
        return false;
      std::memcpy(p, t.data, bytes_of(t));
      blocks.push_back(p);
      t.data = p;
    }
    out = m.output_shapes;
    for (kiln_tensor& t : out) {
      void* p = nullptr;
      if (!ok(kiln_cuda_host_alloc(model, bytes_of(t) + 1, &p), "kiln_cuda_host_alloc"))
        return false;
      blocks.push_back(p);
      t.data = p;
      t.capacity = bytes_of(t) + 1;
    }
    return true;
  }
  ~Pinned() {
    for (void* p : blocks) kiln_cuda_host_free(model, p);
  }
  bool run(void* stream) {
    kiln_cuda_run_options options = kiln_default_cuda_run_options();
    options.stream = stream;
    return ok(kiln_model_run_cuda(model, in.data(), in.size(), out.data(), out.size(), &options),
              "kiln_model_run_cuda (pinned host buffers)");
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s MODEL.so OUT_DIR [NAME=FILE.npy ...] [--threads N] [--runs N]\n",
                 argv[0]);
    return 2;
  }
  const std::string library = argv[1], out_dir = argv[2];
  int threads = 8, runs = 100;
  std::vector<std::pair<std::string, std::string>> given;
  for (int k = 3; k < argc; ++k) {
    const std::string a = argv[k];
    if (a == "--threads" && k + 1 < argc) {
      threads = std::atoi(argv[++k]);
    } else if (a == "--runs" && k + 1 < argc) {
      runs = std::atoi(argv[++k]);
    } else if (a.find('=') != std::string::npos) {
      given.emplace_back(a.substr(0, a.find('=')), a.substr(a.find('=') + 1));
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes, whatever follows
  Cuda cuda{};
  if (!load_cuda(cuda)) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  auto used_mib = [&] {
    size_t free = 0, total = 0;
    cuda.MemGetInfo(&free, &total);
    return static_cast<double>(total - free) / (1 << 20);
  };
  const double used_before = used_mib();
  Model m;
  if (!ok(kiln_model_load(library.c_str(), nullptr, &m.model), "kiln_model_load")) return 1;
  std::printf("%s: device %s, variant %s\n", library.c_str(), kiln_model_device(m.model),
              kiln_model_variant(m.model));
  std::system(("mkdir -p '" + out_dir + "/inputs' '" + out_dir + "/outputs'").c_str());
  std::ofstream list(out_dir + "/inputs.txt");
  const size_t n_in = kiln_model_input_count(m.model), n_out = kiln_model_output_count(m.model);
  m.inputs.resize(n_in);
  m.input_data.resize(n_in);
  uint64_t seed = 12345;
  for (size_t k = 0; k < n_in; ++k) {
    kiln_value_info info;
    ok(kiln_model_input_info(m.model, k, &info), "input_info");
    kiln_tensor& t = m.inputs[k];
    bool read = false;
    for (const auto& [name, file] : given) {
      if (name != info.name) continue;
      if (!read_npy(file, t, m.input_data[k])) {
        std::printf("FAILED: cannot read %s\n", file.c_str());
        return 1;
      }
      read = true;
    }
    if (!read) {
      t.dtype = info.dtype;
      t.rank = info.rank;
      for (int d = 0; d < info.rank; ++d) t.dims[d] = info.dims[d] < 0 ? 1 : info.dims[d];
      m.input_data[k].assign(bytes_of(t) + 1, '\0');
      t.data = m.input_data[k].data();
      if (t.dtype == KILN_FLOAT32) {
        float* f = static_cast<float*>(t.data);
        for (size_t i = 0; i < numel(t); ++i) {
          seed = seed * 6364136223846793005ull + 1442695040888963407ull;
          f[i] = static_cast<float>((seed >> 40) & 0xffffff) / 8388608.0f - 1.0f;
        }
      }
    }
    const std::string path = out_dir + "/inputs/in" + std::to_string(k) + ".npy";
    write_npy(path, t);
    list << info.name << "=" << path << "\n";
  }
  list.close();

  // 1. The reference: host buffers, the library's own stream.
  std::vector<kiln_tensor> out(n_out);
  if (!ok(kiln_model_run(m.model, m.inputs.data(), n_in, out.data(), n_out), "kiln_model_run"))
    return 1;
  for (size_t k = 0; k < n_out; ++k) {
    kiln_value_info info;
    ok(kiln_model_output_info(m.model, k, &info), "output_info");
    m.reference.emplace_back(static_cast<char*>(out[k].data),
                             static_cast<char*>(out[k].data) + bytes_of(out[k]));
    write_npy(out_dir + "/outputs/" + info.name + ".npy", out[k]);
    m.output_shapes.push_back(out[k]);
    m.output_shapes.back().data = nullptr;
    kiln_free(out[k].data);
  }
  std::printf("host buffers (kiln_model_run): %zu outputs written\n", n_out);

  // 2. Device buffers and pinned host buffers on a stream of the caller's.
  int failures = 0;
  void* stream = nullptr;
  cuda.StreamCreate(&stream, 1);
  std::vector<std::vector<char>> got;
  bool device_same = run_device(cuda, m, stream, got) && got == m.reference;
  std::printf("device buffers on the caller's stream: %s\n",
              device_same ? "identical to the host run" : "DIFFER");
  failures += !device_same;
  {
    Pinned pinned;
    bool pinned_same = pinned.make(m) && pinned.run(stream);
    cuda.StreamSynchronize(stream);
    pinned_same = pinned_same && same(pinned.out, m.reference);
    std::printf("pinned host buffers on the caller's stream: %s\n",
                pinned_same ? "identical to the host run" : "DIFFER");
    failures += !pinned_same;
  }
  cuda.StreamDestroy(stream);

  const double used_first = used_mib();

  // 3. Threads, each with its own stream, alternating queued runs with plain ones.
  std::atomic<int> differ{0}, failed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      cuda.CtxSetCurrent(cuda.context);
      void* s = nullptr;
      cuda.StreamCreate(&s, 1);
      Pinned pinned;
      if (!pinned.make(m)) {
        failed += runs;
        return;
      }
      for (int r = 0; r < runs; ++r) {
        if (r % 2 == 0) {
          std::fill(pinned.out.begin(), pinned.out.end(), kiln_tensor{});
          for (size_t k = 0; k < pinned.out.size(); ++k) {
            pinned.out[k] = m.output_shapes[k];
            pinned.out[k].data = pinned.blocks[pinned.in.size() + k];
            pinned.out[k].capacity = bytes_of(m.output_shapes[k]) + 1;
            std::memset(pinned.out[k].data, 0xff, bytes_of(m.output_shapes[k]));  // poisoned
          }
          if (!pinned.run(s)) {
            ++failed;
            continue;
          }
          cuda.StreamSynchronize(s);
          if (!same(pinned.out, m.reference)) ++differ;
        } else {
          std::vector<kiln_tensor> o(n_out);
          if (!ok(kiln_model_run(m.model, m.inputs.data(), n_in, o.data(), n_out), "run")) {
            ++failed;
            continue;
          }
          if (!same(o, m.reference)) ++differ;
          for (kiln_tensor& x : o) kiln_free(x.data);
        }
      }
      cuda.StreamDestroy(s);
    });
  }
  for (std::thread& t : pool) t.join();
  std::printf(
      "%d threads x %d runs (each thread its own stream; queued pinned runs alternating "
      "with kiln_model_run): %d failed, %d differ from the single-threaded run\n",
      threads, runs, failed.load(), differ.load());
  failures += failed.load() + differ.load();
  std::printf(
      "device memory: the first runs took %.1f MiB (weights, a run state's arena, library "
      "handles); the %d threads' run states added %.1f MiB\n",
      used_first - used_before, threads, used_mib() - used_first);

  // 4. Latency, the median of 50 runs after 5: kiln_model_run (host buffers in and out), and
  // queued on the caller's stream with pinned buffers (waited for after each).
  auto median_ms = [&](auto&& one) {
    for (int r = 0; r < 5; ++r) one();
    std::vector<double> ms;
    for (int r = 0; r < 50; ++r) {
      const auto start = std::chrono::steady_clock::now();
      one();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const double plain = median_ms([&] {
    std::vector<kiln_tensor> o(n_out);
    if (ok(kiln_model_run(m.model, m.inputs.data(), n_in, o.data(), n_out), "run")) {
      for (kiln_tensor& x : o) kiln_free(x.data);
    }
  });
  void* timing_stream = nullptr;
  cuda.StreamCreate(&timing_stream, 1);
  double queued = -1;
  {
    // Its pinned blocks go back through the model, so before kiln_model_free below.
    Pinned timed;
    if (timed.make(m)) {
      queued = median_ms([&] {
        timed.run(timing_stream);
        cuda.StreamSynchronize(timing_stream);
      });
    }
  }
  cuda.StreamDestroy(timing_stream);
  const char* graphs = std::getenv("KILN_CUDA_GRAPHS");
  std::printf(
      "median of 50 runs (CUDA graphs %s): kiln_model_run %.3f ms, pinned buffers on the "
      "caller's stream %.3f ms\n",
      graphs != nullptr && std::strcmp(graphs, "0") == 0 ? "off" : "on", plain, queued);

  // 5. The side stream of forks (a residual block's downsample branch beside its main branch,
  // codegen/wrapper/stream_plan.h) against one stream: a second load of the library whose runs
  // all see KILN_CUDA_STREAMS=1 (its graphs are captured without forks), both timed as the
  // pinned runs above in 3 alternating rounds; the best median of each.
  {
    Model single;
    if (ok(kiln_model_load(library.c_str(), nullptr, &single.model), "kiln_model_load")) {
      single.inputs = m.inputs;
      single.output_shapes = m.output_shapes;
      void* stream = nullptr;
      cuda.StreamCreate(&stream, 1);
      {
        Pinned forked, one;
        if (forked.make(m) && one.make(single)) {
          double with_side = 1e30, one_stream = 1e30;
          for (int round = 0; round < 3; ++round) {
            unsetenv("KILN_CUDA_STREAMS");
            with_side = std::min(with_side, median_ms([&] {
                                   forked.run(stream);
                                   cuda.StreamSynchronize(stream);
                                 }));
            setenv("KILN_CUDA_STREAMS", "1", 1);
            one_stream = std::min(one_stream, median_ms([&] {
                                    one.run(stream);
                                    cuda.StreamSynchronize(stream);
                                  }));
          }
          unsetenv("KILN_CUDA_STREAMS");
          std::printf(
              "side stream (CUDA graphs %s), pinned buffers on the caller's stream: %.3f ms with "
              "forks, %.3f ms with KILN_CUDA_STREAMS=1: ratio %.3f\n",
              graphs != nullptr && std::strcmp(graphs, "0") == 0 ? "off" : "on", with_side,
              one_stream, with_side / one_stream);
        }
      }
      cuda.StreamDestroy(stream);
      kiln_model_free(single.model);
    }
  }
  kiln_model_free(m.model);
  std::printf("%s\n", failures == 0 ? "all checks passed" : "CHECKS FAILED");
  return failures == 0 ? 0 : 1;
}
