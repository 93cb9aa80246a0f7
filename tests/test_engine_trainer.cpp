// End-to-end training on a tiny generated dataset: the run directory, checkpoints, results.csv,
// resume continuing exactly, and predict/val with the trained weights.
#include <filesystem>
#include <fstream>
#include <map>

#include <libreyolo/libreyolo.hpp>

#include "data/synthetic.hpp"
#include "io/checkpoint.hpp"
#include "io/image.hpp"
#include "io/pickle.hpp"
#include "io/sample_image.hpp"
#include "engine/validator.hpp"
#include "layers/cudnn_fusion.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;

namespace {
std::string tiny_dataset() {
  static std::string yaml = [] {
    data::SyntheticOptions o;
    o.train_images = 24;
    o.val_images = 8;
    o.width = 96;
    o.height = 80;
    o.num_classes = 3;
    o.threads = 1;
    return data::generate_synthetic_dataset(test::temp_dir("trainer_ds"), o);
  }();
  return yaml;
}

Kwargs base_options(const std::string& project) {
  return {{"data", tiny_dataset()}, {"epochs", "3"},     {"batch", "8"},        {"imgsz", "64"},
          {"workers", "0"},         {"device", "cpu"},   {"eval_interval", "1"}, {"save_period", "1"},
          {"warmup_epochs", "1"},   {"project", project}, {"name", "run"},      {"no_aug_epochs", "1"},
          {"verbose", "false"}};
}

// One epoch without validation: for tests that look at the training itself.
Kwargs one_epoch_options(const std::string& project) {
  Kwargs kw = base_options(project);
  for (auto& [k, v] : kw)
    if (k == "epochs") v = "1";
  kw.emplace_back("val", "false");
  return kw;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(f, l)) out.push_back(l);
  return out;
}
}  // namespace

