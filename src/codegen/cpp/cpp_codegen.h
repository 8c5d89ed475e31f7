#pragma once
/// The CPU backend behind the DeviceCodegen interface: scheduling hooks of CppBackend, kernels
/// of cpp_kernel.h, the kernel prelude, the wrapper's CPU operations (cpp_wrapper_ops.h), and
/// builds with g++ (OpenMP, Sleef, and OpenBLAS or
/// oneDNN when the code calls them) keyed on the runtime headers' content.

#include <memory>
#include <string>

#include "codegen/common/device_codegen.h"
#include "codegen/cpp/cpp_kernel.h"

namespace kiln::codegen {

class CppCodegen final : public DeviceCodegen {
 public:
  ir::Device device() const override { return ir::Device::kCpu; }
  const sched::Backend& scheduling() const override { return backend_; }
  bool supports(const ir::Buffer& buffer) const override;
  GeneratedKernel generate_kernel(const sched::ScheduleItem& item,
                                  const ir::Program& program) const override;
  std::string prelude() const override;
  std::unique_ptr<WrapperOps> wrapper_ops() const override;
  codecache::CompilerConfig build_config(const BuildNeeds& needs) const override;

 private:
  CppBackend backend_;
};

}  // namespace kiln::codegen
