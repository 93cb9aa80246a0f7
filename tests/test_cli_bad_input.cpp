// Bad input gets a clear error: option ranges, dry runs that check what the real run
// checks, unknown flags, out-of-image labels, absurd nc, predict sources and model paths.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <libreyolo/errors.hpp>

#include "cli/cli.hpp"
#include "core/log.hpp"
#include "data/dataset.hpp"
#include "data/dataset_yaml.hpp"
#include "core/config_schema.hpp"
#include "engine/predictor.hpp"
#include "data/synthetic.hpp"
#include "io/image.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;
using libreyolo::cli::run;

namespace {

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

void write_image(const fs::path& p, int h, int w, uint8_t value) {
  fs::create_directories(p.parent_path());
  io::save_image(p.string(), torch::full({h, w, 3}, value, torch::kUInt8));
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// Runs the CLI binary itself (exit code as the shell sees it, stdout and stderr together).
int run_cli(const std::string& args, std::string* output) {
  return test::run_command(std::string("'") + LIBREYOLO_CLI_PATH + "' " + args, output);
}

// The UsageError an option assignment throws, or a failure.
UsageError apply_error(const std::string& key, const std::string& value) {
  TrainConfig c;
  try {
    train_schema().apply(c, {{key, value}}, "train");
  } catch (const UsageError& e) {
    return e;
  }
  ADD_FAILURE() << key << "=" << value << " was accepted";
  return UsageError("accepted");
}

}  // namespace

// --- Option values -----------------------------------------------------------------------------

TEST(BadInput, IntegersBeyond32BitsAreRangeErrorsNotWrapped) {
  // 4294967297 = 2^32 + 1 used to become 1; 4294967304 = 2^32 + 8 became 8.
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"epochs", "4294967297"}, {"batch", "4294967304"}, {"imgsz", "99999999999"},
           {"epochs", "-4294967295"}, {"seed", "99999999999999999999999"}}) {
    const UsageError e = apply_error(key, value);
    EXPECT_EQ(e.code(), "config_range_error") << e.what();
    EXPECT_EQ(e.exit_code(), 2);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + key + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-2147483648 to 2147483647"), std::string::npos) << msg;
  }
  // The ends of the range are still accepted as they are.
  TrainConfig c;
  train_schema().apply(c, {{"epochs", "2147483647"}, {"seed", "-2147483648"}}, "train");
  EXPECT_EQ(c.epochs, 2147483647);
  EXPECT_EQ(c.seed, -2147483648LL);
}

TEST(BadInput, NonFiniteFloatsAreRejected) {
  for (const char* v : {"nan", "NaN", "inf", "-inf", "1e999"}) {
    const UsageError e = apply_error("lr0", v);
    EXPECT_NE(std::string(e.what()).find("'lr0'"), std::string::npos) << e.what();
  }
}

TEST(BadInput, CliReportsTheRangeWithExit2) {
  std::ostringstream out, err;
  EXPECT_EQ(run({"train", "data=builtin", "epochs=4294967297", "--dry-run"}, out, err), 2);
  EXPECT_NE(err.str().find("Invalid value for 'epochs': 4294967297 is out of range"), std::string::npos)
      << err.str();
  EXPECT_EQ(out.str().find("resolved config"), std::string::npos) << out.str();
}

// --- Unknown flags and hints -------------------------------------------------------------------

