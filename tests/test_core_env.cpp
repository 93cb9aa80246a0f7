// The environment variables are listed in one place (core/env.cpp): every LIBREYOLO_* name the
// sources read is in the list, every listed one a user may set is in docs/cli.md, and reading an
// unlisted one is refused.
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/env.hpp"
#include "support.hpp"

namespace fs = std::filesystem;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> listed() {
  std::set<std::string> out;
  for (const auto& v : libreyolo::env_vars()) out.insert(v.name);
  return out;
}

}  // namespace

TEST(Env, EveryVariableTheSourcesNameIsListed) {
  const std::set<std::string> names = listed();
  ASSERT_GT(names.size(), 20u);
  const std::regex quoted("\"(LIBREYOLO_[A-Z0-9_]+)");
  int found = 0;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(LIBREYOLO_SOURCE_DIR) / "src")) {
    const auto ext = e.path().extension().string();
    if (ext != ".cpp" && ext != ".hpp" && ext != ".cu") continue;
    const std::string text = read_all(e.path());
    for (std::sregex_iterator it(text.begin(), text.end(), quoted), end; it != end; ++it) {
      ++found;
      EXPECT_TRUE(names.count((*it)[1].str())) << (*it)[1].str() << " in " << e.path() << " is not in env_vars()";
    }
  }
  EXPECT_GT(found, 30);
}

TEST(Env, EveryUserVariableIsDocumented) {
  const std::string doc = read_all(fs::path(LIBREYOLO_SOURCE_DIR) / "docs" / "cli.md");
  ASSERT_FALSE(doc.empty());
  for (const auto& v : libreyolo::env_vars()) {
    if (std::string(v.effect).rfind("internal:", 0) == 0) continue;
    EXPECT_NE(doc.find(std::string("`") + v.name), std::string::npos) << v.name << " is missing from docs/cli.md";
  }
}

TEST(Env, AnUnlistedVariableIsRefused) {
  EXPECT_THROW(libreyolo::env_get("LIBREYOLO_NOT_A_VARIABLE"), std::logic_error);
  EXPECT_THROW(libreyolo::env_switch_on("LIBREYOLO_NOT_A_VARIABLE"), std::logic_error);
  EXPECT_NO_THROW(libreyolo::env_switch_on("LIBREYOLO_FUSED_CONV"));
}