TEST(Trainer, ShortRunWritesArtifactsAndResumesExactly) {
  const std::string project = test::temp_dir("trainer_runs");
  std::vector<EpochSummary> seen;
  TrainCallbacks cb;
  cb.on_epoch_end = [&](const EpochSummary& e) { seen.push_back(e); };
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
  TrainResult full = model.train(base_options(project), cb);

  ASSERT_EQ(full.epochs.size(), 3u);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(full.save_dir, (fs::path(project) / "run").string());
  for (const char* f : {"train_config.yaml", "results.csv", "summary.json", "weights/last.pt", "weights/best.pt",
                        "weights/epoch_1.pt", "weights/epoch_2.pt"})
    EXPECT_TRUE(fs::exists(fs::path(full.save_dir) / f)) << f;
  EXPECT_GE(full.best_epoch, 1);
  for (const auto& e : full.epochs) {
    EXPECT_TRUE(std::isfinite(e.loss));
    EXPECT_TRUE(e.validated);
  }
  // The class head follows the dataset, and the caller's model holds the trained weights.
  EXPECT_EQ(model.info().num_classes, 3);
  EXPECT_EQ(model.info().names[0], data::synthetic_class_names()[0]);
  auto csv = read_lines((fs::path(full.save_dir) / "results.csv").string());
  ASSERT_EQ(csv.size(), 4u);
  EXPECT_EQ(csv[0].rfind("epoch,time,train/loss,validated,is_best,current_metric", 0), 0u) << csv[0];
  EXPECT_NE(csv[0].find("metrics/mAP50-95"), std::string::npos);
  EXPECT_NE(csv[0].find("lr/group2"), std::string::npos);

  // The training checkpoint schema.
  io::Checkpoint ck = io::read_checkpoint((fs::path(full.save_dir) / "weights" / "epoch_1.pt").string());
  EXPECT_EQ(ck.meta.family.value_or(""), "yolo9");
  EXPECT_EQ(ck.meta.nc.value_or(0), 3);
  for (const char* k : {"epoch", "optimizer", "config", "train_model", "ema", "ema_updates", "best_mAP50_95",
                        "best_epoch", "is_ema_weights", "scaler"})
    EXPECT_TRUE(ck.root->has(k)) << k;
  EXPECT_EQ(ck.root->get("epoch")->as_int(), 0);

  // Resume from the end of epoch 1: epochs 2 and 3 reproduce the uninterrupted run.
  LibreYOLO resumed((fs::path(full.save_dir) / "weights" / "epoch_1.pt").string(), "cpu");
  TrainResult rest = resumed.train({{"resume", "true"}, {"workers", "0"}, {"verbose", "false"}});
  ASSERT_EQ(rest.epochs.size(), 2u);
  EXPECT_EQ(rest.save_dir, full.save_dir);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(rest.epochs[i].epoch, full.epochs[i + 1].epoch);
    EXPECT_DOUBLE_EQ(rest.epochs[i].loss, full.epochs[i + 1].loss) << "epoch " << rest.epochs[i].epoch;
    EXPECT_DOUBLE_EQ(rest.epochs[i].map50_95, full.epochs[i + 1].map50_95);
    EXPECT_DOUBLE_EQ(rest.epochs[i].lrs[0], full.epochs[i + 1].lrs[0]);
  }
  // results.csv keeps epoch 1 and has the redone epochs once.
  EXPECT_EQ(read_lines((fs::path(full.save_dir) / "results.csv").string()).size(), 4u);

  // The trained weights predict and validate.
  auto preds = resumed.predict("SAMPLE_IMAGE", {{"imgsz", "64"}, {"conf", "0.01"}});
  ASSERT_EQ(preds.size(), 1u);
  EXPECT_EQ(preds[0].width, 640);
  ValResult v = resumed.val({{"data", tiny_dataset()}, {"imgsz", "64"}, {"batch", "4"}, {"workers", "0"},
                             {"project", project}, {"name", "val"}});
  EXPECT_GE(v.get("metrics/mAP50", -1), 0.0);
  EXPECT_GT(v.get("speed/images_seen"), 7.0);
  // The run directory of val, its table (one row per class with labels) and files.
  EXPECT_EQ(v.save_dir, (fs::path(project) / "val").string());
  EXPECT_FALSE(v.classes.empty());
  EXPECT_NE(v.table.find("mAP50-95"), std::string::npos);
  for (const char* f : {"metrics.json", "per_class.csv", "confusion_matrix.png", "PR_curve.png", "F1_curve.png"})
    EXPECT_TRUE(fs::exists(fs::path(v.save_dir) / f)) << f;
  // Without imgsz, val (and predict) use the size the checkpoint was trained at, not 640.
  ValResult d = resumed.val({{"data", tiny_dataset()}, {"batch", "4"}, {"workers", "0"}, {"project", project},
                             {"name", "val_default"}});
  std::ifstream mj(fs::path(d.save_dir) / "metrics.json");
  const std::string text((std::istreambuf_iterator<char>(mj)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"imgsz\": 64"), std::string::npos) << text.substr(0, 400);
}

TEST(Trainer, ResumeWithoutCheckpointIsUsageError) {
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 3, "cpu");
  EXPECT_THROW(model.train({{"data", tiny_dataset()}, {"resume", "true"}, {"device", "cpu"}}), UsageError);
}

TEST(Trainer, MissingDatasetIsDataError) {
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 3, "cpu");
  try {
    model.train({{"data", "/no/such/data.yaml"}, {"device", "cpu"}, {"epochs", "1"}});
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(e.exit_code(), 3);
  }
}

