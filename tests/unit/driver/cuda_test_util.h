#pragma once
// What the CUDA driver tests share: a scratch directory, whether a GPU is there, a compile with
// its generated sources, and counting occurrences in generated text.

#include <dlfcn.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "driver/compile.h"
#include "support/files.h"

namespace kiln::driver::cuda_test {

/// A temporary directory removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "kiln-cuda-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

/// True when the CUDA driver finds a device (what the wrappers need to run).
inline bool has_cuda_device() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return false;
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<int (*)(int*)>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  return init != nullptr && count != nullptr && init(0) == 0 && count(&n) == 0 && n > 0;
}

/// A model compiled for CUDA, with the sources its dump holds.
struct Compiled {
  CompiledModel model;
  std::string kernels;  // 5_kernels.cu
  std::string wrapper;  // 5_wrapper.cpp
};

/// Compiles `model` for CUDA under `dir` with a dump: cubins for `archs` (sm_90) without a GPU,
/// the GPU's own architecture with one; at `precision` (--precision), with `autotune`
/// (--autotune; empty: the default).
inline Compiled compile_cuda_dumped(const graph::Model& model, const std::filesystem::path& dir,
                                    ir::Precision precision = ir::Precision::kTf32,
                                    std::optional<autotune::AutotuneMode> autotune = std::nullopt,
                                    const std::string& archs = "90") {
  if (!has_cuda_device()) setenv("KILN_CUDA_ARCHS", archs.c_str(), 1);
  CompileOptions options;
  options.device = ir::Device::kCuda;
  options.precision = precision;
  options.autotune = autotune;
  options.dump_dir = dir / "dump";
  options.cache_dir = dir / "cache";
  CompiledModel compiled = compile(model, options);
  unsetenv("KILN_CUDA_ARCHS");
  return {std::move(compiled), files::read(dir / "dump" / "5_kernels.cu"),
          files::read(dir / "dump" / "5_wrapper.cpp")};
}

/// Sets environment variable `name` for a scope.
struct Env {
  Env(const char* name, const std::string& value) : name(name) { setenv(name, value.c_str(), 1); }
  ~Env() { unsetenv(name); }
  const char* name;
};

/// `text` without its lines that contain `needle`; with `cubin_bytes` false, also without the
/// lines of an embedded cubin's bytes (lines starting with a digit), which differ wherever a
/// kernel does.
inline std::string without_lines(const std::string& text, const std::string& needle,
                                 bool cubin_bytes = true) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find_first_not_of(' ');
    const bool bytes = first != std::string::npos && line[first] >= '0' && line[first] <= '9';
    if (line.find(needle) == std::string::npos && (cubin_bytes || !bytes)) out += line + "\n";
  }
  return out;
}

/// A float32 tensor of `dims` filled with sin(0.37 i + 1.3 salt).
inline graph::Tensor filled(std::vector<int64_t> dims, int64_t salt) {
  graph::Tensor t(graph::DType::kFloat32, std::move(dims));
  auto v = t.mutable_values<float>();
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * salt));
  return t;
}

/// How often `needle` occurs in `text`.
inline size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace kiln::driver::cuda_test
