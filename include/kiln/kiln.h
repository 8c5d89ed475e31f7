// Kiln's C++ API.
//
//   kiln::Model model = kiln::load("resnet.so");            // header-only, over kiln/runtime.h
//   std::vector<kiln::Tensor> outputs = model.run({kiln::Tensor::of<float>({1, 3, 224, 224}, x)});
//
//   kiln::Model built = kiln::compile("resnet.onnx", {.output = "resnet.so"});  // libkiln
//   kiln::BenchResult figures = kiln::bench(model, inputs);  // kiln bench's latency figures
//
// load() and Model need nothing but this header and kiln/runtime.h (find_package(kiln) target
// kiln::runtime); compile() is in the Kiln compiler library (target kiln::kiln). Errors throw
// kiln::Error with the status code and message of the C API.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/runtime.h"

namespace kiln {

class Error : public std::runtime_error {
 public:
  Error(kiln_status_code code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  kiln_status_code code() const { return code_; }

 private:
  kiln_status_code code_;
};

namespace detail {
/// Throws the status as an Error (and frees it); does nothing for success.
inline void check(kiln_status* status) {
  if (status == nullptr) return;
  Error error(kiln_status_get_code(status), kiln_status_message(status));
  kiln_status_free(status);
  throw error;
}
}  // namespace detail

/// A dense row-major tensor that owns its data (or views data the caller keeps alive).
class Tensor {
 public:
  Tensor() = default;
  /// Zero-filled storage for `shape`.
  Tensor(kiln_dtype dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    std::shared_ptr<void> data(std::calloc(std::max<size_t>(bytes(), 1), 1), std::free);
    if (!data) throw std::bad_alloc();
    data_ = std::move(data);
  }
  /// A copy of `values` with `shape`.
  template <typename T>
  static Tensor of(std::vector<int64_t> shape, const std::vector<T>& values) {
    Tensor t(dtype_of<T>(), std::move(shape));
    if (values.size() * sizeof(T) != t.bytes())
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "Tensor::of: the values do not fill the shape");
    if (!values.empty()) std::memcpy(t.data(), values.data(), t.bytes());
    return t;
  }
  /// A view of memory the caller owns and keeps alive while the tensor is used.
  static Tensor view(kiln_dtype dtype, std::vector<int64_t> shape, void* data) {
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.data_ = std::shared_ptr<void>(data, [](void*) {});
    return t;
  }
  /// Takes over storage allocated with malloc (a library-allocated output).
  static Tensor adopt(kiln_dtype dtype, std::vector<int64_t> shape, void* data) {
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.data_ = std::shared_ptr<void>(data, std::free);
    return t;
  }

  kiln_dtype dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * kiln_dtype_size(dtype_); }
  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  template <typename T>
  T* data() {
    return static_cast<T*>(data_.get());
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_.get());
  }

  template <typename T>
  static constexpr kiln_dtype dtype_of() {
    if constexpr (std::is_same_v<T, float>) return KILN_FLOAT32;
    if constexpr (std::is_same_v<T, double>) return KILN_FLOAT64;
    if constexpr (std::is_same_v<T, int64_t>) return KILN_INT64;
    if constexpr (std::is_same_v<T, int32_t>) return KILN_INT32;
    if constexpr (std::is_same_v<T, uint8_t>) return KILN_UINT8;
    if constexpr (std::is_same_v<T, int8_t>) return KILN_INT8;
    if constexpr (std::is_same_v<T, bool>) return KILN_BOOL;
    return KILN_FLOAT32;
  }

 private:
  kiln_dtype dtype_ = KILN_FLOAT32;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> data_;
};

/// An input or output of a model as compiled: dims are -1 where symbolic, named in dim_names.
struct ValueInfo {
  std::string name;
  kiln_dtype dtype = KILN_FLOAT32;  // KILN_UNDEFINED: known only after a run
  std::vector<int64_t> dims;
  std::vector<std::string> dim_names;  // "" for a fixed dim
  /// An output of an If whose branches give different ranks or dtypes: run() returns the rank,
  /// dims and dtype of the branch taken; dims and dim_names are empty.
  bool rank_known_after_run = false;
};

struct LoadOptions {
  int threads = 0;  // OpenMP threads of each run; 0: the OpenMP default
};

