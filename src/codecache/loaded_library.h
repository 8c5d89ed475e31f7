#pragma once
/// A shared library loaded with dlopen (RTLD_NOW | RTLD_LOCAL) for as long as the object lives,
/// with typed symbol lookup. Tested in tests/unit/codecache/code_cache_test.cpp.

#include <filesystem>
#include <string>

namespace kiln::codecache {

/// Owns one dlopen handle; closes it on destruction. Movable, not copyable. Pointers taken from
/// symbol() are valid only while the library is loaded.
class LoadedLibrary {
 public:
  /// Loads `path`, resolving every symbol now. Throws UserError with the path and dlerror's text.
  explicit LoadedLibrary(const std::filesystem::path& path);
  ~LoadedLibrary();
  LoadedLibrary(LoadedLibrary&& other) noexcept;
  LoadedLibrary& operator=(LoadedLibrary&& other) noexcept;
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;

  /// The address of `name` as an F* (F a function type such as `int(int)`, or an object type).
  /// Throws UserError naming the symbol and the library when it is missing. The caller is
  /// responsible for F matching the symbol's real type (use extern "C" names).
  template <class F>
  F* symbol(const std::string& name) const {
    return reinterpret_cast<F*>(raw_symbol(name));
  }

  /// The address of `name`; throws like symbol().
  void* raw_symbol(const std::string& name) const;

  /// True when `name` is defined in the library.
  bool has_symbol(const std::string& name) const;

  const std::filesystem::path& path() const { return path_; }

 private:
  void close();

  std::filesystem::path path_;
  void* handle_ = nullptr;
};

}  // namespace kiln::codecache
