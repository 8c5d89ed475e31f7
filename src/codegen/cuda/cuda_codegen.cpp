#include "codegen/cuda/cuda_codegen.h"

#include "codegen/cuda/cuda_wrapper_ops.h"
#include "codegen/cuda/host_fallback.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "support/error.h"

namespace kiln::codegen {

CudaCodegen::CudaCodegen(std::filesystem::path cache_dir, ir::Precision precision, bool library,
                         bool tune_libraries, bool cached_library_choices)
    : cache_dir_(std::move(cache_dir)),
      precision_(precision),
      library_(library),
      tune_libraries_(tune_libraries),
      cached_library_choices_(cached_library_choices) {
  if (std::string why = nvrtc_missing(); !why.empty()) user_error("--device cuda: {}", why);
}

bool CudaCodegen::supports(const ir::Buffer& buffer) const {
  return buffer.kind != ir::BufferKind::kExtern || !cuda_host_fallback(buffer.call.op);
}

GeneratedKernel CudaCodegen::generate_kernel(const sched::ScheduleItem& item,
                                             const ir::Program& program) const {
  return generate_cuda_kernel(item, program);
}

std::string CudaCodegen::prelude() const { return cuda_kernel_prelude(); }

std::unique_ptr<WrapperOps> CudaCodegen::wrapper_ops() const {
  return std::make_unique<CudaWrapperOps>(host_.wrapper_ops(), prelude(), cache_dir_, precision_,
                                          library_, tune_libraries_, cached_library_choices_);
}

codecache::CompilerConfig CudaCodegen::build_config(const BuildNeeds& needs) const {
  codecache::CompilerConfig config = host_.build_config(needs);
  config.libraries.push_back("dl");
  return config;
}

}  // namespace kiln::codegen
