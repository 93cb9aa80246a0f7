#include <sstream>

#include <libreyolo/errors.hpp>

#include "cli/cli.hpp"
#include "support.hpp"

using libreyolo::cli::parse_args;
using libreyolo::cli::run;

TEST(CliGrammar, KeyValueFlagsAndDashes) {
  auto p = parse_args({"model=a.pt", "--epochs", "5", "--lr0=0.1", "amp=false", "exist-ok", "--no-val", "path=a=b",
                       "--json"},
                      {"amp", "exist_ok", "val"});
  EXPECT_TRUE(p.json);
  std::vector<std::pair<std::string, std::string>> want = {{"model", "a.pt"}, {"epochs", "5"},     {"lr0", "0.1"},
                                                           {"amp", "false"},  {"exist_ok", "true"}, {"val", "false"},
                                                           {"path", "a=b"}};
  EXPECT_EQ(p.kwargs, want);
}

TEST(CliGrammar, BareBoolFollowedByValue) {
  auto p = parse_args({"--amp", "false", "--save"}, {"amp", "save"});
  std::vector<std::pair<std::string, std::string>> want = {{"amp", "false"}, {"save", "true"}};
  EXPECT_EQ(p.kwargs, want);
}

TEST(CliGrammar, MissingValueIsUsageError) {
  EXPECT_THROW(parse_args({"--epochs"}, {}), libreyolo::UsageError);
}

TEST(Cli, ExitCodes) {
  std::ostringstream out, err;
  EXPECT_EQ(run({}, out, err), 2);  // bare command prints help, exit 2
  EXPECT_EQ(run({"trian"}, out, err), 2);
  EXPECT_NE(err.str().find("Did you mean 'train'"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(run({"train", "data=x.yaml", "epcohs=3"}, out, err), 2);
  EXPECT_NE(err.str().find("Did you mean 'epochs'"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(run({"train", "epochs=3"}, out, err), 2);  // data is required
  EXPECT_EQ(run({"predict", "model=does/not/exist.pt"}, out, err), 4);
  EXPECT_EQ(run({"predict", "model=yolo9t", "source=/no/such/image.jpg", "device=cpu"}, out, err), 3);
  EXPECT_EQ(run({"train", "data=x.yaml", "imgsz=100"}, out, err), 2);
  EXPECT_EQ(run({"version", "--json"}, out, err), 0);
  EXPECT_NE(out.str().find("\"libreyolo\""), std::string::npos);
}

TEST(Cli, JsonErrorsGoToStdout) {
  std::ostringstream out, err;
  EXPECT_EQ(run({"train", "data=x.yaml", "bogus=1", "--json"}, out, err), 2);
  EXPECT_NE(out.str().find("\"error\":\"config_unknown_key\""), std::string::npos) << out.str();
  EXPECT_TRUE(err.str().empty());
}

TEST(Cli, DryRunPrintsResolvedConfig) {
  std::ostringstream out, err;
  EXPECT_EQ(run({"detect", "train", "data=builtin", "epochs=3", "--dry-run", "--json"}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("\"epochs\":\"3\""), std::string::npos) << out.str();
}
