#pragma once
/// SHA-256 as defined by FIPS 180-4, for content-addressed caches (the code cache, the autotuning
/// cache): a streaming hasher and one-shot helpers over a string or a file. Tested against the
/// standard vectors in tests/unit/support/hash_test.cpp.

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace kiln {

/// A streaming SHA-256: feed bytes with update(), read the digest at any point (reading does not
/// end the stream; later updates continue from where the data left off).
class Sha256 {
 public:
  Sha256();

  /// Appends `data` to the message.
  Sha256& update(std::string_view data);

  /// The 32-byte digest of everything fed so far.
  std::array<std::uint8_t, 32> digest() const;

  /// The digest as 64 lowercase hex characters.
  std::string hex_digest() const;

 private:
  void compress(const std::uint8_t* block);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffer_size_ = 0;
  std::uint64_t length_ = 0;  // message length in bytes
};

/// SHA-256 of `data` as 64 lowercase hex characters.
std::string sha256_hex(std::string_view data);

/// SHA-256 of a file's contents, read in blocks; throws UserError naming the path when it cannot be
/// read.
std::string sha256_file_hex(const std::filesystem::path& path);

}  // namespace kiln