/// A loaded model library. Copies share the loaded model; run() may be called from many threads.
class Model {
 public:
  explicit Model(const std::string& path, const LoadOptions& options = {}) {
    kiln_options o = kiln_default_options();
    o.threads = options.threads;
    kiln_model* model = nullptr;
    detail::check(kiln_model_load(path.c_str(), &o, &model));
    model_ = std::shared_ptr<kiln_model>(model, kiln_model_free);
    path_ = path;
    for (size_t k = 0; k < kiln_model_input_count(model); ++k) {
      kiln_value_info info;
      detail::check(kiln_model_input_info(model, k, &info));
      inputs_.push_back(describe(info));
    }
    for (size_t k = 0; k < kiln_model_output_count(model); ++k) {
      kiln_value_info info;
      detail::check(kiln_model_output_info(model, k, &info));
      outputs_.push_back(describe(info));
    }
  }

  const std::vector<ValueInfo>& inputs() const { return inputs_; }
  const std::vector<ValueInfo>& outputs() const { return outputs_; }
  /// The --target it was compiled with ("auto", "x86-64-v3", ...).
  std::string target() const { return kiln_model_target(model_.get()); }
  /// The variant of its code this CPU runs ("x86-64-v4").
  std::string variant() const { return kiln_model_variant(model_.get()); }
  /// The library file the model was loaded from (for a compile without an output: in the code
  /// cache).
  const std::string& path() const { return path_; }

  /// Runs the model; the outputs are allocated by the library.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const {
    std::vector<kiln_tensor> out(outputs_.size());
    for (kiln_tensor& t : out) t = kiln_tensor{};
    call(inputs, out);
    std::vector<Tensor> results;
    for (const kiln_tensor& t : out) {
      results.push_back(Tensor::adopt(static_cast<kiln_dtype>(t.dtype),
                                      std::vector<int64_t>(t.dims, t.dims + t.rank), t.data));
    }
    return results;
  }

  /// Runs the model into outputs the caller allocated (each must hold its output's bytes).
  void run(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) const {
    if (outputs.size() != outputs_.size())
      throw Error(KILN_ERROR_INVALID_ARGUMENT, "run: wrong number of output tensors");
    std::vector<kiln_tensor> out(outputs.size());
    for (size_t k = 0; k < outputs.size(); ++k) {
      out[k] = kiln_tensor{};
      out[k].data = outputs[k].data();
      out[k].capacity = outputs[k].bytes();
    }
    call(inputs, out);
  }

  kiln_model* handle() const { return model_.get(); }

 private:
  static ValueInfo describe(const kiln_value_info& info) {
    ValueInfo v;
    v.name = info.name;
    v.dtype = static_cast<kiln_dtype>(info.dtype);
    v.rank_known_after_run = info.rank < 0;
    for (int32_t d = 0; d < info.rank; ++d) {
      v.dims.push_back(info.dims[d]);
      v.dim_names.push_back(info.dim_names[d] != nullptr ? info.dim_names[d] : "");
    }
    return v;
  }

  void call(const std::vector<Tensor>& inputs, std::vector<kiln_tensor>& out) const {
    std::vector<kiln_tensor> in(inputs.size());
    for (size_t k = 0; k < inputs.size(); ++k) {
      const Tensor& t = inputs[k];
      if (t.shape().size() > KILN_MAX_RANK)
        throw Error(KILN_ERROR_BAD_INPUT, "run: an input's rank is above KILN_MAX_RANK");
      in[k] = kiln_tensor{};
      in[k].data = const_cast<void*>(t.data());
      in[k].dtype = t.dtype();
      in[k].rank = static_cast<int32_t>(t.shape().size());
      for (size_t d = 0; d < t.shape().size(); ++d) in[k].dims[d] = t.shape()[d];
    }
    detail::check(kiln_model_run(model_.get(), in.data(), in.size(), out.data(), out.size()));
  }

  std::shared_ptr<kiln_model> model_;
  std::string path_;
  std::vector<ValueInfo> inputs_;
  std::vector<ValueInfo> outputs_;
};

/// Loads a library built by `kiln compile` or kiln::compile.
inline Model load(const std::string& path, const LoadOptions& options = {}) {
  return Model(path, options);
}

struct CompileOptions {
  /// The library to write; empty: it stays in the code cache (weights embedded).
  std::string output;
  bool external_weights = false;
  std::string target = "auto";  // or "x86-64-v3", "x86-64-v4", "native" (LibraryOptions)
  std::string cache_dir;        // empty: KILN_CACHE_DIR or ~/.cache/kiln
  std::string autotune;         // "off", "default", "max"; empty: KILN_AUTOTUNE or default
  /// Where the model runs: "cpu" or "cuda" (kernels on the GPU, matrix products on cuBLASLt,
  /// the ops of the host-fallback list on the host; `kiln run --device`).
  std::string device = "cpu";
  /// The arithmetic of matrix products on the GPU: "tf32" (inputs rounded to TF32 on the tensor
  /// cores, about 1e-3 relative error per product) or "fp32" (about 1e-6); README.md, CUDA
  /// precision.
  std::string precision = "tf32";
  /// Values fixed when compiling for symbolic input dims, by name ({"batch", 8}): the library
  /// is compiled for those sizes (and accepts no other); the model's other symbols stay dynamic.
  std::map<std::string, int64_t> dims;
  /// load.threads also sets the OpenMP threads the compile chooses algorithms for (0: the
  /// OpenMP default of the calling thread).
  LoadOptions load;
};

