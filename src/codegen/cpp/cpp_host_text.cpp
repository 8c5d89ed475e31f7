#include "codegen/cpp/cpp_host_text.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "support/identifier.h"

namespace kiln::codegen {

std::string ctype(graph::DType dtype) { return std::string(graph::dtype_cpp_storage(dtype)); }

std::string cexpr(const sym::Expr& e) {
  return sym::to_cpp(e, [](const sym::Expr& x) {
    for (const sym::Expr& s : sym::free_symbols(x)) {
      if (s.symbol_kind() == sym::SymbolKind::kIndex) return false;
    }
    return true;
  });
}

std::string shape_text(const std::vector<sym::Expr>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + shape[k].str();
  return s + "]";
}

std::string dims_list(const std::vector<sym::Expr>& dims) {
  std::string s;
  for (size_t k = 0; k < dims.size(); ++k) s += (k ? ", " : "") + cexpr(dims[k]);
  return s;
}

std::string data_pointer(const ir::View& v) {
  return fmt::format("static_cast<const {}*>({}) + {}", ctype(v.dtype), v.buffer,
                     cexpr(v.layout.offset));
}

std::string view_init(const ir::View& v) {
  return fmt::format("kiln_rt::View{{{} + {}, {}, {{{}}}, {{{}}}}}", v.buffer,
                     cexpr(v.layout.offset), v.layout.rank(), dims_list(v.layout.sizes),
                     dims_list(v.layout.strides));
}

std::string origins_text(const ir::Buffer& buffer) {
  std::string s;
  for (const ir::Origin& o : buffer.origins)
    s += (s.empty() ? "" : ", ") + comment_text(o.node) + " (" + o.op_type + ")";
  return s;
}

}  // namespace kiln::codegen
