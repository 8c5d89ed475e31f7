// Fuzz target: the ONNX importer (protobuf parse, ONNX checker, shape inference, Kiln's graph
// building and verifier) on a serialized ModelProto. External data resolves against an empty
// scratch directory. Seeds: the suite's model.onnx files (tests/fuzz/make_seeds.py).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_target.h"
#include "onnx/importer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kiln::fuzz::expect_clean(
      [&] { kiln::onnx::import_model_from_bytes(bytes, "fuzz.onnx", kiln::fuzz::scratch_dir()); });
  return 0;
}
