// YOLOX end to end on a tiny generated dataset: training with the family's recipe and input
// convention, the L1 switch at mosaic close (recorded in the checkpoint), resume after the switch
// continuing exactly, results.csv, and predict/val/save/reload with the trained weights.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <libreyolo/libreyolo.hpp>

#include "data/synthetic.hpp"
#include "io/checkpoint.hpp"
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
    return data::generate_synthetic_dataset(test::temp_dir("yolox_ds"), o);
  }();
  return yaml;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(f, l)) out.push_back(l);
  return out;
}

}  // namespace

TEST(YoloxTrain, L1SwitchCheckpointAndExactResumeAfterIt) {
  const std::string project = test::temp_dir("yolox_runs");
  LibreYOLO model = LibreYOLO::create("yolox", "n", 80, "cpu");
  // 4 epochs, the last 2 without mosaic: the switch fires at the start of epoch 3 (1-based).
  const Kwargs opts = {{"data", tiny_dataset()}, {"epochs", "4"},        {"batch", "8"},      {"imgsz", "64"},
                       {"workers", "0"},         {"device", "cpu"},      {"eval_interval", "1"}, {"save_period", "1"},
                       {"warmup_epochs", "1"},   {"no_aug_epochs", "2"}, {"project", project}, {"name", "run"},
                       {"verbose", "false"}};
  TrainResult full = model.train(opts);
  ASSERT_EQ(full.epochs.size(), 4u);
  for (const auto& e : full.epochs) {
    EXPECT_TRUE(std::isfinite(e.loss));
    for (const char* t : {"iou", "obj", "cls", "l1"}) EXPECT_TRUE(std::isfinite(e.loss_term(t, NAN))) << t;
  }
  // L1 is off in the mosaic phase and on after the switch.
  EXPECT_EQ(full.epochs[0].loss_term("l1", -1), 0.0);
  EXPECT_EQ(full.epochs[1].loss_term("l1", -1), 0.0);
  EXPECT_GT(full.epochs[2].loss_term("l1", -1), 0.0);
  EXPECT_GT(full.epochs[3].loss_term("l1", -1), 0.0);
  // The recipe: YOLOX's warm-cos ends on its floor (5% of lr0) over the no-aug epochs.
  EXPECT_NEAR(full.epochs[3].lrs[0], 0.01 * 0.05, 1e-12);

  for (const char* f : {"train_config.yaml", "results.csv", "weights/last.pt", "weights/epoch_2.pt",
                        "weights/epoch_3.pt"})
    EXPECT_TRUE(fs::exists(fs::path(full.save_dir) / f)) << f;
  const auto csv = read_lines((fs::path(full.save_dir) / "results.csv").string());
  ASSERT_EQ(csv.size(), 5u);
  for (const char* col : {"train/iou_loss", "train/obj_loss", "train/cls_loss", "train/l1_loss", "metrics/mAP50"})
    EXPECT_NE(csv[0].find(col), std::string::npos) << col;

  // The switch is in the checkpoints.
  io::Checkpoint before = io::read_checkpoint((fs::path(full.save_dir) / "weights" / "epoch_2.pt").string());
  io::Checkpoint after = io::read_checkpoint((fs::path(full.save_dir) / "weights" / "epoch_3.pt").string());
  EXPECT_EQ(after.meta.family.value_or(""), "yolox");
  EXPECT_EQ(after.meta.size.value_or(""), "n");
  EXPECT_EQ(after.meta.nc.value_or(0), 3);
  ASSERT_TRUE(before.root->has("mosaic_closed"));
  EXPECT_FALSE(before.root->get("mosaic_closed")->b);
  EXPECT_TRUE(after.root->get("mosaic_closed")->b);

  // Resume after the switch: epoch 4 reproduces the uninterrupted run bit for bit.
  LibreYOLO resumed((fs::path(full.save_dir) / "weights" / "epoch_3.pt").string(), "cpu");
  EXPECT_EQ(resumed.info().family, "yolox");
  TrainResult rest = resumed.train({{"resume", "true"}, {"workers", "0"}, {"verbose", "false"}});
  ASSERT_EQ(rest.epochs.size(), 1u);
  EXPECT_EQ(rest.epochs[0].epoch, 4);
  EXPECT_DOUBLE_EQ(rest.epochs[0].loss, full.epochs[3].loss);
  EXPECT_DOUBLE_EQ(rest.epochs[0].loss_term("l1"), full.epochs[3].loss_term("l1"));
  EXPECT_DOUBLE_EQ(rest.epochs[0].map50_95, full.epochs[3].map50_95);

  // Resume before the switch: epochs 3 and 4 switch on time and match too.
  LibreYOLO resumed2((fs::path(full.save_dir) / "weights" / "epoch_2.pt").string(), "cpu");
  TrainResult rest2 = resumed2.train({{"resume", "true"}, {"workers", "0"}, {"verbose", "false"}});
  ASSERT_EQ(rest2.epochs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_DOUBLE_EQ(rest2.epochs[i].loss, full.epochs[i + 2].loss) << i;

  // Predict, val, save and reload with the trained weights.
  auto preds = resumed.predict("SAMPLE_IMAGE", {{"imgsz", "64"}, {"conf", "0.001"}});
  ASSERT_EQ(preds.size(), 1u);
  ValResult v = resumed.val({{"data", tiny_dataset()}, {"imgsz", "64"}, {"batch", "4"}, {"workers", "0"},
                             {"project", project}, {"name", "val"}});
  EXPECT_GE(v.get("metrics/mAP50", -1), 0.0);
  const std::string saved = (fs::path(project) / "saved.pt").string();
  resumed.save(saved);
  LibreYOLO reloaded(saved, "cpu");
  EXPECT_EQ(reloaded.info().family, "yolox");
  EXPECT_EQ(reloaded.info().size, "n");
  EXPECT_EQ(reloaded.info().num_classes, 3);
}
