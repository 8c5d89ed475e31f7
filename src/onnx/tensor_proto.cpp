#include "onnx/tensor_proto.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/ranges.h>

#include "support/error.h"

namespace kiln::onnx {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;

static_assert(std::endian::native == std::endian::little,
              "raw_data is little-endian and copied as is");

namespace {

std::string dims_string(const std::vector<int64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

/// Dims of the proto, checked non-negative, and their element count, checked not to overflow.
std::vector<int64_t> checked_dims(const ::onnx::TensorProto& proto, const std::string& context,
                                  int64_t& numel, int64_t elem_size) {
  std::vector<int64_t> dims(proto.dims().begin(), proto.dims().end());
  numel = 1;
  // Bound by bytes as well as elements so nbytes cannot overflow either.
  int64_t limit = std::numeric_limits<int64_t>::max() / std::max<int64_t>(elem_size, 1);
  for (int64_t d : dims) {
    if (d < 0) user_error("{}: negative dimension in dims {}", context, dims_string(dims));
    if (d != 0 && numel > limit / d) {
      user_error("{}: dims {} give more elements than fit in memory", context, dims_string(dims));
    }
    numel *= d;
  }
  return dims;
}

void check_count(const std::string& context, const std::vector<int64_t>& dims, int64_t numel,
                 const char* field, int64_t count) {
  if (count == numel) return;
  user_error("{}: dims {} give {} elements but {} has {} values", context, dims_string(dims), numel,
             field, count);
}

/// Copies typed-field values into a fresh tensor, converting each with `convert`.
template <typename Out, typename Field, typename Convert>
Tensor from_field(DType dtype, std::vector<int64_t> dims, int64_t numel, const Field& field,
                  const char* field_name, const std::string& context, Convert convert) {
  check_count(context, dims, numel, field_name, field.size());
  Tensor t(dtype, std::move(dims));
  Out* out = static_cast<Out*>(t.mutable_data());
  for (int64_t i = 0; i < numel; ++i) out[i] = convert(field.Get(static_cast<int>(i)));
  return t;
}

template <typename T>
auto cast_to() {
  return [](auto v) { return static_cast<T>(v); };
}

/// The 4- and 2-bit types in int32_data: each int32 holds one packed byte.
Tensor from_packed_int32_data(const ::onnx::TensorProto& proto, DType dtype,
                              std::vector<int64_t> dims, int64_t numel,
                              const std::string& context) {
  const int64_t bytes = graph::dtype_packed_bytes(dtype, numel);
  if (proto.int32_data_size() != bytes) {
    user_error("{}: dims {} of {} need {} packed bytes but int32_data has {} values", context,
               dims_string(dims), graph::dtype_name(dtype), bytes, proto.int32_data_size());
  }
  std::vector<uint8_t> packed(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; ++i) {
    packed[static_cast<size_t>(i)] =
        static_cast<uint8_t>(proto.int32_data(static_cast<int>(i)) & 0xff);
  }
  Tensor t(dtype, std::move(dims));
  graph::unpack_sub_byte(dtype, packed.data(), numel, static_cast<uint8_t*>(t.mutable_data()));
  return t;
}

Tensor from_typed_fields(const ::onnx::TensorProto& proto, DType dtype, std::vector<int64_t> dims,
                         int64_t numel, const std::string& context) {
  auto bits16 = [](int32_t v) { return static_cast<uint16_t>(v & 0xffff); };
  switch (dtype) {
    case DType::kFloat32:
      return from_field<float>(dtype, std::move(dims), numel, proto.float_data(), "float_data",
                               context, cast_to<float>());
    case DType::kFloat64:
      return from_field<double>(dtype, std::move(dims), numel, proto.double_data(), "double_data",
                                context, cast_to<double>());
    case DType::kInt64:
      return from_field<int64_t>(dtype, std::move(dims), numel, proto.int64_data(), "int64_data",
                                 context, cast_to<int64_t>());
    case DType::kUInt32:
      return from_field<uint32_t>(dtype, std::move(dims), numel, proto.uint64_data(), "uint64_data",
                                  context, cast_to<uint32_t>());
    case DType::kUInt64:
      return from_field<uint64_t>(dtype, std::move(dims), numel, proto.uint64_data(), "uint64_data",
                                  context, cast_to<uint64_t>());
    case DType::kInt32:
      return from_field<int32_t>(dtype, std::move(dims), numel, proto.int32_data(), "int32_data",
                                 context, cast_to<int32_t>());
    case DType::kInt16:
      return from_field<int16_t>(dtype, std::move(dims), numel, proto.int32_data(), "int32_data",
                                 context, cast_to<int16_t>());
    case DType::kInt8:
      return from_field<int8_t>(dtype, std::move(dims), numel, proto.int32_data(), "int32_data",
                                context, cast_to<int8_t>());
    case DType::kUInt16:
      return from_field<uint16_t>(dtype, std::move(dims), numel, proto.int32_data(), "int32_data",
                                  context, cast_to<uint16_t>());
    case DType::kUInt8:
      return from_field<uint8_t>(dtype, std::move(dims), numel, proto.int32_data(), "int32_data",
                                 context, cast_to<uint8_t>());
    case DType::kBool:
      return from_field<uint8_t>(dtype, std::move(dims), numel, proto.int32_data(), "int32_data",
                                 context, [](int32_t v) { return uint8_t{v != 0}; });
    case DType::kFloat16:
    case DType::kBFloat16:
      // The spec stores the 16-bit pattern in the low bits of each int32.
      return from_field<uint16_t>(dtype, std::move(dims), numel, proto.int32_data(), "int32_data",
                                  context, bits16);
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kFloat8E8M0:
      // One 8-bit code in the low bits of each int32.
      return from_field<uint8_t>(dtype, std::move(dims), numel, proto.int32_data(), "int32_data",
                                 context, [](int32_t v) { return static_cast<uint8_t>(v & 0xff); });
    case DType::kUInt4:
    case DType::kInt4:
    case DType::kFloat4E2M1:
    case DType::kUInt2:
    case DType::kInt2:
      return from_packed_int32_data(proto, dtype, std::move(dims), numel, context);
    case DType::kString:
    case DType::kUndefined:
      break;
  }
  internal_error("from_typed_fields on {}", graph::dtype_name(dtype));
}

/// A read-only file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int64_t parse_external_int(const std::string& context, const std::string& key,
                           const std::string& value) {
  int64_t result = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), result);
  if (ec != std::errc() || end != value.data() + value.size() || result < 0) {
    user_error("{}: external data {} '{}' is not a non-negative integer", context, key, value);
  }
  return result;
}

