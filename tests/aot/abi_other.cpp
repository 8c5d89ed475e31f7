// The C API header as a program built for another ABI version sees it: loading a library through
// it must be refused (aot_test.cpp, AbiMismatchIsRefused).
#define KILN_ABI_VERSION 999u
#include "kiln/runtime.h"

kiln_status* load_with_abi_999(const char* path) {
  kiln_model* model = nullptr;
  kiln_status* status = kiln_model_load(path, nullptr, &model);
  kiln_model_free(model);
  return status;
}
