/// The prelude texts; they must agree with floor_div_int / mod_int / ceil_div_int (expr.cpp),
/// which prelude_test compiles and checks.

#include "sym/prelude.h"

namespace kiln::sym {

std::string_view cpp_prelude() {
  return R"(#include <algorithm>
#include <cstdint>
#include <string_view>

inline int64_t kiln_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline int64_t kiln_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
inline int64_t kiln_ceildiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) == (b < 0))) ? q + 1 : q;
}
)";
}

std::string_view cuda_prelude() {
  return R"(#include <cstdint>

__host__ __device__ inline int64_t kiln_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
__host__ __device__ inline int64_t kiln_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__host__ __device__ inline int64_t kiln_ceildiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) == (b < 0))) ? q + 1 : q;
}
)";
}

}  // namespace kiln::sym
