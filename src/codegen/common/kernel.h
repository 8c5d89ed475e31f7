#pragma once
/// What a backend's kernel code generator produces for one ScheduleItem of kind kKernel, and what
/// the wrapper needs to call it.

#include <array>
#include <cstdint>
#include <optional>
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

/// How a GPU kernel is launched: grid and block dims as expressions of the size symbols (the
/// wrapper evaluates them at run time), and the dynamic shared memory it needs.
struct LaunchSpec {
  std::array<sym::Expr, 3> grid{sym::Expr(1), sym::Expr(1), sym::Expr(1)};
  std::array<sym::Expr, 3> block{sym::Expr(1), sym::Expr(1), sym::Expr(1)};
  sym::Expr shared_bytes{0};
};

/// A generated kernel: a function named `name` in its backend's language (for the CPU, a
/// complete C++ definition with the signature `extern "C" void name(<args>)` where buffers are
/// `const T*` (inputs) / `T*` (outputs) and sizes are `int64_t`).
struct GeneratedKernel {
  std::string name;
  std::string comment;     // "// name: group" and the ONNX nodes and buffers it covers
  std::string definition;  // the function definition (no includes)
  /// Where `name` stands in `definition`'s signature (its only use there): two kernels are the
  /// same code when their definitions without it are equal (anonymous()).
  size_t name_offset = 0;
  std::vector<KernelArg> args;
  std::vector<std::string> onnx_nodes;  // "name (Op)" covered, also in `comment`
  /// A GPU kernel's launch; none for a CPU function called directly.
  std::optional<LaunchSpec> launch;
  /// A CUDA reduction kernel with several launch configurations (cuda_kernel.h): the autotune
  /// cache's problem text for its choice and their number; under --autotune max, the other
  /// configurations' kernels (named `name`_c<k>), timed against this one at the first run.
  std::string launch_problem;
  int launch_configs = 0;
  std::vector<GeneratedKernel> candidates;

  std::string source() const { return comment + definition; }
  std::string anonymous() const {
    return definition.substr(0, name_offset) + definition.substr(name_offset + name.size());
  }
};

}  // namespace kiln::codegen
