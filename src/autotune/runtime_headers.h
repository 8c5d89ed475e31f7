#pragma once
/// Where the runtime headers (src/runtime) are: generated kernels include them, and so does
/// every autotune choice's source (kiln_rt_pool.h), which the autotuner compiles on its own.

#include <filesystem>

#include "codecache/compiler.h"

namespace kiln::autotune {

/// PREFIX/share/kiln/runtime for an installed Kiln (PREFIX/bin/kiln or PREFIX/lib/libkiln.so),
/// else src/runtime of the checkout it was built from.
std::filesystem::path runtime_include_dir();

/// Sets `config` up for code that includes the runtime headers: their folder on the include path,
/// and the runtime's out-of-line parts (kiln_rt.cpp, and the thread pool that kiln_rt_pool.h's
/// loops call, kiln_rt_pool.cpp) among the shared sources linked into the library.
void add_runtime(codecache::CompilerConfig& config);

}  // namespace kiln::autotune
