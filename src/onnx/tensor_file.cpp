#include "onnx/tensor_file.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <onnx/onnx-data_pb.h>
#include "onnx/tensor_proto.h"
#include "support/error.h"
#include "support/files.h"

namespace kiln::onnx {

namespace fs = std::filesystem;
using graph::DType;
using graph::Tensor;

namespace {

constexpr std::string_view kNpyMagic = "\x93NUMPY";
constexpr size_t kNpyAlign = 64;
// numpy leaves room in the header for the first (C order) axis to grow to this many digits.
constexpr size_t kNpyGrowthDigits = 21;

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

/// A cursor over the header's Python dict literal, e.g.
/// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& what) : text_(text), what_(what) {}

  NpyHeader parse() {
    NpyHeader header;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      std::string key = parse_string();
      expect(':');
      skip_space();
      if (key == "descr") {
        if (peek() == '[') fail("structured (record) dtypes are not supported");
        header.descr = parse_string();
        seen_descr = true;
      } else if (key == "fortran_order") {
        header.fortran_order = parse_bool();
        seen_order = true;
      } else if (key == "shape") {
        header.shape = parse_shape();
        seen_shape = true;
      } else {
        fail(fmt::format("unexpected key '{}'", key));
      }
      skip_space();
      if (peek() == ',') ++pos_;
    }
    if (!seen_descr || !seen_order || !seen_shape) {
      fail("the header must have the keys 'descr', 'fortran_order' and 'shape'");
    }
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    user_error("{}: malformed .npy header: {} (header: {})", what_, problem, text_.substr(0, 200));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && std::strchr(" \t\r\n", text_[pos_]) != nullptr) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(fmt::format("expected '{}' at offset {}", c, pos_));
    ++pos_;
  }
  std::string parse_string() {
    skip_space();
    char quote = peek();
    if (quote != '\'' && quote != '"') fail(fmt::format("expected a string at offset {}", pos_));
    size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string result(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return result;
  }
  bool parse_bool() {
    for (auto [word, value] : {std::pair{std::string_view("True"), true}, {"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail("'fortran_order' must be True or False");
  }
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      int64_t value = 0;
      size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (value > (std::numeric_limits<int64_t>::max() - 9) / 10) fail("dimension too large");
        value = value * 10 + (text_[pos_++] - '0');
      }
      if (pos_ == start) fail(fmt::format("expected a dimension at offset {}", pos_));
      if (peek() == 'L') ++pos_;  // Python 2 long literals
      shape.push_back(value);
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        fail(fmt::format("expected ',' or ')' in shape at offset {}", pos_));
      }
    }
    ++pos_;
    return shape;
  }

  std::string_view text_;
  const std::string& what_;
  size_t pos_ = 0;
};

/// The DType of a numpy descr such as "<f4" or "|b1"; throws UserError for any other.
DType dtype_from_descr(const std::string& descr, const std::string& what) {
  auto unsupported = [&](std::string_view why) {
    user_error("{}: unsupported numpy dtype '{}': {}", what, descr, why);
  };
  if (descr.size() < 2 || std::string_view("<>|=").find(descr[0]) == std::string_view::npos) {
    unsupported("expected a byte order (<, >, | or =), a kind and a size, e.g. '<f4'");
  }
  char order = descr[0];
  std::string_view type = std::string_view(descr).substr(1);
  struct Entry {
    std::string_view type;
    DType dtype;
  };
  static constexpr Entry kTable[] = {
      {"f2", DType::kFloat16}, {"f4", DType::kFloat32}, {"f8", DType::kFloat64},
      {"i1", DType::kInt8},    {"i2", DType::kInt16},   {"i4", DType::kInt32},
      {"i8", DType::kInt64},   {"u1", DType::kUInt8},   {"u2", DType::kUInt16},
      {"u4", DType::kUInt32},  {"u8", DType::kUInt64},  {"b1", DType::kBool},
      {"?", DType::kBool},
  };
  for (const Entry& e : kTable) {
    if (type != e.type) continue;
    if (order == '>' && graph::dtype_size(e.dtype) > 1) {
      unsupported(
          "big-endian data is not supported (convert with "
          "arr.astype(arr.dtype.newbyteorder('<')))");
    }
    return e.dtype;
  }
  unsupported(
      "Kiln reads float16/32/64, int8/16/32/64, uint8/16/32/64 and bool (numpy has no bfloat16)");
  internal_error("unreachable");
}

