// Element semantics of the reference interpreter. Everything is computed in double or in
// (wrapping) 64-bit integer arithmetic and then brought to the result dtype, which is what the
// generated C++ does up to float rounding of intermediate libm results.
#include "ir/interpreter_scalar.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "support/error.h"

namespace kiln::ir::interp {

using graph::DType;

namespace {

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

bool is_unsigned_64(DType dtype) { return dtype == DType::kUInt64; }

uint64_t as_u64(int64_t v) { return static_cast<uint64_t>(v); }

/// Float to int64 by truncation; NaN and out-of-range values give INT64_MIN (x86 cvttsd2si).
/// Values in [2^63, 2^64) are kept for uint64 targets.
int64_t float_to_int(double value, DType to) {
  if (std::isnan(value)) return kInt64Min;
  double t = std::trunc(value);
  if (is_unsigned_64(to) && t >= 9223372036854775808.0 && t < 18446744073709551616.0) {
    return static_cast<int64_t>(static_cast<uint64_t>(t));
  }
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) return kInt64Min;
  return static_cast<int64_t>(t);
}

Scalar make_float(double v, DType dtype) { return Scalar{round_float(v, dtype), 0}; }
Scalar make_int(int64_t v, DType dtype) { return Scalar{0, wrap_int(v, dtype)}; }
Scalar make_bool(bool v) { return Scalar{0, v ? 1 : 0}; }

[[noreturn]] void bad_dtype(OpCode code, DType dtype) {
  internal_error("interpreter: {} is not defined on {}", op_name(code), graph::dtype_name(dtype));
}

double sign_of(double x) {
  if (std::isnan(x)) return x;
  return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0);
}

double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

double unary_float(OpCode code, double x) {
  switch (code) {
    case OpCode::kNeg:
      return -x;
    case OpCode::kAbs:
      return std::fabs(x);
    case OpCode::kExp:
      return std::exp(x);
    case OpCode::kLog:
      return std::log(x);
    case OpCode::kSqrt:
      return std::sqrt(x);
    case OpCode::kRsqrt:
      return 1.0 / std::sqrt(x);
    case OpCode::kReciprocal:
      return 1.0 / x;
    case OpCode::kTanh:
      return std::tanh(x);
    case OpCode::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case OpCode::kErf:
      return std::erf(x);
    case OpCode::kRelu:
      return x < 0 ? 0.0 : x;  // NaN stays NaN
    case OpCode::kFloor:
      return std::floor(x);
    case OpCode::kCeil:
      return std::ceil(x);
    case OpCode::kRound:
      return std::nearbyint(x);  // default rounding mode: half to even
    case OpCode::kSign:
      return sign_of(x);
    case OpCode::kSin:
      return std::sin(x);
    case OpCode::kCos:
      return std::cos(x);
    case OpCode::kTan:
      return std::tan(x);
    case OpCode::kAsin:
      return std::asin(x);
    case OpCode::kAcos:
      return std::acos(x);
    case OpCode::kAtan:
      return std::atan(x);
    case OpCode::kSinh:
      return std::sinh(x);
    case OpCode::kCosh:
      return std::cosh(x);
    case OpCode::kAsinh:
      return std::asinh(x);
    case OpCode::kAcosh:
      return std::acosh(x);
    case OpCode::kAtanh:
      return std::atanh(x);
    case OpCode::kLog1p:
      return std::log1p(x);
    case OpCode::kExpm1:
      return std::expm1(x);
    case OpCode::kSoftplus:
      return softplus(x);
    default:
      bad_dtype(code, DType::kFloat64);
  }
}

