// The compile pipeline as one straight list of stages; each stage can dump its result.
#include "driver/compile.h"

#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "autotune/cache.h"
#include "autotune/select.h"
#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"
#include "codecache/process.h"
#include "codegen/common/device_codegen.h"
#include "codegen/cpp/cpp_kernel.h"
#include "codegen/cuda/cuda_split_reduction.h"
#include "codegen/cuda/nvrtc_compile.h"
#include "codegen/wrapper/model_api.h"
#include "codegen/wrapper/wrapper.h"
#include "driver/placement.h"
#include "lower/conv_select.h"
#include "lower/mixed_precision.h"
#include "sched/scheduler.h"
#include "sched/template_epilogue.h"
#include "support/error.h"
#include "support/files.h"
#include "support/hash.h"
#include "support/log.h"

namespace kiln::driver {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_compiles{0};

class Dumper {
 public:
  explicit Dumper(fs::path dir) : dir_(std::move(dir)) {}
  void write(const std::string& name, const std::string& text) const {
    if (dir_.empty()) return;
    files::write_atomic(dir_ / name, text);
  }

 private:
  fs::path dir_;
};

std::string schedule_text(const sched::Schedule& schedule) {
  return "# before fusion\n" + schedule.before_fusion_text + "\n# after fusion\n" +
         schedule.after_fusion_text;
}

/// A graph's schedule and kernels: the model's, or a control-flow subgraph's.
struct GraphStages {
  std::string function;
  const ir::Program* program = nullptr;
  sched::Schedule schedule;
  std::vector<codegen::GeneratedKernel> kernels;
};

/// Schedules `program` and generates its kernels, then its subgraphs' (depth first) with the
/// backend of subgraphs (the host's). Kernels of a subgraph are prefixed with its name, so names
/// stay unique in the library.
void schedule_graph(const std::string& function, const std::string& prefix,
                    const ir::Program& program, const codegen::DeviceCodegen& codegen,
                    std::vector<GraphStages>& graphs) {
  GraphStages g;
  g.function = function;
  g.program = &program;
  g.schedule = sched::schedule(program, codegen.scheduling());
  for (sched::ScheduleItem& item : g.schedule.items) {
    if (item.kind != sched::ItemKind::kKernel) continue;
    if (!prefix.empty()) item.name = prefix + "_" + item.name;
    g.kernels.push_back(codegen.generate_kernel(item, program));
  }
  graphs.push_back(std::move(g));
  for (const auto& sub : program.subgraphs)
    schedule_graph("subgraph_" + sub->name, sub->name, sub->program, codegen.subgraph_codegen(),
                   graphs);
}

}  // namespace

int compile_count() { return g_compiles.load(); }

CompiledModel::CompiledModel(CompiledModel&&) noexcept = default;
CompiledModel& CompiledModel::operator=(CompiledModel&&) noexcept = default;
CompiledModel::~CompiledModel() = default;

