#pragma once
/// Category logging, switched on by the environment: KILN_LOG=fusion,schedule,output_code,autotune
/// (or "all"). Messages go to stderr prefixed with their category.

#include <fmt/format.h>

#include <cstdio>
#include <string_view>
#include <utility>

namespace kiln::log {

enum class Category { kFusion, kSchedule, kOutputCode, kAutotune, kCompile, kMemory };

/// True when KILN_LOG enables `category`. Reads the environment once.
bool enabled(Category category);

/// The category's name as written in KILN_LOG.
std::string_view category_name(Category category);

/// Writes one line to stderr when the category is enabled.
template <typename... Args>
void write(Category category, fmt::format_string<Args...> format, Args&&... args) {
  if (!enabled(category)) return;
  fmt::print(stderr, "[kiln:{}] {}\n", category_name(category),
             fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kiln::log
