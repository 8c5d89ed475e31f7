#pragma once
/// Scalar helpers of generated C++ kernels, overloaded by type so one op-table entry serves every
/// dtype: NaN-propagating minimum/maximum, ONNX integer division and modulo, round half to even,
/// Welford and arg-reduction accumulators. Self-contained (used by code compiled outside Kiln's
/// build): includes only standard headers.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace kiln {

template <typename T>
inline T relu(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return x < T(0) ? T(0) : x;  // NaN stays NaN
  else if constexpr (std::is_signed_v<T>)
    return x < T(0) ? T(0) : x;
  else
    return x;
}

template <typename T>
inline T abs(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return std::fabs(x);
  else if constexpr (std::is_signed_v<T>)
    return x < T(0) ? static_cast<T>(-x) : x;
  else
    return x;
}

template <typename T>
inline T sign(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(x)) return x;
  }
  return static_cast<T>((T(0) < x) - (x < T(0)));
}

template <typename T>
inline T neg(T x) {
  if constexpr (std::is_same_v<T, bool>)
    return x;
  else
    return static_cast<T>(-x);
}

template <typename T>
inline T maximum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return a < b ? b : a;
}

template <typename T>
inline T minimum(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b < a ? b : a;
}

/// maximum(a, b) and minimum(a, b) for a b that is a number (not NaN; a Clip bound): one
/// comparison, false for a NaN a, which then stays. Signed zeros as maximum's and minimum's.
template <typename T>
inline T maximum_num(T a, T b) {
  return b > a ? b : a;
}

template <typename T>
inline T minimum_num(T a, T b) {
  return b < a ? b : a;
}

/// True division for floats, truncating for integers (0 when dividing by 0).
template <typename T>
inline T div(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    return a / b;
  else if constexpr (std::is_same_v<T, bool>)
    return a;
  else {
    if (b == T(0)) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return static_cast<T>(-a);  // avoids INT_MIN / -1
    }
    return static_cast<T>(a / b);
  }
}

/// C fmod / truncated integer remainder.
template <typename T>
inline T fmod(T a, T b) {
  if constexpr (std::is_floating_point_v<T>)
    return std::fmod(a, b);
  else if constexpr (std::is_same_v<T, bool>)
    return false;
  else {
    if (b == T(0)) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return T(0);
    }
    return static_cast<T>(a % b);
  }
}

/// Remainder with the sign of the divisor (ONNX Mod with fmod=0).
template <typename T>
inline T floor_mod(T a, T b) {
  T r = kiln::fmod(a, b);
  if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>)
    return r;
  else
    return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? static_cast<T>(r + b) : r;
}

template <typename A, typename B>
inline A pow(A a, B b) {
  if constexpr (std::is_floating_point_v<A>) {
    return static_cast<A>(std::pow(a, static_cast<A>(b)));
  } else if constexpr (std::is_floating_point_v<B>) {
    return static_cast<A>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  } else {
    if constexpr (std::is_signed_v<B>) {
      if (b < 0) return a == A(1) ? A(1) : (a == A(-1) ? ((b & 1) ? A(-1) : A(1)) : A(0));
    }
    A result = 1;
    A base = a;
    for (auto e = static_cast<uint64_t>(b); e != 0; e >>= 1) {
      if (e & 1) result = static_cast<A>(result * base);
      base = static_cast<A>(base * base);
    }
    return result;
  }
}

template <typename A, typename B>
inline A shl(A a, B b) {
  using U = std::make_unsigned_t<A>;
  if (b < 0 || static_cast<uint64_t>(b) >= sizeof(A) * 8) return A(0);
  return static_cast<A>(static_cast<U>(a) << b);
}

template <typename A, typename B>
inline A shr(A a, B b) {
  using U = std::make_unsigned_t<A>;
  if (b < 0 || static_cast<uint64_t>(b) >= sizeof(A) * 8) return A(0);
  return static_cast<A>(static_cast<U>(a) >> b);
}

template <typename T>
inline T bit_not(T x) {
  if constexpr (std::is_same_v<T, bool>)
    return !x;
  else
    return static_cast<T>(~x);
}

template <typename T>
inline T round_even(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return std::nearbyint(x);
  else
    return x;
}

template <typename T>
inline T floor(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return std::floor(x);
  else
    return x;
}

template <typename T>
inline T ceil(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return std::ceil(x);
  else
    return x;
}

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
inline T softplus(T x) {
  return (x > T(0) ? x : T(0)) + std::log1p(std::exp(-std::fabs(x)));
}

template <typename T>
inline T rsqrt(T x) {
  return T(1) / std::sqrt(x);
}

template <typename T>
inline T reciprocal(T x) {
  return T(1) / x;
}

template <typename T>
inline bool isnan(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(x);
  else
    return false;
}

template <typename T>
inline bool isposinf(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isinf(x) && x > T(0);
  else
    return false;
}

template <typename T>
inline bool isneginf(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isinf(x) && x < T(0);
  else
    return false;
}

/// Welford's running mean and variance (population).
template <typename T>
struct Welford {
  T mean = T(0);
  T m2 = T(0);
  int64_t n = 0;

  void update(T x) {
    ++n;
    T delta = x - mean;
    mean += delta / static_cast<T>(n);
    m2 += delta * (x - mean);
  }
  /// Chan's parallel combination.
  void combine(T other_mean, T other_m2, int64_t other_n) {
    if (other_n == 0) return;
    if (n == 0) {
      mean = other_mean;
      m2 = other_m2;
      n = other_n;
      return;
    }
    int64_t total = n + other_n;
    T delta = other_mean - mean;
    T w = static_cast<T>(other_n) / static_cast<T>(total);
    mean += delta * w;
    m2 += other_m2 + delta * delta * static_cast<T>(n) * w;
    n = total;
  }
  T variance() const {
    return n > 0 ? m2 / static_cast<T>(n) : std::numeric_limits<T>::quiet_NaN();
  }
  T result_mean() const { return n > 0 ? mean : std::numeric_limits<T>::quiet_NaN(); }
};

/// Running arg-max / arg-min: the first (or last) index of the extreme value; NaN wins.
template <typename T>
struct ArgReduce {
  T best{};
  int64_t index = -1;

  void update(T v, int64_t i, bool is_max, bool select_last) {
    if (index < 0) {
      best = v;
      index = i;
      return;
    }
    if (kiln::isnan(best)) return;
    bool better = kiln::isnan(v) || (is_max ? v > best : v < best);
    if (better || (select_last && v == best)) {
      best = v;
      index = i;
    }
  }
};

}  // namespace kiln
