/// How strings from a model (ONNX names: dims, inputs, outputs, initializers, nodes, subgraph
/// values) reach generated code and files. ONNX names are arbitrary byte strings; exporters write
/// dots, colons, slashes, spaces, leading digits, non-ASCII letters, quotes, backslashes and even
/// control characters. Every identifier Kiln generates from such a name comes from
/// `identifier()`, which is injective; every comment that shows one goes through
/// `comment_text()`, every string literal through `cpp_quote()` (indented_buffer.h), every file
/// name through `file_name()`.
#pragma once

#include <string>
#include <string_view>

namespace kiln {

/// True when `name` is "plain": ASCII letters and digits in runs joined by single underscores,
/// starting with a letter (no leading digit, no leading, trailing or doubled underscore).
bool is_plain_name(std::string_view name);

/// The C/C++ identifier for a model string under a Kiln-chosen `prefix` (a plain name such as
/// "s" for size symbols or "arg3" for the fourth input): `prefix_name` when `name` is plain, else
/// `prefixx` followed by `name` with every byte other than an ASCII letter or digit written as
/// `_` and two lowercase hex digits ("p2o.Dim" -> "sxp2o_2eDim", "1st" -> "sx1st"). Injective for
/// one prefix: plain names keep their spelling (so names that differ only in case stay apart), the
/// escaped form decodes uniquely, and the two forms differ right after the prefix. Identifiers made
/// under different prefixes stay apart as long as no prefix is another one followed by 'x'.
/// The result never starts with a digit, never holds a doubled underscore (reserved in C++) and
/// is never a keyword, as long as `prefix` is none of those.
std::string identifier(std::string_view prefix, std::string_view name);

/// A model string as it appears in a generated comment: as it is when it is printable ASCII
/// without spaces, quotes, backslashes or "*/"; otherwise in single quotes with backslash and
/// quote escaped and control characters and non-ASCII bytes written `\xNN`. Either way it can
/// neither end the line with a backslash (which would continue the comment onto the next line)
/// nor hold a newline nor close a block comment.
std::string comment_text(std::string_view name);

/// Free text holding model strings (an expression over size symbols, say) made safe for a
/// comment: backslashes, control characters and non-ASCII bytes written `\xNN`, and the '/' of
/// "*/" as `\x2f`; everything else unchanged.
std::string comment_safe(std::string_view text);

/// A model string as a terminal shows it (`kiln info`): control characters (escape sequences
/// included) and backslashes written `\xNN`, everything else, UTF-8 included, unchanged.
std::string terminal_text(std::string_view text);

/// A file name for a model string (`kiln run`'s output files): ASCII letters, digits, '_', '-',
/// '[', ']' and '.' stay, except a leading '.'; every other byte is written `%XX` (uppercase hex),
/// so the name can hold no '/' or NUL, is never "", "." or "..", and different names give different
/// files. A name whose escaped form is over 200 bytes is cut to 180 and ends in '~' and 16 hex
/// digits of its hash ('~' appears in no other escaped name).
std::string file_name(std::string_view name);

}  // namespace kiln