std::string_view npy_descr(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "<f2";
    case DType::kFloat32:
      return "<f4";
    case DType::kFloat64:
      return "<f8";
    case DType::kInt8:
      return "|i1";
    case DType::kInt16:
      return "<i2";
    case DType::kInt32:
      return "<i4";
    case DType::kInt64:
      return "<i8";
    case DType::kUInt8:
      return "|u1";
    case DType::kUInt16:
      return "<u2";
    case DType::kUInt32:
      return "<u4";
    case DType::kUInt64:
      return "<u8";
    case DType::kBool:
      return "|b1";
    default:
      return "";
  }
}

/// Python's repr of a shape tuple: "()", "(5,)", "(2, 3)".
std::string shape_repr(const std::vector<int64_t>& dims) {
  if (dims.size() == 1) return fmt::format("({},)", dims[0]);
  return fmt::format("({})", fmt::join(dims, ", "));
}

uint32_t read_le(std::string_view bytes, size_t at, size_t width) {
  uint32_t value = 0;
  for (size_t i = 0; i < width; ++i) {
    value |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
  }
  return value;
}

/// Copies Fortran-order elements into C order (last index fastest).
void fortran_to_c(const char* src, char* dst, const std::vector<int64_t>& dims, size_t elem) {
  size_t rank = dims.size();
  std::vector<int64_t> f_stride(rank, 1), index(rank, 0);
  for (size_t k = 1; k < rank; ++k) f_stride[k] = f_stride[k - 1] * dims[k - 1];
  int64_t numel = 1;
  for (int64_t d : dims) numel *= d;
  int64_t src_offset = 0;
  for (int64_t i = 0; i < numel; ++i) {
    std::memcpy(dst + i * elem, src + src_offset * elem, elem);
    for (size_t k = rank; k-- > 0;) {  // odometer step in C order
      src_offset += f_stride[k];
      if (++index[k] < dims[k]) break;
      src_offset -= f_stride[k] * dims[k];
      index[k] = 0;
    }
  }
}

Tensor read_pb(const fs::path& path) {
  std::string bytes = files::read(path);
  ::onnx::TensorProto proto;
  if (!proto.ParseFromString(bytes)) {
    user_error("{}: not a valid TensorProto file (protobuf parse failed on {} bytes)",
               path.string(), bytes.size());
  }
  // SequenceProto / OptionalProto files parse as a TensorProto whose field 3 (their values, our
  // segment) is set or whose data type is 0; say so rather than report odd dims.
  if (proto.has_segment() || proto.data_type() == 0) {
    user_error(
        "{}: does not hold a plain TensorProto (no data type or a segment field set; is "
        "it an onnx SequenceProto or OptionalProto?)",
        path.string());
  }
  return tensor_from_proto(proto, path.parent_path(), path.string());
}

}  // namespace