Scalar unary_int(OpCode code, int64_t x, DType in, DType out) {
  switch (code) {
    case OpCode::kNeg:
      return make_int(static_cast<int64_t>(0 - as_u64(x)), out);
    case OpCode::kAbs:
      if (is_unsigned_64(in)) return make_int(x, out);
      return make_int(x < 0 ? static_cast<int64_t>(0 - as_u64(x)) : x, out);
    case OpCode::kRelu:
      return make_int(!is_unsigned_64(in) && x < 0 ? 0 : x, out);
    case OpCode::kFloor:
    case OpCode::kCeil:
    case OpCode::kRound:
      return make_int(x, out);
    case OpCode::kSign:
      if (is_unsigned_64(in)) return make_int(x != 0 ? 1 : 0, out);
      return make_int(x > 0 ? 1 : (x < 0 ? -1 : 0), out);
    case OpCode::kBitNot:
      return make_int(~x, out);
    case OpCode::kNot:
      return make_bool(x == 0);
    case OpCode::kIsNan:
    case OpCode::kIsPosInf:
    case OpCode::kIsNegInf:
      return make_bool(false);
    default:
      bad_dtype(code, in);
  }
}

bool compare_float(OpCode code, double a, double b) {
  switch (code) {
    case OpCode::kEq:
      return a == b;
    case OpCode::kNe:
      return a != b;
    case OpCode::kLt:
      return a < b;
    case OpCode::kLe:
      return a <= b;
    case OpCode::kGt:
      return a > b;
    case OpCode::kGe:
      return a >= b;
    default:
      internal_error("interpreter: {} is not a comparison", op_name(code));
  }
}

template <typename T>
bool compare_int(OpCode code, T a, T b) {
  switch (code) {
    case OpCode::kEq:
      return a == b;
    case OpCode::kNe:
      return a != b;
    case OpCode::kLt:
      return a < b;
    case OpCode::kLe:
      return a <= b;
    case OpCode::kGt:
      return a > b;
    case OpCode::kGe:
      return a >= b;
    default:
      internal_error("interpreter: {} is not a comparison", op_name(code));
  }
}

double floor_mod_float(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  if (r == 0) r = std::copysign(0.0, b);
  return r;
}

double binary_float(OpCode code, double a, double b) {
  switch (code) {
    case OpCode::kAdd:
      return a + b;
    case OpCode::kSub:
      return a - b;
    case OpCode::kMul:
      return a * b;
    case OpCode::kDiv:
      return a / b;
    case OpCode::kPow:
      return std::pow(a, b);
    case OpCode::kMinimum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case OpCode::kMaximum:
      return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case OpCode::kFmod:
      return std::fmod(a, b);
    case OpCode::kFloorMod:
      return floor_mod_float(a, b);
    default:
      bad_dtype(code, DType::kFloat64);
  }
}

void check_divisor(int64_t b) {
  if (b == 0) user_error("integer division or remainder by zero");
}

/// Truncating division and remainder; INT64_MIN / -1 wraps as two's complement would.
int64_t div_int(int64_t a, int64_t b, DType t) {
  check_divisor(b);
  if (is_unsigned_64(t)) return static_cast<int64_t>(as_u64(a) / as_u64(b));
  if (b == -1) return static_cast<int64_t>(0 - as_u64(a));
  return a / b;
}

int64_t rem_int(int64_t a, int64_t b, DType t) {
  check_divisor(b);
  if (is_unsigned_64(t)) return static_cast<int64_t>(as_u64(a) % as_u64(b));
  if (b == -1) return 0;
  return a % b;
}

