#include "codegen/cuda/nvrtc_headers.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::codegen {

const std::vector<std::pair<std::string, std::string>>& nvrtc_std_headers() {
  static const std::vector<std::pair<std::string, std::string>> headers = {
      {"algorithm", R"(#pragma once
// std::min and std::max, which printed index expressions call (sym::to_cpp).
namespace std {
template <typename T>
constexpr const T& min(const T& a, const T& b) { return b < a ? b : a; }
template <typename T>
constexpr const T& max(const T& a, const T& b) { return a < b ? b : a; }
}  // namespace std
)"},
      {"cstdint", R"(#pragma once
// Fixed-width integers for NVRTC, which has no C library headers (LP64, as the host).
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
namespace std {
using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t;
using ::uint8_t; using ::uint16_t; using ::uint32_t; using ::uint64_t;
}
#define INT64_C(x) x##L
#define UINT64_C(x) x##UL
)"},
      {"cmath", R"(#pragma once
// std:: math for NVRTC: the CUDA math library's overloads under the names the kernels use.
namespace std {
#define KILN_STD_MATH1(f) \
  inline float f(float x) { return ::f(x); } \
  inline double f(double x) { return ::f(x); }
KILN_STD_MATH1(exp) KILN_STD_MATH1(log) KILN_STD_MATH1(sqrt) KILN_STD_MATH1(tanh)
KILN_STD_MATH1(erf) KILN_STD_MATH1(sin) KILN_STD_MATH1(cos) KILN_STD_MATH1(tan)
KILN_STD_MATH1(asin) KILN_STD_MATH1(acos) KILN_STD_MATH1(atan) KILN_STD_MATH1(sinh)
KILN_STD_MATH1(cosh) KILN_STD_MATH1(asinh) KILN_STD_MATH1(acosh) KILN_STD_MATH1(atanh)
KILN_STD_MATH1(log1p) KILN_STD_MATH1(expm1) KILN_STD_MATH1(fabs) KILN_STD_MATH1(floor)
KILN_STD_MATH1(ceil) KILN_STD_MATH1(nearbyint) KILN_STD_MATH1(trunc) KILN_STD_MATH1(round)
#undef KILN_STD_MATH1
inline float pow(float a, float b) { return ::powf(a, b); }
inline double pow(double a, double b) { return ::pow(a, b); }
inline float fmod(float a, float b) { return ::fmodf(a, b); }
inline double fmod(double a, double b) { return ::fmod(a, b); }
inline bool isnan(float x) { return ::isnan(x); }
inline bool isnan(double x) { return ::isnan(x); }
inline bool isinf(float x) { return ::isinf(x); }
inline bool isinf(double x) { return ::isinf(x); }
}  // namespace std
)"},
      {"limits", R"(#pragma once
// std::numeric_limits for NVRTC: infinities and NaNs by bit pattern.
namespace std {
template <typename T> struct numeric_limits;
template <> struct numeric_limits<float> {
  static float infinity() { return __int_as_float(0x7f800000); }
  static float quiet_NaN() { return __int_as_float(0x7fc00000); }
  static constexpr float lowest() { return -3.40282347e+38f; }
  static constexpr float max() { return 3.40282347e+38f; }
  static constexpr float min() { return 1.17549435e-38f; }
  static constexpr float epsilon() { return 1.19209290e-07f; }
};
template <> struct numeric_limits<double> {
  static double infinity() { return __longlong_as_double(0x7ff0000000000000LL); }
  static double quiet_NaN() { return __longlong_as_double(0x7ff8000000000000LL); }
  static constexpr double lowest() { return -1.7976931348623157e+308; }
  static constexpr double max() { return 1.7976931348623157e+308; }
  static constexpr double min() { return 2.2250738585072014e-308; }
  static constexpr double epsilon() { return 2.2204460492503131e-16; }
};
#define KILN_INT_LIMITS(T, LO, HI) \
  template <> struct numeric_limits<T> { \
    static constexpr T lowest() { return LO; } \
    static constexpr T min() { return LO; } \
    static constexpr T max() { return HI; } \
    static constexpr T infinity() { return 0; } \
    static constexpr T quiet_NaN() { return 0; } \
  };
KILN_INT_LIMITS(bool, false, true)
KILN_INT_LIMITS(signed char, -128, 127)
KILN_INT_LIMITS(char, -128, 127)
KILN_INT_LIMITS(unsigned char, 0, 255)
KILN_INT_LIMITS(short, -32768, 32767)
KILN_INT_LIMITS(unsigned short, 0, 65535)
KILN_INT_LIMITS(int, -2147483647 - 1, 2147483647)
KILN_INT_LIMITS(unsigned int, 0u, 4294967295u)
KILN_INT_LIMITS(long, -9223372036854775807L - 1, 9223372036854775807L)
KILN_INT_LIMITS(unsigned long, 0ul, 18446744073709551615ul)
KILN_INT_LIMITS(long long, -9223372036854775807LL - 1, 9223372036854775807LL)
KILN_INT_LIMITS(unsigned long long, 0ull, 18446744073709551615ull)
#undef KILN_INT_LIMITS
}  // namespace std
)"},
      {"type_traits", R"(#pragma once
// The type traits the runtime's scalar helpers use, for NVRTC.
namespace std {
template <typename A, typename B> inline constexpr bool is_same_v = false;
template <typename A> inline constexpr bool is_same_v<A, A> = true;
template <typename T> struct remove_cv { using type = T; };
template <typename T> struct remove_cv<const T> { using type = T; };
template <typename T> struct remove_cv<volatile T> { using type = T; };
template <typename T> struct remove_cv<const volatile T> { using type = T; };
template <typename T> inline constexpr bool is_floating_point_v =
    is_same_v<typename remove_cv<T>::type, float> || is_same_v<typename remove_cv<T>::type, double>;
template <typename T> inline constexpr bool is_signed_v = T(-1) < T(0);
template <typename T> inline constexpr bool is_unsigned_v = !is_floating_point_v<T> && T(0) < T(-1);
template <typename T> struct make_unsigned;
template <> struct make_unsigned<signed char> { using type = unsigned char; };
template <> struct make_unsigned<char> { using type = unsigned char; };
template <> struct make_unsigned<short> { using type = unsigned short; };
template <> struct make_unsigned<int> { using type = unsigned int; };
template <> struct make_unsigned<long> { using type = unsigned long; };
template <> struct make_unsigned<long long> { using type = unsigned long long; };
template <> struct make_unsigned<unsigned char> { using type = unsigned char; };
template <> struct make_unsigned<unsigned short> { using type = unsigned short; };
template <> struct make_unsigned<unsigned int> { using type = unsigned int; };
template <> struct make_unsigned<unsigned long> { using type = unsigned long; };
template <> struct make_unsigned<unsigned long long> { using type = unsigned long long; };
template <typename T> using make_unsigned_t = typename make_unsigned<T>::type;
}  // namespace std
)"},
      {"cstring", R"(#pragma once
namespace std {
inline void* memcpy(void* to, const void* from, unsigned long n) { return ::memcpy(to, from, n); }
}
)"},
  };
  return headers;
}

}  // namespace kiln::codegen
