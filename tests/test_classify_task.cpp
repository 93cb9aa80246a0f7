// The classify task end to end on the CPU: the class-folder dataset and its errors, the
// training transform's geometry, training through the API (the loss falls, top-1/top-5 are
// computed every epoch, results.csv / results.png / confusion_matrix.png are written, best.pt
// loads back and predicts the same probabilities), and the CLI (train, predict's top-k JSON and
// drawn image, val) with its exit codes for a detection dataset given to a classifier, an image
// folder without class folders, and a model of the other task than the command's task word.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli.hpp"
#include "data/classify.hpp"
#include "data/classify_loader.hpp"
#include "data/rng.hpp"
#include "io/image.hpp"
#include "libreyolo/errors.hpp"
#include "libreyolo/hooks.hpp"
#include "libreyolo/libreyolo.hpp"
#include "ops/resample.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;

namespace {

const std::string kNarrow = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/resnet18n_reference.pt";

// Class "cat" images are reddish, "dog" bluish, with noise; `per_class` each in train/ and half
// as many in val/.
std::string make_dataset(const std::string& tag, int per_class) {
  const fs::path root = fs::path(test::temp_dir(tag)) / "pets";
  torch::manual_seed(7);
  for (const char* split : {"train", "val"}) {
    const int n = std::string(split) == "train" ? per_class : per_class / 2;
    for (int c = 0; c < 2; ++c) {
      const fs::path dir = root / split / (c == 0 ? "cat" : "dog");
      fs::create_directories(dir);
      for (int i = 0; i < n; ++i) {
        auto img = torch::randint(0, 90, {40 + 2 * i % 9, 48, 3}, torch::kInt);
        img.select(2, c == 0 ? 0 : 2).add_(150);
        io::save_image((dir / ("img" + std::to_string(i) + ".png")).string(), img.clamp(0, 255).to(torch::kUInt8));
      }
    }
  }
  return root.string();
}

int run_cli(const std::vector<std::string>& args, std::string* out_text = nullptr) {
  std::ostringstream out, err;
  const int rc = cli::run(args, out, err);
  if (out_text) *out_text = out.str() + err.str();
  return rc;
}

}  // namespace