/// What a compile did.
struct CompileReport {
  double seconds = 0;      // wall time of the compile, import and load included
  bool cache_hit = false;  // the library came from the code cache (the C++ compiler did not run)
  int kernels = 0;         // generated kernel functions
  int library_calls = 0;   // calls of libraries (BLAS, oneDNN)
};

/// Compiles an ONNX model into a library (like `kiln compile`) and loads it. In the Kiln
/// compiler library (find_package(kiln), target kiln::kiln); throws Error for a bad model
/// (KILN_ERROR_INVALID_ARGUMENT) and fills `report` when given.
Model compile(const std::string& onnx_path, const CompileOptions& options = {},
              CompileReport* report = nullptr);

/// compile() of a serialized ONNX ModelProto held in memory; `source_name` names it in error
/// messages. Relative external-data locations are resolved against the current directory.
Model compile_bytes(std::string_view onnx_bytes, const CompileOptions& options = {},
                    CompileReport* report = nullptr, const std::string& source_name = "<bytes>");

struct BenchOptions {
  int iters = 100;     // timed runs
  int warmup = 10;     // untimed runs before them
  double wait_ms = 0;  // untimed sleep before each run (a server's gap between requests)
};

/// Latency of Model::run as `kiln bench` reports it: nearest-rank percentiles of the timed runs
/// (each covering one run, the outputs' allocation included, the previous outputs released
/// before it) and runs per second from the mean.
struct BenchResult {
  int iters = 0;
  int warmup = 0;
  double min_ms = 0, p50_ms = 0, p90_ms = 0, p99_ms = 0, mean_ms = 0;
  double throughput_per_s = 0;
};

/// The figures of timed runs of `ms` milliseconds each (not empty): what bench() and `kiln bench`
/// report.
inline BenchResult bench_figures(std::vector<double> ms, int warmup) {
  std::sort(ms.begin(), ms.end());
  auto percentile = [&](double p) {
    size_t rank = static_cast<size_t>(std::ceil(p / 100 * static_cast<double>(ms.size())));
    return ms[std::clamp<size_t>(rank, 1, ms.size()) - 1];
  };
  double sum = 0;
  for (double t : ms) sum += t;
  BenchResult r;
  r.iters = static_cast<int>(ms.size());
  r.warmup = warmup;
  r.min_ms = ms.front();
  r.p50_ms = percentile(50);
  r.p90_ms = percentile(90);
  r.p99_ms = percentile(99);
  r.mean_ms = sum / static_cast<double>(ms.size());
  r.throughput_per_s = 1000.0 / r.mean_ms;
  return r;
}

/// Milliseconds of `iters` timed calls of `run` after `warmup` untimed ones; `run` returns the
/// run's outputs, which are released before the next call starts its clock. The timing loop of
/// bench() and `kiln bench`. With `wait_ms` > 0 the caller sleeps that long (untimed) before each
/// call, as a server waits between requests, so the runtime's threads go idle between runs.
template <typename Run>
std::vector<double> time_runs(int warmup, int iters, Run&& run, double wait_ms = 0) {
  decltype(run()) outputs;
  auto timed_run = [&] {
    outputs = {};
    if (wait_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(wait_ms));
    auto start = std::chrono::steady_clock::now();
    outputs = run();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  for (int i = 0; i < warmup; ++i) timed_run();
  std::vector<double> ms(static_cast<size_t>(iters));
  for (double& t : ms) t = timed_run();
  return ms;
}

/// Times `model` on `inputs` (warm-up runs, then timed ones); throws Error for bad inputs or
/// options.
inline BenchResult bench(const Model& model, const std::vector<Tensor>& inputs,
                         const BenchOptions& options = {}) {
  if (options.iters < 1 || options.warmup < 0 || !(options.wait_ms >= 0))
    throw Error(KILN_ERROR_INVALID_ARGUMENT,
                "bench: iters must be at least 1, warmup and wait_ms at least 0");
  std::vector<double> ms = time_runs(
      options.warmup, options.iters, [&] { return model.run(inputs); }, options.wait_ms);
  return bench_figures(std::move(ms), options.warmup);
}

}  // namespace kiln