namespace {

/// A file written under a temporary name: renamed to its place by commit(), removed when the
/// compile fails before that.
struct PartialFile {
  fs::path path;
  PartialFile() = default;
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;
  ~PartialFile() {
    std::error_code ec;
    if (!path.empty()) fs::remove(path, ec);
  }
  void commit(const fs::path& to) {
    std::error_code ec;
    fs::rename(path, to, ec);
    if (ec) user_error("{}: cannot store the weights: {}", to.string(), ec.message());
    path.clear();
  }
};

/// What every compile produces before the C++ compiler runs: the program, its schedules and
/// kernels (the model's first, then its subgraphs'), and the wrapper.
struct Generated {
  std::unique_ptr<codegen::DeviceCodegen> codegen;  // the backend of options.device
  std::unique_ptr<ir::Program> program;
  std::vector<GraphStages> graphs;
  codegen::WrapperSource source;
  fs::path cache_dir;
};

/// lower -> schedule and fuse -> generate kernels and wrapper, dumping each stage.
/// `library`: for a model library (compile_library), whose CUDA kernels are built for every
/// architecture of codegen::cuda_library_archs() plus PTX rather than for this machine's GPU.
Generated generate(const graph::Model& model, const CompileOptions& options,
                   std::optional<autotune::TemplateIsa> template_isa, const Dumper& dump,
                   bool library = false) {
  Generated g;
  // Absolute from here on: the compiler runs in other directories, and the paths it is given
  // (the embedded weights' folder) must name the same files there.
  g.cache_dir = options.cache_dir.empty() ? codecache::default_cache_dir()
                                          : fs::absolute(options.cache_dir).lexically_normal();
  const autotune::AutotuneMode tuning =
      options.autotune ? *options.autotune : autotune::autotune_mode_from_env();
  g.codegen = codegen::make_device_codegen(options.device, g.cache_dir, options.precision, library,
                                           tuning == autotune::AutotuneMode::kMax,
                                           tuning != autotune::AutotuneMode::kOff);
  lower::LoweringOptions lowering = options.lowering;
  lowering.threads = omp_get_max_threads();
  lowering.code_cache_dir = g.cache_dir;
  lowering.template_isa = template_isa;
  lowering.device = options.device;
  if (options.autotune) lowering.autotune = options.autotune;
  // --precision fp16|bf16: the graph with its float32 compute in the half type first.
  std::optional<graph::Model> half_model;
  if (ir::is_half_precision(options.precision)) {
    if (options.device != ir::Device::kCuda) {
      user_error("--precision {} is for --device cuda; the CPU computes float32 (use fp32)",
                 ir::precision_name(options.precision));
    }
    lower::MixedPrecisionReport report;
    half_model = lower::to_mixed_precision(model,
                                           options.precision == ir::Precision::kFp16
                                               ? graph::DType::kFloat16
                                               : graph::DType::kBFloat16,
                                           &report);
    if (!report.skipped.empty()) {
      fmt::print(stderr, "kiln: --precision {}: {}\n", ir::precision_name(options.precision),
                 report.skipped);
    }
    dump.write("0_mixed_precision.txt", half_model ? graph::dump(*half_model->graph) : "");
  }
  const graph::Graph& graph = half_model ? *half_model->graph : *model.graph;
  g.program = std::make_unique<ir::Program>(lower::lower_graph(graph, lowering));
  // CPU convolution choices (templates with prepacked weights) only for the CPU: CUDA runs every
  // convolution on cuDNN.
  if (options.device == ir::Device::kCpu) lower::select_conv_choices(*g.program, lowering);
  const ir::Program& program = *g.program;
  dump.write("1_ir.txt", program.str());
  if (options.fuse_epilogues) {
    sched::fuse_template_epilogues(*g.program, g.codegen->scheduling());
    sched::fuse_conv_prologues(*g.program, g.codegen->scheduling());
  }
  if (options.device != ir::Device::kCpu) place_buffers(*g.program, *g.codegen);
  // Long reductions into few rows: two kernels, so that the first fills the GPU.
  if (options.device == ir::Device::kCuda) codegen::split_long_reductions(*g.program);

  schedule_graph("run_impl", "", program, *g.codegen, g.graphs);
  std::string schedules, decisions;
  for (const GraphStages& stage : g.graphs) {
    std::string title = stage.function == "run_impl" ? "" : "# " + stage.function + "\n";
    schedules += title + schedule_text(stage.schedule);
    decisions += title + stage.schedule.decisions_text();
  }
  dump.write("2_schedule.txt", schedules);
  dump.write("3_fusion_decisions.txt", decisions);

  std::vector<codegen::GraphCode> code;
  for (const GraphStages& stage : g.graphs)
    code.push_back({stage.function, stage.program, &stage.schedule, &stage.kernels});
  g.source = codegen::generate_wrapper(code, *g.codegen);
  dump.write("4_memory_plan.txt", g.source.plan.str(program, g.graphs.front().schedule));
  dump.write("4_arena.txt", g.source.arena.str());
  dump.write("4_streams.txt", g.source.streams.str(g.graphs.front().schedule));
  for (const auto& [name, text] : g.source.units) dump.write("5_" + name, text);
  for (const auto& [name, text] : g.source.device_sources) dump.write("5_" + name, text);
  return g;
}

void fill_stats(const Generated& g, CompileStats& stats) {
  stats.kernels = g.source.kernel_count;
  for (const auto& item : g.graphs.front().schedule.items)
    stats.extern_calls += item.kind == sched::ItemKind::kExtern;
  stats.buffers = static_cast<int>(g.program->buffers.size());
  stats.intermediate_allocations = g.source.plan.intermediate_allocations(*g.program);
  stats.threads = omp_get_max_threads();
  std::map<std::string, std::set<std::string>> nodes;
  for (const auto& item : g.graphs.front().schedule.items) {
    for (const ir::Buffer* b : item.buffers) {
      for (const auto& origin : b->origins)
        nodes[std::string(ir::device_name(item.device))].insert(origin.node);
    }
  }
  for (const auto& [device, names] : nodes)
    stats.nodes_per_device[device] = static_cast<int>(names.size());
}

std::vector<codecache::SourceUnit> source_units(const codegen::WrapperSource& source) {
  std::vector<codecache::SourceUnit> units;
  for (const auto& [name, text] : source.units) units.push_back({name, text});
  return units;
}

}  // namespace

