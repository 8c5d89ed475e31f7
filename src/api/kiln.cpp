// kiln::compile of include/kiln/kiln.h: `kiln compile` as a function of libkiln.so. The library
// is built as `kiln compile` builds it (driver::compile_library) and loaded through the C API
// like any other, so a model compiled here behaves exactly as one shipped to a user. Kiln's
// exceptions become kiln::Error, the only exception type the public API throws.
#include "kiln/kiln.h"

#include <filesystem>
#include <new>

#include "autotune/select.h"
#include "driver/compile.h"
#include "onnx/importer.h"
#include "support/error.h"

namespace kiln {
namespace {

driver::LibraryOptions library_options(const CompileOptions& options) {
  driver::LibraryOptions library;
  library.output = options.output;
  library.external_weights = options.external_weights;
  library.target = options.target;
  library.compile.cache_dir = options.cache_dir;
  if (!options.autotune.empty())
    library.compile.autotune = autotune::parse_autotune_mode(options.autotune, "autotune");
  return library;
}

}  // namespace

Model compile(const std::string& onnx_path, const CompileOptions& options) {
  std::filesystem::path library;
  try {
    const graph::Model model = onnx::import_model(onnx_path);
    library = driver::compile_library(model, library_options(options)).library;
  } catch (const UserError& e) {
    // A bad model, an unsupported op or option, an unwritable output: the caller's to fix.
    throw Error(KILN_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const InternalError& e) {
    throw Error(KILN_ERROR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (const std::bad_alloc&) {
    throw Error(KILN_ERROR_OUT_OF_MEMORY, "kiln::compile: out of memory");
  } catch (const std::exception& e) {
    // Anything else (a file system error, a library's exception) is unexpected here.
    throw Error(KILN_ERROR_INTERNAL, std::string("kiln::compile: ") + e.what());
  }
  return load(library.string(), options.load);
}

}  // namespace kiln
