#pragma once
/// What `kiln bench` times, whatever it was loaded from: a model's inputs and a function that
/// runs it once. load_bench_model() builds one from an ONNX model (compiled here, or found in the
/// code cache) or from a library built by `kiln compile -o model.so`, loaded through its C API
/// (include/kiln/runtime.h) as a user's program would.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/model_inputs.h"
#include "graph/tensor.h"
#include "sym/expr.h"

namespace kiln::cli {

/// One input of a model to benchmark.
struct BenchInput {
  std::string name;
  graph::DType dtype;
  /// Dims; a symbolic dim is a size symbol named as in the model (`batch`).
  std::vector<sym::Expr> shape;
  /// For an index input (read Gather-style): the size of the axis it indexes, the bound of its
  /// random values.
  std::optional<sym::Expr> indexed_axis_size;
};

/// One kernel or library call of a profiled run.
struct TraceEvent {
  std::string name;
  std::string kind;  // "kernel" or "call"
  double start_us = 0;
  double duration_us = 0;
  uint32_t thread = 0;
};

/// A model ready to time.
struct BenchModel {
  std::vector<BenchInput> inputs;
  /// Runs the model once on inputs in `inputs` order and returns its outputs.
  std::function<std::vector<graph::Tensor>(const std::vector<graph::Tensor>&)> run;
  /// Runs it once recording one event per kernel or library call.
  std::function<std::vector<TraceEvent>(const std::vector<graph::Tensor>&)> profiled_run;
  double compile_seconds = 0;             // compiling or loading it
  bool cache_hit = false;                 // the compiled code came from the code cache
  std::string summary;                    // what was compiled: "53 kernels, 54 library calls"
  std::vector<std::string> output_names;  // the outputs run() returns, in order
  GivenInputs given;                      // the inputs given as files (BenchLoadOptions::inputs)
};

struct BenchLoadOptions {
  /// The code cache directory; empty means KILN_CACHE_DIR or ~/.cache/kiln.
  std::filesystem::path cache_dir;
  /// OpenMP threads of each run of a library (0: the OpenMP default).
  int threads = 0;
  /// Inputs given as NAME=FILE (`--input`): read against the model's inputs; the compile of an
  /// ONNX model specializes on them as `kiln run`'s does.
  std::vector<std::string> inputs;
};

/// Loads `path` as a BenchModel: a compiled library when it ends in .so, else an ONNX model,
/// compiled with the OpenMP thread count in effect. Throws UserError.
BenchModel load_bench_model(const std::string& path, const BenchLoadOptions& options);

}  // namespace kiln::cli
