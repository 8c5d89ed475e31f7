#pragma once
/// Device placement: which device computes each buffer of a program compiled for a device other
/// than the CPU (Inductor's per-node device, decided once before scheduling). A buffer goes on
/// the backend's device when the backend computes or holds it (DeviceCodegen::supports: kernel
/// groups, inputs, constants, library calls with GPU code); the others, the backend's host
/// fallbacks (for CUDA, codegen/cuda/host_fallback.h), on the CPU, where the wrapper runs them
/// with explicit copies. The scheduler fuses only buffers of one device and gives each item its
/// buffers' device. Shape computations never become buffers: they stay host expressions.
/// Tested by tests/unit/driver/cuda_compile_test.cpp.

#include "codegen/common/device_codegen.h"
#include "ir/buffer.h"

namespace kiln::driver {

/// Sets the device of every buffer of `program` for `codegen`.
void place_buffers(ir::Program& program, const codegen::DeviceCodegen& codegen);

}  // namespace kiln::driver
