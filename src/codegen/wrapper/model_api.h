#pragma once
/// The C API unit of a model library built by `kiln compile` (as AOTInductor packages a model):
/// the model's inputs, outputs, weights and variants as tables for src/runtime/kiln_rt_api.h,
/// which implements include/kiln/runtime.h over the chosen variant's kiln_run. A variant is the
/// model's wrapper and kernels built as a shared library for one ISA level, embedded whole
/// (.incbin of the built file). The weights are the union of the variants' constants laid out one
/// after another at 64-byte aligned offsets (src/runtime/kiln_rt_weights.h); the unit either
/// embeds them (.incbin of the weights file into read-only data) or expects them in
/// `<stem>.weights` beside the library.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "graph/tensor.h"
#include "ir/buffer.h"

namespace kiln::codegen {

/// The layout of the weights file: the 64-byte header, then the payload (the constants at
/// 64-byte aligned offsets, zeros between them).
struct WeightsBlob {
  std::vector<uint64_t> offsets;  // each constant's offset in the payload
  uint64_t payload_bytes = 0;
  uint64_t checksum = 0;  // of the payload; set by write_weights_file
};

/// The offsets and size of the payload holding `constants` (reads none of their bytes).
WeightsBlob layout_weights(const std::vector<std::shared_ptr<const graph::Tensor>>& constants);

/// Writes the weights file of `blob` to `path` through a temporary name in its directory and a
/// rename, and sets blob.checksum. The constants are streamed to the file one piece at a time
/// and each mapped one gives its pages back once written (graph::Tensor::release_pages), so
/// the file is never held in memory whole. Throws UserError naming the path when it cannot be
/// written (no partial file is left).
void write_weights_file(const std::filesystem::path& path,
                        const std::vector<std::shared_ptr<const graph::Tensor>>& constants,
                        WeightsBlob& blob);

/// One variant of the model's code.
struct ModelVariant {
  std::string name;        // "x86-64-v4"
  std::string features;    // the CPU features it needs, comma-separated
  std::string image_file;  // the built library, found through the assembler's -I
  uint64_t image_bytes = 0;
  /// Its constants (the wrapper's, in order) as indices into the union the weights lay out.
  std::vector<size_t> constants;
};

struct ModelApiOptions {
  std::string target;                  // the --target: "auto", "x86-64-v3", ...
  std::vector<ModelVariant> variants;  // best first
  /// Embed the weights: the unit .incbin's `weights_file` (found through the assembler's -I).
  bool embed_weights = true;
  std::string weights_file;
  /// The variants are CUDA wrappers: the library exports kiln_model_cuda_entry too.
  bool cuda = false;
};

/// The source of model_api.cpp.
std::string generate_model_api(const ir::Program& program, const WeightsBlob& weights,
                               const ModelApiOptions& options);

}  // namespace kiln::codegen
