#include "support/identifier.h"

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "support/hash.h"

namespace kiln {
namespace {

bool is_ascii_alnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

bool is_ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

bool is_plain_name(std::string_view name) {
  if (name.empty() || !is_ascii_alpha(name.front()) || name.back() == '_') return false;
  for (size_t k = 0; k < name.size(); ++k) {
    char c = name[k];
    if (is_ascii_alnum(c)) continue;
    if (c != '_' || name[k - 1] == '_') return false;
  }
  return true;
}

std::string identifier(std::string_view prefix, std::string_view name) {
  std::string out(prefix);
  if (is_plain_name(name)) {
    out += '_';
    out += name;
    return out;
  }
  out += 'x';
  for (char c : name) {
    if (is_ascii_alnum(c)) {
      out += c;
    } else {
      out += fmt::format("_{:02x}", static_cast<unsigned char>(c));
    }
  }
  return out;
}

std::string comment_safe(std::string_view text) {
  std::string out;
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (c == '\\' || byte < 0x20 || byte >= 0x7f ||
        (c == '/' && !out.empty() && out.back() == '*')) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

std::string terminal_text(std::string_view text) {
  std::string out;
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (c == '\\' || byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

std::string comment_text(std::string_view name) {
  bool verbatim = !name.empty();
  for (char c : name) {
    auto byte = static_cast<unsigned char>(c);
    verbatim = verbatim && byte > 0x20 && byte < 0x7f && c != '\\' && c != '\'' && c != '"';
  }
  if (verbatim && name.find("*/") == std::string_view::npos) return std::string(name);
  std::string out = "'";
  for (char c : name) {
    auto byte = static_cast<unsigned char>(c);
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte >= 0x7f || (c == '/' && out.back() == '*')) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string file_name(std::string_view name) {
  std::string out;
  for (size_t k = 0; k < name.size(); ++k) {
    char c = name[k];
    bool keep =
        is_ascii_alnum(c) || c == '_' || c == '-' || c == '[' || c == ']' || (c == '.' && k > 0);
    if (keep) {
      out += c;
    } else {
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
    }
  }
  constexpr size_t kMaxLength = 200;
  constexpr size_t kCutLength = 180;
  if (out.empty()) return "%";  // the empty name (its own file; "%" alone escapes nothing)
  if (out.size() <= kMaxLength) return out;
  out.resize(kCutLength);
  // Never cut inside a %XX escape.
  if (size_t pct = out.rfind('%'); pct != std::string::npos && pct + 3 > out.size())
    out.resize(pct);
  return out + "~" + sha256_hex(name).substr(0, 16);
}

}  // namespace kiln
