#pragma once
/// compile(): the whole pipeline in one straight line (compile.cpp reads as the list of stages),
/// and CompiledModel, a model loaded in this process and ready to run.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "graph/tensor.h"
#include "ir/buffer.h"
#include "ir/device.h"
#include "lower/lowering.h"

namespace kiln::codecache {
class LoadedLibrary;
}

namespace kiln_rt {
struct Profile;  // runtime/kiln_rt_profile.h
}

namespace kiln::driver {

struct CompileOptions {
  /// The code cache directory; empty means KILN_CACHE_DIR or ~/.cache/kiln.
  std::filesystem::path cache_dir;
  /// When set, every stage writes its result here (IR, schedule, fusion decisions, memory plan,
  /// generated sources).
  std::filesystem::path dump_dir;
  lower::LoweringOptions lowering;
  /// Algorithm selection for GEMM (--autotune off|default|max); empty: KILN_AUTOTUNE, else
  /// default (the heuristic plus what the autotune cache holds).
  std::optional<autotune::AutotuneMode> autotune;
  /// Fuse pointwise chains into the GEMM or convolution call before them, and a channels-last
  /// expansion into the depthwise convolution after it (on unless a benchmark compares with the
  /// unfused code).
  bool fuse_epilogues = true;
  /// The device the model's kernels run on; its backend (codegen::make_device_codegen) schedules
  /// and generates them.
  ir::Device device = ir::Device::kCpu;
  /// The arithmetic of matrix products (and, later, convolutions) on the GPU (--precision,
  /// ir/device.h); the CPU computes float32 either way.
  ir::Precision precision = ir::Precision::kTf32;
};

/// Facts about one compile, for the CLI and tests.
struct CompileStats {
  int kernels = 0;       // distinct generated kernel functions
  int extern_calls = 0;  // library calls
  int buffers = 0;       // buffers in the program
  int intermediate_allocations = 0;
  bool cache_hit = false;  // the shared library came from the code cache
  double seconds = 0;      // wall time of compile()
  int threads = 0;         // OpenMP threads the kernels and libraries use
  /// Device name ("cpu", "cuda") -> how many ONNX nodes of the model have work scheduled there
  /// (a node split between devices, such as NonZero's count on the host and its kernel on the
  /// GPU, counts on both).
  std::map<std::string, int> nodes_per_device;
};

class CompiledModel {
 public:
  CompiledModel(CompiledModel&&) noexcept;
  CompiledModel& operator=(CompiledModel&&) noexcept;
  ~CompiledModel();

  const std::vector<ir::InputSpec>& inputs() const { return inputs_; }
  const std::vector<ir::OutputSpec>& outputs() const { return outputs_; }
  const CompileStats& stats() const { return stats_; }
  /// Index inputs (read as Gather-style indices): input buffer name -> the axis size they index.
  const std::vector<ir::IndexCheck>& index_checks() const { return index_checks_; }

  /// Runs the model on inputs given in inputs() order. Throws UserError for bad inputs (the
  /// message names the input, expected versus actual) and for run-time errors such as an
  /// out-of-range index. With `profile`, the run records one event per kernel or library call.
  std::vector<graph::Tensor> run(const std::vector<graph::Tensor>& inputs,
                                 kiln_rt::Profile* profile = nullptr) const;

  /// The model's inputs and outputs as ONNX values (tensors, sequences, optionals) over the
  /// flat inputs() and outputs().
  const std::vector<ir::BoundaryValue>& input_values() const { return input_values_; }
  const std::vector<ir::BoundaryValue>& output_values() const { return output_values_; }
  /// run() on ONNX values: sequences and optionals must have the length and presence the model
  /// was compiled for (UserError otherwise).
  std::vector<graph::IoValue> run_values(const std::vector<graph::IoValue>& inputs) const;

  /// The CUDA graph segments this model's runs have captured and launched so far ({0, 0} for a
  /// model without CUDA graphs), for tests.
  std::pair<int64_t, int64_t> cuda_graph_segments() const;