TEST(ClassifyData, ReadsClassFoldersAndRejectsOtherLayouts) {
  const std::string root = make_dataset("cls_data", 4);
  const auto ds = data::load_classify_dataset(root);
  EXPECT_EQ(ds.names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(ds.train.samples.size(), 8u);
  EXPECT_EQ(ds.val.samples.size(), 4u);
  EXPECT_TRUE(ds.has_val);
  EXPECT_EQ(ds.train.samples.front().label, 0);
  EXPECT_EQ(ds.train.samples.back().label, 1);
  // A split folder stands for its root.
  EXPECT_EQ(data::load_classify_dataset(root + "/train").train.samples.size(), 8u);

  const auto code_of = [](const std::string& data) {
    try {
      data::load_classify_dataset(data);
    } catch (const DataError& e) {
      return e.code();
    }
    return std::string("accepted");
  };
  // Images without class folders.
  const fs::path loose = fs::path(test::temp_dir("cls_loose")) / "flat";
  fs::create_directories(loose);
  io::save_image((loose / "a.png").string(), torch::zeros({8, 8, 3}, torch::kUInt8));
  EXPECT_EQ(code_of(loose.string()), "data_no_class_folders");
  const fs::path loose_split = fs::path(test::temp_dir("cls_loose2")) / "root";
  fs::create_directories(loose_split / "train");
  io::save_image((loose_split / "train" / "a.png").string(), torch::zeros({8, 8, 3}, torch::kUInt8));
  EXPECT_EQ(code_of(loose_split.string()), "data_no_class_folders");
  // A detection dataset: its YAML, or its images/ and labels/ folders.
  const fs::path det = fs::path(test::temp_dir("cls_det")) / "coco";
  fs::create_directories(det / "images" / "train");
  fs::create_directories(det / "labels" / "train");
  std::ofstream(det / "data.yaml") << "path: .\ntrain: images/train\nval: images/train\nnames: [a]\n";
  EXPECT_EQ(code_of((det / "data.yaml").string()), "data_task_mismatch");
  EXPECT_EQ(code_of(det.string()), "data_task_mismatch");
  // Different classes in val/.
  const fs::path odd = fs::path(test::temp_dir("cls_odd")) / "root";
  for (const char* d : {"train/a", "train/b", "val/a", "val/c"}) {
    fs::create_directories(odd / d);
    io::save_image((odd / d / "x.png").string(), torch::zeros({8, 8, 3}, torch::kUInt8));
  }
  EXPECT_EQ(code_of(odd.string()), "data_class_mismatch");
  EXPECT_EQ(code_of("/nonexistent/classify/data"), "data_not_found");
  try {
    data::load_classify_dataset(loose.string());
  } catch (const DataError& e) {
    EXPECT_EQ(e.exit_code(), 3);
  }
}

TEST(ClassifyData, TransformsGiveTheNetworkSize) {
  auto img = torch::randint(0, 256, {37, 81, 3}, torch::kUInt8);
  data::Rng rng(3);
  for (int i = 0; i < 20; ++i) {
    const auto t = data::classify_train_transform(img, 24, 0.5, rng);
    EXPECT_EQ(t.sizes().vec(), (std::vector<int64_t>{24, 24, 3}));
  }
  const auto e = data::classify_eval_transform(img, 24, 0.875);
  EXPECT_EQ(e.sizes().vec(), (std::vector<int64_t>{24, 24, 3}));
  // A constant image stays constant through the resampling (weights sum to one).
  const auto flat = torch::full({30, 50, 3}, 77, torch::kUInt8);
  EXPECT_TRUE(ops::resize_bicubic_pil(flat, 11, 13).eq(77).all().item<bool>());
  EXPECT_TRUE(ops::resize_bicubic_pil(flat, 90, 70).eq(77).all().item<bool>());
}

// A window of the resampling, computed alone, is the same bytes as that window of the whole
// output: downscaled, upscaled, one axis kept, four and one channels.
TEST(ClassifyData, ResizeWindowEqualsTheCropOfTheWholeResize) {
  torch::manual_seed(3);
  for (int64_t c : {3, 1}) {
    const auto img = torch::randint(0, 256, {61, 97, c}, torch::kUInt8);
    struct Case {
      int64_t oh, ow, top, left, wh, ww;
    };
    for (const Case& k : {Case{40, 64, 5, 9, 30, 40}, Case{120, 150, 0, 0, 120, 150}, Case{61, 50, 7, 3, 50, 47},
                          Case{30, 97, 2, 10, 28, 80}, Case{200, 97, 100, 0, 100, 97}}) {
      const auto whole = ops::resize_bicubic_pil(img, k.oh, k.ow);
      const auto win = ops::resize_bicubic_pil_window(img, k.oh, k.ow, k.top, k.left, k.wh, k.ww);
      EXPECT_TRUE(win.equal(whole.narrow(0, k.top, k.wh).narrow(1, k.left, k.ww)))
          << c << " channels, " << k.oh << "x" << k.ow << " window at " << k.top << "," << k.left;
    }
    EXPECT_THROW(ops::resize_bicubic_pil_window(img, 40, 64, 20, 0, 30, 10), std::invalid_argument);
  }
}

// The loader's batches are a function of the seed and the epoch only: the same with 0, 1 and 3
// worker threads; every training sample is the training transform of the image at its place in
// the epoch's order with the draws of that place; evaluation batches keep the split's order and
// its last partial batch.
TEST(ClassifyData, LoaderBatchesDependOnTheSeedNotTheWorkers) {
  const auto ds = data::load_classify_dataset(make_dataset("cls_loader", 7));  // 14 training images
  data::ClassifyLoaderOptions o;
  o.batch = 4;
  o.imgsz = 16;
  o.seed = 5;
  const auto epoch_batches = [&](int workers, int64_t epoch) {
    o.workers = workers;
    data::ClassifyLoader loader(ds.train, o);
    EXPECT_EQ(loader.size(), 3);  // 14 / 4, the partial batch dropped
    loader.set_epoch(epoch);
    std::vector<data::ClassifyBatch> out;
    while (auto b = loader.next()) out.push_back(*b);
    return out;
  };
  const auto inline_e1 = epoch_batches(0, 1);
  ASSERT_EQ(inline_e1.size(), 3u);
  for (int workers : {1, 3}) {
    const auto threaded = epoch_batches(workers, 1);
    ASSERT_EQ(threaded.size(), 3u);
    for (size_t b = 0; b < 3; ++b) {
      EXPECT_TRUE(threaded[b].images.equal(inline_e1[b].images)) << workers << " workers, batch " << b;
      EXPECT_TRUE(threaded[b].labels.equal(inline_e1[b].labels)) << workers << " workers, batch " << b;
    }
  }
  // Each sample is what the transform gives for its image and its place in the order.
  o.workers = 0;
  const data::ClassifyLoader probe(ds.train, o);
  const auto order = probe.epoch_order(1);
  for (int64_t pos : {0, 5, 11}) {
    const auto& s = ds.train.samples[static_cast<size_t>(order[static_cast<size_t>(pos)])];
    data::Rng rng = data::Rng::for_sample(5, 1, pos, 0);
    const auto want = data::classify_train_transform(io::decode_image(s.path), 16, o.flip_prob, rng);
    EXPECT_TRUE(inline_e1[static_cast<size_t>(pos / 4)].images[pos % 4].equal(want)) << pos;
    EXPECT_EQ(inline_e1[static_cast<size_t>(pos / 4)].labels[pos % 4].item<int64_t>(), s.label);
  }
  // Another epoch, another order.
  EXPECT_NE(order, probe.epoch_order(2));
  // Evaluation: every sample in the split's order, the last batch partial.
  o.train = false;
  o.workers = 2;
  o.crop_pct = 0.875;
  data::ClassifyLoader val(ds.train, o);
  EXPECT_EQ(val.size(), 4);
  int64_t seen = 0;
  while (auto b = val.next()) {
    for (int64_t j = 0; j < b->labels.size(0); ++j, ++seen) {
      const auto& s = ds.train.samples[static_cast<size_t>(seen)];
      EXPECT_TRUE(b->images[j].equal(data::classify_eval_transform(io::decode_image(s.path), 16, 0.875))) << seen;
      EXPECT_EQ(b->labels[j].item<int64_t>(), s.label);
    }
  }
  EXPECT_EQ(seen, 14);
}

// An unreadable image fails the batch that holds it with the decoder's DataError (naming the
// file), on the caller's thread; the next epoch starts again.
TEST(ClassifyData, LoaderReportsAnUnreadableImageAndRecovers) {
  const std::string root = make_dataset("cls_loader_bad", 4);
  auto ds = data::load_classify_dataset(root);
  const std::string bad = ds.train.samples[2].path;
  { std::ofstream(bad, std::ios::binary | std::ios::trunc) << "not an image"; }
  for (int workers : {0, 2}) {
    data::ClassifyLoaderOptions o;
    o.train = false;
    o.batch = 2;
    o.imgsz = 8;
    o.workers = workers;
    data::ClassifyLoader loader(ds.train, o);
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader.set_epoch(epoch);
      ASSERT_TRUE(loader.next().has_value()) << workers;  // samples 0 and 1
      try {
        loader.next();
        ADD_FAILURE() << "the batch with the unreadable image was returned (" << workers << " workers)";
      } catch (const DataError& e) {
        EXPECT_NE(std::string(e.what()).find(fs::path(bad).filename().string()), std::string::npos) << e.what();
      }
      EXPECT_FALSE(loader.next().has_value()) << "the epoch ends after an error";
    }
  }
}

