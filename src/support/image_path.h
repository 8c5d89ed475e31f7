#pragma once
/// Where the running Kiln is installed: the file of the loaded image that holds Kiln's code (the
/// kiln executable, or libkiln.so when the compiler is embedded in a program), so that an
/// installed compiler finds its runtime headers relative to itself.

#include <filesystem>

namespace kiln {

/// The absolute path of the executable or shared library this code was linked into (symlinks
/// resolved); empty when it cannot be found.
std::filesystem::path running_image_path();

/// `relative` under the install prefix of the running image (the folder above the image's
/// folder: PREFIX for PREFIX/bin/kiln and PREFIX/lib/libkiln.so) when that path exists; else
/// empty.
std::filesystem::path installed_path(const std::filesystem::path& relative);

}  // namespace kiln
