#include "codegen/cuda/cuda_wrapper_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "autotune/cuda_choice.h"
#include "codegen/cpp/cpp_host_text.h"
#include "codegen/cuda/cuda_attention.h"
#include "codegen/cuda/cuda_conv.h"
#include "codegen/cuda/cuda_gemm_template.h"
#include "codegen/cuda/cuda_matmul.h"
#include "codegen/cuda/host_fallback.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "support/error.h"
#include "support/identifier.h"

namespace kiln::codegen {

namespace {

/// `bytes` as the initializer of an unsigned char array, 20 to a line.
void write_bytes(IndentedBuffer& out, const std::string& bytes) {
  std::string line;
  for (size_t k = 0; k < bytes.size(); ++k) {
    line += fmt::format("{},", static_cast<unsigned>(static_cast<unsigned char>(bytes[k])));
    if (k % 20 == 19) {
      out.line(line);
      line.clear();
    }
  }
  if (!line.empty()) out.line(line);
}

std::string launch_dims(const std::array<sym::Expr, 3>& dims) {
  return fmt::format("{}, {}, {}", cexpr(dims[0]), cexpr(dims[1]), cexpr(dims[2]));
}

}  // namespace

void CudaWrapperOps::note(const ir::ExternCall& call) {
  if (call.as<ir::AttentionCall>() != nullptr) {
    // Kiln's kernel for its heads (cuda_attention.h), in the module.
    if (auto heads = cuda_attention_heads(call)) attention_heads_.insert(*heads);
    return;
  }
  if (call.as<ir::MatMulCall>() != nullptr || call.as<ir::ConvCall>() != nullptr) {
    uses_workspace_ = true;
    uses_blas_ = uses_blas_ || call.as<ir::MatMulCall>() != nullptr;
    uses_dnn_ = uses_dnn_ || call.as<ir::ConvCall>() != nullptr;
    conv_epilogue_ = conv_epilogue_ || conv_has_epilogue(call);
    if (call.as<ir::MatMulCall>() != nullptr) note_gemm_template(call);
    return;
  }
  host_->note(call);
}

void CudaWrapperOps::note_gemm_template(const ir::ExternCall& call) {
  if (call.inputs.empty() || !call.inputs[0]) return;
  // Kiln's GEMM template runs TF32 float32 products and the half types (cuda_gemm_template.h).
  std::optional<CudaGemmPrecision> precision;
  switch (call.inputs[0]->dtype) {
    case graph::DType::kFloat16:
      precision = CudaGemmPrecision::kF16;
      break;
    case graph::DType::kBFloat16:
      precision = CudaGemmPrecision::kBf16;
      break;
    case graph::DType::kFloat32:
      if (ir::allows_tf32(precision_)) precision = CudaGemmPrecision::kTf32;
      break;
    default:
      break;
  }
  if (!precision) return;
  // Its kernels go into the module where the run may time them (--autotune max) or a cached
  // choice may pick them; without either the module is what it was before the template.
  if (!template_wanted_) {
    template_wanted_ = tune_libraries_;
    if (!*template_wanted_ && cached_library_choices_) {
      template_wanted_ = autotune::cache_has_library(
          autotune::AutotuneCache(autotune::default_autotune_cache_path(cache_dir_)), "kiln_gemm");
    }
  }
  if (*template_wanted_) gemm_precisions_.insert(*precision);
}

void CudaWrapperOps::write_includes(IndentedBuffer& out, bool uses_control) {
  host_->write_includes(out, uses_control);
  out.line("#include \"kiln_rt_cuda.h\"");
}

void CudaWrapperOps::write_run_state_members(IndentedBuffer& out) {
  host_->write_run_state_members(out);
  out.line("    kiln_cuda::RunState cuda;");
}

void CudaWrapperOps::write_model_state_members(IndentedBuffer& out) {
  out.line("    kiln_cuda::SharedConstants cuda_constants;");
  out.line("    kiln_cuda::GraphStats cuda_graph_stats;  // graph segments of its runs");
}

void CudaWrapperOps::write_workspace(IndentedBuffer& out) {
  out.line("state.cuda.begin_run(kCubins, sizeof kCubins / sizeof kCubins[0], kKernelNames,");
  out.line(
      "                     sizeof kKernelNames / sizeof kKernelNames[0], inputs, kInputCount,");
  out.line("                     kCudaGraphs && profile == nullptr);");
  out.line("kiln_cuda::DeviceWorkspace ws(state.cuda.memory());");
  if (uses_workspace_ && side_library_calls_) {
    out.line("// cuBLASLt's and cuDNN's workspaces, in the arena: one per stream");
    out.line("state.cuda.reserve_library_workspace(2);");
  } else if (uses_workspace_) {
    out.line("state.cuda.reserve_library_workspace();  // cuBLASLt's and cuDNN's, in the arena");
  }
  if ((uses_dnn_ || uses_blas_) && tune_libraries_)
    out.line("state.cuda.tune_convolutions();  // --autotune max: library candidates timed");
}

bool CudaWrapperOps::runs_concurrently(const sched::ScheduleItem& item) const {
  if (item.device != ir::Device::kCuda || item.buffers.empty()) return false;
  if (item.kind == sched::ItemKind::kKernel) return true;
  const ir::Buffer& b = *item.buffers.front();
  return b.device == ir::Device::kCuda &&
         (b.call.as<ir::MatMulCall>() != nullptr || b.call.as<ir::ConvCall>() != nullptr ||
          b.call.as<ir::AttentionCall>() != nullptr);
}

void CudaWrapperOps::write_fork(IndentedBuffer& out, size_t k, const std::string& what) {
  out.linef("// fork {}: {}", k, comment_safe(what));
  out.linef("const bool fork{} = state.cuda.fork(profile == nullptr);  // false: one stream", k);
}

void CudaWrapperOps::write_side(IndentedBuffer& out, size_t k, bool enter) {
  if (enter) {
    out.linef("state.cuda.side(fork{}, true);  // on the side stream of fork {}", k, k);
  } else {
    out.linef("state.cuda.side(fork{}, false);", k);
  }
}

void CudaWrapperOps::write_join(IndentedBuffer& out, size_t k) {
  out.linef("state.cuda.join(fork{});  // the main stream waits for fork {}'s side stream", k, k);
}

void CudaWrapperOps::write_size_known(IndentedBuffer& out, const std::string& identifier) {
  out.linef("state.cuda.size_known({});  // graph segments from here on are keyed by it",
            identifier);
}

void CudaWrapperOps::write_input_data(IndentedBuffer& out, size_t k, const std::string& ctype,
                                      const std::string& pointer) {
  inputs_[pointer] = {k, ctype};
  out.linef("const {}* {} = state.cuda.upload_input<{}>(ws, in{});  // copied to the GPU", ctype,
            pointer, ctype, k);
}

std::string CudaWrapperOps::host_input_data(const std::string& pointer) const {
  auto it = inputs_.find(pointer);
  KILN_CHECK(it != inputs_.end(), "{} is not a model input", pointer);
  return fmt::format("state.cuda.host_input<{}>(in{})", it->second.second, it->second.first);
}

void CudaWrapperOps::write_constant_data(IndentedBuffer& out, size_t index,
                                         const std::string& ctype, const std::string& pointer,
                                         size_t bytes) {
  constants_[pointer] = index;
  out.linef("const {}* {} = static_cast<const {}*>(state.cuda.constant({}, constants[{}], {}));",
            ctype, pointer, ctype, index, index, bytes);
}

void CudaWrapperOps::write_arena(IndentedBuffer& out, const std::string& bytes) {
  out.linef("char* const arena = state.cuda.arena({});", bytes);
}

void CudaWrapperOps::write_allocation(IndentedBuffer& out, const Allocation& a) {
  const std::string& t = a.ctype;
  switch (a.place) {
    case Allocation::Place::kOutput:  // computed on the GPU, copied out by finish_output
    case Allocation::Place::kWorkspace:
      out.linef("{}* {} = ws.alloc<{}>({});", t, a.buffer, t, a.elements);
      return;
    case Allocation::Place::kArena:
      out.linef("{}* {} = reinterpret_cast<{}*>(arena + {});", t, a.buffer, t, a.offset);
      return;
  }
}

void CudaWrapperOps::write_index_check(IndentedBuffer& out, const std::string& pointer,
                                       const std::string& count, const std::string& size,
                                       bool has_ignored, int64_t ignored, const std::string& node) {
  out.linef("state.cuda.check_indices({}, {}, {}, {}, {}LL, {});  // on the GPU", pointer, count,
            size, has_ignored ? "true" : "false", ignored, node);
}

void CudaWrapperOps::write_size_read(IndentedBuffer& out, const std::string& identifier,
                                     const std::string& pointer, const std::string& element) {
  waits_ = true;
  out.linef("const int64_t {} = state.cuda.read({}, {}, \"a size read from data\");", identifier,
            pointer, element);
}

void CudaWrapperOps::write_release(IndentedBuffer& out, const std::string& pointer) {
  out.linef("ws.release({});", pointer);
}

void CudaWrapperOps::write_take_over(IndentedBuffer& out, const std::string& results) {
  out.linef("for (const kiln_rt::TensorArg& r : {}) ws.adopt(r.data);", results);
}

void CudaWrapperOps::write_hand_over(IndentedBuffer& out, const std::string& pointer) {
  out.linef("ws.detach({});", pointer);
}

void CudaWrapperOps::write_finish_output(IndentedBuffer& out, size_t k, const std::string& data,
                                         const std::string& dtype, const std::string& rank,
                                         const std::string& dims, const std::string& element_size,
                                         const std::string& name) {
  out.linef("kiln_cuda::finish_output(state.cuda, outputs[{}], {}, {}, {}, {}, {}, {});", k, data,
            dtype, rank, dims, element_size, name);
}

void CudaWrapperOps::write_declarations(IndentedBuffer& out,
                                        const std::vector<const GeneratedKernel*>& all) {
  std::vector<const GeneratedKernel*> kernels, host_kernels;
  for (const GeneratedKernel* k : all) (k->launch ? kernels : host_kernels).push_back(k);
  host_->write_declarations(out, host_kernels);
  std::string source = "// Generated by Kiln: CUDA kernels. Do not edit.\n" + prelude_;
  for (const GeneratedKernel* k : kernels) {
    source += '\n';
    source += k->source();
    for (const GeneratedKernel& c : k->candidates) source += '\n' + c.source();
  }
  // A convolution with an epilogue (cuda_conv.h) runs it as a kernel of its own where cuDNN has
  // no engine for the fused graph: the module carries that kernel.
  if (conv_epilogue_) source += conv_epilogue_source();
  const bool uses_attention = !attention_heads_.empty();
  if (uses_attention) source += cuda_attention_source(attention_heads_);
  // Kiln's GEMM template, an autotune choice beside cuBLASLt (found by name at run time).
  if (!gemm_precisions_.empty()) source += cuda_gemm_template_source(gemm_precisions_);
  std::vector<CudaBinary> binaries;
  const std::vector<int> archs = library_ ? cuda_library_archs() : cuda_target_archs();
  // A library for other machines carries PTX for its oldest architecture too: the driver
  // compiles it for GPUs newer than every cubin.
  const int ptx_arch = library_ ? *std::min_element(archs.begin(), archs.end()) : 0;
  if (!kernels.empty() || conv_epilogue_ || uses_attention || !gemm_precisions_.empty())
    binaries = nvrtc_compile(source, archs, cache_dir_, ptx_arch);
  device_sources_.emplace_back("kernels.cu", source);
  out.line(
      "// The model's CUDA kernels (compiled by NVRTC): one cubin per architecture, and for a");
  out.line("// library the PTX of the oldest one.");
  for (size_t b = 0; b < binaries.size(); ++b) {
    out.linef("alignas(16) static const unsigned char kCubin{}[] = {{", b);
    out.indent();
    write_bytes(out, binaries[b].cubin);
    out.dedent();
    out.line("};");
  }
  out.line("static const kiln_cuda::Cubin kCubins[] = {");
  for (size_t b = 0; b < binaries.size(); ++b) {
    out.linef("    {{{}, kCubin{}, {}}},", binaries[b].arch, b, binaries[b].ptx ? 1 : 0);
  }
  if (binaries.empty()) out.line("    {0, nullptr, 0},");
  out.line("};");
  // The driver a cubin of this NVRTC needs: one for the same CUDA major version or newer.
  const std::string nvrtc = nvrtc_version_text();
  const int min_driver = 1000 * std::atoi(nvrtc.c_str());
  out.linef("static constexpr size_t kInputCount = {};", inputs_.size());
  out.line("// Runs become CUDA graphs (kiln_cuda::RunState::begin_run), one graph segment per");
  if (waits_) {
    out.line("// stretch of device work between two waits for the GPU (here: host fallbacks or");
    out.line("// sizes read from data split the run).");
  } else {
    out.line("// stretch of device work between two waits for the GPU (here: one).");
  }
  out.line("static constexpr bool kCudaGraphs = true;");
  out.linef("// What the machine must have (NVRTC {}); checked when a model library loads.", nvrtc);
  out.linef(
      "static const kiln_cuda::DeviceNeeds kDeviceNeeds = {{kCubins, sizeof kCubins / sizeof "
      "kCubins[0], {}, {}, {}}};",
      min_driver, uses_blas_ ? "true" : "false", uses_dnn_ ? "true" : "false");
  out.line("static const char* const kKernelNames[] = {");
  for (const GeneratedKernel* k : kernels) out.linef("    \"{}\",", k->name);
  for (const auto& [d, dv] : attention_heads_)
    out.linef("    \"{}\",", cuda_attention_kernel_name(d, dv));
  // --autotune max: the other launch configurations of the reduction kernels, numbered after
  // the kernels above (launch_<kernel> times them at the first run).
  for (const GeneratedKernel* k : kernels) {
    for (const GeneratedKernel& c : k->candidates) out.linef("    \"{}\",", c.name);
  }
  if (kernels.empty() && !uses_attention) out.line("    nullptr,");
  out.line("};");
  if (uses_attention)
    out.line("// The fused attention kernels' numbers in kKernelNames (RunState::attention).");
  size_t number = kernels.size();
  for (const auto& [d, dv] : attention_heads_)
    out.linef("static constexpr int k_{} = {};", cuda_attention_kernel_name(d, dv), number++);
  out.line("");
  size_t candidate_number = number;
  const std::string nvrtc_version = [&] {
    // 1000 * major + 10 * minor, the version a launch configuration's timing is reported with.
    const size_t dot = nvrtc.find('.');
    return std::to_string(1000 * std::atoi(nvrtc.c_str()) +
                          (dot == std::string::npos ? 0 : 10 * std::atoi(nvrtc.c_str() + dot + 1)));
  }();
  for (size_t i = 0; i < kernels.size(); ++i) {
    const GeneratedKernel& k = *kernels[i];
    KILN_CHECK(k.launch.has_value(), "CUDA kernel {} has no launch", k.name);
    std::string params = "kiln_cuda::RunState& cuda";
    std::string args, sizes;
    for (const KernelArg& a : k.args) {
      if (a.kind == KernelArg::Kind::kSize) {
        params += fmt::format(", int64_t {}", a.name);
        args += ", " + a.name;
        sizes += (sizes.empty() ? "" : ", ") + a.name;
        continue;
      }
      std::string p = fmt::format("p{}", &a - k.args.data());
      params += fmt::format(", {}{}* {}", a.is_output ? "" : "const ", ctype(a.dtype), p);
      args += ", " + p;
    }
    out.linef("static void launch_{}({}) {{", k.name, params);
    if (k.candidates.empty()) {
      out.linef("    cuda.launch({}, \"{}\", {}, {}, {}{});", i, k.name,
                launch_dims(k.launch->grid), launch_dims(k.launch->block),
                cexpr(k.launch->shared_bytes), args);
      out.line("}");
      continue;
    }
    // --autotune max: each configuration timed at the first run of each set of sizes, the
    // fastest launched last and from then on (RunState::launch_tuned).
    out.linef("    cuda.launch_tuned(\"{}\", {}, {}, {{{}}}, {}, [&](int config) {{", k.name,
              cpp_quote(k.launch_problem), nvrtc_version, sizes, k.candidates.size() + 1);
    out.line("        switch (config) {");
    for (size_t c = 0; c < k.candidates.size(); ++c) {
      const GeneratedKernel& v = k.candidates[c];
      KILN_CHECK(v.launch.has_value(), "CUDA kernel {} has no launch", v.name);
      out.linef("            case {}: cuda.launch({}, \"{}\", {}, {}, {}{}); return;", c + 1,
                candidate_number++, v.name, launch_dims(v.launch->grid),
                launch_dims(v.launch->block), cexpr(v.launch->shared_bytes), args);
    }
    out.linef("            default: cuda.launch({}, \"{}\", {}, {}, {}{}); return;", i, k.name,
              launch_dims(k.launch->grid), launch_dims(k.launch->block),
              cexpr(k.launch->shared_bytes), args);
    out.line("        }");
    out.line("    });");
    out.line("}");
  }
}

void CudaWrapperOps::write_kernel_call(IndentedBuffer& out, const std::string& label,
                                       const std::string& function, const std::string& args) {
  out.line("{");
  out.indent();
  write_timing_mark(out, label, "kernel");
  out.linef("launch_{}(state.cuda, {});", function, args);
  // A profiled run waits for each kernel, so that its event times the kernel, not its launch.
  out.linef("if (profile != nullptr) state.cuda.synchronize({});", cpp_quote(label));
  out.dedent();
  out.line("}");
}

void CudaWrapperOps::write_library_choice(IndentedBuffer& out, const std::string& library, int site,
                                          const std::optional<std::string>& problem) {
  if (!cached_library_choices_ || !problem) return;
  if (autotune_gpu_.empty()) autotune_gpu_ = autotune::cuda_autotune_gpu();
  const std::optional<autotune::CudaLibraryChoice> choice = autotune::lookup_cuda_library_choice(
      autotune::AutotuneCache(autotune::default_autotune_cache_path(cache_dir_)), library, *problem,
      autotune_gpu_);
  if (library == "cublaslt" && !gemm_precisions_.empty()) {
    // Kiln's GEMM template, timed in the same run as cuBLASLt's algorithms: baked when faster.
    const std::optional<autotune::CudaLibraryChoice> kiln = autotune::lookup_cuda_library_choice(
        autotune::AutotuneCache(autotune::default_autotune_cache_path(cache_dir_)), "kiln_gemm",
        *problem, autotune_gpu_);
    if (kiln && (!choice || (kiln->gpu == choice->gpu && kiln->ms < choice->ms))) {
      const std::vector<CudaGemmConfig>& configs = cuda_gemm_configs();
      const CudaGemmConfig& c = configs.at(static_cast<size_t>(kiln->index / 2) % configs.size());
      out.linef(
          "state.cuda.gemm_template_choice({}, {}, {});  // autotune cache: Kiln's GEMM template "
          "{}x{}x{}{}, sm_{}",
          site, kiln->index, kiln->version, c.bm, c.bn, c.bk, kiln->index % 2 ? " split-K" : "",
          kiln->arch);
      return;
    }
  }
  if (!choice) return;
  const bool conv = library == "cudnn";
  out.linef("state.cuda.library_choice({}, {}, {}, {});  // autotune cache: {} {} #{}, sm_{}",
            conv ? "true" : "false", site, choice->index, choice->version,
            conv ? "cuDNN" : "cuBLASLt", conv ? "engine" : "algorithm", choice->index,
            choice->arch);
}

void CudaWrapperOps::write_library_call(IndentedBuffer& out, const ir::Buffer& buffer,
                                        const ir::Program& program) {
  if (buffer.device == ir::Device::kCuda && buffer.call.as<ir::MatMulCall>() != nullptr) {
    write_library_choice(out, "cublaslt", matmul_sites_, cuda_matmul_problem(buffer, precision_));
    write_cuda_matmul(out, buffer, matmul_sites_++, precision_,
                      fmt::format("matmul ({})", origins_text(buffer)));
    return;
  }
  if (buffer.device == ir::Device::kCuda && buffer.call.as<ir::ConvCall>() != nullptr) {
    write_library_choice(out, "cudnn", conv_sites_, cuda_conv_problem(buffer, precision_));
    write_cuda_conv(out, buffer, conv_sites_++, precision_,
                    fmt::format("conv ({})", origins_text(buffer)));
    return;
  }
  if (buffer.device == ir::Device::kCuda && buffer.call.as<ir::AttentionCall>() != nullptr) {
    write_cuda_attention(out, buffer, fmt::format("attention ({})", origins_text(buffer)));
    return;
  }
  // lower/nn.cpp gives no GEMM choice (a CPU template's packed weights) for CUDA.
  KILN_CHECK(buffer.call.as<ir::GemmCall>() == nullptr,
             "gemm {}: a CPU GEMM choice in a program lowered for CUDA", buffer.name);
  const std::optional<std::string_view> reason = cuda_host_fallback(buffer.call.op);
  if (buffer.device != ir::Device::kCpu || !reason) {
    internal_error("{} of buffer {} has no GPU emission and is not on the host-fallback list",
                   buffer.call.name(), buffer.name);
  }
  out.linef("// on the host: {}", comment_safe(std::string(*reason)));
  write_on_host(out, buffer, program, true,
                [&] { host_->write_library_call(out, buffer, program); });
  out.line("host.finish();  // what it wrote, to the GPU");
}

void CudaWrapperOps::write_on_host(IndentedBuffer& out, const ir::Buffer& buffer,
                                   const ir::Program& program, bool writes,
                                   const std::function<void()>& write_call) {
  // The buffers it reads, then the one it writes, numbered in the HostCall.
  std::vector<const ir::Buffer*> buffers;
  for (const std::string& name : buffer.reads()) {
    const ir::Buffer* b = program.find(name);
    KILN_CHECK(b != nullptr, "{} reads {}, which the program lacks", buffer.name, name);
    buffers.push_back(b);
  }
  if (writes) buffers.push_back(&buffer);
  waits_ = true;  // a host call synchronizes: no CUDA graph for this program
  std::vector<std::string> names;
  for (const ir::Buffer* b : buffers) names.push_back(b->name);
  out.linef("kiln_cuda::HostCall host(state.cuda, {{{}}});", fmt::join(names, ", "));
  out.line("{");
  {
    auto _ = out.scope();
    if (writes) {
      out.line(
          "// What it reads: the host's constants, copies of the rest from the GPU; host storage");
      out.line("// for what it writes:");
    } else {
      out.line("// What it reads: the host's constants, copies of the rest from the GPU:");
    }
    for (size_t k = 0; k < buffers.size(); ++k) {
      const ir::Buffer& b = *buffers[k];
      const std::string t = ctype(b.dtype);
      const std::string n = cexpr(b.layout.storage_size());
      if (auto c = constants_.find(b.name); c != constants_.end()) {
        out.linef("const {}* const {} = static_cast<const {}*>(constants[{}]);  // the host's", t,
                  b.name, t, c->second);
      } else if (!writes || k + 1 < buffers.size()) {
        out.linef("const {}* const {} = host.in<{}>({}, {});", t, b.name, t, k, n);
      } else {
        out.linef("{}* const {} = host.out<{}>({}, {});", t, b.name, t, k, n);
      }
    }
    out.linef("host.ready({});", cpp_quote(buffer.call.name()));
    write_call();
  }
  out.line("}");
}

void CudaWrapperOps::write_control_flow(IndentedBuffer& out, const ir::Buffer& buffer,
                                        const ir::Program& program, int64_t results,
                                        const std::function<void()>& write_call) {
  const std::optional<std::string_view> reason = cuda_host_fallback(buffer.call.op);
  KILN_CHECK(reason.has_value(), "{}: control flow missing from the host-fallback list",
             buffer.name);
  out.linef("// on the host: {}", comment_safe(std::string(*reason)));
  write_on_host(out, buffer, program, false, write_call);
  out.linef("kiln_cuda::results_to_device(state.cuda, ws, {}, {});  // host results, to the GPU",
            buffer.name, results);
}

void CudaWrapperOps::write_entry_points(IndentedBuffer& out) {
  out.lines(R"(
// Checks that this machine runs the model (kiln_cuda::check_device): 0 when it does, else 1 with
// the reason in `error`.
extern "C" int kiln_check_device(char* error, int64_t error_size) {
    try {
        const std::string why = kiln_cuda::check_device(kDeviceNeeds);
        if (why.empty()) return 0;
        std::snprintf(error, static_cast<size_t>(error_size), "%s", why.c_str());
    } catch (const std::exception& e) {
        std::snprintf(error, static_cast<size_t>(error_size), "%s", e.what());
    }
    return 1;
}

// kiln_run with inputs and outputs in device memory or host memory, on the caller's stream (or
// null: the run state's own, waited for at the end): see include/kiln/runtime.h's
// kiln_model_run_cuda. A run on the caller's stream returns once its work is queued.
extern "C" int kiln_run_cuda(const kiln_rt::TensorArg* inputs, kiln_rt::TensorArg* outputs,
                             const void* const* constants, void* state, kiln_rt::Profile* profile,
                             char* error, int64_t error_size, void* stream, int inputs_on_device,
                             int outputs_on_device) {
    try {
        auto run = static_cast<ModelState*>(state)->runs.acquire();
        run->cuda.share_constants(&static_cast<ModelState*>(state)->cuda_constants);
        run->cuda.count_graphs(&static_cast<ModelState*>(state)->cuda_graph_stats);
        run->cuda.set_mode({stream, inputs_on_device != 0, outputs_on_device != 0});
        try {
            kiln_cuda::run_retrying(run->cuda, [&] { run_impl(inputs, outputs, constants, *run, profile); });
        } catch (...) {
            run->cuda.end_run();
            throw;
        }
        run->cuda.end_run();
        return 0;
    } catch (const kiln_rt::Error& e) {
        std::snprintf(error, static_cast<size_t>(error_size), "%s", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::snprintf(error, static_cast<size_t>(error_size), "%s", e.what());
        return 3;
    }
}

// The CUDA graph segments the runs of `state` have captured and launched so far.
extern "C" void kiln_cuda_graph_stats(void* state, int64_t* captured, int64_t* launched) {
    const kiln_cuda::GraphStats& stats = static_cast<ModelState*>(state)->cuda_graph_stats;
    *captured = stats.captured.load();
    *launched = stats.launched.load();
}

// Page-locked host memory (cuMemHostAlloc): copies from and to it overlap the GPU's work.
extern "C" int kiln_cuda_host_alloc(size_t bytes, void** p, char* error, int64_t error_size) {
    try {
        kiln_cuda::check(kiln_cuda::driver().cuMemHostAlloc(p, bytes == 0 ? 1 : bytes, 0),
                         "cuMemHostAlloc");
        return 0;
    } catch (const std::exception& e) {
        std::snprintf(error, static_cast<size_t>(error_size), "%s", e.what());
        return 3;
    }
}

extern "C" void kiln_cuda_host_free(void* p) {
    if (p != nullptr) kiln_cuda::driver().cuMemFreeHost(p);
}

// Releases device memory a run allocated for an output (cuMemFree).
extern "C" void kiln_cuda_device_free(void* p) {
    if (p != nullptr) kiln_cuda::driver().cuMemFree(kiln_cuda::device_ptr(p));
})");
}

}  // namespace kiln::codegen
