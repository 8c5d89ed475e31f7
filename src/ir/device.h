#pragma once
/// The device a buffer's storage lives on and a scheduled item runs on. Lowering places every
/// buffer on the CPU; the CUDA backend (codegen/cuda) runs every kernel group on the GPU and
/// library calls on the host, with their data in memory both can reach.

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
