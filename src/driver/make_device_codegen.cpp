// The one place that maps a device to its backend (codegen/common/device_codegen.h).

#include <filesystem>
#include <memory>

#include "codegen/common/device_codegen.h"
#include "codegen/cpp/cpp_codegen.h"
#include "codegen/cuda/cuda_codegen.h"
#include "support/error.h"

namespace kiln::codegen {

std::unique_ptr<DeviceCodegen> make_device_codegen(ir::Device device,
                                                   const std::filesystem::path& cache_dir,
                                                   ir::Precision precision, bool library,
                                                   bool tune_libraries,
                                                   bool cached_library_choices) {
  switch (device) {
    case ir::Device::kCpu:
      return std::make_unique<CppCodegen>();  // float32 throughout: no precision to choose
    case ir::Device::kCuda:
      return std::make_unique<CudaCodegen>(cache_dir, precision, library, tune_libraries,
                                           cached_library_choices);
  }
  internal_error("no backend for device {}", ir::device_name(device));
}

}  // namespace kiln::codegen
