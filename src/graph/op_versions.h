#pragma once
/// The versions of the default-domain (ai.onnx) ops after opset 17, the last opset Debian's
/// ONNX library (1.12) knows, up to opset 28 (ONNX 1.23). The importer asks it which nodes ONNX
/// 1.12 can still check and infer; the lowering registry asks it up to which opset a lowering
/// written for an op version keeps its meaning.
///
/// A version either changes what the op computes (a new input or attribute, a new mode, a new
/// meaning of an old one) or only widens its type constraints (bfloat16, float8, int4, ...: the
/// computation on the old types is unchanged, and attributes it adds concern the new types only,
/// such as Cast's `saturate` and `round_mode`). The table lists every op whose latest version is
/// above 17, checked against the ONNX 1.23 node suite (each of its single-op cases is written at
/// its op's latest version); an op not in it has not changed since opset 17.
/// Tests: tests/unit/graph/op_versions_test.cpp.

#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln::graph {

/// The newest ai.onnx opset and IR version Kiln imports. IR version 14 (what ONNX 1.23's helpers
/// write) adds only the float6 element types, which Kiln refuses by name where a model uses them.
inline constexpr int64_t kMaxOpset = 28;
inline constexpr int64_t kMaxIrVersion = 14;
/// The newest ai.onnx opset ONNX 1.12's schemas describe.
inline constexpr int64_t kOnnx112Opset = 17;

struct OpVersion {
  int64_t version = 0;
  /// Only the type constraints widened: on the types of the previous version it computes the
  /// same.
  bool types_only = false;
  /// The attributes this version adds (comma-separated), for the importer's check of nodes ONNX
  /// 1.12 cannot check.
  std::string_view new_attributes;
};

/// The versions of `op_type` (ai.onnx) after opset 17, oldest first; empty when it has none.
const std::vector<OpVersion>& op_versions_after_17(std::string_view op_type);

/// Whether ONNX 1.12's schema of `op_type` describes it at `opset` exactly: no version of it
/// in (17, opset].
bool onnx112_schema_is_current(std::string_view op_type, int64_t opset);

/// Whether ONNX 1.12's shape inference of `op_type` still holds at `opset`: every version of it
/// in (17, opset] widens types only.
bool onnx112_inference_holds(std::string_view op_type, int64_t opset);

/// The highest opset at which `op_type` still means what its version `implemented` (a version
/// number: the highest since-version the lowering implements) means: the opset before its next
/// version after `implemented` that changes semantics, or kMaxOpset.
int64_t last_opset_with_meaning_of(std::string_view op_type, int64_t implemented);

/// The attributes the versions of `op_type` in (17, opset] add, for the importer's check.
std::vector<std::string_view> attributes_added_after_17(std::string_view op_type, int64_t opset);

}  // namespace kiln::graph