TEST(BadInput, MisspelledHelpIsAnUnknownFlagWithOneHint) {
  std::ostringstream out, err;
  EXPECT_EQ(run({"train", "--hepl"}, out, err), 2);
  const std::string e = err.str();
  EXPECT_NE(e.find("Unknown flag '--hepl' for 'train'. Did you mean '--help'?"), std::string::npos) << e;
  EXPECT_EQ(e.find("requires a value"), std::string::npos) << e;
  EXPECT_EQ(count_of(e, "Did you mean"), 1u) << e;

  // An unknown --flag does not swallow the next word as its value.
  err.str("");
  EXPECT_EQ(run({"train", "--epcohs", "3", "data=builtin"}, out, err), 2);
  EXPECT_NE(err.str().find("Did you mean '--epochs'?"), std::string::npos) << err.str();

  // A known option still takes the next word as its value.
  err.str("");
  out.str("");
  EXPECT_EQ(run({"train", "--epochs", "3", "data=builtin", "--dry-run", "--json"}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("\"epochs\":\"3\""), std::string::npos) << out.str();
}

TEST(BadInput, UnknownKeyHintIsPrintedOnce) {
  std::ostringstream out, err;
  EXPECT_EQ(run({"train", "data=x.yaml", "epcohs=3"}, out, err), 2);
  EXPECT_EQ(count_of(err.str(), "Did you mean 'epochs'?"), 1u) << err.str();
  EXPECT_NE(err.str().find("Suggestion: Run 'libreyolo train --help'"), std::string::npos) << err.str();
  // A stray word gets a hint too.
  err.str("");
  EXPECT_EQ(run({"train", "hepl"}, out, err), 2);
  EXPECT_NE(err.str().find("Unexpected argument 'hepl'. Did you mean '--help'?"), std::string::npos) << err.str();
}

// --- Dry run checks what the real run checks ---------------------------------------------------

TEST(BadInput, DryRunChecksDeviceModelAndData) {
  std::ostringstream out, err;
  EXPECT_EQ(run({"train", "data=builtin", "device=gpu", "--dry-run"}, out, err), 2) << out.str();
  EXPECT_NE(err.str().find("Invalid device string: 'gpu'"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(run({"train", "model=yolo9x", "data=builtin", "--dry-run"}, out, err), 4) << out.str();
  EXPECT_NE(err.str().find("Unknown model 'yolo9x'"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(run({"train", "model=/no/such/weights.pt", "data=builtin", "--dry-run"}, out, err), 4);
  err.str("");
  EXPECT_EQ(run({"train", "data=/no/such/data.yaml", "--dry-run"}, out, err), 3);
  EXPECT_NE(err.str().find("dataset YAML not found"), std::string::npos) << err.str();
  EXPECT_TRUE(out.str().empty()) << out.str();
  // A valid request is still valid, and says so.
  EXPECT_EQ(run({"train", "model=yolo9t", "data=builtin", "device=cpu", "--dry-run", "--json"}, out, err), 0)
      << err.str();
  EXPECT_NE(out.str().find("\"valid\":true"), std::string::npos) << out.str();
}

// --- Labels ------------------------------------------------------------------------------------

TEST(BadInput, LabelsOutsideTheImageAreClippedOrDropped) {
  const fs::path tmp = test::temp_dir("labels_outside");
  const std::string file = (tmp / "a.txt").string();
  write_text(file,
             "0 0.5 0.5 0.2 0.4\n"            // 1: inside: unchanged
             "1 0.95 0.5 0.2 0.2\n"           // 2: overhangs the right edge: clipped to x2 = 1
             "2 -0.05 0.1 0.2 0.1\n"          // 3: negative centre, partly inside: clipped to x1 = 0
             "3 0.5 0.5 -0.2 0.2\n"           // 4: negative width: dropped
             "4 1.2 0.5 0.2 0.2\n"            // 5: entirely right of the image: dropped
             "5 0.5 -0.3 0.2 0.2\n"           // 6: entirely above: dropped
             "6 -0.1 0.2 0.5 0.2 0.5 1.3\n"   // 7: polygon overhanging left and bottom: clipped
             "7 1.0000001 0.5 0.0000001 0.2\n");  // 8: rounding noise at the edge: not counted
  std::vector<std::string> problems;
  int64_t clipped = 0;
  const auto boxes = data::parse_label_file(file, 200, 100, 0, &problems, &clipped);
  ASSERT_EQ(boxes.size(), 5u);
  EXPECT_EQ(clipped, 3);
  EXPECT_DOUBLE_EQ(boxes[0].x1, 80.0);
  EXPECT_DOUBLE_EQ(boxes[0].y2, 70.0);
  EXPECT_DOUBLE_EQ(boxes[1].cls, 1.0);
  EXPECT_NEAR(boxes[1].x1, 170.0, 1e-9);
  EXPECT_NEAR(boxes[1].x2, 200.0, 1e-9);
  EXPECT_DOUBLE_EQ(boxes[2].cls, 2.0);
  EXPECT_NEAR(boxes[2].x1, 0.0, 1e-9);
  EXPECT_NEAR(boxes[2].x2, 10.0, 1e-9);
  EXPECT_DOUBLE_EQ(boxes[3].cls, 6.0);
  EXPECT_NEAR(boxes[3].x1, 0.0, 1e-9);
  EXPECT_NEAR(boxes[3].x2, 100.0, 1e-9);
  EXPECT_NEAR(boxes[3].y1, 20.0, 1e-9);
  EXPECT_NEAR(boxes[3].y2, 100.0, 1e-9);
  EXPECT_DOUBLE_EQ(boxes[4].cls, 7.0);
  EXPECT_LE(boxes[4].x2, 200.0);
  ASSERT_EQ(problems.size(), 3u);
  const int lines[] = {4, 5, 6};
  for (size_t i = 0; i < problems.size(); ++i)
    EXPECT_EQ(problems[i].rfind(file + ":" + std::to_string(lines[i]) + ":", 0), 0u) << problems[i];
  EXPECT_NE(problems[0].find("negative box size"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("outside the image"), std::string::npos) << problems[1];
}

TEST(BadInput, DatasetCountsClippedAndDroppedLabelsAndWarnsOnce) {
  const fs::path tmp = test::temp_dir("ds_labels_outside");
  std::vector<std::string> images;
  for (int i = 0; i < 3; ++i) {
    const fs::path img = tmp / "images" / ("p" + std::to_string(i) + ".png");
    write_image(img, 32, 32, 100);
    images.push_back(img.string());
    write_text(tmp / "labels" / ("p" + std::to_string(i) + ".txt"),
               "0 0.5 0.5 0.2 0.2\n0 0.95 0.5 0.2 0.2\n0 0.9 0.9 0.4 0.4\n0 2 2 0.1 0.1\n");
  }
  write_text(tmp / "images" / "broken.jpg", "not an image");
  images.push_back((tmp / "images" / "broken.jpg").string());
  data::DatasetOptions opt;
  opt.imgsz = 32;
  set_log_level(LogLevel::Info);
  testing::internal::CaptureStderr();
  data::YoloDataset ds(images, opt);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.num_corrupt(), 1);  // the corrupt image is still skipped and counted
  EXPECT_EQ(ds.num_boxes(), 9);
  EXPECT_EQ(ds.num_label_rows_clipped(), 6);
  EXPECT_EQ(ds.num_label_rows_skipped(), 3);
  EXPECT_EQ(count_of(log, "were clipped to the image"), 1u) << log;
  EXPECT_NE(log.find("6 label rows in 3 files had coordinates outside [0, 1]"), std::string::npos) << log;
  EXPECT_NE(log.find("3 label rows skipped"), std::string::npos) << log;
  for (int64_t i = 0; i < ds.size(); ++i)
    for (const auto& b : ds.original_boxes(i)) {
      EXPECT_GE(b.x1, 0.0);
      EXPECT_GE(b.y1, 0.0);
      EXPECT_LE(b.x2, 32.0);
      EXPECT_LE(b.y2, 32.0);
    }
}

// --- Dataset YAML ------------------------------------------------------------------------------

TEST(BadInput, AbsurdClassCountIsADataErrorNamingNc) {
  const fs::path tmp = test::temp_dir("yaml_nc");
  auto error_of = [&](const std::string& yaml) -> std::string {
    write_text(tmp / "d.yaml", "path: .\ntrain: images\n" + yaml);
    try {
      data::load_dataset_yaml((tmp / "d.yaml").string());
    } catch (const DataError& e) {
      EXPECT_EQ(e.exit_code(), 3);
      return e.what();
    }
    return "accepted";
  };
  std::string e = error_of("nc: 1000000000\n");
  EXPECT_NE(e.find("'nc' is 1000000000"), std::string::npos) << e;
  EXPECT_NE(e.find("between 1 and 100000"), std::string::npos) << e;
  EXPECT_NE(error_of("nc: 99999999999999999999\n").find("'nc'"), std::string::npos);
  EXPECT_NE(error_of("nc: 0\n").find("'nc' is 0"), std::string::npos);
  EXPECT_NE(error_of("nc: lots\n").find("'nc' must be an integer"), std::string::npos);
  EXPECT_NE(error_of("names: {0: a, 100000: b}\n").find("class id 100000"), std::string::npos);
  // The bound itself is allowed.
  EXPECT_EQ(error_of("nc: 100000\n"), "accepted");
  EXPECT_EQ(data::kMaxClasses, 100000);

  // Through the CLI: exit 3 naming nc, before any model is built for it (dry run and real run).
  write_text(tmp / "big.yaml", "path: .\ntrain: images\nval: images\nnc: 1000000000\n");
  std::ostringstream out, err;
  EXPECT_EQ(run({"train", "data=" + (tmp / "big.yaml").string(), "device=cpu", "--dry-run"}, out, err), 3);
  EXPECT_NE(err.str().find("'nc' is 1000000000"), std::string::npos) << err.str();
  err.str("");
  EXPECT_EQ(run({"train", "data=" + (tmp / "big.yaml").string(), "device=cpu", "epochs=1", "imgsz=32"}, out, err),
            3);
  EXPECT_NE(err.str().find("'nc' is 1000000000"), std::string::npos) << err.str();
}

// --- Predict sources and model paths -----------------------------------------------------------

TEST(BadInput, PredictSkipsUnreadableImagesAndKeepsNamesApart) {
  const fs::path tmp = test::temp_dir("predict_sources");
  const fs::path imgs = tmp / "imgs";
  write_image(imgs / "a.jpg", 40, 48, 30);
  write_image(imgs / "b.png", 40, 48, 60);
  write_image(imgs / "dup.jpg", 40, 48, 90);
  write_image(imgs / "dup.png", 40, 48, 120);
  write_text(imgs / "c_broken.jpg", "not an image");
  write_text(imgs / "notes.txt", "ignored");
  const std::string common = " model=yolo9t device=cpu imgsz=64 conf=0.99 project='" + tmp.string() + "'";

  std::string output;
  EXPECT_EQ(run_cli("predict source='" + imgs.string() + "' save=true name=all" + common, &output), 0) << output;
  EXPECT_NE(output.find("skipping " + (imgs / "c_broken.jpg").string()), std::string::npos) << output;
  EXPECT_NE(output.find("1 of 5 images skipped"), std::string::npos) << output;
  for (const char* name : {"a.jpg", "b.png", "dup.jpg", "dup.png"})
    EXPECT_TRUE(fs::is_regular_file(tmp / "all" / name)) << name << "\n" << output;
  EXPECT_FALSE(fs::exists(tmp / "all" / "c_broken.jpg"));
  // dup.png was saved as a PNG, not over dup.jpg.
  EXPECT_EQ(io::decode_image((tmp / "all" / "dup.png").string()).size(0), 40);

  // A pattern the shell did not expand.
  EXPECT_EQ(run_cli("predict source='" + (imgs / "*.png").string() + "' --json" + common, &output), 0)
      << output;
  EXPECT_EQ(count_of(output, "\"source\":"), 2u) << output;
  EXPECT_NE(output.find((imgs / "b.png").string()), std::string::npos) << output;
  EXPECT_NE(output.find((imgs / "dup.png").string()), std::string::npos) << output;
  EXPECT_EQ(run_cli("predict source='" + (imgs / "*.gif").string() + "' save=false" + common, &output), 3) << output;
  EXPECT_NE(output.find("No images match the pattern"), std::string::npos) << output;

  // Nothing readable at all: exit 3.
  write_text(tmp / "bad" / "x.jpg", "garbage");
  write_text(tmp / "bad" / "y.png", "garbage");
  EXPECT_EQ(run_cli("predict source='" + (tmp / "bad").string() + "' save=false" + common, &output), 3) << output;
  EXPECT_NE(output.find("None of the 2 images could be read"), std::string::npos) << output;
}

TEST(BadInput, SavedNamesAreUnique) {
  std::set<std::string> used;
  EXPECT_EQ(engine::saved_image_name("/x/dup.jpg", used), "dup.jpg");
  EXPECT_EQ(engine::saved_image_name("/x/dup.png", used), "dup.png");
  EXPECT_EQ(engine::saved_image_name("/y/dup.jpg", used), "dup_2.jpg");
  EXPECT_EQ(engine::saved_image_name("/z/dup.jpg", used), "dup_3.jpg");
  EXPECT_EQ(engine::saved_image_name("/x/pic.BMP", used), "pic.BMP.jpg");
  EXPECT_EQ(engine::saved_image_name("SAMPLE_IMAGE", used), "sample.jpg");
}

TEST(BadInput, GlobSourcesAreSortedImageFiles) {
  const fs::path tmp = test::temp_dir("glob_sources");
  write_image(tmp / "b.png", 8, 8, 1);
  write_image(tmp / "a.png", 8, 8, 1);
  write_text(tmp / "c.png.txt", "x");
  fs::create_directories(tmp / "d.png");  // a directory matching the pattern is not an image
  const auto files = engine::resolve_sources((tmp / "*.png").string());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], (tmp / "a.png").string());
  EXPECT_EQ(files[1], (tmp / "b.png").string());
  EXPECT_THROW(engine::resolve_sources((tmp / "*.jpg").string()), DataError);
}

TEST(BadInput, DirectoryAsModelSaysSo) {
  const fs::path tmp = test::temp_dir("model_dir");
  std::ostringstream out, err;
  EXPECT_EQ(run({"predict", "model=" + tmp.string(), "source=SAMPLE_IMAGE", "device=cpu"}, out, err), 4);
  EXPECT_NE(err.str().find("is a directory"), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("not found"), std::string::npos) << err.str();
  // A run directory: the hint names the checkpoint inside it.
  write_text(tmp / "weights" / "best.pt", "x");
  err.str("");
  EXPECT_EQ(run({"info", "model=" + tmp.string()}, out, err), 4);
  EXPECT_NE(err.str().find("model=" + (tmp / "weights" / "best.pt").string()), std::string::npos) << err.str();
}

TEST(BadInput, FoldersListOnlyFormatsThisBuildReadsAndSaySoForTheRest) {
  // A .webp or .tif beside JPEGs is skipped with a warning, not listed and then reported
  // corrupt; a folder of such files alone is "no images that this build reads" (exit 3).
  const fs::path tmp = test::temp_dir("unread_formats");
  write_image(tmp / "a.png", 8, 8, 1);
  write_text(tmp / "b.webp", "RIFF....WEBP");
  write_text(tmp / "c.TIF", "II*.");
  const auto files = engine::resolve_sources(tmp.string());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], (tmp / "a.png").string());
  const fs::path only = test::temp_dir("unread_only");
  write_text(only / "x.webp", "RIFF....WEBP");
  try {
    engine::resolve_sources(only.string());
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("that this build reads (JPEG, PNG, BMP)"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(io::has_image_extension("x.gif"));
  EXPECT_TRUE(io::has_unread_image_extension("x.GIF"));
  EXPECT_TRUE(io::has_image_extension("x.JPEG"));
}

TEST(BadInput, HalfOnTheCpuIsSaidInPredictAndValToo) {
  std::string output;
  EXPECT_EQ(run_cli("predict model=yolo9t source=SAMPLE_IMAGE device=cpu half=true imgsz=64 save=false", &output), 0)
      << output;
  EXPECT_NE(output.find("CUDA-only: predicting in float32"), std::string::npos) << output;
}

TEST(BadInput, ProfileSubcommandTyposGetADidYouMean) {
  std::ostringstream out, err;
  EXPECT_EQ(run({"profile", "sumary", "x.json"}, out, err), 2);
  EXPECT_NE(err.str().find("did you mean 'summary'"), std::string::npos) << err.str();
}

// A host-only profile prints the product's report and nothing of the libraries under it: Kineto's
// own device probe logged "ERROR: ... gpuGetDeviceCount failed" on machines without a GPU.
TEST(BadInput, AHostProfilePrintsNoRawLibraryLines) {
  const fs::path tmp = test::temp_dir("host_profile_quiet");
  std::string output;
  EXPECT_EQ(run_cli("profile infer --imgsz 64 --warmup 0 --runs 2 --device cpu --project '" + tmp.string() + "'",
                    &output),
            0)
      << output;
  EXPECT_NE(output.find("inference profile"), std::string::npos) << output;
  EXPECT_EQ(output.find("gpuGetDeviceCount"), std::string::npos) << output;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) EXPECT_NE(line.rfind("ERROR:", 0), 0u) << line;
}

// A run directory's name is a folder under project: an empty name numbered project itself ("2",
// "3"), an absolute one or one with ".." left it.
TEST(BadInput, RunNamesThatLeaveTheProjectAreRangeErrors) {
  for (const std::string cmd : {"train data=builtin --dry-run", "predict source=SAMPLE_IMAGE", "val data=builtin"})
    for (const std::string name : {"name=", "name=/tmp/elsewhere", "name=../up", "name=a/./b"}) {
      std::ostringstream out, err;
      std::vector<std::string> args;
      std::istringstream words(cmd + " model=yolo9t device=cpu imgsz=64 " + name);
      for (std::string w; words >> w;) args.push_back(w);
      EXPECT_EQ(run(args, out, err), 2) << cmd << " " << name << "\n" << err.str();
      EXPECT_NE(err.str().find("'name'"), std::string::npos) << cmd << " " << name << "\n" << err.str();
    }
}

TEST(BadInput, DryRunMakesEveryCheckTheRunMakesBeforeItsFirstStep) {
  // Each of these was reported valid by a dry run that only read the options and the YAML; the
  // real run stopped on it. Now the dry run stops on it too, with the real run's exit code.
  const fs::path tmp = test::temp_dir("dry_run_checks");
  data::SyntheticOptions o;
  o.train_images = 8;
  o.val_images = 2;
  o.width = o.height = 64;
  o.num_classes = 2;
  o.threads = 1;
  const std::string good = data::generate_synthetic_dataset((tmp / "good").string(), o);
  fs::create_directories(tmp / "empty" / "images" / "train");
  fs::create_directories(tmp / "empty" / "images" / "val");
  write_text(tmp / "empty" / "data.yaml",
             "path: " + (tmp / "empty").string() + "\ntrain: images/train\nval: images/val\nnames: [a, b]\n");
  const std::string empty = (tmp / "empty" / "data.yaml").string();
  const std::vector<std::string> base = {"train", "model=yolo9t", "workers=0", "--dry-run"};
  // Each key once (a key given twice with two values is a conflict of its own).
  const auto with_defaults = [&](std::vector<std::string> args) {
    const auto has = [&](const std::string& k) {
      return std::any_of(args.begin(), args.end(), [&](const std::string& a) { return a.rfind(k + "=", 0) == 0; });
    };
    if (!has("imgsz")) args.push_back("imgsz=64");
    if (!has("batch")) args.push_back("batch=4");
    if (!has("project")) args.push_back("project=" + (tmp / "runs").string());
    return args;
  };
  struct Case {
    std::vector<std::string> extra;
    int code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{"data=" + empty}, 3, "no images"},
      {{"data=" + good, "device=0,1"}, 2, "CUDA"},
      {{"data=" + good, "freeze=garbage"}, 2, "freeze"},
      {{"data=" + good, "resume=true"}, 2, "checkpoint"},
      {{"data=" + good, "project=/proc/no_such_dir"}, 1, "not writable"},
      {{"data=" + good, "imgsz=100000"}, 2, "above 8192"},
      // Terabytes of activations: refused with the numbers before anything is allocated.
      {{"data=" + good, "imgsz=8192", "batch=512", "device=cpu"}, 2, "Not enough memory"},
      // Another family's name for a schedule (YOLOX's) means nothing to YOLOv9.
      {{"data=" + good, "scheduler=yoloxwarmcos"}, 2, "'scheduler'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = base;
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    args = with_defaults(args);
    std::ostringstream out, err;
    EXPECT_EQ(run(args, out, err), c.code) << c.extra.back() << "\n" << err.str();
    EXPECT_NE(err.str().find(c.says), std::string::npos) << c.extra.back() << "\n" << err.str();
  }
  std::vector<std::string> args = base;
  args.push_back("data=" + good);
  args = with_defaults(args);
  std::ostringstream out, err;
  EXPECT_EQ(run(args, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("every check passed"), std::string::npos) << out.str();
  EXPECT_FALSE(fs::exists(tmp / "runs")) << "a dry run writes nothing";
  // Nor beside the images: cache=disk is left to the run.
  args.push_back("cache=disk");
  std::ostringstream out2, err2;
  EXPECT_EQ(run(args, out2, err2), 0) << err2.str();
  for (const auto& e : fs::recursive_directory_iterator(tmp / "good"))
    EXPECT_EQ(e.path().filename().string().find(".libreyolo_cache"), std::string::npos) << e.path();
}

TEST(BadInput, QuietAndVerboseTogetherAreAConflict) {
  std::ostringstream out, err;
  EXPECT_EQ(run({"train", "data=builtin", "--quiet", "--verbose", "--dry-run"}, out, err), 2);
  EXPECT_NE(err.str().find("--quiet and --verbose contradict each other"), std::string::npos) << err.str();
}

TEST(BadInput, HostMemoryIsNotReportedAsGpuMemory) {
  // std::bad_alloc is the host's allocator (it was reported as cuda_oom on a CPU-only machine);
  // the GPU's is c10::OutOfMemoryError.
  const auto code_of = [](auto thrower) {
    try {
      thrower();
    } catch (...) {
      return cli::error_for_exception(std::current_exception()).code();
    }
    return std::string("none");
  };
  EXPECT_EQ(code_of([] { throw std::bad_alloc(); }), "out_of_memory");
  EXPECT_EQ(code_of([] { throw c10::OutOfMemoryError(c10::SourceLocation{"f", "file.cpp", 1}, "CUDA out of memory"); }),
            "cuda_oom");
  EXPECT_EQ(code_of([] { throw std::runtime_error("x"); }), "io_error");
}