 private:
  friend CompiledModel compile(const graph::Model& model, const CompileOptions& options);
  CompiledModel() = default;
  std::unique_ptr<codecache::LoadedLibrary> library_;
  /// --autotune max on CUDA: the run state's tuning report, stored after each run in the
  /// autotune cache at autotune_cache_ (autotune/cuda_choice.h); empty otherwise.
  std::filesystem::path cuda_tune_report_;
  std::filesystem::path autotune_cache_;
  using RunFn = int(const void*, void*, const void* const*, void*, void*, char*, int64_t);
  RunFn* run_ = nullptr;
  /// The library's per-model state (kiln_create_state); declared after library_ so that it is
  /// destroyed while the library is still loaded.
  std::unique_ptr<void, void (*)(void*)> state_{nullptr, nullptr};
  std::vector<std::shared_ptr<const graph::Tensor>> constants_;
  std::vector<const void*> constant_ptrs_;
  std::vector<ir::InputSpec> inputs_;
  std::vector<ir::OutputSpec> outputs_;
  std::vector<ir::BoundaryValue> input_values_;
  std::vector<ir::BoundaryValue> output_values_;
  std::vector<ir::IndexCheck> index_checks_;
  CompileStats stats_;
};

/// Compiles a model: lower → schedule and fuse → generate kernels and wrapper → build (or find
/// in the code cache) → load.
CompiledModel compile(const graph::Model& model, const CompileOptions& options);

/// What a compile generates, without building or loading it: the host units and the device
/// sources. With device cuda the kernels are compiled by NVRTC all the same (the wrapper embeds
/// their cubins; KILN_CUDA_ARCHS picks the architectures), so this checks that a model's CUDA
/// kernels compile on a machine without a GPU (kiln_onnx_runner --compile-only).
struct GeneratedSources {
  std::map<std::string, std::string> units;           // host C++ units by file name
  std::map<std::string, std::string> device_sources;  // "kernels.cu" and the like
  CompileStats stats;
};
GeneratedSources generate_sources(const graph::Model& model, const CompileOptions& options);

/// `kiln compile`: a self-contained model library with the C API of include/kiln/runtime.h.
struct LibraryOptions {
  CompileOptions compile;
  /// Where the library goes ("model.so"); written through a temporary name and a rename. Empty:
  /// it stays in the code cache (LibraryResult::library says where).
  std::filesystem::path output;
  /// Weights in `<stem>.weights` beside the library (memory-mapped and checked at load) instead
  /// of in its read-only data.
  bool external_weights = false;
  /// "auto": a variant of the model's code per ISA level (x86-64-v4 and x86-64-v3), the best one
  /// the CPU runs chosen at load; "x86-64-v3" (AVX2 and FMA: any recent x86-64 server),
  /// "x86-64-v4" (AVX-512) or "native" (this machine's CPU): that one alone.
  std::string target = "auto";
  /// Fill LibraryResult::needed and packages (runs ldd and dpkg: for `kiln compile`'s report).
  bool find_dependencies = false;
};

struct LibraryResult {
  std::filesystem::path library;
  std::filesystem::path weights;  // empty when embedded
  uint64_t weights_bytes = 0;
  uint64_t variant_weights_bytes = 0;  // of weights_bytes, what variants other than the first add
  std::string target;
  /// The variants it holds, best first: the ISA level, the CPU features it needs, its code's bytes.
  struct Variant {
    std::string name;
    std::string features;
    uint64_t code_bytes = 0;
  };
  std::vector<Variant> variants;
  /// The arena of one run's intermediates, and what they would take allocated one by one
  /// (both in bytes; expressions of the size symbols for dynamic shapes).
  std::string arena_bytes;
  std::string intermediate_bytes;
  /// Shared libraries it needs at run time (ldd) and the Debian packages that hold them, when
  /// LibraryOptions::find_dependencies asked for them.
  std::vector<std::string> needed;
  std::vector<std::string> packages;
  /// "cpu", or "cuda" for --device cuda: then the modules of its kernels ("sm_80, sm_90 and PTX
  /// for compute_80"; empty when it has no kernel) and the libraries it loads at run time with
  /// dlopen (which ldd does not show), each with the version it needs.
  std::string device = "cpu";
  std::string cuda_modules;
  std::vector<std::string> loads;
  /// --device cuda: the calls that run on the side stream, one line per fork
  /// (codegen/wrapper/stream_plan.h); empty when none does.
  std::string cuda_side_stream;
  CompileStats stats;
};

/// Compiles a model into a shared library at options.output (see LibraryOptions). The build
/// goes through the code cache, so compiling the same model again copies the cached library.
/// Throws UserError for a bad model, an unknown target or an unwritable output.
LibraryResult compile_library(const graph::Model& model, const LibraryOptions& options);

/// How many compiles this process has run through compile() (tests count recompilations).
int compile_count();

}  // namespace kiln::driver
