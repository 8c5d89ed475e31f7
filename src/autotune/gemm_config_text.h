#pragma once
/// GemmConfig as text, for IR attributes and the autotune cache: encode_gemm_config writes
/// GemmConfig::name() ("avx2_6x16_mc96_nc768_kc256_nr-outer_mn", "_direct-a" when A is read in
/// place) and decode_gemm_config reads it back. Tested in tests/unit/autotune.

#include <string>

#include "autotune/gemm_template.h"

namespace kiln::autotune {

std::string encode_gemm_config(const GemmConfig& config);
/// Throws InternalError for text that encode_gemm_config did not write.
GemmConfig decode_gemm_config(const std::string& text);

}  // namespace kiln::autotune