int64_t floor_mod_int(int64_t a, int64_t b, DType t) {
  int64_t r = rem_int(a, b, t);
  if (!is_unsigned_64(t) && r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

int64_t shift_int(OpCode code, int64_t a, int64_t amount, DType t) {
  int64_t width = 8 * graph::dtype_size(t);
  bool is_signed = graph::is_signed(t);
  if (amount < 0 || amount >= width) {
    if (code == OpCode::kShl || !is_signed) return 0;
    return a < 0 ? -1 : 0;
  }
  if (code == OpCode::kShl) return static_cast<int64_t>(as_u64(a) << amount);
  if (is_signed) return a >> amount;
  return static_cast<int64_t>(as_u64(a) >> amount);  // a is zero-extended for unsigned types
}

int64_t min_max_int(OpCode code, int64_t a, int64_t b, DType t) {
  bool less = is_unsigned_64(t) ? as_u64(a) < as_u64(b) : a < b;
  if (code == OpCode::kMinimum) return less ? a : b;
  return less ? b : a;
}

int64_t binary_int(OpCode code, int64_t a, int64_t b, DType t) {
  switch (code) {
    case OpCode::kAdd:
      return static_cast<int64_t>(as_u64(a) + as_u64(b));
    case OpCode::kSub:
      return static_cast<int64_t>(as_u64(a) - as_u64(b));
    case OpCode::kMul:
      return static_cast<int64_t>(as_u64(a) * as_u64(b));
    case OpCode::kDiv:
      return div_int(a, b, t);
    case OpCode::kMinimum:
    case OpCode::kMaximum:
      return min_max_int(code, a, b, t);
    case OpCode::kFmod:
      return rem_int(a, b, t);
    case OpCode::kFloorMod:
      return floor_mod_int(a, b, t);
    case OpCode::kBitAnd:
      return a & b;
    case OpCode::kBitOr:
      return a | b;
    case OpCode::kBitXor:
      return a ^ b;
    case OpCode::kShl:
    case OpCode::kShr:
      return shift_int(code, a, b, t);
    default:
      bad_dtype(code, t);
  }
}

/// Integer power by squaring with wrap-around; negative exponents truncate 1 / a^-e.
int64_t pow_int(int64_t base, int64_t exponent) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exponent % 2 == 0) ? 1 : -1;
    check_divisor(base);
    return 0;
  }
  uint64_t result = 1;
  uint64_t b = as_u64(base);
  while (exponent > 0) {
    if (exponent & 1) result *= b;
    b *= b;
    exponent >>= 1;
  }
  return static_cast<int64_t>(result);
}

Scalar apply_pow(Scalar a, DType at, Scalar b, DType bt, DType out) {
  if (is_float_dtype(at)) return make_float(std::pow(a.f, to_double(b, bt)), out);
  if (is_float_dtype(bt)) return make_int(float_to_int(std::pow(to_double(a, at), b.f), out), out);
  return make_int(pow_int(a.i, b.i), out);
}

template <typename T>
T load_raw(const graph::Tensor& t, int64_t k) {
  T value;
  std::memcpy(&value, static_cast<const char*>(t.data()) + k * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return value;
}

template <typename T>
void store_raw(graph::Tensor& t, int64_t k, T value) {
  std::memcpy(static_cast<char*>(t.mutable_data()) + k * static_cast<int64_t>(sizeof(T)), &value,
              sizeof(T));
}

}  // namespace

bool is_float_dtype(DType dtype) { return graph::is_floating(dtype); }

int64_t wrap_int(int64_t value, DType dtype) {
  switch (dtype) {
    case DType::kInt8:
      return static_cast<int8_t>(value);
    case DType::kUInt8:
      return static_cast<uint8_t>(value);
    case DType::kInt16:
      return static_cast<int16_t>(value);
    case DType::kUInt16:
      return static_cast<uint16_t>(value);
    case DType::kInt32:
      return static_cast<int32_t>(value);
    case DType::kUInt32:
      return static_cast<uint32_t>(value);
    case DType::kInt64:
    case DType::kUInt64:
      return value;
    case DType::kBool:
      return value != 0 ? 1 : 0;
    default:
      internal_error("interpreter: {} is not an integer dtype", graph::dtype_name(dtype));
  }
}

double round_float(double value, DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return value;
    case DType::kFloat32:
      return static_cast<float>(value);
    case DType::kFloat16:
      return graph::half_to_float(graph::float_to_half(static_cast<float>(value)));
    case DType::kBFloat16:
      return graph::bfloat16_to_float(graph::float_to_bfloat16(static_cast<float>(value)));
    default:
      internal_error("interpreter: {} is not a floating dtype", graph::dtype_name(dtype));
  }
}

Scalar from_double(double value, DType dtype) {
  if (is_float_dtype(dtype)) return make_float(value, dtype);
  if (dtype == DType::kBool) return make_bool(value != 0);
  return make_int(float_to_int(value, dtype), dtype);
}