/// True when `inner` (canonical) lies inside `dir` (canonical), comparing whole components.
bool is_inside(const fs::path& inner, const fs::path& dir) {
  auto [dir_end, inner_it] = std::mismatch(dir.begin(), dir.end(), inner.begin(), inner.end());
  return dir_end == dir.end() && inner_it != inner.end();
}

/// The file named by `location`, checked to be a relative path that stays inside `model_dir`
/// after following symlinks.
fs::path resolve_external_path(const std::string& location, const fs::path& model_dir,
                               const std::string& context) {
  if (location.empty()) user_error("{}: external data has an empty location", context);
  fs::path rel(location);
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    user_error(
        "{}: external data location '{}' is an absolute path; it must be relative to the "
        "model directory",
        context, location);
  }
  for (const fs::path& part : rel) {
    if (part == "..") {
      user_error(
          "{}: external data location '{}' contains '..'; it must stay inside the model "
          "directory",
          context, location);
    }
  }
  fs::path dir = model_dir.empty() ? fs::path(".") : model_dir;
  fs::path full = dir / rel;
  std::error_code ec;
  if (!fs::exists(full, ec)) {
    user_error("{}: external data file '{}' not found (looked for {})", context, location,
               full.string());
  }
  fs::path canonical_dir = fs::canonical(dir, ec);
  if (ec) user_error("{}: cannot resolve model directory {}", context, dir.string());
  fs::path canonical_file = fs::canonical(full, ec);
  if (ec) user_error("{}: cannot resolve external data file {}", context, full.string());
  if (!is_inside(canonical_file, canonical_dir)) {
    user_error("{}: external data location '{}' resolves to {}, outside the model directory {}",
               context, location, canonical_file.string(), canonical_dir.string());
  }
  return canonical_file;
}

Tensor external_tensor(const ::onnx::TensorProto& proto, DType dtype, std::vector<int64_t> dims,
                       int64_t numel, const fs::path& model_dir, const std::string& context) {
  if (dtype == DType::kString) {
    user_error("{}: string tensors cannot use external data", context);
  }
  std::string location;
  std::optional<int64_t> offset, length;
  for (const auto& entry : proto.external_data()) {
    if (entry.key() == "location") location = entry.value();
    if (entry.key() == "offset") offset = parse_external_int(context, "offset", entry.value());
    if (entry.key() == "length") length = parse_external_int(context, "length", entry.value());
  }
  fs::path path = resolve_external_path(location, model_dir, context);

  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) {
    user_error("{}: cannot open external data file {}: {}", context, path.string(),
               std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    user_error("{}: external data file {} is not a regular file", context, path.string());
  }
  auto file_size = static_cast<int64_t>(st.st_size);
  int64_t begin = offset.value_or(0);
  if (begin > file_size) {
    user_error("{}: external data offset {} is beyond the end of {} ({} bytes)", context, begin,
               path.string(), file_size);
  }
  int64_t expected = graph::dtype_packed_bytes(dtype, numel);
  // Without a length the data runs to the end of the file, as onnx's own loader reads it.
  int64_t size = length.value_or(file_size - begin);
  if (size > file_size - begin) {
    // Not begin + size, which overflows for a length near 2^63.
    user_error("{}: external data of length {} at offset {} runs past the end of {} ({} bytes)",
               context, size, begin, path.string(), file_size);
  }
  if (size != expected) {
    user_error("{}: dims {} of {} need {} bytes but external data length is {}", context,
               dims_string(dims), graph::dtype_name(dtype), expected, size);
  }
  if (size == 0) return Tensor(dtype, std::move(dims));

  // mmap needs a page-aligned file offset; map from the page start and point into it.
  int64_t page = ::sysconf(_SC_PAGESIZE);
  int64_t map_begin = begin / page * page;
  auto map_size = static_cast<size_t>(size + (begin - map_begin));
  void* base = ::mmap(nullptr, map_size, PROT_READ, MAP_PRIVATE, file.fd, map_begin);
  if (base == MAP_FAILED) {
    user_error("{}: cannot map external data file {}: {}", context, path.string(),
               std::strerror(errno));
  }
  std::shared_ptr<const void> mapping(
      base, [map_size](const void* p) { ::munmap(const_cast<void*>(p), map_size); });
  const char* data = static_cast<const char*>(base) + (begin - map_begin);
  if (graph::dtype_packed_bits(dtype) < 8) {
    // ONNX packs 4- and 2-bit elements; Kiln keeps a byte per element.
    Tensor t(dtype, std::move(dims));
    graph::unpack_sub_byte(dtype, reinterpret_cast<const uint8_t*>(data), numel,
                           static_cast<uint8_t*>(t.mutable_data()));
    return t;
  }
  if (begin % graph::dtype_size(dtype) != 0) {
    // A misaligned offset would make typed access misaligned: copy instead of borrowing.
    Tensor t(dtype, std::move(dims));
    std::memcpy(t.mutable_data(), data, static_cast<size_t>(size));
    return t;
  }
  return Tensor::mapped(dtype, std::move(dims), std::move(mapping), data,
                        static_cast<size_t>(size));
}

}  // namespace

