#pragma once
// Kiln runtime: the error of a model's run (kiln_rt.h's fail throws it, kiln_run reports it), for
// the runtime headers and programs that catch it or format shapes.

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kiln_rt.h"

namespace kiln_rt {

/// An error of the model's run (bad input, out-of-range index): reported by kiln_run.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A shape as text: "[2, 3]".
KILN_RT_LOCAL std::string dims_str(const int64_t* dims, int rank);

}  // namespace kiln_rt
