// Fuzz target: external data of initializers (tensor_from_proto with data_location EXTERNAL): the
// location (relative, confined to the model directory after following symlinks), offset and
// length keys, the file's size, the memory mapping and the copy of misaligned data.
//
// Input: a 4-byte little-endian length n, n bytes of a serialized TensorProto, then the bytes of
// the file `data.bin` in the model directory. The model directory also holds a subdirectory
// `dir` and a symlink `up` to its parent, so locations that escape or name a directory are
// reachable. tests/fuzz/external_input_to_model.py turns such an input into a model.onnx and its
// data.bin for `kiln info`. Seeds: the suite's input tensors moved to external data.
#include <onnx/onnx_pb.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "fuzz_target.h"
#include "onnx/tensor_file.h"
#include "onnx/tensor_proto.h"

namespace fs = std::filesystem;

namespace {

const fs::path& model_dir() {
  static const fs::path dir = [] {
    fs::path d = kiln::fuzz::scratch_dir() / "model";
    fs::create_directories(d / "dir");
    fs::create_directory_symlink("..", d / "up");
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t n = 0;
  std::memcpy(&n, data, 4);
  if (n > size - 4) return 0;
  ::onnx::TensorProto proto;
  if (!proto.ParseFromArray(data + 4, static_cast<int>(n))) return 0;
  proto.set_data_location(::onnx::TensorProto_DataLocation_EXTERNAL);
  kiln::fuzz::write_file(
      model_dir() / "data.bin",
      std::string_view(reinterpret_cast<const char*>(data) + 4 + n, size - 4 - n));
  kiln::fuzz::expect_clean([&] {
    kiln::graph::Tensor t = kiln::onnx::tensor_from_proto(proto, model_dir(), "initializer 'w'");
    (void)kiln::onnx::tensor_summary(t);  // reads every element of the mapping
  });
  return 0;
}
