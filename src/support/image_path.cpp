// dladdr on a function of this file names the image it was linked into; the main program's
// link map has an empty name (dladdr would give argv[0], maybe relative), so it is read from
// /proc/self/exe instead.
#include "support/image_path.h"

#include <dlfcn.h>
#include <link.h>

#include <filesystem>
#include <system_error>

namespace kiln {

namespace fs = std::filesystem;

fs::path running_image_path() {
  static const fs::path path = [] {
    Dl_info info{};
    link_map* map = nullptr;
    if (dladdr1(reinterpret_cast<void*>(&running_image_path), &info, reinterpret_cast<void**>(&map),
                RTLD_DL_LINKMAP) == 0)
      return fs::path();
    std::error_code ec;
    fs::path image = map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0'
                         ? fs::path(map->l_name)
                         : fs::read_symlink("/proc/self/exe", ec);
    if (ec || image.empty()) return fs::path();
    fs::path resolved = fs::canonical(image, ec);
    return ec ? fs::path() : resolved;
  }();
  return path;
}

fs::path installed_path(const fs::path& relative) {
  const fs::path image = running_image_path();
  if (image.empty()) return fs::path();
  const fs::path candidate = image.parent_path().parent_path() / relative;
  std::error_code ec;
  return fs::exists(candidate, ec) ? candidate : fs::path();
}

}  // namespace kiln
