#pragma once
/// The epilogue of a GEMM template kernel (autotune/gemm_template.h) written from the pointwise
/// body fused into it (sched/template_epilogue.h): one C++ expression over `v` (the product's
/// element at row m, column n), `m`, `n` and the buffers the body loads, which become the
/// kernel's extra pointer arguments (named e0, e1, ... so that equal epilogues read the same).
/// The expression is an immediately
/// invoked lambda holding one statement per op of the body.

#include <optional>
#include <string>

#include "autotune/gemm_template.h"
#include "ir/buffer.h"

namespace kiln::codegen {

struct GemmEpilogueCode {
  autotune::GemmEpilogue epilogue;   // its pointer arguments are named e0, e1, ...
  std::vector<std::string> buffers;  // the buffer each argument points to
};

/// `fused`: the buffer the template computes, with the bodies of its call's epilogue_chain, then
/// its own body, as its epilogue (each reads the previous one's value by the name in its call's
/// `product`). nullopt when a body has something an epilogue cannot hold (a
/// reduction, an indirect or masked load, a symbolic size or index, a load of a buffer other
/// than float32).
std::optional<GemmEpilogueCode> gemm_epilogue(const ir::Buffer& fused);

}  // namespace kiln::codegen
