// kiln._kiln: the C++ half of the `kiln` Python package (python/kiln/), over the public C++ API
// of include/kiln/kiln.h. It compiles and loads models and runs them on numpy arrays; the Python
// half turns feeds into arrays of the right dtype, checks names, and builds the API users see
// (kiln.Model, kiln.InferenceSession).
//
// Inputs are read where they lie (the Python half hands over C-contiguous native-order arrays),
// outputs are allocated by the model library and given to numpy with a capsule that frees them,
// so each output array alone owns its memory. The GIL is released while Kiln compiles, loads and
// runs; a loaded model serves concurrent runs (include/kiln/runtime.h). Kiln's errors become the
// exceptions of kiln._errors (KilnError, and KilnUserError, also a ValueError, for user errors).
#include <omp.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/kiln.h"

namespace py = pybind11;

namespace {

/// Whether the status code is the caller's to fix (a ValueError in Python).
bool is_user_error(kiln_status_code code) {
  switch (code) {
    case KILN_ERROR_INVALID_ARGUMENT:
    case KILN_ERROR_BAD_INPUT:
    case KILN_ERROR_LOAD:
    case KILN_ERROR_ABI:
    case KILN_ERROR_UNSUPPORTED_CPU:
    case KILN_ERROR_DEVICE:
      return true;
    case KILN_OK:
    case KILN_ERROR_OUT_OF_MEMORY:
    case KILN_ERROR_INTERNAL:
      return false;
  }
  return false;
}

/// Raises kiln.KilnUserError or kiln.KilnError with Kiln's message and status code.
void raise_kiln_error(const kiln::Error& error) {
  py::module_ errors = py::module_::import("kiln._errors");
  py::object type = errors.attr(is_user_error(error.code()) ? "KilnUserError" : "KilnError");
  py::object instance = type(error.what(), static_cast<int>(error.code()));
  PyErr_SetObject(type.ptr(), instance.ptr());
}

/// The Kiln dtype of a numpy array's elements (native byte order), or nullopt when Kiln has none.
std::optional<kiln_dtype> kiln_dtype_of(const py::dtype& dtype) {
  const char kind = dtype.kind();
  const py::ssize_t size = dtype.itemsize();
  if (kind == 'b' && size == 1) return KILN_BOOL;
  if (kind == 'f') {
    if (size == 2) return KILN_FLOAT16;
    if (size == 4) return KILN_FLOAT32;
    if (size == 8) return KILN_FLOAT64;
  }
  if (kind == 'i') {
    if (size == 1) return KILN_INT8;
    if (size == 2) return KILN_INT16;
    if (size == 4) return KILN_INT32;
    if (size == 8) return KILN_INT64;
  }
  if (kind == 'u') {
    if (size == 1) return KILN_UINT8;
    if (size == 2) return KILN_UINT16;
    if (size == 4) return KILN_UINT32;
    if (size == 8) return KILN_UINT64;
  }
  return std::nullopt;
}

/// The numpy dtype name of a Kiln dtype; empty for bfloat16 and the float8, float4, 4- and 2-bit
/// types, which numpy lacks.
std::string numpy_dtype_name(int32_t dtype) {
  switch (dtype) {
    case KILN_FLOAT32:
      return "float32";
    case KILN_UINT8:
      return "uint8";
    case KILN_INT8:
      return "int8";
    case KILN_UINT16:
      return "uint16";
    case KILN_INT16:
      return "int16";
    case KILN_INT32:
      return "int32";
    case KILN_INT64:
      return "int64";
    case KILN_BOOL:
      return "bool";
    case KILN_FLOAT16:
      return "float16";
    case KILN_FLOAT64:
      return "float64";
    case KILN_UINT32:
      return "uint32";
    case KILN_UINT64:
      return "uint64";
    default:
      return "";
  }
}

/// An input or output as the Python half describes it: (name, dtype code, dims with -1 where
/// symbolic, dim names with "" where fixed).
py::tuple describe(const kiln::ValueInfo& info) {
  return py::make_tuple(info.name, static_cast<int>(info.dtype), info.dims, info.dim_names);
}

/// Views of the arrays as Kiln tensors; the arrays must be C-contiguous and of a Kiln dtype (the
/// Python half sees to it; checked here too) and outlive the views.
std::vector<kiln::Tensor> tensor_views(const std::vector<py::array>& arrays,
                                       const std::vector<kiln::ValueInfo>& infos) {
  std::vector<kiln::Tensor> views;
  for (size_t k = 0; k < arrays.size(); ++k) {
    const py::array& array = arrays[k];
    const std::string name = k < infos.size() ? infos[k].name : std::to_string(k);
    if ((array.flags() & py::array::c_style) == 0)
      throw kiln::Error(KILN_ERROR_BAD_INPUT, "input '" + name + "': not C-contiguous");
    std::optional<kiln_dtype> dtype = kiln_dtype_of(array.dtype());
    if (!dtype || !array.dtype().attr("isnative").cast<bool>()) {
      throw kiln::Error(KILN_ERROR_BAD_INPUT, "input '" + name + "': numpy dtype " +
                                                  py::str(array.dtype()).cast<std::string>() +
                                                  " is not one Kiln supports");
    }
    std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
    views.push_back(kiln::Tensor::view(*dtype, std::move(shape), const_cast<void*>(array.data())));
  }
  return views;
}

/// Gives an output the library allocated to numpy: the array owns it through a capsule that
/// frees it with the array.
py::array adopt_output(kiln::Tensor& tensor) {
  const std::string dtype_name = numpy_dtype_name(tensor.dtype());
  py::dtype dtype(dtype_name);
  std::vector<py::ssize_t> shape(tensor.shape().begin(), tensor.shape().end());
  // The Tensor shares ownership of the malloc'ed data; the capsule keeps a copy of that share.
  auto* owner = new kiln::Tensor(tensor);
  py::capsule base(owner, [](void* p) { delete static_cast<kiln::Tensor*>(p); });
  if (tensor.numel() == 0) return py::array(dtype, shape);
  return py::array(dtype, shape, {}, owner->data(), base);
}

/// A compiled or loaded model, with how long compiling (or loading) it took.
class PyModel {
 public:
  PyModel(kiln::Model model, kiln::CompileReport report, int threads)
      : model_(std::move(model)), report_(report), threads_(threads) {}

