// `libreyolo profile ...` reached through the main command line, and `profile run` for real on
// the CPU: a profile-only training run, its files, the readers on them, and --repeat.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli.hpp"
#include "data/synthetic.hpp"
#include "support.hpp"

namespace fs = std::filesystem;

TEST(ProfileCli, DispatchedFromTheMainCommand) {
  std::ostringstream out, err;
  // A missing source, and a folder without images: predict's errors and exit code (3).
  EXPECT_EQ(libreyolo::cli::run({"profile", "infer", "/no/such/folder", "--device", "cpu"}, out, err), 3);
  EXPECT_NE(err.str().find("Source not found: /no/such/folder"), std::string::npos) << err.str();
  const std::string empty = libreyolo::test::temp_dir("prof_empty_folder");
  EXPECT_EQ(libreyolo::cli::run({"profile", "infer", empty, "--device", "cpu"}, out, err), 3);
  EXPECT_NE(err.str().find("No images found in " + empty), std::string::npos) << err.str();
  // The key=value words of the other commands: source= is the source, model= the weights.
  err.str("");
  EXPECT_EQ(libreyolo::cli::run({"profile", "infer", "model=yolo9t", "source=" + empty, "device=cpu"}, out, err), 3);
  EXPECT_NE(err.str().find("No images found in " + empty), std::string::npos) << err.str();
  EXPECT_EQ(libreyolo::cli::run({"profile", "infer", empty, "runz=3"}, out, err), 2);
  EXPECT_NE(err.str().find("Unknown option --runz"), std::string::npos) << err.str();
  EXPECT_EQ(libreyolo::cli::run({"profile", "infer", "--runz", "3"}, out, err), 2);
  EXPECT_NE(err.str().find("Unknown option --runz"), std::string::npos) << err.str();
  EXPECT_EQ(libreyolo::cli::run({"profile", "run", "--help"}, out, err), 0);
  EXPECT_NE(out.str().find("--repeat"), std::string::npos);
  EXPECT_EQ(libreyolo::cli::run({"profile", "--help"}, out, err), 0);
  EXPECT_NE(out.str().find("what-if"), std::string::npos);
  out.str("");
  EXPECT_EQ(libreyolo::cli::run({"--help"}, out, err), 0);
  EXPECT_NE(out.str().find("profile"), std::string::npos);
  out.str("");
  EXPECT_EQ(libreyolo::cli::run({"profile", "summary", "/no/such/profile.json", "--json"}, out, err), 2);
  EXPECT_NE(out.str().find("not found: /no/such/profile.json"), std::string::npos) << out.str();
  out.str("");
  err.str("");
  EXPECT_EQ(libreyolo::cli::run({"profile", "run", "data.yaml", "--stpes", "3"}, out, err), 2);
  EXPECT_NE(err.str().find("Unknown option --stpes"), std::string::npos) << err.str();
}

