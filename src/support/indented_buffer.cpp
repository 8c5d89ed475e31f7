#include "support/indented_buffer.h"

#include <string>
#include <string_view>

namespace kiln {

void IndentedBuffer::line(std::string_view text) {
  if (text.empty()) {
    lines_.emplace_back();
    return;
  }
  lines_.push_back(std::string(static_cast<size_t>(level_) * 4, ' ') + std::string(text));
}

void IndentedBuffer::lines(std::string_view text) {
  while (!text.empty()) {
    size_t nl = text.find('\n');
    line(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text = text.substr(nl + 1);
  }
}

void IndentedBuffer::splice(const IndentedBuffer& other) {
  for (const std::string& l : other.lines_) line(l);
}

std::string IndentedBuffer::str() const {
  std::string out;
  for (const std::string& l : lines_) {
    out += l;
    out += '\n';
  }
  return out;
}

std::string cpp_quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte >= 0x7f) {
      // Three octal digits always: a shorter escape would take a following digit along.
      out += fmt::format("\\{:03o}", byte);
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace kiln
