#pragma once
/// The ops Kiln can lower and compile, by domain and op type. `kiln info` reports the others as
/// "not compilable yet"; the compiler uses the same list to refuse a model up front with every
/// unsupported op named at once.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::lower {

/// A supported op and the opset versions of its domain that Kiln lowers.
struct SupportedOp {
  std::string name;  // "Op" for ai.onnx, "domain:Op" otherwise
  int64_t min_opset = 1;
  int64_t max_opset = 1;
};

/// Every supported op with its opset range, sorted by name.
std::vector<SupportedOp> supported_op_table();

/// True when Kiln can compile `op_type` of `domain` ("" or "ai.onnx" for the default domain).
bool is_supported_op(std::string_view domain, std::string_view op_type);

/// Every supported op, sorted, as "Op" for ai.onnx and "domain:Op" for other domains.
std::vector<std::string> supported_ops();

}  // namespace kiln::lower
