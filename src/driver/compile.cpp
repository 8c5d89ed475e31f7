// The compile pipeline as one straight list of stages; each stage can dump its result.
#include "driver/compile.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <fstream>

#include "codecache/code_cache.h"
#include "codecache/loaded_library.h"
#include "codegen/cpp/cpp_kernel.h"
#include "codegen/wrapper/wrapper.h"
#include "lower/conv_select.h"
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

/// The runtime headers' content goes into the cache key: the code includes them.
std::string runtime_headers_hash() {
  static const std::string hash = [] {
    Sha256 sha;
    std::vector<fs::path> headers;
    for (const auto& entry : fs::directory_iterator(codegen::cpp_runtime_include_dir())) {
      if (entry.path().extension() == ".h") headers.push_back(entry.path());
    }
    std::sort(headers.begin(), headers.end());
    for (const fs::path& h : headers) {
      sha.update(h.filename().string());
      sha.update(files::read(h));
    }
    return sha.hex_digest();
  }();
  return hash;
}

codecache::CompilerConfig compiler_config(const codegen::WrapperSource& source) {
  codecache::CompilerConfig config;
  config.include_dirs.push_back(codegen::cpp_runtime_include_dir());
  config.libraries.push_back("sleef");
  if (source.uses_blas) {
    config.include_dirs.push_back("/usr/include/x86_64-linux-gnu/openblas-openmp");
    config.libraries.push_back("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so");
  }
  if (source.uses_dnnl) config.libraries.push_back("dnnl");
  for (const std::string& dir : source.include_dirs) {
    if (std::find(config.include_dirs.begin(), config.include_dirs.end(), dir) ==
        config.include_dirs.end())
      config.include_dirs.push_back(dir);
  }
  for (const std::string& lib : source.libraries) {
    if (std::find(config.libraries.begin(), config.libraries.end(), lib) == config.libraries.end())
      config.libraries.push_back(lib);
  }
  config.extra_key = runtime_headers_hash();
  return config;
}

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

/// Schedules `program` and generates its kernels, then its subgraphs' (depth first). Kernels of
/// a subgraph are prefixed with its name, so names stay unique in the library.
void schedule_graph(const std::string& function, const std::string& prefix,
                    const ir::Program& program, codegen::CppBackend& backend,
                    std::vector<GraphStages>& graphs) {
  GraphStages g;
  g.function = function;
  g.program = &program;
  g.schedule = sched::schedule(program, backend);
  for (sched::ScheduleItem& item : g.schedule.items) {
    if (item.kind != sched::ItemKind::kKernel) continue;
    if (!prefix.empty()) item.name = prefix + "_" + item.name;
    g.kernels.push_back(codegen::generate_cpp_kernel(item, program));
  }
  graphs.push_back(std::move(g));
  for (const auto& sub : program.subgraphs)
    schedule_graph("subgraph_" + sub->name, sub->name, sub->program, backend, graphs);
}

}  // namespace

int compile_count() { return g_compiles.load(); }

CompiledModel::CompiledModel(CompiledModel&&) noexcept = default;
CompiledModel& CompiledModel::operator=(CompiledModel&&) noexcept = default;
CompiledModel::~CompiledModel() = default;

CompiledModel compile(const graph::Model& model, const CompileOptions& options) {
  auto start = std::chrono::steady_clock::now();
  ++g_compiles;
  Dumper dump(options.dump_dir);

  lower::LoweringOptions lowering = options.lowering;
  lowering.threads = omp_get_max_threads();
  lowering.code_cache_dir =
      options.cache_dir.empty() ? codecache::default_cache_dir() : options.cache_dir;
  if (options.autotune) lowering.autotune = options.autotune;
  ir::Program program = lower::lower_graph(*model.graph, lowering);
  lower::select_conv_choices(program, lowering);
  dump.write("1_ir.txt", program.str());
  if (options.fuse_epilogues) sched::fuse_template_epilogues(program);

  codegen::CppBackend backend;
  std::vector<GraphStages> graphs;
  schedule_graph("run_impl", "", program, backend, graphs);
  const sched::Schedule& schedule = graphs.front().schedule;
  std::string schedules, decisions;
  for (const GraphStages& g : graphs) {
    std::string title = g.function == "run_impl" ? "" : "# " + g.function + "\n";
    schedules += title + schedule_text(g.schedule);
    decisions += title + g.schedule.decisions_text();
  }
  dump.write("2_schedule.txt", schedules);
  dump.write("3_fusion_decisions.txt", decisions);

  std::vector<codegen::GraphCode> code;
  for (const GraphStages& g : graphs)
    code.push_back({g.function, g.program, &g.schedule, &g.kernels});
  codegen::WrapperSource source = codegen::generate_wrapper(code, codegen::cpp_kernel_prelude());
  dump.write("4_memory_plan.txt", source.plan.str(program, schedule));
  std::vector<codecache::SourceUnit> units;
  for (const auto& [name, text] : source.units) {
    dump.write("5_" + name, text);
    units.push_back({name, text});
  }

  codecache::CodeCache cache(options.cache_dir.empty() ? codecache::default_cache_dir()
                                                       : options.cache_dir);
  fs::path library_path = cache.compile_shared_library(units, compiler_config(source));

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
  CompileStats& stats = compiled.stats_;
  stats.kernels = source.kernel_count;
  for (const auto& item : schedule.items)
    stats.extern_calls += item.kind == sched::ItemKind::kExtern;
  stats.buffers = static_cast<int>(program.buffers.size());
  stats.intermediate_allocations = source.plan.intermediate_allocations(program);
  stats.cache_hit = cache.stats().compiles == 0;
  // The host holds libgomp itself (this call links it): model libraries use OpenMP, and
  // unloading the last user of libgomp under its idle worker threads crashes the process.
  stats.threads = omp_get_max_threads();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::write(log::Category::kCompile, "compiled {} kernels in {:.2f}s ({})", stats.kernels,
             stats.seconds, stats.cache_hit ? "cache hit" : "built");
  return compiled;
}

}  // namespace kiln::driver
