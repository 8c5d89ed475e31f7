#pragma once
/// The C API unit of a model library built by `kiln compile` (AOTInductor's counterpart, seed
/// 001): the model's inputs, outputs, target and weights as tables for
/// src/runtime/kiln_rt_api.h, which implements include/kiln/runtime.h over the wrapper's kiln_run.
/// The weights are the wrapper's constants laid out one after another at 64-byte aligned offsets
/// (src/runtime/kiln_rt_weights.h); the unit either embeds them (.incbin of the weights file into
/// read-only data) or expects them in `<stem>.weights` beside the library.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/tensor.h"
#include "ir/buffer.h"

namespace kiln::codegen {

/// The weights file: the 64-byte header, then the payload.
struct WeightsBlob {
  std::vector<uint64_t> offsets;  // each constant's offset in the payload
  std::vector<unsigned char> file;
  uint64_t payload_bytes() const;
  uint64_t checksum() const;
};

WeightsBlob layout_weights(const std::vector<std::shared_ptr<const graph::Tensor>>& constants);

struct ModelApiOptions {
  std::string target;    // "x86-64-v3" or "native"
  std::string features;  // CPU features the library needs, comma-separated
  /// Embed the weights: the unit .incbin's `weights_file` (found through the assembler's -I).
  bool embed_weights = true;
  std::string weights_file;
};

/// The source of model_api.cpp.
std::string generate_model_api(const ir::Program& program, const WeightsBlob& weights,
                               const ModelApiOptions& options);

}  // namespace kiln::codegen