Tensor decode_npy(std::string_view bytes, const std::string& what) {
  if (bytes.size() < 10 || bytes.substr(0, kNpyMagic.size()) != kNpyMagic) {
    user_error("{}: not a .npy file (missing the \\x93NUMPY magic)", what);
  }
  auto major = static_cast<uint8_t>(bytes[6]);
  auto minor = static_cast<uint8_t>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    user_error("{}: unsupported .npy format version {}.{} (Kiln reads 1.0, 2.0 and 3.0)", what,
               major, minor);
  }
  size_t len_width = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_width) user_error("{}: truncated .npy header", what);
  size_t header_len = read_le(bytes, 8, len_width);
  size_t data_begin = 8 + len_width + header_len;
  if (bytes.size() < data_begin) {
    user_error("{}: truncated .npy header: it declares {} bytes but the file has {} in all", what,
               header_len, bytes.size());
  }
  NpyHeader header = HeaderParser(bytes.substr(8 + len_width, header_len), what).parse();
  DType dtype = dtype_from_descr(header.descr, what);

  int64_t elem = graph::dtype_size(dtype);
  int64_t numel = 1;
  for (int64_t d : header.shape) {
    if (d != 0 && numel > std::numeric_limits<int64_t>::max() / elem / d) {
      user_error("{}: shape {} is too large", what, shape_repr(header.shape));
    }
    numel *= d;
  }
  auto expected = static_cast<size_t>(numel * elem);
  size_t found = bytes.size() - data_begin;
  if (found != expected) {
    user_error("{}: shape {} of {} needs {} data bytes but the file has {}{}", what,
               shape_repr(header.shape), graph::dtype_name(dtype), expected, found,
               found < expected ? " (truncated)" : " (trailing bytes)");
  }
  Tensor t(dtype, header.shape);
  if (expected == 0) return t;
  auto* out = static_cast<char*>(t.mutable_data());
  const char* src = bytes.data() + data_begin;
  if (header.fortran_order && header.shape.size() > 1) {
    fortran_to_c(src, out, header.shape, static_cast<size_t>(elem));
  } else {
    std::memcpy(out, src, expected);
  }
  if (dtype == DType::kBool) {
    for (uint8_t& b : t.mutable_values<uint8_t>()) b = b != 0;
  }
  return t;
}

std::string encode_npy(const Tensor& t, const std::string& what) {
  if (t.dtype() == DType::kBFloat16 || graph::is_small_float(t.dtype()) ||
      graph::is_small_integer(t.dtype())) {
    user_error("{}: numpy has no {}; write the tensor as .pb instead", what,
               graph::dtype_name(t.dtype()));
  }
  if (t.dtype() == DType::kString) {
    user_error("{}: string tensors cannot be written as .npy; write .pb instead", what);
  }
  std::string_view descr = npy_descr(t.dtype());
  KILN_CHECK(!descr.empty(), "no numpy descr for {}", graph::dtype_name(t.dtype()));
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr,
                                 shape_repr(t.dims()));
  if (!t.dims().empty()) {
    size_t digits = std::to_string(t.dims()[0]).size();
    if (digits < kNpyGrowthDigits) dict.append(kNpyGrowthDigits - digits, ' ');
  }
  // Pad with spaces and end with a newline so that the data starts on a 64-byte boundary; like
  // numpy, a header already aligned still gets a full 64 bytes of padding.
  size_t unpadded = kNpyMagic.size() + 4 + dict.size() + 1;
  dict.append(kNpyAlign - unpadded % kNpyAlign, ' ');
  dict.push_back('\n');
  if (dict.size() > 0xffff) user_error("{}: .npy header too long for format 1.0", what);

  std::string out;
  out.reserve(10 + dict.size() + t.nbytes());
  out.append(kNpyMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(dict.size() & 0xff));
  out.push_back(static_cast<char>(dict.size() >> 8));
  out.append(dict);
  out.append(static_cast<const char*>(t.data()), t.nbytes());
  return out;
}

Tensor read_tensor_file(const fs::path& path) {
  std::string ext = path.extension().string();
  if (ext == ".pb") return read_pb(path);
  if (ext == ".npy") return decode_npy(files::read(path), path.string());
  user_error("{}: unknown tensor file extension '{}' (expected .pb or .npy)", path.string(), ext);
}

namespace {

graph::IoValue sequence_from_proto(const ::onnx::SequenceProto& proto, const fs::path& path) {
  if (proto.elem_type() != ::onnx::SequenceProto::TENSOR &&
      proto.elem_type() != ::onnx::SequenceProto::UNDEFINED) {
    user_error("{}: a sequence of non-tensors (elem_type {}) is not supported", path.string(),
               static_cast<int>(proto.elem_type()));
  }
  graph::IoValue v;
  v.kind = graph::ValueKind::kSequence;
  for (const auto& t : proto.tensor_values())
    v.tensors.push_back(tensor_from_proto(t, path.parent_path(), path.string()));
  return v;
}

}  // namespace

