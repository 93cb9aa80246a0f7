// `libreyolo profile ...` reached through the main command line.
#include <sstream>

#include "cli/cli.hpp"
#include "support.hpp"

TEST(ProfileCli, DispatchedFromTheMainCommand) {
  std::ostringstream out, err;
  EXPECT_EQ(libreyolo::cli::run({"profile", "run", "data.yaml"}, out, err), 2);
  EXPECT_NE(err.str().find("not yet in this build"), std::string::npos) << err.str();
  EXPECT_EQ(libreyolo::cli::run({"profile", "--help"}, out, err), 0);
  EXPECT_NE(out.str().find("what-if"), std::string::npos);
  out.str("");
  EXPECT_EQ(libreyolo::cli::run({"--help"}, out, err), 0);
  EXPECT_NE(out.str().find("profile"), std::string::npos);
  out.str("");
  EXPECT_EQ(libreyolo::cli::run({"profile", "summary", "/no/such/profile.json", "--json"}, out, err), 2);
  EXPECT_NE(out.str().find("not found: /no/such/profile.json"), std::string::npos) << out.str();
}
