#include "support/log.h"

#include <array>
#include <cstdlib>
#include <string>
#include <string_view>

namespace kiln::log {
namespace {

constexpr std::array<std::string_view, 6> kNames = {"fusion",  "schedule", "output_code",
                                                     "autotune", "compile", "memory"};

std::array<bool, kNames.size()> parse_env() {
  std::array<bool, kNames.size()> on{};
  const char* env = std::getenv("KILN_LOG");
  if (env == nullptr) return on;
  std::string_view rest(env);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    for (size_t i = 0; i < kNames.size(); ++i) {
      if (item == kNames[i] || item == "all") on[i] = true;
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return on;
}

}  // namespace

bool enabled(Category category) {
  static const std::array<bool, kNames.size()> on = parse_env();
  return on[static_cast<size_t>(category)];
}

std::string_view category_name(Category category) { return kNames[static_cast<size_t>(category)]; }

}  // namespace kiln::log
