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

/// The arithmetic of matrix products and convolutions on a GPU (`--precision`): kFp32 computes
/// them in float32 throughout; kTf32 (the default, as PyTorch's for convolutions) lets the
/// tensor cores round their float32 inputs to TF32 (10 mantissa bits) and accumulate in float32,
/// about 1e-3 relative error per product instead of about 1e-6 (README.md, CUDA precision).
/// kFp16 and kBf16 (CUDA only) store the model's float32 activations and weights in float16 or
/// bfloat16 (lower/mixed_precision.h: which ops run in which type); products accumulate in
/// float32, and the float32 GEMMs and convolutions left may use TF32 as with kTf32. Every other
/// op, and everything on the CPU, computes in float32 either way.
enum class Precision : uint8_t { kFp32, kTf32, kFp16, kBf16 };

inline std::string_view precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

/// Whether float32 products and convolutions may use TF32 tensor cores under `precision`.
inline bool allows_tf32(Precision precision) { return precision != Precision::kFp32; }

/// Whether `precision` stores activations in a half type (fp16, bf16).
inline bool is_half_precision(Precision precision) {
  return precision == Precision::kFp16 || precision == Precision::kBf16;
}

/// The precision called `name` ("fp32", "tf32", "fp16", "bf16"), or nullopt.
inline std::optional<Precision> precision_from_name(std::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "tf32") return Precision::kTf32;
  if (name == "fp16") return Precision::kFp16;
  if (name == "bf16") return Precision::kBf16;
  return std::nullopt;
}

/// The device called `name` ("cpu", "cuda"), or nullopt.
inline std::optional<Device> device_from_name(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return std::nullopt;
}

}  // namespace kiln::ir