TEST(Trainer, DatasetsWithoutLabelsAreNamedNotTrainedOn) {
  // A copy of the tiny dataset: first with no label files at all (training refuses: nothing to
  // learn, and an mAP of -1 would be "best"), then with labels for the training split only (the
  // run goes on without validation).
  const fs::path src = fs::path(tiny_dataset()).parent_path();
  const fs::path dir = test::temp_dir("trainer_nolabels");
  fs::create_directory_symlink(src / "images", dir / "images");  // labels are looked up beside: none
  std::ofstream(dir / "data.yaml") << "path: " << dir.string() << "\ntrain: images/train\nval: images/val\n"
                                   << "names: [circle, square, triangle]\n";
  Kwargs o = base_options(test::temp_dir("trainer_nolabels_runs"));
  o[0].second = (dir / "data.yaml").string();
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 3, "cpu");
  try {
    model.train(o);
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(e.code(), "no_labels");
    EXPECT_NE(std::string(e.what()).find("24 images have no labels"), std::string::npos) << e.what();
    // Where the labels were looked for: the user sees which rule missed them.
    EXPECT_NE(std::string(e.what()).find((dir / "labels" / "train").string()), std::string::npos) << e.what();
  }
  fs::create_directories(dir / "labels");
  fs::create_directory_symlink(src / "labels" / "train", dir / "labels" / "train");
  o[1].second = "1";  // one epoch
  const TrainResult r = model.train(o);
  EXPECT_TRUE(r.best_checkpoint.empty());
  EXPECT_TRUE(fs::exists(fs::path(r.save_dir) / "weights" / "last.pt"));
  // val of a split without labels has no mAP to give: a data error naming the split and the path.
  LibreYOLO trained((fs::path(r.save_dir) / "weights" / "last.pt").string(), "cpu");
  try {
    trained.val({{"data", (dir / "data.yaml").string()}, {"imgsz", "64"}, {"project", test::temp_dir("trainer_nolabels_val")}});
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(e.code(), "no_labels");
    EXPECT_NE(std::string(e.what()).find("split 'val'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find((dir / "labels" / "val").string()), std::string::npos) << e.what();
  }
}

// predict save=true keeps the sources' file names: into a source's own folder (exist_ok=true with
// that folder as project/name) it would replace the images, and is refused before any is written.
TEST(Predict, SavingIntoTheSourcesFolderIsRefused) {
  const fs::path dir = test::temp_dir("predict_into_source");
  fs::create_directories(dir / "imgs");
  const fs::path img = dir / "imgs" / "photo.png";
  io::save_image(img.string(), io::make_sample_image());
  const auto before = fs::file_size(img);
  LibreYOLO model("yolo9t", "cpu");
  try {
    model.predict(img.string(), {{"imgsz", "64"}, {"save", "true"}, {"project", dir.string()}, {"name", "imgs"},
                                 {"exist_ok", "true"}});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(e.code(), "config_conflict");
    EXPECT_NE(std::string(e.what()).find("photo.png"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fs::file_size(img), before);
  // Elsewhere it saves as usual.
  const auto r = model.predict(img.string(), {{"imgsz", "64"}, {"save", "true"}, {"project", dir.string()}, {"name", "out"}});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(fs::exists(r[0].saved_path));
}

TEST(Trainer, ResumeFromAnotherWorkingDirectoryFindsTheDataAndTheRun) {
  // Started with data and project relative to one directory, resumed from another: the saved
  // config holds absolute paths, so the resume reads the same data and continues the same run.
  const fs::path home = test::temp_dir("trainer_cwd");
  const fs::path ds = fs::path(tiny_dataset());
  fs::create_directory_symlink(ds.parent_path(), home / "ds");
  const fs::path before = fs::current_path();
  fs::current_path(home);
  Kwargs o = base_options("runs");
  o[0].second = "ds/" + ds.filename().string();
  o[1].second = "2";
  o.emplace_back("save_period", "1");
  TrainResult first;
  {
    LibreYOLO model = LibreYOLO::create("yolo9", "t", 3, "cpu");
    first = model.train(o);
  }
  const fs::path epoch1 = fs::path(first.save_dir) / "weights" / "epoch_1.pt";
  ASSERT_TRUE(fs::exists(epoch1)) << first.save_dir;
  EXPECT_TRUE(fs::path(first.save_dir).is_absolute());
  const auto ck = io::read_checkpoint(epoch1.string());
  const std::string saved_data = ck.root->get("config")->get("data")->as_string();
  EXPECT_TRUE(fs::path(saved_data).is_absolute()) << saved_data;
  fs::current_path(fs::temp_directory_path());
  LibreYOLO resumed(epoch1.string(), "cpu");
  const TrainResult r = resumed.train({{"resume", "true"}, {"device", "cpu"}, {"verbose", "false"}});
  fs::current_path(before);
  EXPECT_EQ(r.save_dir, first.save_dir);
}

TEST(Validator, ModelAndDatasetClassesAreCompared) {
  const std::vector<std::string> model = {"cat", "dog", "bird", "fish"};
  try {
    engine::check_classes_match(model, 4, {"car", "bus"}, "d.yaml");
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_EQ(e.code(), "class_mismatch");
    const std::string m = e.what();
    EXPECT_NE(m.find("4 classes (cat, dog, bird, fish)"), std::string::npos) << m;
    EXPECT_NE(m.find("'d.yaml' 2 (car, bus)"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(engine::check_classes_match(model, 4, {"cat", "dog", "bird", "horse"}, "d.yaml"));
  EXPECT_NO_THROW(engine::check_classes_match(model, 4, {}, "d.yaml"));  // no names: nothing to compare
}

TEST(Predict, SampleImageAndSavedDrawing) {
  LibreYOLO model("yolo9t", "cpu");
  const std::string out = test::temp_dir("predict");
  auto r = model.predict("SAMPLE_IMAGE", {{"imgsz", "160"}, {"save", "true"}, {"project", out}, {"conf", "0.000001"}});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].height, 480);
  EXPECT_FALSE(r[0].detections.empty());  // an untrained head scores its anchors near sigmoid(-10) = 4.5e-5
  EXPECT_LE(r[0].detections.size(), 300u);
  ASSERT_FALSE(r[0].saved_path.empty());
  EXPECT_TRUE(fs::exists(r[0].saved_path));
  for (const auto& d : r[0].detections) {
    EXPECT_GE(d.x1, 0);
    EXPECT_LE(d.x2, 640);
    EXPECT_LE(d.y2, 480);
    EXPECT_GT(d.score, 0.000001f);
  }
}

// Pixels in memory predict as the same image read from a file: RGB, BGR (flipped channel order),
// with an alpha channel, with padded rows; grey as its three equal channels; and a classifier
// takes them too. Views that cannot be images are refused with source_invalid.
TEST(Predict, ImagesInMemoryPredictAsTheirFiles) {
  const auto close_to = [](const std::vector<Detection>& a, const std::vector<Detection>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].class_id, b[i].class_id) << what << " " << i;
      EXPECT_FLOAT_EQ(a[i].score, b[i].score) << what << " " << i;
      EXPECT_FLOAT_EQ(a[i].x1, b[i].x1) << what << " " << i;
      EXPECT_FLOAT_EQ(a[i].y2, b[i].y2) << what << " " << i;
    }
  };
  LibreYOLO model("yolo9t", "cpu");
  const Kwargs opts = {{"imgsz", "96"}, {"conf", "0.000001"}};
  const torch::Tensor rgb = io::make_sample_image().contiguous();  // [480, 640, 3]
  const std::string png = test::temp_dir("predict_memory") + "/sample.png";
  io::save_image(png, rgb);
  const auto from_file = model.predict(png, opts);
  ASSERT_EQ(from_file.size(), 1u);
  ASSERT_FALSE(from_file[0].detections.empty());

  ImageView v{rgb.data_ptr<uint8_t>(), 480, 640, 3, 0, false, "mine"};
  const auto r = model.predict(std::vector<ImageView>{v}, opts);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].source, "mine");
  EXPECT_EQ(r[0].height, 480);
  EXPECT_EQ(r[0].width, 640);
  close_to(r[0].detections, from_file[0].detections, "rgb");

  const torch::Tensor bgr = rgb.flip(2).contiguous();
  const torch::Tensor rgba = torch::cat({rgb, torch::full({480, 640, 1}, 9, torch::kUInt8)}, 2).contiguous();
  const torch::Tensor padded = torch::cat({rgb, torch::zeros({480, 5, 3}, torch::kUInt8)}, 1).contiguous();
  const auto several = model.predict(
      std::vector<ImageView>{{bgr.data_ptr<uint8_t>(), 480, 640, 3, 0, true, ""},
                             {rgba.data_ptr<uint8_t>(), 480, 640, 4, 0, false, ""},
                             {padded.data_ptr<uint8_t>(), 480, 640, 3, 645 * 3, false, ""}},
      opts);
  ASSERT_EQ(several.size(), 3u);
  EXPECT_EQ(several[0].source, "image0");
  EXPECT_EQ(several[2].source, "image2");
  for (size_t i = 0; i < 3; ++i) close_to(several[i].detections, from_file[0].detections, several[i].source);

  const torch::Tensor grey = rgb.select(2, 1).contiguous();
  const std::string grey_png = test::temp_dir("predict_memory") + "/grey.png";
  io::save_image(grey_png, grey.unsqueeze(2).expand({480, 640, 3}).contiguous());
  close_to(model.predict(std::vector<ImageView>{{grey.data_ptr<uint8_t>(), 480, 640, 1, 0, false, ""}}, opts)[0].detections,
           model.predict(grey_png, opts)[0].detections, "grey");

  const auto code_of = [&](const ImageView& bad) {
    try {
      model.predict(std::vector<ImageView>{bad}, opts);
    } catch (const UsageError& e) {
      return e.code();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(code_of({nullptr, 480, 640, 3, 0, false, ""}), "source_invalid");
  EXPECT_EQ(code_of({rgb.data_ptr<uint8_t>(), 0, 640, 3, 0, false, ""}), "source_invalid");
  EXPECT_EQ(code_of({rgb.data_ptr<uint8_t>(), 480, 640, 2, 0, false, ""}), "source_invalid");
  EXPECT_EQ(code_of({rgb.data_ptr<uint8_t>(), 480, 640, 3, 100, false, ""}), "source_invalid");
  EXPECT_THROW(model.predict(std::vector<ImageView>{}, opts), UsageError);

  LibreYOLO classifier = LibreYOLO::create("resnet", "18", 5, "cpu");
  const auto c_file = classifier.predict(png, {{"imgsz", "64"}});
  const auto c_mem = classifier.predict(std::vector<ImageView>{v}, {{"imgsz", "64"}});
  ASSERT_EQ(c_mem.size(), 1u);
  ASSERT_EQ(c_mem[0].probs.size(), c_file[0].probs.size());
  for (size_t i = 0; i < c_mem[0].probs.size(); ++i) EXPECT_FLOAT_EQ(c_mem[0].probs[i], c_file[0].probs[i]);
}

TEST(Predict, SavedWeightsRoundTrip) {
  LibreYOLO a = LibreYOLO::create("yolo9", "t", 5, "cpu");
  const std::string path = test::temp_dir("save") + "/m.pt";
  a.save(path);
  LibreYOLO b(path, "cpu");
  EXPECT_EQ(b.info().num_classes, 5);
  EXPECT_EQ(b.info().size, "t");
  auto ra = a.predict("SAMPLE_IMAGE", {{"imgsz", "96"}, {"conf", "0.000001"}});
  auto rb = b.predict("SAMPLE_IMAGE", {{"imgsz", "96"}, {"conf", "0.000001"}});
  ASSERT_EQ(ra[0].detections.size(), rb[0].detections.size());
  for (size_t i = 0; i < ra[0].detections.size(); ++i) EXPECT_FLOAT_EQ(ra[0].detections[i].score, rb[0].detections[i].score);
}

// A class count far beyond what a confusion matrix can show (its (nc + 1)^2 counts once ended
// validation with bad_alloc, a warning, exit 0 and no best.pt): the run validates, keeps a best
// model and draws every validation picture but the matrix.
TEST(Trainer, HundredThousandClassesValidateAndKeepABestModel) {
  const std::string project = test::temp_dir("trainer_many_classes");
  const fs::path base = fs::path(tiny_dataset()).parent_path();
  const std::string yaml = project + "/many.yaml";
  {
    std::ofstream f(yaml);
    f << "path: " << base.string() << "\ntrain: images/train\nval: images/val\nnames: [";
    for (int i = 0; i < 100000; ++i) f << (i ? ", " : "") << "c" << i;
    f << "]\n";
  }
  Kwargs kw = base_options(project);
  for (auto& [k, v] : kw) {
    if (k == "epochs") v = "1";
    if (k == "data") v = yaml;
  }
  kw.emplace_back("aux_weight", "0");
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 3, "cpu");
  TrainResult r = model.train(kw);
  ASSERT_FALSE(r.best_checkpoint.empty());
  EXPECT_TRUE(fs::exists(r.best_checkpoint));
  const fs::path dir = fs::path(r.best_checkpoint).parent_path().parent_path();
  EXPECT_TRUE(fs::exists(dir / "PR_curve.png"));
  EXPECT_FALSE(fs::exists(dir / "confusion_matrix.png"));
  EXPECT_EQ(model.info().num_classes, 100000);
}

