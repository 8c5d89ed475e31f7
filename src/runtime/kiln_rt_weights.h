#pragma once
// Kiln runtime: the weights blob of a model library. `kiln compile` lays a model's constants out
// one after another at 64-byte aligned offsets and either embeds the blob in the library's
// read-only data or writes it beside the library as `<stem>.weights`:
//
//   offset 0   "KILNWTS1"                      magic
//   offset 8   uint64 payload bytes
//   offset 16  uint64 checksum of the payload (weights_checksum)
//   offset 64  the payload: the constants
//
// The library records the payload's size and checksum, and refuses a weights file that differs.
// Header-only; included by the compiler (to write the blob) and by model libraries (to check it).

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace kiln_rt {

inline constexpr char kWeightsMagic[8] = {'K', 'I', 'L', 'N', 'W', 'T', 'S', '1'};
inline constexpr size_t kWeightsHeaderBytes = 64;

/// A 64-bit checksum of `bytes` (four independent multiply-rotate lanes over 8-byte words, then
/// the tail and the length): several GB/s, so checking a large weights file at load is cheap.
/// Detects truncation and any altered byte with overwhelming probability; not cryptographic.
inline uint64_t weights_checksum(const void* data, size_t bytes) {
  constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull, kPrime2 = 0xC2B2AE3D27D4EB4Full;
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  auto mix = [&](uint64_t acc, uint64_t word) { return rotl(acc + word * kPrime2, 31) * kPrime1; };
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {kPrime1 + kPrime2, kPrime2, 0, 0 - kPrime1};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t word;
      std::memcpy(&word, p + i + 8 * k, 8);
      lane[k] = mix(lane[k], word);
    }
  }
  uint64_t h = rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18);
  for (; i < bytes; ++i) h = rotl(h ^ (p[i] * kPrime1), 11) * kPrime2;
  h ^= static_cast<uint64_t>(bytes);
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  return h;
}

/// Fills the 64-byte header for a payload.
inline void weights_header(unsigned char* header, const void* payload, uint64_t bytes) {
  std::memset(header, 0, kWeightsHeaderBytes);
  std::memcpy(header, kWeightsMagic, 8);
  std::memcpy(header + 8, &bytes, 8);
  const uint64_t checksum = weights_checksum(payload, bytes);
  std::memcpy(header + 16, &checksum, 8);
}

/// A weights file mapped read-only by map_weights_file; the owner munmaps `mapping`.
struct WeightsFile {
  void* mapping = nullptr;
  size_t mapping_bytes = 0;
  const unsigned char* payload = nullptr;  // mapping + kWeightsHeaderBytes
};

/// Maps the weights file at `path` (beside the library `library_path`, named in messages) and
/// checks it against what the library was built with: the file is the header plus `payload_bytes`
/// bytes, its magic is right, and the size and checksum in its header and the checksum of its
/// payload are `payload_bytes` and `checksum`. Returns true and fills `file`, or writes why not
/// into `error` (one sentence naming `path`) and returns false with nothing left mapped.
/// The file's contents are untrusted (tests/fuzz/weights_file_fuzzer.cpp).
inline bool map_weights_file(const char* path, const char* library_path, uint64_t payload_bytes,
                             uint64_t checksum, WeightsFile& file, char* error, size_t error_size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::snprintf(error, error_size,
                  "%s: cannot open the weights file of %s (%s); a library compiled with "
                  "--weights external needs it beside it",
                  path, library_path, std::strerror(errno));
    return false;
  }
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  // Compared without computing header + payload_bytes, which could wrap around.
  const uint64_t found = stat_ok ? static_cast<uint64_t>(st.st_size) : 0;
  if (!stat_ok || !S_ISREG(st.st_mode) || found < kWeightsHeaderBytes ||
      found - kWeightsHeaderBytes != payload_bytes) {
    ::close(fd);
    std::snprintf(error, error_size,
                  "%s: expected %llu + %llu bytes, found %llu: the weights file is truncated or "
                  "belongs to another build of %s",
                  path, static_cast<unsigned long long>(kWeightsHeaderBytes),
                  static_cast<unsigned long long>(payload_bytes),
                  static_cast<unsigned long long>(found), library_path);
    return false;
  }
  void* mapping = ::mmap(nullptr, found, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) {
    std::snprintf(error, error_size, "%s: cannot map the weights file: %s", path,
                  std::strerror(errno));
    return false;
  }
  const auto* bytes = static_cast<const unsigned char*>(mapping);
  uint64_t header_size = 0, header_checksum = 0;
  std::memcpy(&header_size, bytes + 8, 8);
  std::memcpy(&header_checksum, bytes + 16, 8);
  if (std::memcmp(bytes, kWeightsMagic, 8) != 0 || header_size != payload_bytes ||
      header_checksum != checksum ||
      weights_checksum(bytes + kWeightsHeaderBytes, payload_bytes) != checksum) {
    ::munmap(mapping, found);
    std::snprintf(error, error_size,
                  "%s: checksum mismatch: the weights file was altered or belongs to another "
                  "build of %s",
                  path, library_path);
    return false;
  }
  file.mapping = mapping;
  file.mapping_bytes = found;
  file.payload = bytes + kWeightsHeaderBytes;
  return true;
}

}  // namespace kiln_rt
