#include "autotune/gemm_config_text.h"

#include <sstream>
#include <vector>

#include "support/error.h"

namespace kiln::autotune {

std::string encode_gemm_config(const GemmConfig& config) { return config.name(); }

GemmConfig decode_gemm_config(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, '_');) parts.push_back(part);
  KILN_CHECK(parts.size() == 7 || (parts.size() == 8 && parts[7] == "direct-a"),
             "not a gemm config: '{}'", text);
  GemmConfig c;
  KILN_CHECK(parts[0] == "avx2" || parts[0] == "avx512", "gemm config '{}': unknown ISA", text);
  c.isa = parts[0] == "avx512" ? GemmIsa::kAvx512 : GemmIsa::kAvx2;
  KILN_CHECK(std::sscanf(parts[1].c_str(), "%dx%d", &c.mr, &c.nr) == 2 &&
                 std::sscanf(parts[2].c_str(), "mc%d", &c.mc) == 1 &&
                 std::sscanf(parts[3].c_str(), "nc%d", &c.nc) == 1 &&
                 std::sscanf(parts[4].c_str(), "kc%d", &c.kc) == 1,
             "gemm config '{}': bad blocks", text);
  KILN_CHECK(parts[5] == "nr-outer" || parts[5] == "mr-outer", "gemm config '{}': loop order",
             text);
  c.loop_order = parts[5] == "nr-outer" ? GemmLoopOrder::kNrOuter : GemmLoopOrder::kMrOuter;
  KILN_CHECK(parts[6] == "m" || parts[6] == "n" || parts[6] == "mn",
             "gemm config '{}': thread split", text);
  c.thread_split = parts[6] == "m"   ? GemmThreadSplit::kM
                   : parts[6] == "n" ? GemmThreadSplit::kN
                                     : GemmThreadSplit::kMN;
  c.pack_a = parts.size() == 7;
  KILN_CHECK(c.name() == text, "gemm config '{}' reads back as '{}'", text, c.name());
  return c;
}

}  // namespace kiln::autotune