double to_double(Scalar s, DType dtype) {
  if (is_float_dtype(dtype)) return s.f;
  if (is_unsigned_64(dtype)) return static_cast<double>(as_u64(s.i));
  return static_cast<double>(s.i);
}

Scalar cast(Scalar s, DType from, DType to) {
  if (to == DType::kBool) return make_bool(is_float_dtype(from) ? s.f != 0 : s.i != 0);
  if (is_float_dtype(to)) {
    if (is_float_dtype(from)) return make_float(s.f, to);
    if (to == DType::kFloat32) {  // one rounding step, as static_cast<float>(int64) does
      float f = is_unsigned_64(from) ? static_cast<float>(as_u64(s.i)) : static_cast<float>(s.i);
      return Scalar{f, 0};
    }
    return make_float(to_double(s, from), to);
  }
  if (is_float_dtype(from)) return make_int(float_to_int(s.f, to), to);
  return make_int(s.i, to);
}

Scalar apply_unary(OpCode code, Scalar a, DType in, DType out) {
  if (code == OpCode::kNot) {
    if (in != DType::kBool) bad_dtype(code, in);
    return make_bool(a.i == 0);
  }
  if (!is_float_dtype(in)) return unary_int(code, a.i, in, out);
  switch (code) {
    case OpCode::kIsNan:
      return make_bool(std::isnan(a.f));
    case OpCode::kIsPosInf:
      return make_bool(std::isinf(a.f) && a.f > 0);
    case OpCode::kIsNegInf:
      return make_bool(std::isinf(a.f) && a.f < 0);
    case OpCode::kBitNot:
      bad_dtype(code, in);
    default:
      return make_float(unary_float(code, a.f), out);
  }
}

Scalar apply_binary(OpCode code, Scalar a, DType at, Scalar b, DType bt, DType out) {
  if (code == OpCode::kPow) return apply_pow(a, at, b, bt, out);
  if (code == OpCode::kShl || code == OpCode::kShr) {
    if (is_float_dtype(at) || is_float_dtype(bt)) bad_dtype(code, at);
    return make_int(shift_int(code, a.i, b.i, at), out);
  }
  if (at != bt) {
    internal_error("interpreter: {} operands differ in dtype: {} vs {}", op_name(code),
                   graph::dtype_name(at), graph::dtype_name(bt));
  }
  if (is_comparison(code)) {
    if (is_float_dtype(at)) return make_bool(compare_float(code, a.f, b.f));
    if (is_unsigned_64(at)) return make_bool(compare_int(code, as_u64(a.i), as_u64(b.i)));
    return make_bool(compare_int(code, a.i, b.i));
  }
  switch (code) {
    case OpCode::kAnd:
      return make_bool(a.i != 0 && b.i != 0);
    case OpCode::kOr:
      return make_bool(a.i != 0 || b.i != 0);
    case OpCode::kXor:
      return make_bool((a.i != 0) != (b.i != 0));
    default:
      break;
  }
  if (is_float_dtype(at)) return make_float(binary_float(code, a.f, b.f), out);
  return make_int(binary_int(code, a.i, b.i, at), out);
}

Scalar to_storage(Scalar s, DType from, DType storage) {
  if (graph::is_small_float(storage)) {
    float value = static_cast<float>(cast(s, from, DType::kFloat32).f);
    uint8_t code = graph::float_to_small_float(storage, value);
    return Scalar{graph::small_float_to_float(storage, code), 0};
  }
  if (graph::is_small_integer(storage)) {
    return Scalar{0, graph::wrap_small_integer(storage, cast(s, from, DType::kInt32).i)};
  }
  return cast(s, from, storage);
}

