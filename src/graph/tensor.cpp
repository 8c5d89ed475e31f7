#include "graph/tensor.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime/kiln_small_types.h"
#include "support/error.h"

namespace kiln::graph {

namespace {

constexpr size_t kAlignment = 64;

/// Product of dims, checking that none is negative and that the product fits.
int64_t checked_numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    KILN_CHECK(d >= 0, "negative dimension {} in tensor dims", d);
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      internal_error("tensor dims overflow int64 in their product");
    }
    n *= d;
  }
  return n;
}

size_t checked_nbytes(DType dtype, const std::vector<int64_t>& dims) {
  int64_t n = checked_numel(dims);
  int64_t size = dtype_size(dtype);
  if (size != 0 && n > std::numeric_limits<int64_t>::max() / size) {
    internal_error("tensor of {} elements of {} overflows int64 bytes", n, dtype_name(dtype));
  }
  return static_cast<size_t>(n * size);
}

template <typename T>
T load(const void* data, int64_t i) {
  T value;
  std::memcpy(&value, static_cast<const char*>(data) + i * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return value;
}

/// Saturating float-to-int64 conversion (truncation toward zero); NaN gives 0. A plain cast is
/// undefined behaviour out of range.
int64_t saturate_to_int64(double value) {
  if (std::isnan(value)) return 0;
  if (value >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (value < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(value);
}

}  // namespace

Tensor::Tensor(DType dtype, std::vector<int64_t> dims)
    : dtype_(dtype), dims_(std::move(dims)), owned_(true) {
  KILN_CHECK(dtype != DType::kUndefined, "tensor of undefined dtype");
  if (dtype == DType::kString) {
    strings_.resize(static_cast<size_t>(checked_numel(dims_)));
    return;
  }
  nbytes_ = checked_nbytes(dtype_, dims_);
  // Always allocate at least one aligned block so data() is never null, even for empty tensors.
  size_t alloc = (nbytes_ + kAlignment - 1) / kAlignment * kAlignment;
  if (alloc == 0) alloc = kAlignment;
  void* p = ::operator new (alloc, std::align_val_t{kAlignment});
  std::memset(p, 0, alloc);
  storage_ = std::shared_ptr<void>(
      p, [](void* q) { ::operator delete (q, std::align_val_t{kAlignment}); });
  data_ = p;
}

Tensor::Tensor(DType dtype, std::vector<int64_t> dims, std::shared_ptr<const void> owner,
               const void* data, size_t nbytes)
    : dtype_(dtype),
      dims_(std::move(dims)),
      storage_(std::move(owner)),
      data_(data),
      owned_(false),
      nbytes_(nbytes) {
  KILN_CHECK(dtype != DType::kUndefined && dtype != DType::kString,
             "borrowed tensor storage needs a numeric dtype, got {}", dtype_name(dtype));
  size_t expected = checked_nbytes(dtype_, dims_);
  KILN_CHECK(nbytes == expected, "borrowed tensor has {} bytes, dims need {}", nbytes, expected);
  KILN_CHECK(data != nullptr || nbytes == 0, "borrowed tensor data is null");
}

Tensor Tensor::mapped(DType dtype, std::vector<int64_t> dims, std::shared_ptr<const void> owner,
                      const void* data, size_t nbytes) {
  Tensor t(dtype, std::move(dims), std::move(owner), data, nbytes);
  t.mapped_ = true;
  return t;
}

void Tensor::release_pages() const {
  if (!mapped_ || nbytes_ == 0) return;
  // The whole pages the bytes touch: the mapping covers them (see mapped()), and for a read-only
  // private file mapping MADV_DONTNEED only forgets them (there are no private copies to lose).
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data_) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data_) + nbytes_ + page - 1) / page * page;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