  py::list inputs() const { return describe_all(model_.inputs()); }
  py::list outputs() const { return describe_all(model_.outputs()); }
  const std::string& path() const { return model_.path(); }
  std::string target() const { return model_.target(); }
  std::string variant() const { return model_.variant(); }
  py::dict report() const {
    py::dict d;
    d["seconds"] = report_.seconds;
    d["cache_hit"] = report_.cache_hit;
    d["kernels"] = report_.kernels;
    d["library_calls"] = report_.library_calls;
    return d;
  }

  /// Runs on arrays in the model's input order; returns the outputs in its output order.
  py::list run(const std::vector<py::array>& arrays) const {
    std::vector<kiln::Tensor> inputs = tensor_views(arrays, model_.inputs());
    std::vector<kiln::Tensor> outputs;
    {
      py::gil_scoped_release release;
      outputs = model_.run(inputs);
    }
    for (const kiln::Tensor& t : outputs) {
      if (numpy_dtype_name(t.dtype()).empty())
        throw kiln::Error(KILN_ERROR_BAD_INPUT,
                          "an output is bfloat16, float8, float4 or a 4- or 2-bit integer, "
                          "which numpy has no dtype for");
    }
    py::list result;
    for (kiln::Tensor& t : outputs) result.append(adopt_output(t));
    return result;
  }

  /// kiln::bench on arrays in input order; the figures `kiln bench --json` prints.
  py::dict bench(const std::vector<py::array>& arrays, int iters, int warmup,
                 double wait_ms) const {
    std::vector<kiln::Tensor> inputs = tensor_views(arrays, model_.inputs());
    kiln::BenchResult r;
    {
      py::gil_scoped_release release;
      r = kiln::bench(model_, inputs, {.iters = iters, .warmup = warmup, .wait_ms = wait_ms});
    }
    py::dict d;
    d["threads"] = threads_ > 0 ? threads_ : omp_get_max_threads();
    d["iters"] = r.iters;
    d["warmup"] = r.warmup;
    d["wait_ms"] = wait_ms;
    d["compile_s"] = report_.seconds;
    d["cache_hit"] = report_.cache_hit;
    d["min_ms"] = r.min_ms;
    d["p50_ms"] = r.p50_ms;
    d["p90_ms"] = r.p90_ms;
    d["p99_ms"] = r.p99_ms;
    d["mean_ms"] = r.mean_ms;
    d["throughput_per_s"] = r.throughput_per_s;
    if (!inputs.empty() && !inputs[0].shape().empty()) {
      const int64_t batch = inputs[0].shape()[0];
      d["batch"] = batch;
      d["samples_per_s"] = r.throughput_per_s * static_cast<double>(batch);
    }
    return d;
  }

