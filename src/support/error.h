#pragma once
/// Kiln's two kinds of error. A UserError is the user's to fix (a bad model, an unsupported op, a
/// wrong input): its message names the thing and says expected versus found. An InternalError is
/// a bug in Kiln. The CLI maps them to exit status 2 and 3.

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace kiln {

/// An error the user can fix: bad model, bad input, unsupported feature.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

/// A broken invariant inside Kiln: always a bug.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

/// Throws a UserError with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void user_error(fmt::format_string<Args...> format, Args&&... args) {
  throw UserError(fmt::format(format, std::forward<Args>(args)...));
}

/// Throws an InternalError with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void internal_error(fmt::format_string<Args...> format, Args&&... args) {
  throw InternalError(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kiln

/// Checks an internal invariant; on failure throws InternalError naming the file and line.
#define KILN_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      throw ::kiln::InternalError(fmt::format("{}:{}: check failed: {}: {}", __FILE__,     \
                                              __LINE__, #cond, fmt::format(__VA_ARGS__))); \
    }                                                                                      \
  } while (0)
