#pragma once
/// A line buffer for generated code with an indentation level (4 spaces per level), the
/// counterpart of Inductor's IndentedBuffer.

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

class IndentedBuffer {
 public:
  /// Appends one line at the current indentation (an empty line stays empty).
  void line(std::string_view text);

  /// Appends a fmt-formatted line.
  template <typename... Args>
  void linef(fmt::format_string<Args...> format, Args&&... args) {
    line(fmt::format(format, std::forward<Args>(args)...));
  }

  /// Appends every line of `text` (split at '\n') at the current indentation.
  void lines(std::string_view text);

  /// Appends another buffer's lines, indented by the current level.
  void splice(const IndentedBuffer& other);

  void indent() { ++level_; }
  void dedent() { --level_; }

  /// RAII indentation: `{ auto _ = buf.scope(); ... }`.
  class Scope {
   public:
    explicit Scope(IndentedBuffer& buffer) : buffer_(buffer) { buffer_.indent(); }
    ~Scope() { buffer_.dedent(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    IndentedBuffer& buffer_;
  };
  [[nodiscard]] Scope scope() { return Scope(*this); }

  /// The text, each line ending in '\n'.
  std::string str() const;
  bool empty() const { return lines_.empty(); }

 private:
  std::vector<std::string> lines_;
  int level_ = 0;
};

/// `text` as a C++ string literal: in double quotes, with quotes and backslashes escaped and
/// control characters and non-ASCII bytes as three-digit octal escapes (the literal holds exactly
/// the bytes of `text`).
std::string cpp_quote(const std::string& text);

}  // namespace kiln
