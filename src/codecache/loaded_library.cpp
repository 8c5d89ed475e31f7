#include "codecache/loaded_library.h"

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <utility>

#include "support/error.h"

namespace kiln::codecache {
namespace {

std::string last_dl_error() {
  const char* message = ::dlerror();
  return message != nullptr ? message : "unknown dlerror";
}

}  // namespace

LoadedLibrary::LoadedLibrary(const std::filesystem::path& path) : path_(path) {
  handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    user_error("cannot load shared library {}: {}", path.string(), last_dl_error());
  }
}

LoadedLibrary::~LoadedLibrary() { close(); }

LoadedLibrary::LoadedLibrary(LoadedLibrary&& other) noexcept
    : path_(std::move(other.path_)), handle_(std::exchange(other.handle_, nullptr)) {}

LoadedLibrary& LoadedLibrary::operator=(LoadedLibrary&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void LoadedLibrary::close() {
  if (handle_ != nullptr) ::dlclose(handle_);
  handle_ = nullptr;
}

void* LoadedLibrary::raw_symbol(const std::string& name) const {
  KILN_CHECK(handle_ != nullptr, "symbol '{}' looked up in a moved-from LoadedLibrary", name);
  ::dlerror();  // clear, so a stale error is not mistaken for this lookup's
  void* address = ::dlsym(handle_, name.c_str());
  if (address == nullptr) {
    user_error("symbol '{}' not found in {}: {}", name, path_.string(), last_dl_error());
  }
  return address;
}

bool LoadedLibrary::has_symbol(const std::string& name) const {
  if (handle_ == nullptr) return false;
  ::dlerror();
  return ::dlsym(handle_, name.c_str()) != nullptr;
}

}  // namespace kiln::codecache
