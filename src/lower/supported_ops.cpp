#include "lower/supported_ops.h"

#include "lower/lowering.h"

namespace kiln::lower {

bool is_supported_op(std::string_view domain, std::string_view op_type) {
  return Registry::instance().find(domain, op_type) != nullptr;
}

std::vector<std::string> supported_ops() { return Registry::instance().ops(); }

}  // namespace kiln::lower
