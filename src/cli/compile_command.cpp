// `kiln compile MODEL -o model.so`: a self-contained model library with the C API of
// include/kiln/runtime.h (driver::compile_library), and what it needs at run time.
#include <fmt/format.h>
#include <omp.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "autotune/select.h"
#include "cli/commands.h"
#include "driver/compile.h"
#include "onnx/importer.h"
#include "support/error.h"

namespace kiln::cli {
namespace {

struct CompileArgs {
  std::string model;
  std::string output;
  std::string weights = "embed";
  std::string target = "auto";
  std::string dump_dir;
  std::string cache_dir;
  std::string autotune;
  std::string conv_layout = "auto";
  std::string device = "cpu";
  std::string precision = "tf32";
  bool no_fuse_attention = false;
  bool cuda_fused_attention = false;
  int threads = 0;  // 0: OpenMP's default (OMP_NUM_THREADS, else the hardware threads)
};

std::string bytes_text(const std::string& bytes) {
  char* end = nullptr;
  const double v = std::strtod(bytes.c_str(), &end);
  if (end == bytes.c_str() || *end != '\0') return bytes + " bytes";
  if (v >= 1 << 20) return fmt::format("{:.2f} MiB", v / (1 << 20));
  if (v >= 1 << 10) return fmt::format("{:.1f} KiB", v / (1 << 10));
  return fmt::format("{} B", v);
}

int compile_model(const CompileArgs& args) {
  if (args.weights != "embed" && args.weights != "external")
    user_error("--weights {}: expected embed or external", args.weights);
  graph::Model model = onnx::import_model(args.model);
  driver::LibraryOptions options;
  options.output = args.output;
  options.external_weights = args.weights == "external";
  options.target = args.target;
  options.find_dependencies = true;
  options.compile.dump_dir = args.dump_dir;
  options.compile.cache_dir = args.cache_dir;
  options.compile.lowering.fuse_attention = !args.no_fuse_attention;
  options.compile.lowering.cuda_fused_attention = args.cuda_fused_attention;
  if (!args.autotune.empty())
    options.compile.autotune = autotune::parse_autotune_mode(args.autotune, "--autotune");
  if (args.conv_layout == "nchw") {
    options.compile.lowering.conv_layout = lower::ConvLayout::kNchw;
  } else if (args.conv_layout == "nhwc") {
    options.compile.lowering.conv_layout = lower::ConvLayout::kChannelsLast;
  } else if (args.conv_layout != "auto") {
    user_error("--conv-layout {}: expected auto, nchw or nhwc", args.conv_layout);
  }
  std::optional<ir::Device> device = ir::device_from_name(args.device);
  if (!device) user_error("--device {}: expected cpu or cuda", args.device);
  options.compile.device = *device;
  std::optional<ir::Precision> precision = ir::precision_from_name(args.precision);
  if (!precision) user_error("--precision {}: expected fp32, tf32, fp16 or bf16", args.precision);
  options.compile.precision = *precision;
  // The GEMM and convolution algorithms (how work is split between threads, block sizes) are
  // chosen for the threads a run will have: the compile's OpenMP thread count.
  if (args.threads > 0) omp_set_num_threads(args.threads);
  const driver::LibraryResult r = driver::compile_library(model, options);

  fmt::print("library: {} (target {})\n", r.library.string(), r.target);
  for (const driver::LibraryResult::Variant& v : r.variants) {
    fmt::print("variant: {} (needs {}; code {})\n", v.name, v.features,
               bytes_text(std::to_string(v.code_bytes)));
  }
  std::string prepacked;
  if (r.variant_weights_bytes > 0 && r.variants.size() > 1) {
    prepacked = fmt::format(", of which {} are weights prepacked for the other variants",
                            bytes_text(std::to_string(r.variant_weights_bytes)));
  }
  if (r.weights.empty()) {
    fmt::print("weights: {} embedded{}\n", bytes_text(std::to_string(r.weights_bytes)), prepacked);
  } else {
    fmt::print("weights: {} in {} (keep it beside the library){}\n",
               bytes_text(std::to_string(r.weights_bytes)), r.weights.string(), prepacked);
  }
  fmt::print("kernels: {}, library calls: {}\n", r.stats.kernels, r.stats.extern_calls);
  if (r.device != "cuda") {
    fmt::print("threads: algorithms chosen for runs on {} thread{} (--threads)\n", r.stats.threads,
               r.stats.threads == 1 ? "" : "s");
  }
  if (r.device == "cuda") {
    fmt::print("device: cuda (--precision {}); kernels: {}\n", args.precision,
               r.cuda_modules.empty() ? "none" : r.cuda_modules);
    for (const std::string& lib : r.loads) fmt::print("loads at run time: {}\n", lib);
    if (!r.cuda_side_stream.empty()) {
      fmt::print("side stream (KILN_CUDA_STREAMS=1 runs them on one stream):\n");
      std::istringstream forks(r.cuda_side_stream);
      for (std::string line; std::getline(forks, line);) fmt::print("  {}\n", line);
    }
  }
  fmt::print("arena: {} per run, for intermediates of {} allocated one by one\n",
             bytes_text(r.arena_bytes), bytes_text(r.intermediate_bytes));
  fmt::print("compiled in {:.2f}s ({})\n", r.stats.seconds,
             r.stats.cache_hit ? "from the code cache" : "built");
  if (!r.needed.empty()) fmt::print("needs at run time: {}\n", fmt::join(r.needed, " "));
  if (!r.packages.empty())
    fmt::print("Debian packages: apt-get install {}\n", fmt::join(r.packages, " "));
  return 0;
}

}  // namespace

void add_compile_command(CLI::App& app, CommandAction& chosen) {
  auto args = std::make_shared<CompileArgs>();
  CLI::App* cmd = app.add_subcommand(
      "compile", "Compile a model into a self-contained shared library with a C API");
  cmd->add_option("model", args->model, "the ONNX model")->required();
  cmd->add_option("-o,--output", args->output, "the library to write (model.so)")->required();
  cmd->add_option("--weights", args->weights,
                  "embed (in the library's read-only data, the default) or external (in "
                  "<stem>.weights beside it, memory-mapped and checked at load)");
  cmd->add_option("--target", args->target,
                  "auto (the default: the model's code for x86-64-v4 and x86-64-v3 in one "
                  "library, the best one the CPU runs chosen at load), x86-64-v3 (AVX2 and "
                  "FMA), x86-64-v4 (AVX-512) or native (this machine's CPU)");
  cmd->add_option("--dump", args->dump_dir,
                  "write the IR, schedule, fusion decisions, memory plan and sources here");
  cmd->add_option("--cache-dir", args->cache_dir,
                  "the code cache (default: KILN_CACHE_DIR or ~/.cache/kiln)");
  cmd->add_option("--autotune", args->autotune,
                  "GEMM algorithm selection: off, default or max (see kiln run --help)");
  cmd->add_option("--conv-layout", args->conv_layout,
                  "activations of 2-D convolutions: auto (channels-last when the model has a "
                  "depthwise convolution or 3 or more float32 2-D ones, or float16/bfloat16 "
                  "ones on CUDA), nchw or nhwc");
  cmd->add_option("--device", args->device,
                  "cpu (the default) or cuda: a library that runs on an NVIDIA GPU, with its "
                  "kernels for sm_80 and sm_90 (KILN_CUDA_ARCHS) plus PTX, built without a GPU");
  cmd->add_option("--precision", args->precision,
                  "with --device cuda, the arithmetic of matrix products and convolutions: tf32 "
                  "(the default), fp32, or fp16 / bf16 (activations and weights in that type, "
                  "float32 accumulation and statistics)");
  cmd->add_option("--threads", args->threads,
                  "the threads the library's runs will use, for which it chooses its GEMM and "
                  "convolution algorithms (default: OMP_NUM_THREADS, else the hardware threads; "
                  "compiling on a larger machine than the one that runs the library needs it)")
      ->check(CLI::Range(1, 65536));
  cmd->add_flag("--no-fuse-attention", args->no_fuse_attention,
                "run attention (MatMul, scale, mask, Softmax, MatMul) node by node instead of "
                "as one fused kernel");
  cmd->add_flag("--cuda-fused-attention", args->cuda_fused_attention,
                "with --device cuda, run attention as Kiln's fused kernel (float32, heads up to "
                "128) instead of cuBLASLt's batched products and a Softmax kernel (the default: "
                "faster for BERT-base at sequence 128 on an H200)");
  cmd->callback([args, &chosen] { chosen = [args] { return compile_model(*args); }; });
}

}  // namespace kiln::cli