TEST(Trainer, FreezeKeepsTheBackboneAndPythonReadsTheCheckpoint) {
  const std::string project = test::temp_dir("trainer_freeze");
  // Fine-tuning from saved weights (a fresh model would be re-initialised from the seed).
  const std::string init = project + "/init.pt";
  LibreYOLO::create("yolo9", "t", 3, "cpu").save(init);
  auto before = io::read_checkpoint(init).model;
  LibreYOLO model(init, "cpu");
  Kwargs kw = base_options(project);
  for (auto& [k, v] : kw)
    if (k == "epochs") v = "1";
  kw.emplace_back("freeze", "10");  // the ten backbone groups
  kw.emplace_back("ema", "false");  // so that `model` holds the trained weights themselves
  TrainResult r = model.train(kw);
  io::Checkpoint after = io::read_checkpoint(r.last_checkpoint);
  std::map<std::string, torch::Tensor> old(before.begin(), before.end());
  int frozen_same = 0, head_changed = 0;
  for (const auto& [k, v] : after.model) {
    if (!old.count(k) || !v.is_floating_point() || k.find("running_") != std::string::npos) continue;
    const bool same = torch::equal(v, old[k]);
    if (k.rfind("backbone.", 0) == 0) {
      EXPECT_TRUE(same) << k;
      frozen_same += same;
    } else if (k.rfind("neck.", 0) == 0 && !same) {
      ++head_changed;
    }
  }
  EXPECT_GT(frozen_same, 100);
  EXPECT_GT(head_changed, 10);

  auto py = test::python_with_torch();
  if (!py) GTEST_SKIP() << "python with torch not available: Python interop of the checkpoint not checked";
  std::string out;
  const std::string script =
      "import torch,sys; d=torch.load(sys.argv[1], weights_only=True); "
      "assert d['schema_version']=='1.0' and d['model_family']=='yolo9' and d['nc']==3; "
      "m=d['model']; main=[k for k in m if not k.startswith(('aux.','aux_head.'))]; "
      "assert len(main)==1338 and len(m)>len(main) and type(m).__name__=='OrderedDict'; "
      "assert d['epoch']==0 and len(d['optimizer']['param_groups'])==3; print('ok')";
  ASSERT_EQ(test::run_command(*py + " -c \"" + script + "\" " + r.last_checkpoint, &out), 0) << out;
  EXPECT_NE(out.find("ok"), std::string::npos);
}