 private:
  static py::list describe_all(const std::vector<kiln::ValueInfo>& infos) {
    py::list list;
    for (const kiln::ValueInfo& info : infos) list.append(describe(info));
    return list;
  }

  kiln::Model model_;
  kiln::CompileReport report_;
  int threads_;
};

kiln::CompileOptions compile_options(const std::string& autotune, int threads,
                                     const std::string& cache_dir,
                                     const std::map<std::string, int64_t>& dims) {
  kiln::CompileOptions options;
  options.autotune = autotune;
  options.cache_dir = cache_dir;
  options.dims = dims;
  options.load.threads = threads;
  return options;
}

PyModel compile_path(const std::string& path, const std::string& autotune, int threads,
                     const std::string& cache_dir, const std::map<std::string, int64_t>& dims) {
  kiln::CompileOptions options = compile_options(autotune, threads, cache_dir, dims);
  kiln::CompileReport report;
  py::gil_scoped_release release;
  kiln::Model model = kiln::compile(path, options, &report);
  return PyModel(std::move(model), report, threads);
}

PyModel compile_bytes(const py::bytes& bytes, const std::string& autotune, int threads,
                      const std::string& cache_dir, const std::map<std::string, int64_t>& dims) {
  kiln::CompileOptions options = compile_options(autotune, threads, cache_dir, dims);
  kiln::CompileReport report;
  // The bytes object is immutable and held by the caller while the GIL is released.
  char* data = nullptr;
  py::ssize_t size = 0;
  if (PyBytes_AsStringAndSize(bytes.ptr(), &data, &size) != 0) throw py::error_already_set();
  py::gil_scoped_release release;
  kiln::Model model = kiln::compile_bytes(std::string_view(data, static_cast<size_t>(size)),
                                          options, &report, "<model bytes>");
  return PyModel(std::move(model), report, threads);
}

PyModel load(const std::string& path, int threads) {
  py::gil_scoped_release release;
  const auto start = std::chrono::steady_clock::now();
  kiln::Model model = kiln::load(path, {.threads = threads});
  kiln::CompileReport report;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.cache_hit = false;
  return PyModel(std::move(model), report, threads);
}

}  // namespace

PYBIND11_MODULE(_kiln, m) {
  m.doc() = "Kiln's compiler and runtime for Python (the C++ half of the kiln package)";
  m.attr("version") = KILN_VERSION;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kiln::Error& e) {
      raise_kiln_error(e);
    }
  });

  py::class_<PyModel>(m, "Model")
      .def_property_readonly("inputs", &PyModel::inputs)
      .def_property_readonly("outputs", &PyModel::outputs)
      .def_property_readonly("path", &PyModel::path)
      .def_property_readonly("target", &PyModel::target)
      .def_property_readonly("variant", &PyModel::variant)
      .def_property_readonly("report", &PyModel::report)
      .def("run", &PyModel::run, py::arg("inputs"))
      .def("bench", &PyModel::bench, py::arg("inputs"), py::arg("iters"), py::arg("warmup"),
           py::arg("wait_ms"));

  m.def("compile_path", &compile_path, py::arg("path"), py::arg("autotune"), py::arg("threads"),
        py::arg("cache_dir"), py::arg("dims"));
  m.def("compile_bytes", &compile_bytes, py::arg("data"), py::arg("autotune"), py::arg("threads"),
        py::arg("cache_dir"), py::arg("dims"));
  m.def("load", &load, py::arg("path"), py::arg("threads"));
  m.def("dtype_name", &numpy_dtype_name, py::arg("code"));
}
