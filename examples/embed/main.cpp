// embed_run: loads a model library built by `kiln compile` and runs it. Needs only the
// header-only kiln::runtime target (no Kiln library at run time).
//
//   embed_run MODEL.so OUTPUT_DIR [NAME=FILE.npy]...
//
// Prints the model's inputs and outputs (symbolic dims by name), reads each input from its .npy
// file, runs, and writes each output as OUTPUT_DIR/<name>.npy.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "model_io.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.so OUTPUT_DIR [NAME=FILE.npy]...\n", argv[0]);
    return 2;
  }
  try {
    const kiln::Model model = kiln::load(argv[1]);
    example::print_signature(model);
    example::run_files(model, std::vector<std::string>(argv + 3, argv + argc), argv[2]);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error (kiln status %d): %s\n", static_cast<int>(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