// A fresh model is initialised from the seed, so a run is reproducible whatever the random state
// before train() (LibTorch seeds its default generator randomly at start-up).
TEST(Trainer, FreshModelRunsAreReproducibleForASeed) {
  const std::string project = test::temp_dir("trainer_seed");
  auto run = [&](const std::string& name) {
    LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
    torch::rand({7});  // disturb the global generator differently for each run
    Kwargs kw = one_epoch_options(project);
    for (auto& [k, v] : kw)
      if (k == "name") v = name;
    return model.train(kw).epochs.at(0).loss;
  };
  const double a = run("a");
  torch::rand({3});
  const double b = run("b");
  EXPECT_DOUBLE_EQ(a, b);
}

// cuda_graph=true where graphs cannot run (the CPU) trains eager and says so once; an unknown
// scope is a usage error naming the valid one.
TEST(Trainer, CudaGraphOnTheCpuTrainsEagerWithOneLine) {
  const std::string project = test::temp_dir("trainer_graph_cpu");
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
  Kwargs kw = one_epoch_options(project);
  kw.emplace_back("cuda_graph", "true");
  testing::internal::CaptureStderr();
  const auto r = model.train(kw);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("CUDA graphs off (CUDA graphs need a CUDA device): training eager"), std::string::npos) << log;
  EXPECT_NE(log.find("CUDA graphs: 0 of "), std::string::npos) << log;
  EXPECT_TRUE(std::isfinite(r.epochs.at(0).loss));
  kw.emplace_back("cuda_graph_scope", "decoder");
  try {
    model.train(kw);
    ADD_FAILURE() << "cuda_graph_scope=decoder was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda_graph_scope"), std::string::npos) << e.what();
  }
}

