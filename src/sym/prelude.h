#pragma once
/// Source text that generated kernels include before any expression printed by sym::to_cpp or
/// sym::to_cuda: floor division, floor modulo (sign of the divisor) and ceiling division on
/// int64_t, matching sym::evaluate.

#include <string_view>

namespace kiln::sym {

/// C++ definitions of inline kiln_floordiv / kiln_mod / kiln_ceildiv for int64_t, plus the
/// includes the printed expressions need (<algorithm> for std::min/std::max, <cstdint>).
std::string_view cpp_prelude();

/// The same functions for CUDA sources, declared __host__ __device__.
std::string_view cuda_prelude();

}  // namespace kiln::sym
