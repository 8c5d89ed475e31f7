#pragma once
/// The host-fallback list of the CUDA backend: the library-call kinds (ir/library_call.h) that
/// run on the host under `--device cuda`, each with the reason it does. Placement
/// (driver/placement.h) puts these calls on the CPU; the CUDA wrapper copies the buffers such a
/// call reads from the GPU before it and the buffer it writes back after it
/// (cuda_wrapper_ops.h). A kind missing from the list fails to compile (the visit names every
/// kind), so a new kind must say where it runs.

#include <optional>
#include <string_view>

#include "ir/library_call.h"

namespace kiln::codegen {

/// Why `call` runs on the host under --device cuda, or nullopt when the GPU runs it.
std::optional<std::string_view> cuda_host_fallback(const ir::LibraryCall& call);

}  // namespace kiln::codegen
