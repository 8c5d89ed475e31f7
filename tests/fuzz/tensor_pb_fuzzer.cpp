// Fuzz target: the .pb readers of `kiln run --input`: the bytes are written to a file and read as
// a tensor (TensorProto), as a sequence (SequenceProto) and as an optional (OptionalProto), the
// three ways read_value_file reads a value. External data resolves inside the scratch directory,
// which holds nothing else. Seeds: the suite's input_*.pb and output_*.pb files.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string_view>

#include "fuzz_target.h"
#include "graph/graph.h"
#include "onnx/tensor_file.h"

namespace {

void read_as(const std::filesystem::path& path, kiln::graph::Type type) {
  kiln::fuzz::expect_clean([&] {
    kiln::graph::IoValue value = kiln::onnx::read_value_file(path, type);
    for (const kiln::graph::Tensor& t : value.tensors) (void)kiln::onnx::tensor_summary(t);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path path = kiln::fuzz::scratch_dir() / "input.pb";
  kiln::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  using kiln::graph::Type;
  using kiln::graph::ValueKind;
  Type tensor;
  tensor.kind = ValueKind::kTensor;
  read_as(path, tensor);
  Type sequence;
  sequence.kind = ValueKind::kSequence;
  sequence.element = std::make_shared<Type>(tensor);
  read_as(path, sequence);
  Type optional;
  optional.kind = ValueKind::kOptional;
  optional.element = std::make_shared<Type>(sequence);
  read_as(path, optional);
  return 0;
}
