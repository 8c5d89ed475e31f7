#pragma once
/// The device a buffer's storage lives on and a scheduled item runs on. Lowering places every
/// buffer on the CPU; a GPU backend will place groups on its device and leave on the host what
/// it has no kernel for (shared/CUDA-DESIGN.md, sched/placement).

#include <cstdint>
#include <string_view>

namespace kiln::ir {

enum class Device : uint8_t { kCpu };

inline std::string_view device_name(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
  }
  return "?";
}

}  // namespace kiln::ir
