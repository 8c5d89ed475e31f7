#pragma once
/// The interface a backend implements for one device (Inductor's per-device BaseScheduling, both
/// halves, with get_scheduling_for_device's choice): the scheduler's fusion hooks, the kernel of
/// a scheduled group, the text every unit of kernels starts with, and how its units are built.
/// The driver picks one per device with make_device_codegen and names no backend itself. The
/// wrapper's per-device operations are the backend's too (WrapperOps).
///
/// Implementations: codegen/cpp/cpp_codegen.h (CppCodegen, the CPU: C++ with OpenMP and SIMD),
/// codegen/cuda/cuda_codegen.h (CudaCodegen: CUDA kernels through NVRTC, library calls on the
/// host).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codecache/compiler.h"
#include "codegen/common/kernel.h"
#include "ir/buffer.h"
#include "ir/device.h"
#include "sched/schedule.h"
#include "sched/scheduler.h"
#include "support/indented_buffer.h"

namespace kiln::codegen {

/// What the generated units need to build besides the backend's own headers and libraries.
struct BuildNeeds {
  bool uses_blas = false;                 // OpenBLAS
  bool uses_dnnl = false;                 // oneDNN
  std::vector<std::string> include_dirs;  // the autotune choices' (autotune::ChoiceLinkage)
  std::vector<std::string> libraries;
};

/// Where the wrapper's memory plan puts a buffer it allocates (WrapperOps::write_allocation).
/// Expressions are C++ text of the wrapper's function.
struct Allocation {
  enum class Place : uint8_t {
    kOutput,     // the caller's buffer for model output `output` (or storage handed to it)
    kArena,      // `offset` bytes into the run's arena
    kWorkspace,  // the function's workspace: a size known only mid-run, or a subgraph's buffer
  };
  Place place = Place::kWorkspace;
  std::string buffer;       // the pointer to declare
  std::string ctype;        // its element type
  std::string elements;     // kOutput, kWorkspace: how many elements
  std::string offset;       // kArena
  size_t output = 0;        // kOutput: the output's index
  std::string output_name;  // kOutput: the output's name as a C++ string literal
};

/// What differs per device in the wrapper (codegen/wrapper/wrapper.h), which writes the
/// device-neutral rest itself (memory-plan decisions, control flow, guards and checks,
/// data-dependent sizes, output shapes): the runtime headers, the run state's members (its
/// arena, what library calls keep between runs), storage (the workspace, arena, allocations,
/// releases, results handed between functions), declarations of what it calls, kernel calls,
/// library calls and the timing marks around them. One object serves one wrapper: it gathers
/// the units and build needs of what it wrote.
class WrapperOps {
 public:
  virtual ~WrapperOps() = default;
  /// Notes what `call` needs; called for every call of every graph before anything is written.
  virtual void note(const ir::ExternCall& call) = 0;
  /// The includes; `uses_control`: the wrapper runs If, Loop or Scan.
  virtual void write_includes(IndentedBuffer& out, bool uses_control) = 0;
  /// Members of the per-run state struct.
  virtual void write_run_state_members(IndentedBuffer& out) = 0;
  /// Members of the per-model state struct, shared by its runs (before its pool of run states,
  /// so that they outlive them).
  virtual void write_model_state_members(IndentedBuffer& out) { (void)out; }
  /// A function's workspace, its first line: the storage write_allocation's kWorkspace takes.
  virtual void write_workspace(IndentedBuffer& out) = 0;
  /// Declares `const ctype* pointer`: the data of model input `k` (`in<k>`, a TensorArg).
  virtual void write_input_data(IndentedBuffer& out, size_t k, const std::string& ctype,
                                const std::string& pointer) = 0;
  /// The data of model input buffer `pointer` (declared by write_input_data) where the host
  /// reads it: value guards and sizes read from an input's values.
  virtual std::string host_input_data(const std::string& pointer) const { return pointer; }
  /// Declares `const ctype* pointer`: the data of constant `index` (`constants[index]`, `bytes`
  /// bytes).
  virtual void write_constant_data(IndentedBuffer& out, size_t index, const std::string& ctype,
                                   const std::string& pointer, size_t bytes) = 0;
  /// `char* const arena`: the run state's arena, grown to `bytes`.
  virtual void write_arena(IndentedBuffer& out, const std::string& bytes) = 0;
  /// Declares `allocation.buffer` at its place.
  virtual void write_allocation(IndentedBuffer& out, const Allocation& allocation) = 0;
  /// Checks that the `count` indices at `pointer` lie in [-size, size) (`has_ignored`:
  /// `ignored` is allowed too), failing with a message naming `node` (a string literal) and the
  /// first index out of range; written before the first item that reads them. Arguments are
  /// C++ expressions.
  virtual void write_index_check(IndentedBuffer& out, const std::string& pointer,
                                 const std::string& count, const std::string& size,
                                 bool has_ignored, int64_t ignored, const std::string& node) = 0;
  /// Declares `const int64_t identifier`: element `element` of computed buffer `pointer`, a size
  /// the host needs from here on.
  virtual void write_size_read(IndentedBuffer& out, const std::string& identifier,
                               const std::string& pointer, const std::string& element) = 0;
  /// Frees workspace storage at `pointer` (a buffer past its last use).
  virtual void write_release(IndentedBuffer& out, const std::string& pointer) = 0;
  /// The workspace takes over the data of every TensorArg of array `results` (a control-flow
  /// call's, allocated by the subgraph).
  virtual void write_take_over(IndentedBuffer& out, const std::string& results) = 0;
  /// The workspace lets go of `pointer`: a subgraph's output, which its caller takes over.
  virtual void write_hand_over(IndentedBuffer& out, const std::string& pointer) = 0;
  /// Fills model output `k` (`outputs[k]`) with `data`: C++ expressions of its dtype code, rank,
  /// dims array, element size, and name (a string literal).
  virtual void write_finish_output(IndentedBuffer& out, size_t k, const std::string& data,
                                   const std::string& dtype, const std::string& rank,
                                   const std::string& dims, const std::string& element_size,
                                   const std::string& name) = 0;
  /// What the timing marks (write_timing_mark) need, before any function.
  virtual void write_timing_support(IndentedBuffer& out) = 0;
  /// Declarations of the kernels and of the functions library calls call.
  virtual void write_declarations(IndentedBuffer& out,
                                  const std::vector<const GeneratedKernel*>& kernels) = 0;
  /// Times what follows in its scope in a profiled run: `label` names the event, `kind` is
  /// "kernel" or "call".
  virtual void write_timing_mark(IndentedBuffer& out, const std::string& label,
                                 const std::string& kind) = 0;
  /// A call of kernel `function` with argument text `args`, timed as `label`.
  virtual void write_kernel_call(IndentedBuffer& out, const std::string& label,
                                 const std::string& function, const std::string& args) = 0;
  /// The library call that computes `buffer` (an extern buffer of `program`, not control flow).
  virtual void write_library_call(IndentedBuffer& out, const ir::Buffer& buffer,
                                  const ir::Program& program) = 0;
  /// The control-flow call `buffer` of `program` (If, Loop, Scan), which `write_call` writes
  /// over host data; its results, the TensorArg array named `buffer.name`, hold `results`
  /// tensors the subgraph allocated. A device whose storage is not the host's copies what the
  /// call reads to the host first and the results to the device after it.
  virtual void write_control_flow(IndentedBuffer& /*out*/, const ir::Buffer& /*buffer*/,
                                  const ir::Program& /*program*/, int64_t /*results*/,
                                  const std::function<void()>& write_call) {
    write_call();
  }
  /// Concurrent streams (codegen/wrapper/stream_plan.h): true for an item that queues device
  /// work without waiting and may run on a side stream; none on a device with one stream.
  virtual bool runs_concurrently(const sched::ScheduleItem& /*item*/) const { return false; }
  /// Before the model's function: whether its plan has forks with library calls on the side.
  virtual void note_streams(size_t /*forks*/, bool /*side_library_calls*/) {}
  /// Fork `k` (before its chain's first call), a side call's start (`enter`) and end, the join
  /// (before the first call reading the chain's result). `what` describes the fork.
  virtual void write_fork(IndentedBuffer& /*out*/, size_t /*k*/, const std::string& /*what*/) {}
  virtual void write_side(IndentedBuffer& /*out*/, size_t /*k*/, bool /*enter*/) {}
  virtual void write_join(IndentedBuffer& /*out*/, size_t /*k*/) {}
  /// `identifier`, a size known only mid-run (read from data or from an input's values), is
  /// one the device work after it depends on (CUDA graphs are keyed by it).
  virtual void write_size_known(IndentedBuffer& /*out*/, const std::string& /*identifier*/) {}
  /// The operations of the functions of control-flow subgraphs, which run on the host: this
  /// object on the CPU.
  virtual WrapperOps& subgraph_ops() { return *this; }
  /// True when the kernels are host functions the wrapper puts into translation units of
  /// kernels after the prelude (the CPU); false when write_declarations builds them itself.
  virtual bool kernels_in_host_units() const { return true; }
  /// Device code built into the units rather than being one (the CUDA kernels' source, whose
  /// cubins the wrapper embeds), as (file name, text): written with the dumps, never compiled.
  virtual std::vector<std::pair<std::string, std::string>> take_device_sources() { return {}; }
  /// The statement by which kiln_run runs the model's function on `run` (its RunState lease).
  virtual std::string run_call() const {
    return "run_impl(inputs, outputs, constants, *run, profile);";
  }
  /// Entry points of the wrapper's own, after kiln_run (the CUDA wrapper's device checks and
  /// runs on a caller's stream).
  virtual void write_entry_points(IndentedBuffer& out) { (void)out; }
  /// Translation units of its own (the functions of GEMM and convolution choices), in order.
  virtual std::vector<std::pair<std::string, std::string>> take_units() = 0;
  /// What the units need to build.
  virtual BuildNeeds needs() const = 0;
};

class DeviceCodegen {
 public:
  virtual ~DeviceCodegen() = default;