// A single-process training times new convolution plans on a worker (PlanTuning::Background), a
// process-wide mode: when it ends, the mode before it is back, so that what runs next in the
// process (a benchmark, a multi-GPU rank, another trainer) gets its own default.
TEST(Trainer, PutsBackThePlanTuningModeItChose) {
  using models::PlanTuning;
  models::set_training_plan_tuning(PlanTuning::Background);
  if (models::set_training_plan_tuning(PlanTuning::InCall) != PlanTuning::Background)
    GTEST_SKIP() << "built without the cuDNN frontend: one tuning mode only";
  const std::string project = test::temp_dir("trainer_plan_tuning");
  {
    LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
    model.train(one_epoch_options(project));
  }
  EXPECT_EQ(models::set_training_plan_tuning(PlanTuning::InCall), PlanTuning::InCall)
      << "the trainer left its tuning mode in place";
}

// A folder through predict at batch 1, 2 and 4 (decoding runs a batch ahead on its own threads):
// the same images in the same order with the same detections, the unreadable file skipped in each.
TEST(Predict, FolderBatchesAndDecodeAheadKeepOrderAndDetections) {
  const fs::path dir = fs::path(test::temp_dir("predict_folder")) / "imgs";
  fs::create_directories(dir);
  for (int i = 0; i < 6; ++i) {
    torch::Tensor img = io::make_sample_image(120 + 8 * i, 160 - 4 * i);
    io::save_image((dir / ("img" + std::to_string(i) + (i % 2 ? ".png" : ".jpg"))).string(), img);
  }
  std::ofstream(dir / "img3b.jpg") << "not an image";
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
  std::vector<std::vector<PredictResult>> runs;
  for (const char* batch : {"1", "2", "4"})
    runs.push_back(model.predict(dir.string(), {{"imgsz", "96"}, {"conf", "0.000001"}, {"batch", batch}}));
  ASSERT_EQ(runs[0].size(), 6u);
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (size_t i = 0; i < runs[0].size(); ++i) {
      const auto &a = runs[0][i], &b = runs[r][i];
      EXPECT_EQ(a.source, b.source);
      EXPECT_EQ(a.height, b.height);
      ASSERT_EQ(a.detections.size(), b.detections.size()) << a.source << " batch run " << r;
      for (size_t k = 0; k < a.detections.size(); ++k) {
        EXPECT_EQ(a.detections[k].class_id, b.detections[k].class_id);
        EXPECT_NEAR(a.detections[k].x1, b.detections[k].x1, 1e-3);
        EXPECT_NEAR(a.detections[k].y2, b.detections[k].y2, 1e-3);
        EXPECT_NEAR(a.detections[k].score, b.detections[k].score, 1e-5);
      }
    }
  }
  EXPECT_EQ(fs::path(runs[0][3].source).filename(), "img3.png");
  EXPECT_EQ(fs::path(runs[0][4].source).filename(), "img4.jpg");  // after the skipped img3b.jpg
  EXPECT_GT(runs[0][0].detections.size(), 0u);
}

