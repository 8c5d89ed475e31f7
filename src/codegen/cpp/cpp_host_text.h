#pragma once
/// Text helpers of the host C++ the wrapper and its library calls are written in: types, size
/// expressions, views and comments.

#include <string>
#include <vector>

#include "graph/dtype.h"
#include "ir/buffer.h"
#include "sym/expr.h"

namespace kiln::codegen {

/// The C++ storage type of `dtype` ("float", "int64_t", "kiln_rt::half", ...).
std::string ctype(graph::DType dtype);

/// A size expression as C++ (sizes are built from size symbols, which are never negative).
std::string cexpr(const sym::Expr& e);

/// "[2, s0]": a shape for messages.
std::string shape_text(const std::vector<sym::Expr>& shape);

/// "2, s0": sizes as a C++ initializer list's elements.
std::string dims_list(const std::vector<sym::Expr>& dims);

/// A contiguous view's data pointer, typed.
std::string data_pointer(const ir::View& v);

/// A kiln_rt::View initializer of a strided view.
std::string view_init(const ir::View& v);

/// "n1 (Relu), n2 (Add)": the ONNX nodes a buffer came from, for comments and profile labels
/// (names as comment_text writes them).
std::string origins_text(const ir::Buffer& buffer);

}  // namespace kiln::codegen
