#pragma once
/// A concrete host tensor: dtype, static dims, and contiguous row-major bytes. Used for
/// initializers, constants folded at compile time, and the inputs and outputs of runs. The bytes
/// may be owned or borrowed from a memory mapping (external data), kept alive by `storage`.
/// A tensor over a read-only file mapping (Tensor::mapped) may give its pages back to the kernel
/// once read (release_pages): a model's weights then need not all be resident at once.
/// String tensors hold their elements in `strings` instead of bytes.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/dtype.h"

namespace kiln::graph {

class Tensor {
 public:
  Tensor() = default;
  /// A zero-filled tensor owning its bytes.
  Tensor(DType dtype, std::vector<int64_t> dims);
  /// A tensor over bytes owned by `owner` (e.g. a memory mapping).
  Tensor(DType dtype, std::vector<int64_t> dims, std::shared_ptr<const void> owner,
         const void* data, size_t nbytes);
  /// A tensor over a read-only, private memory mapping of a file that `owner` unmaps. The
  /// mapping must cover the pages `data` .. `data + nbytes` touch, and nothing may write to it.
  static Tensor mapped(DType dtype, std::vector<int64_t> dims, std::shared_ptr<const void> owner,
                       const void* data, size_t nbytes);
  /// A mapped tensor (see mapped()) over a copy of `data` (the bytes `dims` of `dtype` need) in
  /// an unlinked temporary file of `dir`: the bytes live in the page cache, which the kernel
  /// may write back and evict, instead of in this process's memory (compile time keeps large
  /// prepacked weights so until it writes them out). Throws UserError naming `dir` when the file
  /// cannot be written (e.g. the disk is full).
  static Tensor spilled(DType dtype, std::vector<int64_t> dims, const void* data,
                        const std::filesystem::path& dir);
  /// A string tensor.
  static Tensor strings(std::vector<int64_t> dims, std::vector<std::string> values);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  int64_t numel() const;
  size_t nbytes() const { return nbytes_; }
  const void* data() const { return data_; }
  /// Whether the bytes are a read-only file mapping (Tensor::mapped).
  bool is_mapped() const { return mapped_; }
  /// For a mapped tensor, drops its pages from this process's resident memory (madvise
  /// MADV_DONTNEED): they stay in the page cache, and a later read maps them again. Nothing for
  /// other tensors. Callers that have read a large weight once (to pack it, to write it out)
  /// call this so that a model's weights are not all resident together.
  void release_pages() const;
  /// Mutable bytes; only for tensors that own them (throws InternalError otherwise).
  void* mutable_data();
  template <typename T>
  std::span<const T> values() const {
    return {static_cast<const T*>(data_), static_cast<size_t>(numel())};
  }
  template <typename T>
  std::span<T> mutable_values() {
    return {static_cast<T*>(mutable_data()), static_cast<size_t>(numel())};
  }
  const std::vector<std::string>& string_values() const { return strings_; }

  /// Element i converted to double / int64 (any numeric dtype, 16-, 8- and 4-bit floats decoded).
  double element_as_double(int64_t i) const;
  int64_t element_as_int64(int64_t i) const;

 private:
  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> dims_;
  std::shared_ptr<const void> storage_;
  const void* data_ = nullptr;
  bool owned_ = false;
  bool mapped_ = false;
  size_t nbytes_ = 0;
  std::vector<std::string> strings_;
};

/// IEEE half / bfloat16 conversions.
float half_to_float(uint16_t bits);
uint16_t float_to_half(float value);
float bfloat16_to_float(uint16_t bits);
uint16_t float_to_bfloat16(float value);

/// The float8 / float4 conversions of runtime/kiln_small_types.h by dtype: the value of a code,
/// and a value narrowed to a code (rounding to nearest even, not saturating).
float small_float_to_float(DType dtype, uint8_t code);
uint8_t float_to_small_float(DType dtype, float value);
/// `value` wrapped to int4, uint4, int2 or uint2 (its low bits, sign-extended for the signed).
int64_t wrap_small_integer(DType dtype, int64_t value);

/// ONNX's packing of the 4- and 2-bit types (two or four elements a byte, the first in the low
/// bits) to and from Kiln's byte per element (int4/int2 sign-extended). `packed` holds
/// dtype_packed_bytes(dtype, numel) bytes; unused high bits of the last byte are written as 0.
void unpack_sub_byte(DType dtype, const uint8_t* packed, int64_t numel, uint8_t* elements);
void pack_sub_byte(DType dtype, const uint8_t* elements, int64_t numel, uint8_t* packed);

}  // namespace kiln::graph
