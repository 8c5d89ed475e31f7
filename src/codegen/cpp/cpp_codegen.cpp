#include "codegen/cpp/cpp_codegen.h"

#include "codegen/cpp/cpp_wrapper_ops.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "autotune/runtime_headers.h"
#include "support/error.h"
#include "support/files.h"
#include "support/hash.h"

namespace kiln::codegen {

namespace fs = std::filesystem;

namespace {

/// The runtime headers' content goes into the cache key: the code includes them.
std::string runtime_headers_hash() {
  static const std::string hash = [] {
    Sha256 sha;
    std::vector<fs::path> headers;
    for (const auto& entry : fs::directory_iterator(cpp_runtime_include_dir())) {
      if (entry.path().extension() == ".h") headers.push_back(entry.path());
    }
    headers.push_back(cpp_public_include_dir() / "kiln" / "runtime.h");
    std::sort(headers.begin(), headers.end());
    for (const fs::path& h : headers) {
      sha.update(h.filename().string());
      sha.update(files::read(h));
    }
    return sha.hex_digest();
  }();
  return hash;
}

template <typename T>
void add_unique(std::vector<T>& list, const T& item) {
  if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
}

}  // namespace

bool CppCodegen::supports(const ir::Buffer& /*buffer*/) const { return true; }

GeneratedKernel CppCodegen::generate_kernel(const sched::ScheduleItem& item,
                                            const ir::Program& program) const {
  return generate_cpp_kernel(item, program);
}

std::string CppCodegen::prelude() const { return cpp_kernel_prelude(); }

std::unique_ptr<WrapperOps> CppCodegen::wrapper_ops() const {
  return std::make_unique<CppWrapperOps>(prelude());
}

codecache::CompilerConfig CppCodegen::build_config(const BuildNeeds& needs) const {
  codecache::CompilerConfig config;
  autotune::add_runtime(config);
  config.libraries.push_back("sleef");
  if (needs.uses_blas) {
    config.include_dirs.push_back("/usr/include/x86_64-linux-gnu/openblas-openmp");
    config.libraries.push_back("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so");
  }
  if (needs.uses_dnnl) config.libraries.push_back("dnnl");
  for (const std::string& dir : needs.include_dirs) add_unique(config.include_dirs, fs::path(dir));
  for (const std::string& lib : needs.libraries) add_unique(config.libraries, lib);
  config.extra_key = runtime_headers_hash();
  return config;
}

}  // namespace kiln::codegen