GeneratedSources generate_sources(const graph::Model& model, const CompileOptions& options) {
  auto start = std::chrono::steady_clock::now();
  Generated g = generate(model, options, std::nullopt, Dumper(options.dump_dir));
  GeneratedSources result;
  for (const auto& [name, text] : g.source.units) result.units[name] = text;
  for (const auto& [name, text] : g.source.device_sources) result.device_sources[name] = text;
  fill_stats(g, result.stats);
  result.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

CompiledModel compile(const graph::Model& model, const CompileOptions& options) {
  auto start = std::chrono::steady_clock::now();
  ++g_compiles;
  Generated g = generate(model, options, std::nullopt, Dumper(options.dump_dir));
  const ir::Program& program = *g.program;
  const codegen::WrapperSource& source = g.source;
  codecache::CodeCache cache(g.cache_dir);
  fs::path library_path =
      cache.compile_shared_library(source_units(source), g.codegen->build_config(source.needs));

  CompiledModel compiled;
  compiled.library_ = std::make_unique<codecache::LoadedLibrary>(library_path);
  compiled.run_ = compiled.library_->symbol<CompiledModel::RunFn>("kiln_run");
  void* state = compiled.library_->symbol<void*()>("kiln_create_state")();
  if (state == nullptr)
    internal_error("{}: cannot create the model's state", library_path.string());
  compiled.state_ = {state, compiled.library_->symbol<void(void*)>("kiln_destroy_state")};
  compiled.constants_ = source.constants;
  for (const auto& constant : compiled.constants_)
    compiled.constant_ptrs_.push_back(constant->data());
  compiled.inputs_ = program.inputs;
  compiled.outputs_ = program.outputs;
  compiled.input_values_ = program.input_values;
  compiled.output_values_ = program.output_values;
  compiled.index_checks_ = program.index_checks;
  const autotune::AutotuneMode tuning =
      options.autotune ? *options.autotune : autotune::autotune_mode_from_env();
  if (options.device == ir::Device::kCuda && tuning == autotune::AutotuneMode::kMax) {
    // The run state reports the library candidates it times to $KILN_CUDA_TUNE_REPORT
    // (kiln_rt_cuda.h report_tuning); each run() stores that report in the autotune cache, for
    // the next compile to bake the choices in (autotune/cuda_choice.h).
    // A report the user asked for (the variable set, not by an earlier compile) is left to them.
    static bool set_here = false;
    const fs::path report = g.cache_dir / fmt::format("cuda-tune-report-{}.txt", getpid());
    const char* set = std::getenv("KILN_CUDA_TUNE_REPORT");
    if (set == nullptr || *set == '\0' || set_here) {
      set_here = true;
      setenv("KILN_CUDA_TUNE_REPORT", report.c_str(), 1);
      compiled.cuda_tune_report_ = report;
      compiled.autotune_cache_ = autotune::default_autotune_cache_path(g.cache_dir);
    }
  }
  CompileStats& stats = compiled.stats_;
  fill_stats(g, stats);
  stats.cache_hit = cache.stats().compiles == 0;
  // The host holds libgomp itself (this call links it): model libraries use OpenMP, and
  // unloading the last user of libgomp under its idle worker threads crashes the process.
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::write(log::Category::kCompile, "compiled {} kernels in {:.2f}s ({})", stats.kernels,
             stats.seconds, stats.cache_hit ? "cache hit" : "built");
  return compiled;
}

namespace {

/// One build of the model's code for an ISA level: its name, -march, the CPU features it checks
/// at load, and the ISA its GEMM and convolution templates may use (empty: the host's).
struct Target {
  std::string name;
  std::string march;
  std::string features;
  std::optional<autotune::TemplateIsa> template_isa;
};

/// The variants a library built for `--target name` holds, best first.
std::vector<Target> targets_for(const std::string& name) {
  const std::string v3 = "avx,avx2,fma,bmi,bmi2,f16c";
  const std::string v4 = v3 + ",avx512f,avx512bw,avx512cd,avx512dq,avx512vl";
  const Target x86_64_v3{"x86-64-v3", "-march=x86-64-v3", v3, autotune::TemplateIsa::kAvx2};
  const Target x86_64_v4{"x86-64-v4", "-march=x86-64-v4", v4, autotune::TemplateIsa::kAvx512};
  if (name == "auto") return {x86_64_v4, x86_64_v3};
  if (name == "x86-64-v3") return {x86_64_v3};
  if (name == "x86-64-v4") return {x86_64_v4};
  if (name == "native") {
    // Code built with -march=native on an AVX-512 machine may use AVX-512 anywhere.
    if (autotune::host_template_isa() == autotune::TemplateIsa::kAvx512)
      return {{"native", "-march=native", v4, std::nullopt}};
    return {{"native", "-march=native", v3, std::nullopt}};
  }
  user_error("--target {}: expected auto, x86-64-v3, x86-64-v4 or native", name);
}

/// The shared libraries `libraries` need (ldd: the model library and its variants, which it
/// loads) and the Debian packages that hold them (dpkg -S); empty lists when the tools are
/// missing.
void find_dependencies(const std::vector<fs::path>& libraries, LibraryResult& result) {
  std::vector<std::string> paths;
  for (const fs::path& library : libraries) {
    process::Result ldd = process::run({"ldd", {library.string()}, {}, std::chrono::seconds(30)});
    if (!ldd.ok()) return;
    std::istringstream lines(ldd.stdout_text);
    for (std::string line; std::getline(lines, line);) {
      const size_t arrow = line.find("=> ");
      if (arrow == std::string::npos) continue;
      std::string path = line.substr(arrow + 3);
      path = path.substr(0, path.find(' '));
      if (path.empty() || path[0] != '/') continue;
      if (std::find(paths.begin(), paths.end(), path) != paths.end()) continue;
      result.needed.push_back(fs::path(path).filename().string());
      paths.push_back(path);
    }
  }
  // dpkg knows a file by the path its package installed: with Debian's merged /usr that may be
  // /lib/... for a library ldd finds under /usr/lib/..., or the target of a symlink.
  std::set<std::string> packages;
  for (const std::string& path : paths) {
    std::vector<std::string> names = {path, fs::canonical(path).string()};
    for (size_t k = 0, n = names.size(); k < n; ++k) {
      if (names[k].rfind("/usr/", 0) == 0) names.push_back(names[k].substr(4));
    }
    for (const std::string& name : names) {
      process::Result dpkg = process::run({"dpkg", {"-S", name}, {}, std::chrono::seconds(30)});
      if (!dpkg.ok()) continue;
      std::string package = dpkg.stdout_text.substr(0, dpkg.stdout_text.find(':'));
      if (!package.empty()) packages.insert(package);
      break;
    }
  }
  result.packages.assign(packages.begin(), packages.end());
}

/// Copies `from` to `to` through a temporary name in the destination directory and a rename.
void copy_atomic(const fs::path& from, const fs::path& to) {
  const fs::path temp = to.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::copy_file(from, temp, fs::copy_options::overwrite_existing, ec);
  if (!ec) fs::permissions(temp, fs::perms(0755), ec);
  if (!ec) fs::rename(temp, to, ec);
  if (ec) {
    fs::remove(temp);
    user_error("{}: cannot write the library: {}", to.string(), ec.message());
  }
}

/// "sm_80, sm_90 and PTX for compute_80": the modules of a CUDA library's kernels.
std::string cuda_modules_text() {
  std::vector<int> archs = codegen::cuda_library_archs();
  std::string text;
  for (int arch : archs) text += fmt::format("{}sm_{}", text.empty() ? "" : ", ", arch);
  return fmt::format("{} and PTX for compute_{}", text,
                     *std::min_element(archs.begin(), archs.end()));
}

std::string bytes_expr(const sym::Expr& e) {
  if (auto v = e.as_integer()) return std::to_string(*v);
  return e.str();
}

/// The constants of every variant as one list, equal tensors once (variants that prepack a
/// weight alike share it), and each variant's constants as indices into it.
struct ConstantUnion {
  std::vector<std::shared_ptr<const graph::Tensor>> all;
  std::vector<std::vector<size_t>> per_variant;
  uint64_t shared_bytes = 0;  // what the first variant's constants take
};

/// The name of embedded weights in the cache's weights folder: their checksum and size.
std::string blob_file_name(const codegen::WeightsBlob& weights) {
  return fmt::format("{:016x}-{}.weights", weights.checksum, weights.payload_bytes);
}

ConstantUnion unite_constants(const std::vector<const codegen::WrapperSource*>& sources) {
  ConstantUnion result;
  // By byte size: tensors of different content differ early, so comparing is cheap.
  std::map<size_t, std::vector<size_t>> by_size;
  for (const codegen::WrapperSource* source : sources) {
    std::vector<size_t>& indices = result.per_variant.emplace_back();
    for (const auto& tensor : source->constants) {
      const auto* bytes = static_cast<const unsigned char*>(tensor->data());
      const size_t n = tensor->nbytes();
      std::vector<size_t>& same = by_size[n];
      auto found = std::find_if(same.begin(), same.end(), [&](size_t k) {
        if (result.all[k] == tensor) return true;
        if (result.all[k]->dtype() != tensor->dtype()) return false;
        const bool equal = std::memcmp(result.all[k]->data(), bytes, n) == 0;
        // Equal weights were read whole: give the pages of mapped ones back.
        result.all[k]->release_pages();
        tensor->release_pages();
        return equal;
      });
      if (found != same.end()) {
        indices.push_back(*found);
        continue;
      }
      same.push_back(result.all.size());
      indices.push_back(result.all.size());
      result.all.push_back(tensor);
    }
    if (result.per_variant.size() == 1) {
      for (const auto& tensor : result.all) result.shared_bytes += tensor->nbytes();
    }
  }
  return result;
}

/// How one variant of the model's code builds: a complete shared library exporting kiln_run, as
/// `kiln run` builds one, for the variant's -march.
codecache::LibrarySpec variant_spec(const Target& target, const Generated& g) {
  codecache::CompilerConfig config = g.codegen->build_config(g.source.needs);
  for (std::string& flag : config.flags) {
    if (flag == "-march=native") flag = target.march;
  }
  return {source_units(g.source), config};
}

/// What the model library itself needs to build: every variant's libraries (so that ldd shows
/// what the library needs at run time), built for the baseline x86-64 (it must run on any CPU to
/// say which features one lacks).
codecache::CompilerConfig outer_config(const std::vector<Generated>& variants) {
  auto add_new = [](std::vector<std::string>& to, const std::vector<std::string>& from) {
    for (const std::string& item : from) {
      if (std::find(to.begin(), to.end(), item) == to.end()) to.push_back(item);
    }
  };
  codegen::BuildNeeds needs;
  for (const Generated& g : variants) {
    needs.uses_blas |= g.source.needs.uses_blas;
    needs.uses_dnnl |= g.source.needs.uses_dnnl;
    add_new(needs.include_dirs, g.source.needs.include_dirs);
    add_new(needs.libraries, g.source.needs.libraries);
  }
  codecache::CompilerConfig config = variants.front().codegen->build_config(needs);
  config.include_dirs.push_back(codegen::cpp_public_include_dir());
  // The C API unit calls nothing of the runtime's out-of-line part (the variants link it), and
  // its flags name the variants' folders, so its own objects would be compiled for every model.
  config.shared_sources.clear();
  for (std::string& flag : config.flags) {
    if (flag == "-march=native") flag = "-march=x86-64";
  }
  return config;
}

}  // namespace

LibraryResult compile_library(const graph::Model& model, const LibraryOptions& options) {
  auto start = std::chrono::steady_clock::now();
  ++g_compiles;
  const bool cuda = options.compile.device == ir::Device::kCuda;
  // On CUDA the host code does little (launches, library calls, host fallbacks): one variant for
  // any recent x86-64 unless a target is named.
  const std::vector<Target> targets =
      targets_for(cuda && options.target == "auto" ? "x86-64-v3" : options.target);
  const fs::path dump_dir = options.compile.dump_dir;
  std::vector<Generated> variants;
  std::vector<codecache::LibrarySpec> specs;
  for (const Target& target : targets) {
    // The first variant dumps into the dump directory, the others into a folder of their own.
    CompileOptions compile = options.compile;
    if (!dump_dir.empty() && !variants.empty()) compile.dump_dir = dump_dir / target.name;
    // A template ISA this host lacks cannot be timed here: its choices are the heuristic's.
    if (target.template_isa == autotune::TemplateIsa::kAvx512 &&
        autotune::host_template_isa() != autotune::TemplateIsa::kAvx512)
      compile.autotune = autotune::AutotuneMode::kOff;
    variants.push_back(
        generate(model, compile, target.template_isa, Dumper(compile.dump_dir), true));
    specs.push_back(variant_spec(target, variants.back()));
  }
  const Generated& g = variants.front();
  codecache::CodeCache cache(g.cache_dir);
  const std::vector<fs::path> images = cache.compile_many(specs);  // the variants side by side

  // The weights: one blob; embedded, the assembler includes it from the cache's weights folder.
  std::vector<const codegen::WrapperSource*> sources;
  for (const Generated& v : variants) sources.push_back(&v.source);
  const ConstantUnion constants = unite_constants(sources);
  // The weights file is written before the model's unit is generated: the unit records the
  // payload's checksum, which is known once the payload has streamed through it. External
  // weights go to their place beside the library; embedded ones to the cache's weights folder
  // under a name made of their checksum and size (the assembler includes them from there).
  codegen::WeightsBlob weights = codegen::layout_weights(constants.all);
  const fs::path blob_dir = g.cache_dir / "weights";
  const fs::path& output = options.output;
  fs::path weights_path;
  // External weights are written under a name of their own and take their place beside the
  // library only once it is built and copied, so that a failed compile leaves neither a weights
  // file without its library nor a library (of an earlier compile) beside weights not its own.
  PartialFile partial_weights;
  if (options.external_weights) {
    if (output.empty()) user_error("external weights need an output path");
    fs::path stem = output;
    if (stem.extension() == ".so") stem.replace_extension();
    weights_path = stem.string() + ".weights";
    if (weights_path.has_parent_path()) fs::create_directories(weights_path.parent_path());
    partial_weights.path = weights_path.string() + fmt::format(".partial-{}", ::getpid());
    codegen::write_weights_file(partial_weights.path, constants.all, weights);
  } else {
    fs::create_directories(blob_dir);
    const fs::path unnamed = blob_dir / fmt::format("unnamed-{}.weights", ::getpid());
    codegen::write_weights_file(unnamed, constants.all, weights);
    // Named once the checksum is known; equal contents under an equal name, so replacing a file
    // already there changes nothing.
    std::error_code ec;
    fs::rename(unnamed, blob_dir / blob_file_name(weights), ec);
    if (ec) {
      fs::remove(unnamed, ec);
      user_error("{}: cannot store the weights: {}", blob_dir.string(), ec.message());
    }
  }
  const std::string blob_name = blob_file_name(weights);
  codegen::ModelApiOptions api;
  api.target = options.target;
  api.embed_weights = !options.external_weights;
  api.weights_file = blob_name;
  api.cuda = cuda;
  codecache::CompilerConfig config = outer_config(variants);
  for (size_t v = 0; v < targets.size(); ++v) {
    api.variants.push_back({targets[v].name, targets[v].features, images[v].filename().string(),
                            fs::file_size(images[v]), constants.per_variant[v]});
    // -Xassembler passes each argument whole (-Wa, would split a path at its commas).
    config.flags.insert(config.flags.end(),
                        {"-Xassembler", "-I", "-Xassembler", images[v].parent_path().string()});
  }
  const std::string model_api = codegen::generate_model_api(*g.program, weights, api);
  Dumper(dump_dir).write("5_model_api.cpp", model_api);
  if (api.embed_weights) {
    config.flags.insert(config.flags.end(),
                        {"-Xassembler", "-I", "-Xassembler", blob_dir.string()});
  }
  const fs::path built = cache.compile_shared_library({{"model_api.cpp", model_api}}, config);

  LibraryResult result;
  if (output.empty()) {  // the library stays in the code cache
    result.library = built;
  } else {
    if (output.has_parent_path()) fs::create_directories(output.parent_path());
    copy_atomic(built, output);
    result.library = output;
  }
  if (!partial_weights.path.empty()) partial_weights.commit(weights_path);
  result.weights = weights_path;
  result.weights_bytes = weights.payload_bytes;
  result.variant_weights_bytes = weights.payload_bytes - constants.shared_bytes;
  result.target = options.target;
  for (size_t v = 0; v < targets.size(); ++v)
    result.variants.push_back({targets[v].name, targets[v].features, fs::file_size(images[v])});
  result.arena_bytes = bytes_expr(g.source.arena.total);
  result.intermediate_bytes = bytes_expr(g.source.arena.intermediates);
  if (options.find_dependencies) {
    std::vector<fs::path> libraries = {result.library};
    libraries.insert(libraries.end(), images.begin(), images.end());
    find_dependencies(libraries, result);
  }
  fill_stats(g, result.stats);
  if (cuda) {
    result.device = "cuda";
    result.cuda_side_stream = g.source.streams.str(g.graphs.front().schedule);
    if (result.stats.kernels > 0) result.cuda_modules = cuda_modules_text();
    // Loaded with dlopen (kiln_rt_cuda.h), so ldd does not show them.
    result.loads.push_back("libcuda.so.1 (the NVIDIA driver, for CUDA " +
                           codegen::nvrtc_version_text() + " or newer)");
    bool blas = false, dnn = false;
    for (const auto& buffer : g.program->buffers) {
      if (buffer->kind != ir::BufferKind::kExtern || buffer->device != ir::Device::kCuda) continue;
      blas = blas || buffer->call.as<ir::MatMulCall>() != nullptr;
      dnn = dnn || buffer->call.as<ir::ConvCall>() != nullptr;
    }
    if (blas) result.loads.push_back("libcublasLt.so.13 or .12 (cuBLASLt 12.0 or newer)");
    if (dnn) result.loads.push_back("libcudnn.so.9 (cuDNN 9)");
  }
  result.stats.cache_hit = cache.stats().compiles == 0;
  result.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kiln::driver
