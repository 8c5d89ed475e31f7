#pragma once
/// The standard headers the kernels' runtime helpers include (kiln_scalar.h, kiln_half.h and
/// sym::cuda_prelude: <cstdint>, <cmath>, <limits>, <type_traits>, <cstring>; <algorithm>
/// for the std::min and std::max of printed index expressions), written for NVRTC,
/// which has no C++ standard library: fixed-width integers as on the host (LP64), std:: math as
/// the CUDA math library's overloads, infinities and NaNs by bit pattern. NVRTC takes them as
/// in-memory headers, so compiling needs nothing installed beside libnvrtc.

#include <string>
#include <utility>
#include <vector>

namespace kiln::codegen {

/// (include name, content) of each header.
const std::vector<std::pair<std::string, std::string>>& nvrtc_std_headers();

}  // namespace kiln::codegen
