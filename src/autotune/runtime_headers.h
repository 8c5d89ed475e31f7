#pragma once
/// Where the runtime headers (src/runtime) are: generated kernels include them, and so does
/// every autotune choice's source (kiln_rt_pool.h), which the autotuner compiles on its own.

#include <filesystem>

namespace kiln::autotune {

/// PREFIX/share/kiln/runtime for an installed Kiln (PREFIX/bin/kiln or PREFIX/lib/libkiln.so),
/// else src/runtime of the checkout it was built from.
std::filesystem::path runtime_include_dir();

}  // namespace kiln::autotune
