#include "driver/placement.h"

namespace kiln::driver {

void place_buffers(ir::Program& program, const codegen::DeviceCodegen& codegen) {
  for (const auto& buffer : program.buffers) {
    buffer->device = codegen.supports(*buffer) ? codegen.device() : ir::Device::kCpu;
  }
}

}  // namespace kiln::driver
