#include "lower/supported_ops.h"

#include <algorithm>
#include <array>

namespace kiln::lower {

namespace {

struct SupportedOp {
  std::string_view domain;  // "" for ai.onnx
  std::string_view op_type;
};

// Filled in as lowerings land (one entry per op, with its lowering in lower/).
constexpr std::array<SupportedOp, 0> kSupportedOps = {};

}  // namespace

bool is_supported_op(std::string_view domain, std::string_view op_type) {
  if (domain == "ai.onnx") domain = "";
  return std::any_of(kSupportedOps.begin(), kSupportedOps.end(), [&](const SupportedOp& op) {
    return op.domain == domain && op.op_type == op_type;
  });
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> names;
  for (const SupportedOp& op : kSupportedOps) {
    names.push_back(op.domain.empty() ? std::string(op.op_type)
                                      : std::string(op.domain) + ":" + std::string(op.op_type));
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace kiln::lower