// Inference CUDA graphs where they cannot run (the CPU): predict with cuda_graph=true|auto gives
// what eager gives; capture_graph is a usage error naming the reason; a bad value is refused.
TEST(Predict, CudaGraphOnTheCpuRunsEagerAndCaptureSaysWhy) {
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cpu");
  const auto a = model.predict("SAMPLE_IMAGE", {{"imgsz", "128"}, {"conf", "0.000001"}});
  const auto b = model.predict("SAMPLE_IMAGE", {{"imgsz", "128"}, {"conf", "0.000001"}, {"cuda_graph", "true"}});
  const auto c = model.predict("SAMPLE_IMAGE", {{"imgsz", "128"}, {"conf", "0.000001"}, {"cuda_graph", "auto"}});
  ASSERT_EQ(a.at(0).detections.size(), b.at(0).detections.size());
  ASSERT_EQ(a.at(0).detections.size(), c.at(0).detections.size());
  for (size_t i = 0; i < a[0].detections.size(); ++i) EXPECT_EQ(a[0].detections[i].score, b[0].detections[i].score);
  EXPECT_TRUE(model.graph_info().captured.empty());
  try {
    model.capture_graph(128, 1, "float32");
    ADD_FAILURE() << "capture_graph on the CPU was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.predict("SAMPLE_IMAGE", {{"cuda_graph", "sometimes"}}), UsageError);
}

// A checkpoint whose stored image size is outside any usable range (damaged or edited by hand)
// loads with a warning and the family's default size instead of sending that size to the
// allocator in predict and val.
TEST(Predict, CheckpointImageSizeOutOfRangeFallsBackToTheDefault) {
  const fs::path dir = test::temp_dir("ckpt_imgsz");
  const std::string good = (dir / "good.pt").string();
  LibreYOLO("yolo9t", "cpu").save(good);
  for (const int64_t bad : {int64_t{100000}, int64_t{2147483616}}) {
    auto root = libreyolo::io::load_torch_file(good);
    root->set("imgsz", libreyolo::io::PyValue::from_int(bad));
    const std::string path = (dir / ("imgsz_" + std::to_string(bad) + ".pt")).string();
    libreyolo::io::save_torch_file(path, *root);
    LibreYOLO model(path, "cpu");
    EXPECT_EQ(model.info().imgsz, 640) << bad;
    const auto r = model.predict("SAMPLE_IMAGE", {{"imgsz", "64"}});
    EXPECT_EQ(r.size(), 1u);
  }
}

// resume=<path> of another family's checkpoint: a model error naming both families (exit 4), in
// the dry run too, not a complaint about an option of the other family's saved config.
TEST(Trainer, ResumeFromAnotherFamilysCheckpointIsAModelError) {
  const fs::path dir = test::temp_dir("resume_family");
  const std::string yolox = (dir / "yolox.pt").string();
  LibreYOLO("yoloxn", "cpu").save(yolox);
  for (const bool dry : {true, false}) {
    LibreYOLO model("yolo9t", "cpu");
    const Kwargs o = {{"data", tiny_dataset()}, {"resume", yolox}, {"device", "cpu"}, {"epochs", "2"},
                      {"project", (dir / "runs").string()}};
    try {
      if (dry)
        model.check_train(o);
      else
        model.train(o);
      FAIL() << "expected ModelError";
    } catch (const ModelError& e) {
      EXPECT_EQ(e.code(), "model_family_mismatch") << dry;
      EXPECT_EQ(e.exit_code(), 4);
      EXPECT_NE(std::string(e.what()).find("is a yolox checkpoint; the model being trained is yolo9"), std::string::npos)
          << e.what();
    }
  }
}

// Training from a trained YOLOv9 checkpoint takes its auxiliary branch's tensors too: the model's
// other entries are not "missing" from them, so no partial-match warning (it named 1338 entries).
TEST(Trainer, FineTuningFromATrainedCheckpointLoadsTheAuxBranchWithoutAWarning) {
  Kwargs o = base_options(test::temp_dir("finetune_aux"));
  o[1].second = "1";  // one epoch
  LibreYOLO first = LibreYOLO::create("yolo9", "t", 3, "cpu");
  const TrainResult r = first.train(o);
  LibreYOLO tuned(r.last_checkpoint, "cpu");
  testing::internal::CaptureStderr();
  tuned.check_train(o);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("Auxiliary branch: "), std::string::npos) << err;
  EXPECT_EQ(err.find("partly match"), std::string::npos) << err;
}
