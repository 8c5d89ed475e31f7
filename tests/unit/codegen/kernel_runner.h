#pragma once
/// Test harness for generated C++ kernels: schedules a Program with the CPU backend, generates
/// every kernel, adds a small entry function that calls them in order, compiles the translation
/// unit with g++ (-O3 -march=native -fopenmp, warnings as errors, the runtime's pool and -lsleef)
/// through a code cache in a temp dir under the build dir,
/// dlopens it and runs it on caller-provided buffers. Extern buffers are treated as provided
/// data (the harness never runs extern calls).

#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "autotune/runtime_headers.h"
#include "codecache/code_cache.h"
#include "codegen/cpp/cpp_kernel.h"
#include "sched/scheduler.h"

namespace kiln::testing {

/// Bytes of one buffer.
using Bytes = std::vector<char>;

template <typename T>
Bytes to_bytes(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <typename T>
std::vector<T> from_bytes(const Bytes& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

class CompiledProgram {
 public:
  sched::Schedule schedule;
  std::string source;
  std::vector<std::string> kernel_sources;

  CompiledProgram(const ir::Program& program, const std::string& test_name,
                  const codegen::CppKernelOptions& options = {})
      : program_(program) {
    schedule = sched::schedule(program, codegen::CppBackend());
    for (const auto& b : program.buffers) names_.push_back(b->name);
    for (const auto& [out, in] : inplace_pairs()) alias_[out] = in;
    std::string calls;
    std::set<std::string> symbols;
    std::vector<codegen::GeneratedKernel> kernels;
    for (const sched::ScheduleItem& item : schedule.items) {
      if (item.kind != sched::ItemKind::kKernel) continue;
      kernels.push_back(codegen::generate_cpp_kernel(item, program, options));
      for (const auto& a : kernels.back().args) {
        if (a.kind == codegen::KernelArg::Kind::kSize) symbols.insert(a.size.name());
      }
    }
    symbols_.assign(symbols.begin(), symbols.end());
    source = codegen::cpp_kernel_prelude();
    for (const auto& k : kernels) {
      // Appended in two steps: GCC 12 warns (-Wrestrict, a false positive) on the inlined
      // "literal" + std::string&& here.
      source += '\n';
      source += k.source();
      kernel_sources.push_back(k.source());
      calls += "  " + call(k) + ";\n";
    }
    source +=
        "\nextern \"C\" void kiln_test_entry(void** bufs, const int64_t* syms) {\n" + calls + "}\n";
    compile(test_name);
  }

  // The library stays loaded: unloading it could unload libgomp under its idle worker threads.

  /// Runs on `data` (inputs and extern results by name); returns every buffer's bytes.
  std::map<std::string, Bytes> run(std::map<std::string, Bytes> data,
                                   const std::map<std::string, int64_t>& sizes) {
    if (entry_ == nullptr) throw std::runtime_error("kernels did not compile");
    sym::Binding binding(sizes.begin(), sizes.end());
    std::vector<void*> ptrs;
    for (const std::string& name : names_) {
      const ir::Buffer* b = program_.find(name);
      auto n = static_cast<size_t>(sym::evaluate(b->layout.storage_size(), binding) *
                                   graph::dtype_size(b->dtype));
      Bytes& bytes = data[name];
      if (bytes.size() < n) bytes.resize(n);
    }
    for (const std::string& name : names_) {
      auto a = alias_.find(name);
      ptrs.push_back(data[a == alias_.end() ? name : a->second].data());
    }
    std::vector<int64_t> syms;
    for (const std::string& s : symbols_) syms.push_back(sizes.at(s));
    entry_(ptrs.data(), syms.data());
    for (const auto& [out, in] : alias_) data[out] = data[in];
    return data;
  }

 private:
  std::vector<std::pair<std::string, std::string>> inplace_pairs() const {
    std::vector<std::pair<std::string, std::string>> pairs;
    for (const auto& item : schedule.items) {
      pairs.insert(pairs.end(), item.inplace.begin(), item.inplace.end());
    }
    return pairs;
  }

  std::string call(const codegen::GeneratedKernel& k) const {
    std::string text = k.name + "(";
    for (size_t i = 0; i < k.args.size(); ++i) {
      const auto& a = k.args[i];
      if (i) text += ", ";
      if (a.kind == codegen::KernelArg::Kind::kSize) {
        size_t pos = std::find(symbols_.begin(), symbols_.end(), a.size.name()) - symbols_.begin();
        text += fmt::format("syms[{}]", pos);
        continue;
      }
      size_t pos = std::find(names_.begin(), names_.end(), a.name) - names_.begin();
      text += fmt::format("static_cast<{}{}*>(bufs[{}])", a.is_output ? "" : "const ",
                          graph::dtype_cpp_storage(a.dtype), pos);
    }
    return text + ")";
  }

  void compile(const std::string& test_name) {
    namespace fs = std::filesystem;
    fs::path dir = fs::path(KILN_BUILD_DIR) / "test-tmp" / "codegen" / test_name;
    fs::remove_all(dir);
    codecache::CompilerConfig config;
    config.flags = {"-std=c++17",
                    "-O3",
                    "-march=native",
                    "-fopenmp",
                    "-shared",
                    "-fPIC",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-Wno-unused-variable",
                    "-Wno-unused-parameter"};
    autotune::add_runtime(config);
    config.libraries.push_back("sleef");
    fs::path lib;
    try {
      lib = codecache::CodeCache(dir).compile_shared_library(source, config);
    } catch (const std::exception& e) {
      FAIL() << "compile failed:\n" << e.what() << "\n" << source;
    }
    handle_ = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    entry_ = reinterpret_cast<void (*)(void**, const int64_t*)>(dlsym(handle_, "kiln_test_entry"));
    ASSERT_NE(entry_, nullptr);
  }

  const ir::Program& program_;
  std::vector<std::string> names_;
  std::vector<std::string> symbols_;
  std::map<std::string, std::string> alias_;  // in-place output -> input whose memory it uses
  void* handle_ = nullptr;
  void (*entry_)(void**, const int64_t*) = nullptr;
};

}  // namespace kiln::testing
