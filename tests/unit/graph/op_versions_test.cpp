// The table of op versions after opset 17 (graph/op_versions.h): what the importer and the
// lowering registry read from it.
#include "graph/op_versions.h"

#include <gtest/gtest.h>

#include <string_view>
#include <vector>

namespace kiln::graph {
namespace {

TEST(OpVersionsTest, UnchangedOpsKeepTheirMeaningThroughTheNewestOpset) {
  EXPECT_TRUE(op_versions_after_17("Add").empty());
  EXPECT_TRUE(onnx112_schema_is_current("Add", kMaxOpset));
  EXPECT_EQ(last_opset_with_meaning_of("Add", 17), kMaxOpset);
}

TEST(OpVersionsTest, AChangeOfMeaningEndsAnOlderLowering) {
  // ReduceMean-18 takes axes as an input.
  EXPECT_EQ(last_opset_with_meaning_of("ReduceMean", 17), 17);
  EXPECT_EQ(last_opset_with_meaning_of("ReduceMean", 18), kMaxOpset);
  EXPECT_FALSE(onnx112_schema_is_current("ReduceMean", 18));
  EXPECT_TRUE(onnx112_schema_is_current("ReduceMean", 17));
  EXPECT_FALSE(onnx112_inference_holds("ReduceMean", 18));
  // Pad: axes input at 18, mode 'wrap' at 19, then types only.
  EXPECT_EQ(last_opset_with_meaning_of("Pad", 17), 17);
  EXPECT_EQ(last_opset_with_meaning_of("Pad", 18), 18);
  EXPECT_EQ(last_opset_with_meaning_of("Pad", 19), kMaxOpset);
}

TEST(OpVersionsTest, VersionsThatOnlyAddTypesDoNot) {
  // Acos-22 adds bfloat16; Reshape gained float8, int4, float4, float8e8m0 and int2.
  EXPECT_EQ(last_opset_with_meaning_of("Acos", 17), kMaxOpset);
  EXPECT_EQ(last_opset_with_meaning_of("Reshape", 17), kMaxOpset);
  EXPECT_FALSE(onnx112_schema_is_current("Reshape", 19));
  EXPECT_TRUE(onnx112_inference_holds("Reshape", 25));
}

TEST(OpVersionsTest, AddedAttributesUpToAnOpset) {
  auto names = attributes_added_after_17("Cast", 19);
  EXPECT_EQ(names, (std::vector<std::string_view>{"saturate"}));
  names = attributes_added_after_17("Cast", 25);
  EXPECT_EQ(names, (std::vector<std::string_view>{"saturate", "round_mode"}));
  EXPECT_TRUE(attributes_added_after_17("Cast", 18).empty());
}

}  // namespace
}  // namespace kiln::graph
