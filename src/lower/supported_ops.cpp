#include "lower/supported_ops.h"

#include <string>
#include <string_view>
#include <vector>

#include "lower/lowering.h"

namespace kiln::lower {

bool is_supported_op(std::string_view domain, std::string_view op_type) {
  return Registry::instance().find(domain, op_type) != nullptr;
}

std::vector<std::string> supported_ops() { return Registry::instance().ops(); }

std::vector<SupportedOp> supported_op_table() {
  std::vector<SupportedOp> table;
  for (const std::string& name : supported_ops()) {
    size_t colon = name.find(':');
    std::string domain = colon == std::string::npos ? "" : name.substr(0, colon);
    std::string op = colon == std::string::npos ? name : name.substr(colon + 1);
    const OpLowering* lowering = Registry::instance().find(domain, op);
    table.push_back({name, lowering->min_opset, lowering->max_opset});
  }
  return table;
}

}  // namespace kiln::lower
