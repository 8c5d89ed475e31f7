// Imports every model of the ONNX 1.12 backend suite (node, pytorch-converted, pytorch-operator,
// simple). The models Kiln refuses are pinned, with the reason, in tests/onnx/import_refusals.txt;
// any other refusal fails, and so does a pinned model that now imports (the list only shrinks).
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "onnx/importer.h"
#include "support/error.h"

namespace kiln::onnx {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSuiteDirs[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};

/// "<dir>/<case>" -> reason, from the committed list.
std::map<std::string, std::string> read_refusals() {
  std::map<std::string, std::string> refusals;
  std::ifstream in(fs::path(KILN_TESTS_DIR) / "onnx" / "import_refusals.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.find(' ');
    refusals[line.substr(0, space)] = space == std::string::npos ? "" : line.substr(space + 1);
  }
  return refusals;
}

TEST(SuiteImportTest, EveryModelImportsOrIsPinned) {
  std::map<std::string, std::string> refusals = read_refusals();
  int imported = 0;
  int refused = 0;
  int total = 0;
  std::string unexpected;
  for (const char* dir : kSuiteDirs) {
    fs::path root = fs::path(KILN_TEST_DATA_DIR) / dir;
    ASSERT_TRUE(fs::is_directory(root)) << root << " is missing (libonnx-testdata)";
    std::vector<fs::path> cases;
    for (const auto& entry : fs::directory_iterator(root)) cases.push_back(entry.path());
    std::sort(cases.begin(), cases.end());
    for (const fs::path& dir_path : cases) {
      fs::path model = dir_path / "model.onnx";
      if (!fs::exists(model)) continue;
      ++total;
      std::string key = std::string(dir) + "/" + dir_path.filename().string();
      bool pinned = refusals.count(key) != 0;
      try {
        import_model(model);
        ++imported;
        if (pinned) unexpected += key + ": imports now; remove it from import_refusals.txt\n";
      } catch (const UserError& e) {
        ++refused;
        if (!pinned) unexpected += key + ": refused: " + e.what() + "\n";
      } catch (const std::exception& e) {
        ++refused;
        unexpected += key + ": internal error: " + e.what() + "\n";
      }
    }
  }
  std::cout << "imported " << imported << " of " << total << " suite models, " << refused
            << " refused (" << refusals.size() << " pinned)\n";
  EXPECT_EQ(total, 1072);
  EXPECT_TRUE(unexpected.empty()) << unexpected;
}

}  // namespace
}  // namespace kiln::onnx
