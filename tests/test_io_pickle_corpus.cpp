// The fuzz corpus (tests/data/pickle_corpus: seeds from Python and C++, and inputs that once
// made fuzz_checkpoint fail) read the way the fuzz target reads it: every file must load or be
// refused with ModelError, and whatever loads must survive a save and reload.
#include <filesystem>

#include "../fuzz/checkpoint_input.hpp"
#include "pickle_test_util.hpp"

namespace fs = std::filesystem;
using namespace libreyolo::test;

TEST(PickleCorpus, EveryFileLoadsOrIsRefused) {
  const fs::path dir = fs::path(LIBREYOLO_SOURCE_DIR) / "tests/data/pickle_corpus";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 25u);
  std::map<std::string, bool> loaded;
  for (const auto& path : files) {
    const std::string bytes = read_file(path.string());
    try {
      const std::string archive =
          libreyolo::fuzz::archive_from_input(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      loaded[path.filename().string()] = libreyolo::fuzz::exercise_checkpoint(archive);
    } catch (const std::exception& e) {
      ADD_FAILURE() << path.filename() << ": " << e.what();
    }
  }
  // The seeds are valid files except the hostile one; the regression archives are refused.
  for (const auto& [name, ok] : loaded) {
    const bool seed = name.rfind("py_", 0) == 0 || name.rfind("cpp_", 0) == 0 || name.rfind("raw_", 0) == 0;
    if (seed) EXPECT_EQ(ok, name.find("evil") == std::string::npos) << name;
  }
  EXPECT_FALSE(loaded["regress_no_version.pt"]);
  EXPECT_FALSE(loaded["regress_no_folder.pt"]);
  EXPECT_TRUE(loaded["regress_ok_minimal.pt"]);
}