TEST(ClassifyTrain, ApiTrainsValidatesSavesAndReloads) {
  const std::string data = make_dataset("cls_train", 12);
  const std::string project = test::temp_dir("cls_runs");
  LibreYOLO model(kNarrow, "cpu");
  std::vector<EpochSummary> seen;
  TrainCallbacks cb;
  cb.on_epoch_end = [&](const EpochSummary& e) { seen.push_back(e); };
  const TrainResult r = model.train({{"data", data},
                                     {"epochs", "4"},
                                     {"imgsz", "32"},
                                     {"batch", "8"},
                                     {"lr0", "0.01"},
                                     {"workers", "2"},
                                     {"project", project},
                                     {"name", "api"},
                                     {"verbose", "false"}},
                                    cb);
  ASSERT_EQ(r.epochs.size(), 4u);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_LT(r.epochs.back().loss, r.epochs.front().loss);
  for (const auto& e : r.epochs) {
    EXPECT_TRUE(e.validated);
    const double top1 = e.map50_95;
    EXPECT_GE(top1, 0.0);
    EXPECT_LE(top1, 1.0);
    bool has_top5 = false;
    for (const auto& [k, v] : e.metrics)
      if (k == "metrics/accuracy_top5") {
        has_top5 = true;
        EXPECT_DOUBLE_EQ(v, 1.0);  // top-min(5, 2)
      }
    EXPECT_TRUE(has_top5);
    EXPECT_GT(e.loss_term("ce", -1), 0.0);
  }
  EXPECT_GE(r.best_epoch, 1);
  for (const char* f : {"results.csv", "results.png", "confusion_matrix.png", "weights/last.pt", "weights/best.pt",
                        "train_config.yaml"})
    EXPECT_TRUE(fs::exists(fs::path(r.save_dir) / f)) << f;
  {  // the run's options as a detection run keeps them, the dataset's path absolute
    std::ifstream yml(fs::path(r.save_dir) / "train_config.yaml");
    const std::string text((std::istreambuf_iterator<char>(yml)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("data: " + fs::absolute(data).lexically_normal().string()), std::string::npos) << text;
  }
  std::ifstream csv(fs::path(r.save_dir) / "results.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_NE(header.find("metrics/accuracy_top1"), std::string::npos);
  EXPECT_NE(header.find("metrics/accuracy_top5"), std::string::npos);
  EXPECT_NE(header.find("train/ce"), std::string::npos);

  const auto info = model.info();
  EXPECT_EQ(info.num_classes, 2);
  EXPECT_EQ(info.names, (std::vector<std::string>{"cat", "dog"}));
  // The trained model ends with the evaluated (EMA) weights, which best.pt holds when the last
  // epoch was the best.
  LibreYOLO back(r.last_checkpoint, "cpu");
  EXPECT_EQ(back.info().task, "classify");
  EXPECT_EQ(back.info().names, info.names);
  EXPECT_EQ(back.info().imgsz, 32);
  const std::string img = data + "/val/dog/img0.png";
  const auto a = model.predict(img);
  const auto b = back.predict(img);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(a[0].top.size(), 2u);
  ASSERT_EQ(a[0].probs.size(), 2u);
  EXPECT_NEAR(a[0].probs[0] + a[0].probs[1], 1.0, 1e-5);
  EXPECT_GE(a[0].top[0].score, a[0].top[1].score);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(a[0].probs[i], b[0].probs[i], 1e-6);
  EXPECT_TRUE(a[0].detections.empty());
  // val on the same split gives the last epoch's top-1.
  const auto v = back.val({{"data", data}, {"batch", "4"}, {"project", project}, {"name", "val"}});
  EXPECT_NEAR(v.get("metrics/accuracy_top1", -1), r.epochs.back().map50_95, 1e-9);
  EXPECT_TRUE(fs::exists(fs::path(v.save_dir) / "confusion_matrix.png"));
}

TEST(ClassifyCli, TrainPredictValAndTaskErrors) {
  const std::string data = make_dataset("cls_cli", 6);
  const std::string project = test::temp_dir("cls_cli_runs");
  std::string text;
  ASSERT_EQ(run_cli({"classify", "train", "model=" + kNarrow, "data=" + data, "epochs=1", "imgsz=32", "batch=4",
                 "project=" + project, "name=cli", "--json"},
                &text),
            0)
      << text;
  const auto last_line = [](const std::string& s) {
    auto t = s;
    while (!t.empty() && t.back() == '\n') t.pop_back();
    return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
  };
  auto j = nlohmann::json::parse(last_line(text));
  EXPECT_EQ(j["status"], "complete");
  EXPECT_TRUE(j["best_metrics"].contains("accuracy_top1"));
  const std::string best = j["best_weights"];

  ASSERT_EQ(run_cli({"predict", "model=" + best, "source=" + data + "/val/cat", "save=true", "project=" + project,
                 "name=pred", "--json"},
                &text),
            0)
      << text;
  j = nlohmann::json::parse(last_line(text));
  ASSERT_EQ(j["results"].size(), 3u);
  const auto& first = j["results"][0];
  ASSERT_EQ(first["top"].size(), 2u);
  EXPECT_NEAR(first["top"][0]["score"].get<double>() + first["top"][1]["score"].get<double>(), 1.0, 1e-5);
  EXPECT_TRUE(first["top"][0]["class_name"] == "cat" || first["top"][0]["class_name"] == "dog");
  EXPECT_TRUE(fs::exists(first["saved_path"].get<std::string>()));

  ASSERT_EQ(run_cli({"classify", "val", "model=" + best, "data=" + data, "project=" + project, "name=val", "--json"}, &text),
            0)
      << text;
  j = nlohmann::json::parse(last_line(text));
  EXPECT_TRUE(j["metrics"].contains("metrics/accuracy_top1"));

  // A classifier given to detect, a detector given to classify: exit 4.
  EXPECT_EQ(run_cli({"detect", "predict", "model=" + best, "source=" + data + "/val/cat"}, &text), 4) << text;
  EXPECT_NE(text.find("classify model"), std::string::npos) << text;
  EXPECT_EQ(run_cli({"classify", "predict", "model=yolo9t", "source=SAMPLE_IMAGE"}, &text), 4) << text;
  // An image folder without class folders, a detection dataset: exit 3.
  const fs::path flat = fs::path(test::temp_dir("cls_cli_flat")) / "imgs";
  fs::create_directories(flat);
  io::save_image((flat / "a.png").string(), torch::zeros({8, 8, 3}, torch::kUInt8));
  EXPECT_EQ(run_cli({"train", "model=" + best, "data=" + flat.string(), "epochs=1", "project=" + project}, &text), 3)
      << text;
  EXPECT_NE(text.find("class folders"), std::string::npos) << text;
  EXPECT_EQ(run_cli({"train", "model=" + best, "data=builtin", "epochs=1", "project=" + project}, &text), 3) << text;
}

TEST(ClassifyTrain, MobilenetAndEfficientnetTrainAndReload) {
  const std::string data = make_dataset("cls_train_more", 4);
  const std::string project = test::temp_dir("cls_runs_more");
  for (const std::string fam : {"mobilenetv4", "efficientnetv2"}) {
    LibreYOLO model(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/" + fam + "n_reference.pt", "cpu");
    const TrainResult r = model.train({{"data", data},
                                       {"epochs", "2"},
                                       {"imgsz", "32"},
                                       {"batch", "4"},
                                       {"workers", "0"},
                                       {"project", project},
                                       {"name", fam},
                                       {"verbose", "false"}});
    ASSERT_EQ(r.epochs.size(), 2u) << fam;
    EXPECT_TRUE(std::isfinite(r.final_loss)) << fam;
    EXPECT_TRUE(r.epochs.back().validated) << fam;
    LibreYOLO back(r.last_checkpoint, "cpu");
    EXPECT_EQ(back.info().family, fam);
    EXPECT_EQ(back.info().task, "classify");
    EXPECT_EQ(back.info().num_classes, 2);
    const auto a = model.predict(data + "/val/cat/img0.png");
    const auto b = back.predict(data + "/val/cat/img0.png");
    ASSERT_EQ(b[0].probs.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(a[0].probs[i], b[0].probs[i], 1e-6) << fam;
  }
  // Training needs a batch of two at least (BatchNorm over a 1 x 1 head map).
  LibreYOLO m(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/mobilenetv4n_reference.pt", "cpu");
  EXPECT_THROW(m.train({{"data", data}, {"epochs", "1"}, {"batch", "1"}, {"project", project}}), UsageError);
}

// The classify task runs on the train loop every task shares: the profiler's window over its real
// steps (profile_then_stop ends the run there), and the caller's hooks around epochs and steps.
TEST(ClassifyTrain, ProfilerAndCallerHooksRunOnAClassifier) {
  struct Counter : TrainHook {
    int epochs = 0, steps = 0, ended = 0;
    void after_step(TrainState&) override { ++steps; }
    void after_epoch(TrainState&, EpochSummary& e) override {
      ++epochs;
      EXPECT_TRUE(e.validated) << "the task's validation runs before the caller's hooks see the epoch";
    }
    void after_train(TrainState&, TrainResult&) override { ++ended; }
  };
  const std::string data = make_dataset("cls_hooks", 8);
  const std::string project = test::temp_dir("cls_hooks_runs");
  LibreYOLO model(kNarrow, "cpu");
  auto counter = std::make_shared<Counter>();
  const Kwargs base = {{"data", data}, {"imgsz", "32"}, {"batch", "2"}, {"workers", "0"},
                       {"project", project}, {"verbose", "false"}};
  Kwargs kw = base;
  kw.insert(kw.end(), {{"epochs", "2"}, {"name", "hooks"}});
  const TrainResult r = model.train(kw, {}, {counter});
  EXPECT_EQ(counter->epochs, 2);
  EXPECT_EQ(counter->steps, 16);  // 2 epochs of 16 images at batch 2
  EXPECT_EQ(counter->ended, 1);
  EXPECT_EQ(r.epochs.size(), 2u);

  kw = base;
  kw.insert(kw.end(), {{"epochs", "3"}, {"name", "prof"}, {"profile", "true"}, {"profile_warmup", "1"},
                       {"profile_steps", "4"}, {"profile_then_stop", "true"}, {"profile_trace", "false"}});
  const TrainResult p = model.train(kw);
  ASSERT_TRUE(fs::exists(fs::path(p.save_dir) / "profile_summary.json"));
  EXPECT_TRUE(p.epochs.empty()) << "the run stops after the window, inside its first epoch";
  std::ifstream in(fs::path(p.save_dir) / "profile_summary.json");
  const auto summary = nlohmann::json::parse(in);
  EXPECT_GT(summary["real"]["step_ms"].get<double>(), 0.0) << summary.dump();
}

TEST(ClassifyTrain, WhatTheLoopCannotDoYetIsRefusedByNameInTheDryRunToo) {
  // Options the detection trainer honours and the classify loop does not are errors naming the
  // option, from the check (dry_run) as from train itself, before any run directory is made.
  const std::string data = make_dataset("cls_refused", 2);
  const std::string project = test::temp_dir("cls_refused_runs");
  LibreYOLO model(std::string(LIBREYOLO_SOURCE_DIR) + "/tests/data/mobilenetv4n_reference.pt", "cpu");
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"loader", "gpu"}, "loader=gpu"},
      {{"cache", "ram"}, "cache=ram"},
      {{"resume", "true"}, "resume"},
  };
  for (const auto& [option, named] : cases) {
    const Kwargs kw = {{"data", data}, {"epochs", "1"}, {"batch", "2"}, {"imgsz", "32"}, {"project", project},
                       {"name", "refused"}, option};
    for (const bool dry : {true, false}) {
      try {
        if (dry)
          model.check_train(kw);
        else
          (void)model.train(kw);
        ADD_FAILURE() << option.first << "=" << option.second << " was accepted (dry " << dry << ")";
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("classify"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_FALSE(std::filesystem::exists(project + "/refused"));
  // Accepted as before: no cache, and the CPU loader by name.
  EXPECT_NO_THROW(model.check_train({{"data", data}, {"batch", "2"}, {"cache", "false"}, {"loader", "cpu"}}));
}
