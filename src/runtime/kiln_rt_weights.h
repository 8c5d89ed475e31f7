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

/// The 64-bit checksum of a weights payload (four independent multiply-rotate lanes over 8-byte
/// words, then the tail and the length): several GB/s, so checking a large weights file at load
/// is cheap. Detects truncation and any altered byte with overwhelming probability; not
/// cryptographic. Fed in pieces of any size (`kiln compile` streams the payload through it while
/// writing the file), it gives what weights_checksum gives for the whole.
class WeightsChecksum {
 public:
  void update(const void* data, size_t bytes) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    total_ += bytes;
    if (pending_ > 0) {  // complete the 32-byte block left over from the last piece
      const size_t take = bytes < 32 - pending_ ? bytes : 32 - pending_;
      std::memcpy(block_ + pending_, p, take);
      pending_ += take;
      p += take;
      bytes -= take;
      if (pending_ < 32) return;
      consume(block_, lane_);
      pending_ = 0;
    }
    uint64_t lane[4] = {lane_[0], lane_[1], lane_[2], lane_[3]};  // in registers for the loop
    for (; bytes >= 32; p += 32, bytes -= 32) consume(p, lane);
    std::memcpy(lane_, lane, sizeof lane);
    std::memcpy(block_, p, bytes);
    pending_ = bytes;
  }

  uint64_t finish() const {
    uint64_t h = rotl(lane_[0], 1) + rotl(lane_[1], 7) + rotl(lane_[2], 12) + rotl(lane_[3], 18);
    for (size_t i = 0; i < pending_; ++i) h = rotl(h ^ (block_[i] * kPrime1), 11) * kPrime2;
    h ^= static_cast<uint64_t>(total_);
    h ^= h >> 33;
    h *= kPrime2;
    h ^= h >> 29;
    return h;
  }

 private:
  static constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull, kPrime2 = 0xC2B2AE3D27D4EB4Full;
  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static void consume(const unsigned char* p, uint64_t* lane) {
    for (int k = 0; k < 4; ++k) {
      uint64_t word;
      std::memcpy(&word, p + 8 * k, 8);
      lane[k] = rotl(lane[k] + word * kPrime2, 31) * kPrime1;
    }
  }

  uint64_t lane_[4] = {kPrime1 + kPrime2, kPrime2, 0, 0 - kPrime1};
  unsigned char block_[32] = {};
  size_t pending_ = 0;  // bytes of block_ not yet consumed (fewer than 32)
  uint64_t total_ = 0;
};

/// The checksum of a whole payload (WeightsChecksum over it in one piece).
inline uint64_t weights_checksum(const void* data, size_t bytes) {
  WeightsChecksum checksum;
  checksum.update(data, bytes);
  return checksum.finish();
}

/// Fills the 64-byte header for a payload of `bytes` bytes with checksum `checksum`.
inline void weights_header(unsigned char* header, uint64_t bytes, uint64_t checksum) {
  std::memset(header, 0, kWeightsHeaderBytes);
  std::memcpy(header, kWeightsMagic, 8);
  std::memcpy(header + 8, &bytes, 8);
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
  // The checksum reads every page; each piece gives its pages back once read (they stay in the
  // page cache), so the check never holds the file resident whole: a run touches only its
  // variant's constants, and those pages come back as it reads them. (A library built for
  // several ISA levels keeps each one's prepacked weights, so the file may be a multiple of
  // what one variant reads.)
  bool intact = std::memcmp(bytes, kWeightsMagic, 8) == 0 && header_size == payload_bytes &&
                header_checksum == checksum;
  if (intact) {
    constexpr size_t kPiece = size_t{64} << 20;  // a multiple of the page size
    WeightsChecksum sum;
    sum.update(bytes + kWeightsHeaderBytes, payload_bytes < kPiece - kWeightsHeaderBytes
                                                ? payload_bytes
                                                : kPiece - kWeightsHeaderBytes);
    ::madvise(mapping, kPiece < found ? kPiece : found, MADV_DONTNEED);
    for (size_t at = kPiece; at < found; at += kPiece) {
      const size_t n = found - at < kPiece ? found - at : kPiece;
      sum.update(bytes + at, n);
      ::madvise(const_cast<unsigned char*>(bytes) + at, n, MADV_DONTNEED);
    }
    intact = sum.finish() == checksum;
  }
  if (!intact) {
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
