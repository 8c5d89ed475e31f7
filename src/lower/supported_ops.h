#pragma once
/// The ops Kiln can lower and compile, by domain and op type. `kiln info` reports the others as
/// "not compilable yet"; the compiler uses the same list to refuse a model up front with every
/// unsupported op named at once.

#include <string>
#include <string_view>
#include <vector>

namespace kiln::lower {

/// True when Kiln can compile `op_type` of `domain` ("" or "ai.onnx" for the default domain).
bool is_supported_op(std::string_view domain, std::string_view op_type);

/// Every supported op, sorted, as "Op" for ai.onnx and "domain:Op" for other domains.
std::vector<std::string> supported_ops();

}  // namespace kiln::lower
