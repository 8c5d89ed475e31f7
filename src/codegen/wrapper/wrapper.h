#pragma once
/// The wrapper: host C++ that runs a compiled model (Inductor's wrapper codegen, Python and C++).
/// It binds size symbols from the inputs' shapes, checks every input's dtype and shape against what
/// the compile assumed, allocates, frees and reuses intermediates by the memory plan, checks index
/// tensors, calls the kernels and library functions in schedule order, and returns the outputs.
///
/// The generated entry points (C calling convention, no exception crosses them):
///   extern "C" void* kiln_create_state();          // per loaded model, nullptr when out of memory
///   extern "C" void kiln_destroy_state(void* state);
///   extern "C" int kiln_run(const kiln_rt::TensorArg* inputs, kiln_rt::TensorArg* outputs,
///                           const void* const* constants, void* state,
///                           kiln_rt::Profile* profile, char* error, int64_t error_size);
/// kiln_run returns 0, or 2 for a bad input (message in `error`), 3 for an internal failure.
/// The state is a pool of per-run states (the arena of the intermediates, what library calls
/// cache between runs: oneDNN primitives and weights reordered for them): concurrent runs each
/// take one, and two models that share the library never share it. An output whose TensorArg
/// has data gets written there (it must hold `capacity` bytes); otherwise it is allocated with
/// the C heap and released with free() (or kiln_free()). `profile`, when not null, gets one
/// event per kernel or library call.
/// `constants` holds the data of every constant buffer in Program order
/// (WrapperSource::constants).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codegen/common/device_codegen.h"
#include "codegen/common/kernel.h"
#include "codegen/wrapper/memory_plan.h"
#include "ir/buffer.h"
#include "sched/schedule.h"

namespace kiln::codegen {

struct WrapperSource {
  /// Translation units: the wrapper first, then kernel units (compiled in parallel).
  std::vector<std::pair<std::string, std::string>> units;
  /// Device code the units embed (file name, text), for the dumps only.
  std::vector<std::pair<std::string, std::string>> device_sources;
  /// The data of the constant buffers passed through `constants`, in order (every graph's).
  std::vector<std::shared_ptr<const graph::Tensor>> constants;
  /// What the units need to build (the libraries the calls use, the choices' linkage).
  BuildNeeds needs;
  MemoryPlan plan;       // the model's function's
  ArenaPlan arena;       // where its intermediates live
  StreamPlan streams;    // its calls on a side stream (none on a device with one stream)
  int kernel_count = 0;  // distinct kernel functions after deduplication
};

/// One graph to generate a function for: the model's (first, function "run_impl") or a
/// control-flow subgraph's. `kernels` are the generated kernels of the schedule's kernel items,
/// in item order; their names are unique across graphs.
struct GraphCode {
  std::string function;
  const ir::Program* program = nullptr;
  const sched::Schedule* schedule = nullptr;
  const std::vector<GeneratedKernel>* kernels = nullptr;
};

/// Generates the wrapper (one function per graph) and groups the kernels of all graphs into
/// translation units; identical kernels are emitted once. What differs per device (includes,
/// run state, kernel and library calls, timing marks) comes from `codegen`'s WrapperOps; the
/// kernel units start with its prelude.
WrapperSource generate_wrapper(const std::vector<GraphCode>& graphs, const DeviceCodegen& codegen);

}  // namespace kiln::codegen
