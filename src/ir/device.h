#pragma once
/// The device a buffer is computed on and a scheduled item runs on. Lowering places every
/// buffer on the CPU; for another device, placement (driver/placement.h) puts each buffer on it
/// unless the backend leaves it to the host (the CUDA backend's host-fallback list), and the
/// wrapper copies data between the two around such ops.

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::ir {

enum class Device : uint8_t { kCpu, kCuda };

inline std::string_view device_name(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

/// The device called `name` ("cpu", "cuda"), or nullopt.
inline std::optional<Device> device_from_name(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return std::nullopt;
}

}  // namespace kiln::ir
