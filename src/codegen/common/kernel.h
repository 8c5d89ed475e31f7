#pragma once
/// What a backend's kernel code generator produces for one ScheduleItem of kind kKernel, and what
/// the wrapper needs to call it.

#include <string>
#include <vector>

#include "graph/dtype.h"
#include "sym/expr.h"

namespace kiln::codegen {

/// One parameter of a generated kernel function, in order.
struct KernelArg {
  enum class Kind : uint8_t { kBuffer, kSize };
  Kind kind = Kind::kBuffer;
  std::string name;  // buffer name (kBuffer) or the size symbol's identifier (kSize)
  graph::DType dtype = graph::DType::kFloat32;  // kBuffer: element type
  bool is_output = false;                       // kBuffer: written by the kernel
  sym::Expr size;                               // kSize: the symbol (or expression) passed
};

/// A generated kernel: a complete C++ function definition named `name`, with the signature
/// `extern "C" void name(<args>)` where buffers are `const T*` (inputs) / `T*` (outputs) and
/// sizes are `int64_t`.
struct GeneratedKernel {
  std::string name;
  std::string comment;     // "// name: group" and the ONNX nodes and buffers it covers
  std::string definition;  // the function definition (no includes)
  std::vector<KernelArg> args;
  std::vector<std::string> onnx_nodes;  // "name (Op)" covered, also in `comment`

  std::string source() const { return comment + definition; }
};

}  // namespace kiln::codegen