TEST(ProfileCli, RunProfilesATrainingWindowOnTheCpu) {
  libreyolo::data::SyntheticOptions o;
  o.train_images = 24;
  o.val_images = 4;
  o.width = o.height = 64;
  o.num_classes = 2;
  o.threads = 1;
  const std::string yaml = libreyolo::data::generate_synthetic_dataset(libreyolo::test::temp_dir("prof_run_ds"), o);
  const std::string project = libreyolo::test::temp_dir("prof_run");
  std::ostringstream out, err;
  const std::vector<std::string> base = {"profile", "run",     yaml,      "--imgsz", "64",       "--batch",
                                         "8",       "--steps", "4",       "--warmup", "1",       "--workers",
                                         "0",       "--device", "cpu",    "--project", project};
  std::vector<std::string> args = base;
  args.push_back("--json");
  ASSERT_EQ(libreyolo::cli::run(args, out, err), 0) << err.str();
  auto j = nlohmann::json::parse(out.str());
  const std::string profile = j["profile"].get<std::string>();
  EXPECT_EQ(profile, (fs::path(project) / "prof" / "profile.json").string());
  for (const char* f : {"profile.json", "profile_summary.json", "profile_trace.json", "timeline.html"})
    EXPECT_TRUE(fs::exists(fs::path(project) / "prof" / f)) << f;
  const std::string bound = j["bound"].get<std::string>();
  EXPECT_TRUE(bound == "dataloader" || bound == "host / launch" || bound == "compute" || bound == "memory-pressure")
      << bound;
  EXPECT_GT(j["img_per_s"].get<double>(), 0.0);
  // The readers take the file the run wrote.
  out.str("");
  EXPECT_EQ(libreyolo::cli::run({"profile", "phases", profile, "--json"}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("loss"), std::string::npos) << out.str();

  // --repeat 2: two trials and their aggregate.
  out.str("");
  args = base;
  args.insert(args.end(), {"--repeat", "2"});
  ASSERT_EQ(libreyolo::cli::run(args, out, err), 0) << err.str();
  // A second invocation has a directory of its own (numbered): the first run's files stay.
  EXPECT_TRUE(fs::exists(fs::path(project) / "prof2" / "trial_0" / "profile.json"));
  EXPECT_TRUE(fs::exists(fs::path(project) / "prof2" / "trial_1" / "profile.json"));
  ASSERT_TRUE(fs::exists(fs::path(project) / "prof2" / "profile_repeat.json"));
  EXPECT_TRUE(fs::exists(fs::path(project) / "prof" / "profile.json"));
  EXPECT_NE(out.str().find("(n=2)"), std::string::npos) << out.str();
}

// `profile infer` for real on the CPU (the sample image, a fresh v9-t): the JSON headline, the
// files in the mode-"inference" schema, a reader on them, and --repeat.
TEST(ProfileCli, InferProfilesPredictIterationsOnTheCpu) {
  const std::string project = libreyolo::test::temp_dir("prof_infer");
  std::ostringstream out, err;
  const std::vector<std::string> base = {"profile", "infer", "--imgsz", "128", "--warmup", "1", "--runs", "6",
                                         "--device", "cpu", "--project", project};
  std::vector<std::string> args = base;
  args.push_back("--json");
  ASSERT_EQ(libreyolo::cli::run(args, out, err), 0) << err.str();
  const auto j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["mode"], "inference");
  EXPECT_GT(j["img_per_s"].get<double>(), 0.0);
  const double p50 = j["latency_p50_ms"].get<double>(), p90 = j["latency_p90_ms"].get<double>(),
               p99 = j["latency_p99_ms"].get<double>();
  EXPECT_GT(p50, 0.0);
  EXPECT_LE(p50, p90);
  EXPECT_LE(p90, p99);
  for (const char* k : {"preprocess", "forward", "postprocess"}) EXPECT_GE(j["stages_ms"][k].get<double>(), 0.0) << k;
  EXPECT_GT(j["stages_ms"]["forward"].get<double>(), 0.0);
  const std::string bound = j["bound"].get<std::string>();
  EXPECT_TRUE(bound == "compute" || bound == "preprocess" || bound == "nms / postprocess") << bound;
  const fs::path dir = fs::path(project) / "infer";
  for (const char* f : {"profile.json", "profile_summary.json", "profile_trace.json"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  std::ifstream in(dir / "profile.json");
  const auto prof = nlohmann::json::parse(in);
  EXPECT_EQ(prof["mode"], "inference");
  EXPECT_EQ(prof["schema"], "libreyolo.profile.analysis/v1");
  EXPECT_EQ(prof["latency"]["n"], 3);  // the unsynced half of 6 runs
  EXPECT_TRUE(prof["metrics"].contains("latency_p99_ms"));
  out.str("");
  EXPECT_EQ(libreyolo::cli::run({"profile", "summary", (dir / "profile.json").string()}, out, err), 0) << err.str();
  // --repeat 2
  out.str("");
  args = base;
  args.insert(args.end(), {"--repeat", "2", "--no-trace"});
  ASSERT_EQ(libreyolo::cli::run(args, out, err), 0) << err.str();
  EXPECT_TRUE(fs::exists(fs::path(project) / "infer2" / "trial_0" / "profile.json"));
  EXPECT_TRUE(fs::exists(fs::path(project) / "infer2" / "trial_1" / "profile.json"));
  EXPECT_FALSE(fs::exists(fs::path(project) / "infer2" / "trial_1" / "profile_trace.json"));
  ASSERT_TRUE(fs::exists(fs::path(project) / "infer2" / "infer_repeat.json"));
  EXPECT_TRUE(fs::exists(dir / "profile_trace.json")) << "the first run's files stay";
}

// A profile file with fields of other types than this build writes: a bad file (exit 2, as any
// file the readers cannot read) named with the field's problem, not the JSON library's text.
TEST(ProfileCli, AProfileWithWrongFieldTypesIsNamedAsSuch) {
  const std::string path = libreyolo::test::temp_dir("prof_bad") + "/profile.json";
  std::ofstream(path) << R"({"schema": "libreyolo.profile.analysis/v1", "mode": "train", "step_ms": "slow",
                             "bound": 3, "metrics": {"img_per_s": "fast"}})";
  std::ostringstream out, err;
  EXPECT_EQ(libreyolo::cli::run({"profile", "summary", path}, out, err), 2) << err.str();
  EXPECT_EQ(out.str(), "") << "no partial report before the error";
  EXPECT_NE(err.str().find(path + " is not a profile this build reads"), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("json.exception"), std::string::npos) << err.str();
}