Scalar bitcast(Scalar s, DType from, DType to) {
  // Through one element of each type, as generated code stores and reads it (little-endian).
  graph::Tensor stored(from, {});
  write_element(stored, 0, s, graph::compute_dtype(from));
  uint64_t bits = 0;
  std::memcpy(&bits, stored.data(), static_cast<size_t>(graph::dtype_size(from)));
  const int64_t width = graph::dtype_packed_bits(from);
  if (width < 64) bits &= (uint64_t{1} << width) - 1;  // a sub-byte type's own bits
  if (graph::is_small_integer(to)) {
    bits = static_cast<uint64_t>(graph::wrap_small_integer(to, static_cast<int64_t>(bits)));
  } else if (to == DType::kBool) {
    bits = bits != 0;
  }
  graph::Tensor read(to, {});
  std::memcpy(read.mutable_data(), &bits, static_cast<size_t>(graph::dtype_size(to)));
  return read_element(read, 0);
}

Scalar read_element(const graph::Tensor& tensor, int64_t k) {
  DType dtype = tensor.dtype();
  if (is_float_dtype(dtype) || graph::is_small_float(dtype)) {
    return Scalar{tensor.element_as_double(k), 0};
  }
  if (dtype == DType::kUInt64)
    return Scalar{0, static_cast<int64_t>(load_raw<uint64_t>(tensor, k))};
  if (dtype == DType::kString || dtype == DType::kUndefined) {
    user_error("the interpreter cannot read {} tensors", graph::dtype_name(dtype));
  }
  return Scalar{0, tensor.element_as_int64(k)};
}

void write_element(graph::Tensor& tensor, int64_t k, Scalar s, DType from) {
  DType dtype = tensor.dtype();
  if (graph::is_small_float(dtype)) {
    // Narrowed as generated stores narrow: without saturating (casts clamp before).
    float value = static_cast<float>(cast(s, from, DType::kFloat32).f);
    return store_raw<uint8_t>(tensor, k, graph::float_to_small_float(dtype, value));
  }
  if (graph::is_small_integer(dtype)) {
    int64_t value = graph::wrap_small_integer(dtype, cast(s, from, DType::kInt32).i);
    return store_raw<uint8_t>(tensor, k, static_cast<uint8_t>(value));
  }
  Scalar v = cast(s, from, dtype);
  switch (dtype) {
    case DType::kFloat32:
      return store_raw<float>(tensor, k, static_cast<float>(v.f));
    case DType::kFloat64:
      return store_raw<double>(tensor, k, v.f);
    case DType::kFloat16:
      return store_raw<uint16_t>(tensor, k, graph::float_to_half(static_cast<float>(v.f)));
    case DType::kBFloat16:
      return store_raw<uint16_t>(tensor, k, graph::float_to_bfloat16(static_cast<float>(v.f)));
    case DType::kInt8:
      return store_raw<int8_t>(tensor, k, static_cast<int8_t>(v.i));
    case DType::kUInt8:
      return store_raw<uint8_t>(tensor, k, static_cast<uint8_t>(v.i));
    case DType::kInt16:
      return store_raw<int16_t>(tensor, k, static_cast<int16_t>(v.i));
    case DType::kUInt16:
      return store_raw<uint16_t>(tensor, k, static_cast<uint16_t>(v.i));
    case DType::kInt32:
      return store_raw<int32_t>(tensor, k, static_cast<int32_t>(v.i));
    case DType::kUInt32:
      return store_raw<uint32_t>(tensor, k, static_cast<uint32_t>(v.i));
    case DType::kInt64:
      return store_raw<int64_t>(tensor, k, v.i);
    case DType::kUInt64:
      return store_raw<uint64_t>(tensor, k, as_u64(v.i));
    case DType::kBool:
      return store_raw<uint8_t>(tensor, k, v.i != 0 ? 1 : 0);
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kUInt4:
    case DType::kInt4:
    case DType::kFloat4E2M1:
    case DType::kFloat8E8M0:
    case DType::kUInt2:
    case DType::kInt2:
      internal_error("write_element: {} is narrowed above", graph::dtype_name(dtype));
    case DType::kString:
    case DType::kUndefined:
      break;
  }
  user_error("the interpreter cannot write {} tensors", graph::dtype_name(dtype));
}

}  // namespace kiln::ir::interp