Tensor Tensor::spilled(DType dtype, std::vector<int64_t> dims, const void* data,
                       const std::filesystem::path& dir) {
  const size_t nbytes = checked_nbytes(dtype, dims);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // O_TMPFILE: a file with no name, gone when the last mapping of it is; where the file system
  // lacks it, a named file unlinked at once.
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string name = (dir / "kiln-spill-XXXXXX").string();
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  auto fail = [&](const char* what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    user_error("{}: cannot {} a temporary file of {} bytes for a prepacked weight: {}",
               dir.string(), what, nbytes, std::strerror(err));
  };
  if (fd < 0) fail("create");
  const auto* bytes = static_cast<const char*>(data);
  for (size_t done = 0; done < nbytes;) {
    const ssize_t n = ::write(fd, bytes + done, nbytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write");
    done += static_cast<size_t>(n);
  }
  const size_t map_bytes = nbytes == 0 ? 1 : nbytes;
  if (nbytes == 0 && ::ftruncate(fd, 1) != 0) fail("write");
  void* base = ::mmap(nullptr, map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) fail("map");
  ::close(fd);
  std::shared_ptr<const void> mapping(
      base, [map_bytes](const void* p) { ::munmap(const_cast<void*>(p), map_bytes); });
  return mapped(dtype, std::move(dims), std::move(mapping), base, nbytes);
}

Tensor Tensor::strings(std::vector<int64_t> dims, std::vector<std::string> values) {
  Tensor t;
  t.dtype_ = DType::kString;
  t.dims_ = std::move(dims);
  int64_t n = checked_numel(t.dims_);
  KILN_CHECK(static_cast<int64_t>(values.size()) == n, "string tensor has {} values, dims need {}",
             values.size(), n);
  t.strings_ = std::move(values);
  t.owned_ = true;
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

void* Tensor::mutable_data() {
  if (!owned_) internal_error("mutable_data() on a tensor that borrows its bytes");
  // Owned bytes were allocated non-const by the constructor above.
  return const_cast<void*>(data_);
}

double Tensor::element_as_double(int64_t i) const {
  KILN_CHECK(i >= 0 && i < numel(), "element {} out of range for {} elements", i, numel());
  switch (dtype_) {
    case DType::kFloat32:
      return load<float>(data_, i);
    case DType::kFloat64:
      return load<double>(data_, i);
    case DType::kFloat16:
      return half_to_float(load<uint16_t>(data_, i));
    case DType::kBFloat16:
      return bfloat16_to_float(load<uint16_t>(data_, i));
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat4E2M1:
    case DType::kFloat8E8M0:
      return small_float_to_float(dtype_, load<uint8_t>(data_, i));
    case DType::kInt4:
    case DType::kInt2:
      return load<int8_t>(data_, i);
    case DType::kUInt4:
    case DType::kUInt2:
      return load<uint8_t>(data_, i);
    case DType::kUInt8:
      return load<uint8_t>(data_, i);
    case DType::kInt8:
      return load<int8_t>(data_, i);
    case DType::kUInt16:
      return load<uint16_t>(data_, i);
    case DType::kInt16:
      return load<int16_t>(data_, i);
    case DType::kInt32:
      return load<int32_t>(data_, i);
    case DType::kInt64:
      return static_cast<double>(load<int64_t>(data_, i));
    case DType::kUInt32:
      return load<uint32_t>(data_, i);
    case DType::kUInt64:
      return static_cast<double>(load<uint64_t>(data_, i));
    case DType::kBool:
      return load<uint8_t>(data_, i) != 0 ? 1.0 : 0.0;
    case DType::kString:
    case DType::kUndefined:
      break;
  }
  internal_error("element_as_double on a {} tensor", dtype_name(dtype_));
}

int64_t Tensor::element_as_int64(int64_t i) const {
  KILN_CHECK(i >= 0 && i < numel(), "element {} out of range for {} elements", i, numel());
  switch (dtype_) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat4E2M1:
    case DType::kFloat8E8M0:
      return saturate_to_int64(element_as_double(i));
    case DType::kInt4:
    case DType::kInt2:
      return load<int8_t>(data_, i);
    case DType::kUInt4:
    case DType::kUInt2:
      return load<uint8_t>(data_, i);
    case DType::kUInt8:
      return load<uint8_t>(data_, i);
    case DType::kInt8:
      return load<int8_t>(data_, i);
    case DType::kUInt16:
      return load<uint16_t>(data_, i);
    case DType::kInt16:
      return load<int16_t>(data_, i);
    case DType::kInt32:
      return load<int32_t>(data_, i);
    case DType::kInt64:
      return load<int64_t>(data_, i);
    case DType::kUInt32:
      return load<uint32_t>(data_, i);
    case DType::kUInt64: {
      uint64_t v = load<uint64_t>(data_, i);
      return v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>(v);
    }
    case DType::kBool:
      return load<uint8_t>(data_, i) != 0 ? 1 : 0;
    case DType::kString:
    case DType::kUndefined:
      break;
  }
  internal_error("element_as_int64 on a {} tensor", dtype_name(dtype_));
}

float half_to_float(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf or nan; the payload moves up unchanged
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t float_to_half(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t exponent = (bits >> 23) & 0xffu;
  uint32_t mantissa = bits & 0x7fffffu;
  if (exponent == 0xff) {
    if (mantissa == 0) return sign | 0x7c00u;
    // Keep the top payload bits and force the quiet bit so a nan never turns into inf.
    return static_cast<uint16_t>(sign | 0x7e00u | (mantissa >> 13));
  }
  int32_t e = static_cast<int32_t>(exponent) - 127 + 15;  // biased half exponent
  if (e >= 31) return sign | 0x7c00u;                     // >= 2^16: overflows to inf
  if (e <= 0) {
    // Half subnormal (or zero): value / 2^-24, rounded to nearest even. Below 2^-25 (e < -10)
    // everything rounds to zero; float subnormals land here too.
    if (e < -10) return sign;
    uint32_t m = mantissa | 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t result = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;  // may carry to normal
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;  // carry may reach inf
  return static_cast<uint16_t>(sign | result);
}

float bfloat16_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bfloat16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // nan stays a (quiet) nan
  }
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float small_float_to_float(DType dtype, uint8_t code) {
  switch (dtype) {
    case DType::kFloat8E4M3FN:
      return f8e4m3fn_to_float(code);
    case DType::kFloat8E4M3FNUZ:
      return f8e4m3fnuz_to_float(code);
    case DType::kFloat8E5M2:
      return f8e5m2_to_float(code);
    case DType::kFloat8E5M2FNUZ:
      return f8e5m2fnuz_to_float(code);
    case DType::kFloat4E2M1:
      return f4e2m1_to_float(code);
    case DType::kFloat8E8M0:
      return f8e8m0_to_float(code);
    default:
      internal_error("small_float_to_float on {}", dtype_name(dtype));
  }
}

uint8_t float_to_small_float(DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat8E4M3FN:
      return float_to_f8e4m3fn(value);
    case DType::kFloat8E4M3FNUZ:
      return float_to_f8e4m3fnuz(value);
    case DType::kFloat8E5M2:
      return float_to_f8e5m2(value);
    case DType::kFloat8E5M2FNUZ:
      return float_to_f8e5m2fnuz(value);
    case DType::kFloat4E2M1:
      return float_to_f4e2m1(value);
    case DType::kFloat8E8M0:
      return float_to_f8e8m0(value);
    default:
      internal_error("float_to_small_float on {}", dtype_name(dtype));
  }
}

int64_t wrap_small_integer(DType dtype, int64_t value) {
  auto v = static_cast<int32_t>(static_cast<uint64_t>(value) & 0xFFu);
  switch (dtype) {
    case DType::kInt4:
      return wrap_int4(v);
    case DType::kUInt4:
      return wrap_uint4(v);
    case DType::kInt2:
      return wrap_int2(v);
    case DType::kUInt2:
      return wrap_uint2(v);
    default:
      internal_error("wrap_small_integer on {}", dtype_name(dtype));
  }
}

void unpack_sub_byte(DType dtype, const uint8_t* packed, int64_t numel, uint8_t* elements) {
  const int64_t bits = dtype_packed_bits(dtype);
  KILN_CHECK(bits == 4 || bits == 2, "unpack_sub_byte on {}", dtype_name(dtype));
  const int64_t per_byte = 8 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const bool is_signed_type = dtype == DType::kInt4 || dtype == DType::kInt2;
  for (int64_t i = 0; i < numel; ++i) {
    auto shift = static_cast<uint32_t>((i % per_byte) * bits);
    uint32_t v = (static_cast<uint32_t>(packed[i / per_byte]) >> shift) & mask;
    if (is_signed_type && (v & (1u << (bits - 1))) != 0) v |= ~mask;  // sign-extend
    elements[i] = static_cast<uint8_t>(v & 0xFFu);
  }
}

void pack_sub_byte(DType dtype, const uint8_t* elements, int64_t numel, uint8_t* packed) {
  const int64_t bits = dtype_packed_bits(dtype);
  KILN_CHECK(bits == 4 || bits == 2, "pack_sub_byte on {}", dtype_name(dtype));
  const int64_t per_byte = 8 / bits;
  const uint32_t mask = (1u << bits) - 1;
  std::memset(packed, 0, static_cast<size_t>(dtype_packed_bytes(dtype, numel)));
  for (int64_t i = 0; i < numel; ++i) {
    auto shift = static_cast<uint32_t>((i % per_byte) * bits);
    packed[i / per_byte] =
        static_cast<uint8_t>(packed[i / per_byte] | ((elements[i] & mask) << shift));
  }
}

}  // namespace kiln::graph
