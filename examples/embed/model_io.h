// What both example programs do with a loaded model: print its inputs and outputs, read inputs
// from NAME=FILE.npy arguments, run, and write each output as OUTPUT_DIR/<name>.npy.
#pragma once

#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "npy.h"

namespace example {

inline const char* dtype_name(kiln_dtype dtype) {
  switch (dtype) {
    case KILN_FLOAT32:
      return "float32";
    case KILN_FLOAT64:
      return "float64";
    case KILN_FLOAT16:
      return "float16";
    case KILN_BFLOAT16:
      return "bfloat16";
    case KILN_INT64:
      return "int64";
    case KILN_INT32:
      return "int32";
    case KILN_INT16:
      return "int16";
    case KILN_INT8:
      return "int8";
    case KILN_UINT64:
      return "uint64";
    case KILN_UINT32:
      return "uint32";
    case KILN_UINT16:
      return "uint16";
    case KILN_UINT8:
      return "uint8";
    case KILN_BOOL:
      return "bool";
    case KILN_FLOAT8E4M3FN:
      return "float8e4m3fn";
    case KILN_FLOAT8E4M3FNUZ:
      return "float8e4m3fnuz";
    case KILN_FLOAT8E5M2:
      return "float8e5m2";
    case KILN_FLOAT8E5M2FNUZ:
      return "float8e5m2fnuz";
    case KILN_UINT4:
      return "uint4";
    case KILN_INT4:
      return "int4";
    case KILN_FLOAT4E2M1:
      return "float4e2m1";
    case KILN_FLOAT8E8M0:
      return "float8e8m0";
    case KILN_UINT2:
      return "uint2";
    case KILN_INT2:
      return "int2";
    case KILN_UNDEFINED:  // an output whose dtype the run decides
      return "?";
  }
  return "?";
}

/// "x: float32[N, 3, 8, 8]": symbolic dims by name; "y: float32 (rank known after a run)" for
/// an output of an If whose branches give different ranks.
inline std::string describe(const kiln::ValueInfo& value) {
  if (value.rank_known_after_run)
    return value.name + ": " + dtype_name(value.dtype) + " (rank known after a run)";
  std::string text = value.name + ": " + dtype_name(value.dtype) + "[";
  for (size_t d = 0; d < value.dims.size(); ++d) {
    if (d > 0) text += ", ";
    text += value.dims[d] < 0 ? value.dim_names[d] : std::to_string(value.dims[d]);
  }
  return text + "]";
}

inline void print_signature(const kiln::Model& model) {
  std::printf("target: %s\n", model.target().c_str());
  for (const kiln::ValueInfo& v : model.inputs()) std::printf("input  %s\n", describe(v).c_str());
  for (const kiln::ValueInfo& v : model.outputs()) std::printf("output %s\n", describe(v).c_str());
}

/// Runs `model` on the NAME=FILE.npy arguments and writes its outputs into `output_dir`.
inline void run_files(const kiln::Model& model, const std::vector<std::string>& input_args,
                      const std::filesystem::path& output_dir) {
  std::map<std::string, std::string> files;
  for (const std::string& arg : input_args) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) throw std::runtime_error(arg + ": expected NAME=FILE.npy");
    files[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  std::vector<kiln::Tensor> inputs;  // in the model's order
  for (const kiln::ValueInfo& v : model.inputs()) {
    auto it = files.find(v.name);
    if (it == files.end()) throw std::runtime_error("no file for input '" + v.name + "'");
    inputs.push_back(npy::read(it->second));
    files.erase(it);
  }
  if (!files.empty())
    throw std::runtime_error("the model has no input '" + files.begin()->first + "'");

  const std::vector<kiln::Tensor> outputs = model.run(inputs);
  std::filesystem::create_directories(output_dir);
  for (size_t k = 0; k < outputs.size(); ++k) {
    std::string file = model.outputs()[k].name;
    for (char& c : file) {
      if (c == '/' || c == '\\') c = '_';
    }
    const std::filesystem::path path = output_dir / (file + ".npy");
    npy::write(path.string(), outputs[k]);
    std::printf("wrote %s\n", path.string().c_str());
  }
}

}  // namespace example