  virtual ir::Device device() const = 0;

  /// The scheduler's hooks: kernel names, group keys and fusion vetoes.
  virtual const sched::Backend& scheduling() const = 0;

  /// Whether this device computes `buffer` (else it runs on the host).
  virtual bool supports(const ir::Buffer& buffer) const = 0;

  /// The kernel of a kernel item of `program`'s schedule (Inductor's codegen_node). A GPU
  /// kernel carries its launch (GeneratedKernel::launch).
  virtual GeneratedKernel generate_kernel(const sched::ScheduleItem& item,
                                          const ir::Program& program) const = 0;

  /// The includes and helpers every translation unit of kernels starts with, once.
  virtual std::string prelude() const = 0;

  /// The wrapper's per-device operations, for one wrapper.
  virtual std::unique_ptr<WrapperOps> wrapper_ops() const = 0;

  /// The backend of control-flow subgraphs (If, Loop and Scan bodies), which run on the host
  /// with the wrapper's control flow (kiln_rt_control.h): this one on the CPU; the wrapper's
  /// subgraph_ops() writes their functions.
  virtual const DeviceCodegen& subgraph_codegen() const { return *this; }

  /// The compiler, flags, include directories and libraries of the generated units.
  virtual codecache::CompilerConfig build_config(const BuildNeeds& needs) const = 0;
};

/// The backend of `device`; what it caches (the CUDA backend's cubins) goes under `cache_dir`.
/// `precision`: the arithmetic of the GPU's matrix products (ir/device.h). `library`: the code
/// goes into a model library for other machines (`kiln compile`): the CUDA backend then builds
/// its kernels for every architecture of cuda_library_archs() plus PTX, not for this machine's
/// GPU. `tune_libraries` (--autotune max): the CUDA backend's library calls time their
/// candidate algorithms at their first run (kiln_rt_cuda.h: cuDNN engines, cuBLASLt algorithms)
/// instead of taking the heuristic's first. `cached_library_choices` (not --autotune off): they
/// take the choice the autotune cache holds for their problem (autotune/cuda_choice.h).
std::unique_ptr<DeviceCodegen> make_device_codegen(ir::Device device,
                                                   const std::filesystem::path& cache_dir,
                                                   ir::Precision precision, bool library = false,
                                                   bool tune_libraries = false,
                                                   bool cached_library_choices = true);

}  // namespace kiln::codegen