Tensor tensor_from_proto(const ::onnx::TensorProto& proto, const fs::path& model_dir,
                         const std::string& context) {
  int32_t code = proto.data_type();
  std::optional<DType> maybe_dtype = graph::dtype_from_onnx(code);
  if (!maybe_dtype) {
    user_error("{}: unsupported tensor data type {} (code {})", context,
               graph::onnx_type_name(code), code);
  }
  DType dtype = *maybe_dtype;
  if (dtype == DType::kUndefined) user_error("{}: tensor data type is UNDEFINED (0)", context);
  if (proto.has_segment()) user_error("{}: segmented tensors are not supported", context);

  int64_t numel = 0;
  std::vector<int64_t> dims = checked_dims(proto, context, numel, graph::dtype_size(dtype));

  if (proto.data_location() == ::onnx::TensorProto_DataLocation_EXTERNAL) {
    return external_tensor(proto, dtype, std::move(dims), numel, model_dir, context);
  }
  if (dtype == DType::kString) {
    check_count(context, dims, numel, "string_data", proto.string_data_size());
    return Tensor::strings(std::move(dims),
                           {proto.string_data().begin(), proto.string_data().end()});
  }
  if (proto.has_raw_data()) {
    const std::string& raw = proto.raw_data();
    int64_t expected = graph::dtype_packed_bytes(dtype, numel);
    if (static_cast<int64_t>(raw.size()) != expected) {
      user_error("{}: dims {} of {} need {} bytes but raw_data has {}", context, dims_string(dims),
                 graph::dtype_name(dtype), expected, raw.size());
    }
    Tensor t(dtype, std::move(dims));
    if (graph::dtype_packed_bits(dtype) < 8) {
      graph::unpack_sub_byte(dtype, reinterpret_cast<const uint8_t*>(raw.data()), numel,
                             static_cast<uint8_t*>(t.mutable_data()));
      return t;
    }
    if (!raw.empty()) std::memcpy(t.mutable_data(), raw.data(), raw.size());
    if (dtype == DType::kBool) {
      // Normalise bools to 0/1 so downstream code may rely on it.
      for (uint8_t& b : t.mutable_values<uint8_t>()) b = b != 0;
    }
    return t;
  }
  return from_typed_fields(proto, dtype, std::move(dims), numel, context);
}

::onnx::TensorProto tensor_to_proto(const Tensor& t, const std::string& name) {
  KILN_CHECK(t.dtype() != DType::kUndefined, "tensor_to_proto on an undefined tensor '{}'", name);
  ::onnx::TensorProto proto;
  if (!name.empty()) proto.set_name(name);
  proto.set_data_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.dims()) proto.add_dims(d);
  if (t.dtype() == DType::kString) {
    for (const std::string& s : t.string_values()) proto.add_string_data(s);
    return proto;
  }
  if (graph::dtype_packed_bits(t.dtype()) < 8) {
    std::string packed(static_cast<size_t>(graph::dtype_packed_bytes(t.dtype(), t.numel())), '\0');
    graph::pack_sub_byte(t.dtype(), static_cast<const uint8_t*>(t.data()), t.numel(),
                         reinterpret_cast<uint8_t*>(packed.data()));
    proto.set_raw_data(std::move(packed));
    return proto;
  }
  proto.set_raw_data(static_cast<const char*>(t.data()), t.nbytes());
  return proto;
}

}  // namespace kiln::onnx
