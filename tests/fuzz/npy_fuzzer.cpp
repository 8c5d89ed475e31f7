// Fuzz target: the .npy reader (decode_npy: magic, version, header dict, dtype, shape, data size,
// Fortran order). Every element of a decoded tensor is read back, so a short buffer shows up.
// Seeds: .npy files written from the suite's tensors (tests/fuzz/make_seeds.py).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_target.h"
#include "onnx/tensor_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kiln::fuzz::expect_clean([&] {
    kiln::graph::Tensor t = kiln::onnx::decode_npy(bytes, "fuzz.npy");
    (void)kiln::onnx::tensor_summary(t);
  });
  return 0;
}
