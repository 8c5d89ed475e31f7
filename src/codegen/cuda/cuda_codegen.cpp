#include "codegen/cuda/cuda_codegen.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "autotune/cuda_choice.h"

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
  // --autotune max: every launch configuration, timed at the first run.
  GeneratedKernel kernel = generate_cuda_kernel(item, program, {tune_libraries_, std::nullopt});
  // Else the autotune cache's choice for a static problem. A kernel with size arguments is
  // timed at each run's sizes, which its cache entries name: none is baked (a per-size table
  // in the wrapper would be).
  const bool sized = std::any_of(kernel.args.begin(), kernel.args.end(), [](const KernelArg& a) {
    return a.kind == KernelArg::Kind::kSize;
  });
  if (tune_libraries_ || !cached_library_choices_ || kernel.launch_configs < 2 || sized) {
    return kernel;
  }
  const std::filesystem::path cache = autotune::default_autotune_cache_path(cache_dir_);
  if (!std::filesystem::exists(cache)) return kernel;
  const std::optional<autotune::CudaLibraryChoice> choice = autotune::lookup_cuda_library_choice(
      autotune::AutotuneCache(cache), "kiln", kernel.launch_problem, autotune::cuda_autotune_gpu());
  if (!choice || choice->index == 0) return kernel;
  if (choice->index >= kernel.launch_configs) {
    std::fprintf(stderr,
                 "kiln: warning: autotune cache %s: launch configuration #%d of kernel %s is not "
                 "one of its %d; the heuristic's is used\n",
                 cache.string().c_str(), choice->index, item.name.c_str(), kernel.launch_configs);
    return kernel;
  }
  GeneratedKernel chosen =
      generate_cuda_kernel(item, program, {false, static_cast<size_t>(choice->index)});
  chosen.comment += fmt::format("//   (the autotune cache's choice on sm_{}: {:.4g} ms)\n",
                                choice->arch, choice->ms);
  return chosen;
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
