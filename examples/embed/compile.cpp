// embed_compile: compiles an ONNX model in-process with kiln::compile (libkiln.so, target
// kiln::kiln), then runs it as embed_run does.
//
//   embed_compile [--cache-dir DIR] [--autotune MODE] [--weights external]
//                 MODEL.onnx LIBRARY.so OUTPUT_DIR [NAME=FILE.npy]...
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "model_io.h"

int main(int argc, char** argv) {
  kiln::CompileOptions options;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--cache-dir" && has_value) {
      options.cache_dir = argv[++i];
    } else if (arg == "--autotune" && has_value) {
      options.autotune = argv[++i];
    } else if (arg == "--weights" && has_value) {
      options.external_weights = std::string(argv[++i]) == "external";
    } else {
      args.push_back(arg);
    }
  }
  if (args.size() < 3) {
    std::fprintf(stderr,
                 "usage: %s [--cache-dir DIR] [--autotune MODE] [--weights external] MODEL.onnx "
                 "LIBRARY.so OUTPUT_DIR [NAME=FILE.npy]...\n",
                 argv[0]);
    return 2;
  }
  try {
    options.output = args[1];
    const kiln::Model model = kiln::compile(args[0], options);
    std::printf("compiled %s -> %s\n", args[0].c_str(), args[1].c_str());
    example::print_signature(model);
    example::run_files(model, std::vector<std::string>(args.begin() + 3, args.end()), args[2]);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error (kiln status %d): %s\n", static_cast<int>(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
