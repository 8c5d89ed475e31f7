// A small .npy reader and writer for the example (numpy's format 1.0 to 3.0, little-endian,
// C order): float32, float64, int64, int32, uint8, int8 and bool arrays.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace npy {

struct DtypeName {
  kiln_dtype dtype;
  const char* descr;  // numpy's dtype string
};

inline constexpr DtypeName kDtypes[] = {
    {KILN_FLOAT32, "<f4"}, {KILN_FLOAT64, "<f8"}, {KILN_INT64, "<i8"}, {KILN_INT32, "<i4"},
    {KILN_UINT8, "|u1"},   {KILN_INT8, "|i1"},    {KILN_BOOL, "|b1"},
};

/// The value of `key` in the header dict, e.g. "'<f4'" or "(2, 3)".
inline std::string header_field(const std::string& header, const std::string& key,
                                const std::string& path) {
  const size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) throw std::runtime_error(path + ": no '" + key + "' in header");
  size_t begin = header.find(':', at) + 1;
  while (header[begin] == ' ') ++begin;
  size_t end = begin;
  if (header[begin] == '(') {
    end = header.find(')', begin) + 1;
  } else {
    while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  }
  return header.substr(begin, end - begin);
}

inline kiln::Tensor read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw std::runtime_error(path + ": not a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  const size_t length_bytes = major == 1 ? 2 : 4;
  size_t header_len = 0;
  for (size_t i = 0; i < length_bytes; ++i)
    header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  const size_t data_at = 8 + length_bytes + header_len;
  if (bytes.size() < data_at) throw std::runtime_error(path + ": truncated header");
  const std::string header = bytes.substr(8 + length_bytes, header_len);

  std::string descr = header_field(header, "descr", path);
  descr = descr.substr(1, descr.size() - 2);                 // strip the quotes
  if (descr.size() == 3 && descr[2] == '1') descr[0] = '|';  // one byte: no byte order
  const DtypeName* found = nullptr;
  for (const DtypeName& d : kDtypes) {
    if (descr == d.descr) found = &d;
  }
  if (found == nullptr) throw std::runtime_error(path + ": unsupported dtype " + descr);
  if (header_field(header, "fortran_order", path) != "False")
    throw std::runtime_error(path + ": Fortran-order arrays are not supported");

  std::vector<int64_t> shape;
  const std::string dims = header_field(header, "shape", path);
  for (size_t i = 1; i < dims.size();) {
    if (dims[i] >= '0' && dims[i] <= '9') {
      size_t used = 0;
      shape.push_back(std::stoll(dims.substr(i), &used));
      i += used;
    } else {
      ++i;
    }
  }
  kiln::Tensor tensor(found->dtype, shape);
  if (bytes.size() - data_at != tensor.bytes())
    throw std::runtime_error(path + ": data size does not match the shape");
  if (tensor.bytes() > 0) std::memcpy(tensor.data(), bytes.data() + data_at, tensor.bytes());
  return tensor;
}

inline void write(const std::string& path, const kiln::Tensor& tensor) {
  const char* descr = nullptr;
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == tensor.dtype()) descr = d.descr;
  }
  if (descr == nullptr)
    throw std::runtime_error(path + ": no .npy dtype for kiln dtype " +
                             std::to_string(tensor.dtype()));
  std::string shape = "(";
  for (int64_t d : tensor.shape()) shape += std::to_string(d) + ", ";
  if (tensor.shape().size() > 1) shape.resize(shape.size() - 2);  // (2, 3) but (2,)
  if (tensor.shape().size() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string header =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Pad with spaces so the data starts 64-byte aligned, ending in a newline (as numpy does).
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';

  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error(path + ": cannot write");
  out.write("\x93NUMPY\x01\x00", 8);
  const char length[2] = {static_cast<char>(header.size() & 0xff),
                          static_cast<char>(header.size() >> 8)};
  out.write(length, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(tensor.data()), static_cast<std::streamsize>(tensor.bytes()));
  if (!out) throw std::runtime_error(path + ": write failed");
}

}  // namespace npy