graph::IoValue read_value_file(const fs::path& path, const graph::Type& type) {
  if (type.kind == graph::ValueKind::kTensor) return graph::IoValue::tensor(read_tensor_file(path));
  if (path.extension() != ".pb") {
    user_error("{}: a {} value is read from a .pb file (an onnx SequenceProto or OptionalProto)",
               path.string(), type.str());
  }
  std::string bytes = files::read(path);
  if (type.kind == graph::ValueKind::kSequence) {
    ::onnx::SequenceProto proto;
    if (!proto.ParseFromString(bytes))
      user_error("{}: not a valid SequenceProto file", path.string());
    return sequence_from_proto(proto, path);
  }
  ::onnx::OptionalProto proto;
  if (!proto.ParseFromString(bytes))
    user_error("{}: not a valid OptionalProto file", path.string());
  graph::IoValue v;
  if (proto.has_sequence_value()) {
    v = sequence_from_proto(proto.sequence_value(), path);
  } else if (proto.has_tensor_value()) {
    v.tensors.push_back(tensor_from_proto(proto.tensor_value(), path.parent_path(), path.string()));
  } else {
    v.present = false;
    bool sequence = type.element && type.element->kind == graph::ValueKind::kSequence;
    v.kind = sequence ? graph::ValueKind::kSequence : graph::ValueKind::kTensor;
  }
  v.optional = true;
  return v;
}

void write_tensor_file(const Tensor& t, const fs::path& path, const std::string& name) {
  std::string ext = path.extension().string();
  if (ext == ".npy") {
    files::write_atomic(path, encode_npy(t, path.string()));
    return;
  }
  if (ext == ".pb") {
    std::string bytes;
    if (!tensor_to_proto(t, name).SerializeToString(&bytes)) {
      user_error("{}: cannot serialize the tensor (over protobuf's 2 GiB limit?)", path.string());
    }
    files::write_atomic(path, bytes);
    return;
  }
  user_error("{}: unknown tensor file extension '{}' (expected .pb or .npy)", path.string(), ext);
}

std::string tensor_summary(const Tensor& t) {
  constexpr int64_t kShown = 6;
  std::string out = fmt::format("{}[{}]", graph::dtype_name(t.dtype()), fmt::join(t.dims(), ", "));
  int64_t n = t.numel();
  if (n == 0) return out + " (empty)";
  std::vector<std::string> shown;
  if (t.dtype() == DType::kString) {
    for (int64_t i = 0; i < std::min(n, kShown); ++i) {
      const std::string& s = t.string_values()[static_cast<size_t>(i)];
      shown.push_back(s.size() <= 24 ? fmt::format("\"{}\"", s)
                                     : fmt::format("\"{}...\"", s.substr(0, 21)));
    }
    if (n > kShown) shown.emplace_back("...");
    return fmt::format("{} values=[{}]", out, fmt::join(shown, ", "));
  }
  bool floating = graph::is_floating(t.dtype()) || t.dtype() == DType::kUInt64;
  auto show = [&](double v) {
    // Integers print exactly while doubles hold them exactly (below 2^53).
    if (floating || std::abs(v) >= 9007199254740992.0) return fmt::format("{:.6g}", v);
    return fmt::format("{}", static_cast<int64_t>(v));
  };
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0;
  int64_t nans = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = t.element_as_double(i);
    if (std::isnan(v)) {
      ++nans;
      continue;
    }
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  for (int64_t i = 0; i < std::min(n, kShown); ++i) {
    shown.push_back(floating ? show(t.element_as_double(i))
                             : fmt::format("{}", t.element_as_int64(i)));
  }
  if (n > kShown) shown.emplace_back("...");
  if (nans == n) return fmt::format("{} all nan values=[{}]", out, fmt::join(shown, ", "));
  std::string result = fmt::format("{} min={} max={} mean={:.6g}", out, show(lo), show(hi),
                                   sum / static_cast<double>(n - nans));
  if (nans > 0) result += fmt::format(" nan={}", nans);
  return fmt::format("{} values=[{}]", result, fmt::join(shown, ", "));
}

}  // namespace kiln::onnx
