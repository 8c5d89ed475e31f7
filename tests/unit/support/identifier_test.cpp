// The one sanitizer for model strings in generated code and file names (support/identifier.h).
#include "support/identifier.h"

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

namespace kiln {
namespace {

// Names real exporters write, and the troublesome classes the importer must take.
const std::vector<std::string> kNames = {"batch",
                                         "p2o.DynamicDimension.0",
                                         "input:0",
                                         "a/b",
                                         "a.b",
                                         "a-b",
                                         "a_b",
                                         "a__b",
                                         "_a",
                                         "a_",
                                         "1st",
                                         "é",
                                         "日本",
                                         "quo\"te",
                                         "it's",
                                         "back\\",
                                         "new\nline",
                                         "tab\t",
                                         std::string("nul\0x", 5),
                                         "..",
                                         ".",
                                         "",
                                         "int",
                                         "class",
                                         "i0",
                                         "Data",
                                         "data",
                                         "x_2e",
                                         "x.",
                                         "sx_a",
                                         "a b",
                                         "*/",
                                         "a*/b",
                                         "\x7f",
                                         "7f",
                                         "_7f",
                                         "\xff\xfe"};

TEST(Identifier, PlainNamesKeepTheirSpelling) {
  EXPECT_EQ(identifier("s", "batch"), "s_batch");
  EXPECT_EQ(identifier("arg0", "input_ids"), "arg0_input_ids");
  EXPECT_EQ(identifier("s", "Data"), "s_Data");
  EXPECT_EQ(identifier("s", "data"), "s_data");
}

TEST(Identifier, OtherNamesAreEscaped) {
  EXPECT_EQ(identifier("s", "p2o.DynamicDimension.0"), "sxp2o_2eDynamicDimension_2e0");
  EXPECT_EQ(identifier("s", "a_b"), "s_a_b");
  EXPECT_EQ(identifier("s", "a__b"), "sxa_5f_5fb");
  EXPECT_EQ(identifier("s", ""), "sx");
  EXPECT_EQ(identifier("s", "1st"), "sx1st");
  EXPECT_EQ(identifier("s", "\x7f"), "sx_7f");
  EXPECT_EQ(identifier("s", "7f"), "sx7f");
}

TEST(Identifier, IsInjectiveAndAlwaysAValidNonReservedIdentifier) {
  const std::regex valid("[A-Za-z][A-Za-z0-9_]*");
  std::set<std::string> seen;
  for (const std::string& name : kNames) {
    std::string id = identifier("s", name);
    EXPECT_TRUE(std::regex_match(id, valid)) << id;
    EXPECT_EQ(id.find("__"), std::string::npos) << id;
    EXPECT_TRUE(seen.insert(id).second) << "'" << name << "' collides as " << id;
  }
}

TEST(Identifier, PlainNames) {
  EXPECT_TRUE(is_plain_name("a1_b2"));
  EXPECT_FALSE(is_plain_name("1a"));
  EXPECT_FALSE(is_plain_name("a__b"));
  EXPECT_FALSE(is_plain_name("a_"));
  EXPECT_FALSE(is_plain_name("_a"));
  EXPECT_FALSE(is_plain_name(""));
  EXPECT_FALSE(is_plain_name("é"));
}

TEST(CommentText, NeverEndsInABackslashNorHoldsANewline) {
  for (const std::string& name : kNames) {
    for (const std::string& text : {comment_text(name), comment_safe(name)}) {
      EXPECT_EQ(text.find('\n'), std::string::npos) << text;
      EXPECT_EQ(text.find('\r'), std::string::npos) << text;
      EXPECT_EQ(text.find("*/"), std::string::npos) << text;
      EXPECT_TRUE(text.empty() || text.back() != '\\') << text;
      for (char c : text) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << text;
    }
  }
  EXPECT_EQ(comment_text("/model/MatMul_1"), "/model/MatMul_1");
  EXPECT_EQ(comment_text("back\\"), "'back\\\\'");
  EXPECT_EQ(comment_text("a b"), "'a b'");
  EXPECT_EQ(comment_text(""), "''");
  EXPECT_EQ(comment_safe("P=batch\\*16"), "P=batch\\x5c*16");
}

TEST(FileName, StaysInItsDirectoryAndIsInjective) {
  std::set<std::string> seen;
  for (const std::string& name : kNames) {
    std::string f = file_name(name);
    EXPECT_EQ(f.find('/'), std::string::npos) << f;
    EXPECT_EQ(f.find('\0'), std::string::npos) << f;
    EXPECT_NE(f, ".");
    EXPECT_NE(f, "..");
    EXPECT_FALSE(f.empty());
    EXPECT_NE(f.front(), '.') << f;
    EXPECT_TRUE(seen.insert(f).second) << "'" << name << "' collides as " << f;
  }
  EXPECT_EQ(file_name("y"), "y");
  EXPECT_EQ(file_name("../up"), "%2E.%2Fup");
  EXPECT_EQ(file_name("seq[3]"), "seq[3]");
  EXPECT_EQ(file_name("a:b"), "a%3Ab");
}

TEST(FileName, LongNamesAreCutWithAHash) {
  std::string a(300, 'a');
  std::string b = a + "b";
  std::string fa = file_name(a);
  EXPECT_LE(fa.size(), 200u);
  EXPECT_NE(fa, file_name(b));
  EXPECT_NE(fa.find('~'), std::string::npos);
  // Cut before an escape, never inside one.
  std::string slashes(100, '/');
  std::string fs = file_name(slashes);
  EXPECT_LE(fs.size(), 200u);
  EXPECT_EQ(fs.substr(0, fs.find('~')).size() % 3, 0u) << fs;
}

TEST(TerminalText, EscapesControlCharactersAndBackslashesOnly) {
  EXPECT_EQ(terminal_text("input:0/tokens.ids"), "input:0/tokens.ids");
  EXPECT_EQ(terminal_text("1st input-\xc3\xa9 \xe6\x97\xa5"), "1st input-\xc3\xa9 \xe6\x97\xa5");
  EXPECT_EQ(terminal_text("z\x01"), "z\\x01");
  EXPECT_EQ(terminal_text("\x1b[31mred\x7f"), "\\x1b[31mred\\x7f");
  EXPECT_EQ(terminal_text("new\nline \"dim\" tail\\"), "new\\x0aline \"dim\" tail\\x5c");
}

}  // namespace
}  // namespace kiln
