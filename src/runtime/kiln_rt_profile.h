#pragma once
// Kiln runtime: the events of a profiled run (kiln_rt.h's ProfileScope records them), for the
// programs that read them (`kiln bench --profile`, the C API's model library).

#include <chrono>
#include <cstdint>
#include <vector>

#include "kiln_rt.h"

namespace kiln_rt {

/// One kernel or library call of a profiled run.
struct ProfileEvent {
  const char* name;
  const char* kind;  // "kernel" or "call"
  int64_t start_ns;
  int64_t duration_ns;
};

/// Where a profiled run records its events.
struct Profile {
  std::chrono::steady_clock::time_point origin;
  std::vector<ProfileEvent> events;
};

}  // namespace kiln_rt
