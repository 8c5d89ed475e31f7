// The persistent autotune cache (src/autotune/cache.h): what its key holds, a store and lookup
// round trip, merging of later results, and a corrupt file treated as empty.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "autotune/cache.h"
#include "support/files.h"

#include "test_util.h"

namespace kiln::autotune {
namespace {

using namespace test;  // NOLINT: the shared fixtures

namespace fs = std::filesystem;

TEST(AutotuneCache, KeyNamesTheProblemTheHostTheThreadsAndTheVersion) {
  const nlohmann::json key = gemm_cache_key(128, 3072, 768, 4);
  EXPECT_EQ(key.at("op"), "gemm");
  EXPECT_EQ(key.at("m"), 128);
  EXPECT_EQ(key.at("n"), 3072);
  EXPECT_EQ(key.at("k"), 768);
  EXPECT_EQ(key.at("strides"), nlohmann::json::parse("[[768, 1], [3072, 1], [3072, 1]]"));
  EXPECT_EQ(key.at("dtype"), "float32");
  EXPECT_EQ(key.at("cpu"), host_cpu().model);
  EXPECT_EQ(key.at("isa"), host_cpu().isa_flags);
  EXPECT_NE(host_cpu().isa_flags.find("sse2"), std::string::npos) << host_cpu().isa_flags;
  EXPECT_EQ(key.at("threads"), 4);
  EXPECT_EQ(key.at("timing"), "weights evicted");
  EXPECT_EQ(key.at("kiln"), KILN_VERSION);

  const std::string id = cache_key_id(key);
  EXPECT_EQ(id.size(), 64u);
  EXPECT_EQ(id, cache_key_id(gemm_cache_key(128, 3072, 768, 4)));
  EXPECT_NE(id, cache_key_id(gemm_cache_key(128, 3072, 768, 8)));
  EXPECT_NE(id, cache_key_id(gemm_cache_key(128, 768, 3072, 4)));
  EXPECT_NE(id, cache_key_id(gemm_cache_key(64, 3072, 768, 4)));
}

TEST(AutotuneCache, ConvolutionKeyNamesShapesStridesPadsDilationsAndTheHost) {
  ConvProblem p{.n = 1,
                .c = 64,
                .h = 56,
                .w = 56,
                .m = 128,
                .kh = 3,
                .kw = 3,
                .stride_h = 2,
                .stride_w = 2,
                .pad_top = 1,
                .pad_left = 1,
                .pad_bottom = 1,
                .pad_right = 1};
  const nlohmann::json key = conv_cache_key(p, 2);
  EXPECT_EQ(key.at("op"), "conv2d");
  EXPECT_EQ(key.at("x"), nlohmann::json::parse("[1, 64, 56, 56]"));
  EXPECT_EQ(key.at("w"), nlohmann::json::parse("[128, 64, 3, 3]"));
  EXPECT_EQ(key.at("strides"), nlohmann::json::parse("[2, 2]"));
  EXPECT_EQ(key.at("pads"), nlohmann::json::parse("[1, 1, 1, 1]"));
  EXPECT_EQ(key.at("dilations"), nlohmann::json::parse("[1, 1]"));
  EXPECT_EQ(key.at("layout"), "nchw");
  EXPECT_EQ(key.at("cpu"), host_cpu().model);
  EXPECT_EQ(key.at("threads"), 2);
  EXPECT_EQ(key.at("timing"), "weights evicted");
  EXPECT_EQ(key.at("kiln"), KILN_VERSION);
  const std::string id = cache_key_id(key);
  EXPECT_NE(id, cache_key_id(conv_cache_key(p, 4)));
  p.dilation_w = 2;
  EXPECT_NE(id, cache_key_id(conv_cache_key(p, 2)));
  EXPECT_NE(id, cache_key_id(gemm_cache_key(1, 128, 576, 2)));
}

TEST(AutotuneCache, StoresLooksUpAndMergesResults) {
  const fs::path path = fresh_dir() / "sub" / "autotune.json";
  const AutotuneCache cache(path);
  const nlohmann::json key = gemm_cache_key(8, 16, 32, 2);
  EXPECT_TRUE(cache.lookup(key).empty());

  const CachedResults first{
      {"openblas", {.hash_key = "h1", .ms = 0.25, .error = ""}},
      {"template x", {.hash_key = "h2", .ms = std::nullopt, .error = "crashed"}}};
  cache.store(key, first);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_TRUE(fs::exists(fs::path(path.string() + ".lock")));
  EXPECT_EQ(cache.lookup(key), first);
  EXPECT_TRUE(cache.lookup(gemm_cache_key(8, 16, 32, 3)).empty());

  // A later store adds and replaces results by name and keeps the others.
  cache.store(key, {{"onednn", {.hash_key = "h3", .ms = 0.5, .error = ""}},
                    {"openblas", {.hash_key = "h4", .ms = 0.2, .error = ""}}});
  const CachedResults merged = AutotuneCache(path).lookup(key);
  ASSERT_EQ(merged.size(), 3u);
  EXPECT_EQ(merged.at("openblas").hash_key, "h4");
  EXPECT_DOUBLE_EQ(*merged.at("openblas").ms, 0.2);
  EXPECT_EQ(merged.at("template x").error, "crashed");
  EXPECT_DOUBLE_EQ(*merged.at("onednn").ms, 0.5);

  // Another key's entry lives beside it.
  const nlohmann::json other = gemm_cache_key(1, 2, 3, 2);
  cache.store(other, {{"openblas", {.hash_key = "h5", .ms = 1.0, .error = ""}}});
  EXPECT_EQ(cache.lookup(key).size(), 3u);
  EXPECT_EQ(cache.lookup(other).size(), 1u);

  // The file is JSON a person can read: the key is stored beside the results.
  const nlohmann::json file = nlohmann::json::parse(files::read(path));
  EXPECT_EQ(file.at("version"), 1);
  EXPECT_EQ(file.at("entries").at(cache_key_id(key)).at("key"), key);
}

TEST(AutotuneCache, CorruptFileIsTreatedAsEmptyAndRewritten) {
  const fs::path path = fresh_dir() / "autotune.json";
  std::ofstream(path) << "{ not json";
  const AutotuneCache cache(path);
  const nlohmann::json key = gemm_cache_key(8, 16, 32, 2);
  EXPECT_TRUE(cache.lookup(key).empty());
  cache.store(key, {{"openblas", {.hash_key = "h", .ms = 0.1, .error = ""}}});
  EXPECT_EQ(cache.lookup(key).size(), 1u);
}

}  // namespace
}  // namespace kiln::autotune
