// kiln::compile and kiln::compile_bytes of include/kiln/kiln.h: `kiln compile` as functions of
// libkiln.so. The library is built as `kiln compile` builds it (driver::compile_library) and
// loaded through the C API like any other, so a model compiled here behaves exactly as one
// shipped to a user. Kiln's exceptions become kiln::Error, the only exception type the public
// API throws.
#include <fmt/format.h>
#include <omp.h>
#include <onnx/onnx_pb.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "autotune/select.h"
#include "driver/compile.h"
#include "kiln/kiln.h"
#include "onnx/importer.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

driver::LibraryOptions library_options(const CompileOptions& options) {
  driver::LibraryOptions library;
  library.output = options.output;
  library.external_weights = options.external_weights;
  library.target = options.target;
  library.compile.cache_dir = options.cache_dir;
  if (!options.autotune.empty())
    library.compile.autotune = autotune::parse_autotune_mode(options.autotune, "autotune");
  const std::optional<ir::Device> device = ir::device_from_name(options.device);
  if (!device) user_error("device '{}': expected cpu or cuda", options.device);
  library.compile.device = *device;
  const std::optional<ir::Precision> precision = ir::precision_from_name(options.precision);
  if (!precision)
    user_error("precision '{}': expected fp32, tf32, fp16 or bf16", options.precision);
  library.compile.precision = *precision;
  return library;
}

/// Rewrites the serialized model so that each symbolic dim named in `dims` is that number in the
/// graph's inputs, outputs and value infos (ONNX shape inference then carries it through the
/// graph). Every name must be a symbolic dim of an input. Bytes that do not parse are returned
/// unchanged: the importer reports why.
std::string fix_dims(std::string_view bytes, const std::map<std::string, int64_t>& dims,
                     const std::string& source) {
  ::onnx::ModelProto proto;
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return std::string(bytes);
  for (const auto& [name, value] : dims) {
    if (value < 0)
      user_error("{}: dims: '{}' = {} is negative, expected a size", source, name, value);
  }
  std::set<std::string> input_symbols;
  auto fix = [&](::onnx::ValueInfoProto& info, bool is_input) {
    if (!info.type().has_tensor_type() || !info.type().tensor_type().has_shape()) return;
    for (auto& dim : *info.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
      if (!dim.has_dim_param()) continue;
      if (is_input) input_symbols.insert(dim.dim_param());
      auto it = dims.find(dim.dim_param());
      if (it != dims.end()) dim.set_dim_value(it->second);
    }
  };
  ::onnx::GraphProto& graph = *proto.mutable_graph();
  for (auto& info : *graph.mutable_input()) fix(info, true);
  for (auto& info : *graph.mutable_output()) fix(info, false);
  for (auto& info : *graph.mutable_value_info()) fix(info, false);
  for (const auto& [name, value] : dims) {
    if (input_symbols.count(name) != 0) continue;
    user_error("{}: dims: the model's inputs have no symbolic dim '{}' (their symbolic dims: {})",
               source, name,
               input_symbols.empty() ? "none" : fmt::format("{}", fmt::join(input_symbols, ", ")));
  }
  return proto.SerializeAsString();
}

/// Sets the calling thread's OpenMP thread count for the compile (its algorithm choices are made
/// for it) and puts the previous one back.
class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int threads) : previous_(omp_get_max_threads()) {
    if (threads > 0) omp_set_num_threads(threads);
  }
  ~OmpThreadsScope() { omp_set_num_threads(previous_); }
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int previous_;
};

/// Runs `import` and the compile, turning Kiln's exceptions into kiln::Error.
Model compile_model(const std::function<graph::Model()>& import, const CompileOptions& options,
                    CompileReport* report) {
  const auto start = std::chrono::steady_clock::now();
  driver::LibraryResult result;
  try {
    OmpThreadsScope threads(options.load.threads);
    const graph::Model model = import();
    result = driver::compile_library(model, library_options(options));
  } catch (const UserError& e) {
    // A bad model, an unsupported op or option, an unwritable output: the caller's to fix.
    throw Error(KILN_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const InternalError& e) {
    throw Error(KILN_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (const std::bad_alloc&) {
    throw Error(KILN_ERROR_OUT_OF_MEMORY, "kiln::compile: out of memory");
  } catch (const std::exception& e) {
    // Anything else (a file system error, a library's exception) is unexpected here.
    throw Error(KILN_ERROR_INTERNAL, std::string("kiln::compile: ") + e.what());
  }
  Model loaded = load(result.library.string(), options.load);
  if (report != nullptr) {
    report->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report->cache_hit = result.stats.cache_hit;
    report->kernels = result.stats.kernels;
    report->library_calls = result.stats.extern_calls;
  }
  return loaded;
}

}  // namespace

Model compile(const std::string& onnx_path, const CompileOptions& options, CompileReport* report) {
  return compile_model(
      [&] {
        if (options.dims.empty()) return onnx::import_model(onnx_path);
        std::error_code ec;
        if (!fs::exists(onnx_path, ec)) user_error("{}: no such file", onnx_path);
        fs::path dir = fs::path(onnx_path).parent_path();
        if (dir.empty()) dir = ".";
        return onnx::import_model_from_bytes(
            fix_dims(files::read(onnx_path), options.dims, onnx_path), onnx_path, dir);
      },
      options, report);
}

Model compile_bytes(std::string_view onnx_bytes, const CompileOptions& options,
                    CompileReport* report, const std::string& source_name) {
  return compile_model(
      [&] {
        if (options.dims.empty())
          return onnx::import_model_from_bytes(onnx_bytes, source_name, ".");
        return onnx::import_model_from_bytes(fix_dims(onnx_bytes, options.dims, source_name),
                                             source_name, ".");
      },
      options, report);
}

}  // namespace kiln
