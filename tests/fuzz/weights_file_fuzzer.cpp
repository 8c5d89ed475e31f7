// Fuzz target: the loader of a model library's external weights file (kiln_rt::map_weights_file,
// what a library built with `kiln compile --weights external` runs at load). The bytes are written
// as the weights file; the size and checksum the library expects are taken from the file's own
// header (offsets 8 and 16), so the fuzzer controls the claims as well as the contents. On
// success the whole payload is read. Seeds: weights files of suite tensors (make_seeds.py).
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "fuzz_target.h"
#include "kiln_rt_weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path path = kiln::fuzz::scratch_dir() / "model.weights";
  kiln::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  uint64_t payload_bytes = 0, checksum = 0;
  if (size >= 24) {
    std::memcpy(&payload_bytes, data + 8, 8);
    std::memcpy(&checksum, data + 16, 8);
  }
  kiln_rt::WeightsFile file;
  char error[1024];
  if (!kiln_rt::map_weights_file(path.c_str(), "model.so", payload_bytes, checksum, file, error,
                                 sizeof(error))) {
    if (std::strstr(error, path.c_str()) == nullptr) {
      std::fprintf(stderr, "fuzz: the error does not name the file: %s\n", error);
      std::abort();
    }
    return 0;
  }
  if (file.mapping_bytes != kiln_rt::kWeightsHeaderBytes + payload_bytes ||
      std::memcmp(file.payload, data + kiln_rt::kWeightsHeaderBytes, payload_bytes) != 0) {
    std::fprintf(stderr, "fuzz: the mapped payload differs from the file\n");
    std::abort();
  }
  ::munmap(file.mapping, file.mapping_bytes);
  return 0;
}
