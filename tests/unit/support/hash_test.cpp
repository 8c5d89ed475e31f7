// SHA-256 against the FIPS 180-2 / NIST example vectors, plus streaming equivalence.

#include "support/hash.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "support/error.h"
#include "support/files.h"

namespace kiln {
namespace {

TEST(Sha256, EmptyString) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, Abc) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Sha256, TwoBlockMessage448Bits) {
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, OneMillionA) {
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, MillionAStreamedInOddChunks) {
  Sha256 hasher;
  std::string chunk(997, 'a');
  size_t fed = 0;
  while (fed + chunk.size() <= 1000000) {
    hasher.update(chunk);
    fed += chunk.size();
  }
  hasher.update(std::string(1000000 - fed, 'a'));
  EXPECT_EQ(hasher.hex_digest(),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, StreamingMatchesOneShotAtEveryLengthAndSplit) {
  // Lengths around the 55/56/64-byte padding boundaries, split at every point.
  std::string data;
  for (int i = 0; i < 130; ++i) data += static_cast<char>('!' + (i * 7) % 90);
  for (size_t len = 0; len <= data.size(); ++len) {
    std::string_view message(data.data(), len);
    std::string expected = sha256_hex(message);
    for (size_t split = 0; split <= len; split += 13) {
      Sha256 hasher;
      hasher.update(message.substr(0, split)).update(message.substr(split));
      ASSERT_EQ(hasher.hex_digest(), expected) << "len " << len << " split " << split;
    }
  }
}

TEST(Sha256, DigestDoesNotEndTheStream) {
  Sha256 hasher;
  hasher.update("a");
  EXPECT_EQ(hasher.hex_digest(), sha256_hex("a"));
  hasher.update("bc");
  EXPECT_EQ(hasher.hex_digest(), sha256_hex("abc"));
}

TEST(Sha256, FileHashMatchesStringHash) {
  std::filesystem::path dir = KILN_BUILD_DIR "/test-tmp/support-hash-file";
  std::filesystem::remove_all(dir);
  std::string content(200000, 'x');
  content += "tail";
  files::write_atomic(dir / "data.bin", content);
  EXPECT_EQ(sha256_file_hex(dir / "data.bin"), sha256_hex(content));
  EXPECT_THROW(sha256_file_hex(dir / "missing.bin"), UserError);
}

}  // namespace
}  // namespace kiln
