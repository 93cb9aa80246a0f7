// The run-directory pictures: each is written, read back, and checked for its size and for
// drawn content where it belongs (not a blank canvas). Also the confusion matrix counts and the
// validation table.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <libreyolo/errors.hpp>

#include "data/synthetic.hpp"
#include "engine/validator.hpp"
#include "eval/coco_eval.hpp"
#include "eval/confusion.hpp"
#include "io/image.hpp"
#include "ops/draw.hpp"
#include "plots/plots.hpp"
#include "core/strings.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace libreyolo;

namespace {

// Pixels of img[y0:y1, x0:x1] within `tol` of colour c in every channel.
int64_t count_near(const torch::Tensor& img, int x0, int y0, int x1, int y1, ops::Rgb8 c, int tol) {
  auto r = img.slice(0, y0, y1).slice(1, x0, x1).to(torch::kInt);
  auto d = (r.select(2, 0) - c.r).abs().le(tol) & (r.select(2, 1) - c.g).abs().le(tol) &
           (r.select(2, 2) - c.b).abs().le(tol);
  return d.sum().item<int64_t>();
}

// Pixels that are clearly not white.
int64_t count_ink(const torch::Tensor& img, int x0, int y0, int x1, int y1) {
  auto r = img.slice(0, y0, y1).slice(1, x0, x1).to(torch::kInt);
  return r.lt(200).any(2).sum().item<int64_t>();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

const ops::Rgb8 kTab10Blue{31, 119, 180};

std::string fmt3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

}  // namespace

TEST(Plots, ResultsCsvGridOfCharts) {
  const std::string dir = test::temp_dir("plots_results");
  const std::string csv = dir + "/results.csv";
  std::string text =
      "epoch,time,train/loss,validated,is_best,current_metric,current_metric_name,best_metric,best_metric_name,"
      "best_epoch,train/box_loss,train/cls_loss,train/dfl_loss,metrics/mAP50-95,metrics/mAP50,metrics/precision,"
      "metrics/recall,speed/total_ms,lr/group0,lr/group1\n";
  for (int e = 1; e <= 12; ++e) {
    const bool val = e % 3 == 0;  // validated every third epoch: empty metric cells otherwise
    const double l = 3.0 / e;
    auto m = [&](double v) { return val ? std::to_string(v) : std::string(); };
    text += std::to_string(e) + ",1.5," + std::to_string(l * 3) + "," + (val ? "1" : "0") + ",0,,metrics/mAP50-95,,," +
            "0," + std::to_string(l) + "," + std::to_string(l * 1.5) + "," + std::to_string(l * 0.5) + "," +
            m(0.05 * e) + "," + m(0.07 * e) + "," + m(0.06 * e) + "," + m(0.04 * e) + ",3.2," +
            std::to_string(0.01 / e) + "," + std::to_string(0.001 * e) + "\n";
  }
  write_text(csv, text);
  const std::string png = dir + "/out/results.png";
  plots::plot_results_csv(csv, png);
  const auto img = io::decode_image(png);
  // Four loss panels, four metric panels, one learning-rate panel: 5 x 2 panels of 440 x 360.
  ASSERT_EQ(img.size(1), 5 * 440);
  ASSERT_EQ(img.size(0), 2 * 360);
  for (int p = 0; p < 9; ++p) {
    const int x0 = (p % 5) * 440, y0 = (p / 5) * 360;
    EXPECT_GT(count_near(img, x0, y0, x0 + 440, y0 + 360, kTab10Blue, 0), 100) << "panel " << p << " has no line";
  }
  // The tenth slot is empty.
  EXPECT_EQ(count_ink(img, 4 * 440, 360, 5 * 440, 720), 0);

  EXPECT_THROW(plots::plot_results_csv(dir + "/missing.csv", png), DataError);
  write_text(dir + "/header_only.csv", "epoch,train/loss\n");
  EXPECT_THROW(plots::plot_results_csv(dir + "/header_only.csv", png), DataError);
  write_text(dir + "/nothing.csv", "epoch,time\n1,2\n");
  EXPECT_THROW(plots::plot_results_csv(dir + "/nothing.csv", png), DataError);
}

TEST(Plots, LabelsHistogramAndScatters) {
  const std::string dir = test::temp_dir("plots_labels");
  torch::manual_seed(3);
  const int64_t n = 400;
  auto labels = torch::rand({n, 5}, torch::kDouble) * 0.5 + 0.25;
  labels.select(1, 0).copy_(torch::randint(0, 3, {n}, torch::kDouble));
  labels.select(1, 0).narrow(0, 0, 200).fill_(1);  // class 1 is the tallest bar
  const std::string jpg = dir + "/labels.jpg";
  plots::plot_labels(labels, {"circle", "square", "Triangle"}, jpg);
  const auto img = io::decode_image(jpg);
  ASSERT_EQ(img.size(1), 1500);
  ASSERT_EQ(img.size(0), 1080);
  // Bars in their class colours in the top panel (JPEG: approximate colours).
  for (int k = 0; k < 3; ++k)
    EXPECT_GT(count_near(img, 0, 0, 1500, 560, ops::class_color(k), 24), 2000) << "bar " << k;
  // Both scatter plots and the box-shape panel have content inside their plot areas.
  for (int p = 0; p < 3; ++p) EXPECT_GT(count_ink(img, p * 500 + 120, 600, p * 500 + 480, 950), 1500) << p;

  EXPECT_THROW(plots::plot_labels(torch::zeros({4, 4}), {}, jpg), UsageError);
  // No labels at all still makes a picture (empty charts).
  plots::plot_labels(torch::empty({0, 5}), {"a"}, dir + "/empty.jpg");
  EXPECT_TRUE(fs::exists(dir + "/empty.jpg"));
}

TEST(Plots, TrainBatchMosaicWithBoxes) {
  const std::string dir = test::temp_dir("plots_batch");
  auto images = torch::full({3, 200, 200, 3}, 90, torch::kUInt8);
  auto targets = torch::full({3, 2, 5}, -1.0f);
  // Image 0: a class-2 box; image 2: a class-0 box; the rest is padding.
  targets[0][0] = torch::tensor({2.0f, 0.25f, 0.25f, 0.75f, 0.75f});
  targets[2][1] = torch::tensor({0.0f, 0.1f, 0.5f, 0.5f, 0.9f});
  const std::string jpg = dir + "/train_batch0.jpg";
  plots::plot_train_batch(images, targets, {"circle", "square", "triangle"}, jpg);
  const auto img = io::decode_image(jpg);
  // 3 images -> a 2 x 2 grid of 200-pixel tiles, two rows used.
  ASSERT_EQ(img.size(1), 400);
  ASSERT_EQ(img.size(0), 400);
  const auto c2 = ops::class_color(2), c0 = ops::class_color(0);
  // Box outline of image 0 along its left edge (x = 50, y 60..140), image 2's left edge at x = 20
  // in the bottom-left tile.
  EXPECT_GT(count_near(img, 48, 60, 53, 140, c2, 40), 100);
  EXPECT_GT(count_near(img, 18, 310, 23, 370, c0, 40), 80);
  // Tile 1 has no box: grey only (the white separator aside).
  EXPECT_EQ(count_near(img, 205, 5, 395, 195, c2, 40) + count_near(img, 205, 5, 395, 195, c0, 40), 0);
  EXPECT_GT(count_near(img, 205, 5, 395, 195, {90, 90, 90}, 6), 180 * 180);

  EXPECT_THROW(plots::plot_train_batch(images, torch::zeros({2, 2, 5}), {}, jpg), UsageError);
  EXPECT_THROW(plots::plot_train_batch(images.to(torch::kFloat), targets, {}, jpg), UsageError);
  // A large batch is scaled to at most 1920 pixels and at most 16 images.
  plots::plot_train_batch(torch::zeros({20, 640, 640, 3}, torch::kUInt8), torch::full({20, 1, 5}, -1.0f), {},
                          dir + "/big.jpg");
  const auto big = io::decode_image(dir + "/big.jpg");
  EXPECT_EQ(big.size(1), 1920);
  EXPECT_EQ(big.size(0), 1920);
}

TEST(Plots, ConfusionMatrixCountsAsUltralytics) {
  eval::ConfusionMatrix cm(3);
  // GT: class 0 at A, class 1 at B, class 2 at C. Detections: class 0 on A (match), class 2 on B
  // (confused), one at .2 confidence on C (dropped: below .25), one class-1 box on nothing.
  auto gt = torch::tensor({0.f, 0.f, 10.f, 10.f, 20.f, 0.f, 30.f, 10.f, 40.f, 0.f, 50.f, 10.f}).view({3, 4});
  auto gc = torch::tensor({0, 1, 2});
  auto det = torch::tensor({0.f, 0.f, 10.f, 10.f, 20.f, 0.f, 30.f, 10.f, 40.f, 0.f, 50.f, 10.f, 80.f, 80.f, 90.f, 90.f})
                 .view({4, 4});
  auto ds = torch::tensor({0.9f, 0.8f, 0.2f, 0.7f});
  auto dc = torch::tensor({0, 2, 2, 1});
  cm.add_image(gt, gc, det, ds, dc);
  EXPECT_EQ(cm.count(0, 0), 1);
  EXPECT_EQ(cm.count(2, 1), 1);  // predicted 2, true 1
  EXPECT_EQ(cm.count(3, 2), 1);  // missed: background row
  EXPECT_EQ(cm.count(1, 3), 1);  // false positive: background column
  int64_t total = 0;
  for (int p = 0; p < 4; ++p)
    for (int t = 0; t < 4; ++t) total += cm.count(p, t);
  EXPECT_EQ(total, 4);
  // One detection per ground truth: a second detection on A is a false positive.
  cm.add_image(gt.narrow(0, 0, 1), gc.narrow(0, 0, 1), det.narrow(0, 0, 1).repeat({2, 1}),
               torch::tensor({0.9f, 0.6f}), torch::tensor({0, 0}));
  EXPECT_EQ(cm.count(0, 0), 2);
  EXPECT_EQ(cm.count(0, 3), 1);
  const auto nm = cm.normalized();
  EXPECT_DOUBLE_EQ(nm[0 * 4 + 0], 1.0);           // true class 0: always predicted 0
  EXPECT_DOUBLE_EQ(nm[0 * 4 + 3] + nm[1 * 4 + 3], 1.0);  // background column sums to 1
  EXPECT_THROW(cm.add_image(gt, torch::tensor({0, 1, 3}), det, ds, dc), UsageError);

  const std::string png = test::temp_dir("plots_cm") + "/confusion_matrix.png";
  plots::plot_confusion_matrix(cm, {"circle", "square", "triangle"}, png);
  const auto img = io::decode_image(png);
  EXPECT_GT(img.size(0), 400);
  EXPECT_GT(img.size(1), 400);
  // The darkest blue of the colour map marks the 1.0 cells.
  EXPECT_GT(count_near(img, 0, 0, img.size(1), img.size(0), {8, 48, 107}, 2), 3 * 100);
}

// Classification's matrix: the class counts alone, no background row or column.
TEST(Plots, ClassificationConfusionMatrixHasNoBackground) {
  const std::vector<std::string> names = {"circle", "square", "triangle"};
  const std::string dir = test::temp_dir("plots_cls_cm");
  // Every sample right: the three diagonal cells at 1.0.
  plots::plot_confusion_matrix(std::vector<int64_t>{5, 0, 0, 0, 4, 0, 0, 0, 6}, names, dir + "/cls.png");
  eval::ConfusionMatrix det(3);
  det.add_image(torch::tensor({0.f, 0.f, 40.f, 40.f}).view({1, 4}), torch::tensor({0}),
                torch::tensor({0.f, 0.f, 40.f, 40.f}).view({1, 4}), torch::tensor({0.9f}), torch::tensor({0}));
  plots::plot_confusion_matrix(det, names, dir + "/det.png");
  const auto cls = io::decode_image(dir + "/cls.png"), with_bg = io::decode_image(dir + "/det.png");
  EXPECT_LT(cls.size(1), with_bg.size(1)) << "one column fewer";
  EXPECT_LT(cls.size(0), with_bg.size(0)) << "one row fewer";
  EXPECT_GT(count_near(cls, 0, 0, cls.size(1), cls.size(0), {8, 48, 107}, 2), 3 * 1000);
  EXPECT_THROW(plots::plot_confusion_matrix(std::vector<int64_t>{1, 2, 3}, names, dir + "/bad.png"),
               std::invalid_argument);
}

TEST(Plots, ValidationCurvesAndTable) {
  eval::CocoEvaluator ev;
  ev.add_ground_truth({{1, 0, 0, 0, 40, 40, 1600}, {1, 1, 100, 100, 40, 40, 1600}, {2, 1, 0, 0, 40, 40, 1600}});
  ev.add_detections({{1, 0, 0, 0, 40, 40, 0.9}, {1, 1, 100, 100, 40, 40, 0.6}, {2, 1, 300, 0, 40, 40, 0.7},
                     {2, 0, 0, 0, 40, 40, 0.4}});
  const auto stats = ev.evaluate();
  eval::ConfusionMatrix cm(2);
  cm.add_image(torch::tensor({0.f, 0.f, 40.f, 40.f}).view({1, 4}), torch::tensor({0}),
               torch::tensor({0.f, 0.f, 40.f, 40.f}).view({1, 4}), torch::tensor({0.9f}), torch::tensor({0}));
  const std::string dir = test::temp_dir("plots_val") + "/val";
  const auto files = plots::plot_validation(stats, &cm, {"circle", "square"}, dir);
  ASSERT_EQ(files.size(), 5u);
  for (const char* name : {"confusion_matrix.png", "PR_curve.png", "F1_curve.png", "P_curve.png", "R_curve.png"}) {
    const std::string path = dir + "/" + name;
    ASSERT_TRUE(fs::exists(path)) << name;
    const auto img = io::decode_image(path);
    EXPECT_GT(img.size(0), 300) << name;
    EXPECT_GT(img.size(1), 300) << name;
    EXPECT_GT(count_ink(img, 0, 0, img.size(1), img.size(0)), 5000) << name;
  }
  // The mean curve is the thick blue line.
  const auto pr = io::decode_image(dir + "/PR_curve.png");
  EXPECT_GT(count_near(pr, 0, 0, pr.size(1), pr.size(0), kTab10Blue, 0), 1000);

  const std::string table = engine::format_val_table(stats, {"circle", "square"});
  std::vector<std::string> lines;
  for (size_t b = 0, e; (e = table.find('\n', b)) != std::string::npos; b = e + 1) lines.push_back(table.substr(b, e - b));
  ASSERT_EQ(lines.size(), 4u) << table;
  for (const char* col : {"Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"})
    EXPECT_NE(lines[0].find(col), std::string::npos) << col;
  EXPECT_EQ(lines[1].substr(0, 22), std::string(19, ' ') + "all");
  EXPECT_NE(lines[1].find(fmt3(stats.stats[0])), std::string::npos) << lines[1];
  EXPECT_EQ(lines[2].substr(16, 6), "circle");
  EXPECT_EQ(lines[3].substr(16, 6), "square");
  // "square": 2 images, 2 instances.
  EXPECT_EQ(lines[3].substr(22, 22), std::string(10, ' ') + "2" + std::string(10, ' ') + "2");
  // Non-ASCII names are padded by display columns: every row is as wide on screen, and the
  // numbers start in the same column.
  const std::string wide = engine::format_val_table(stats, {"k\xC3\xA4tzchen", "\xE7\x8C\xAB\xE7\x8C\xAB"});
  std::vector<std::string> rows;
  for (size_t b = 0, e; (e = wide.find('\n', b)) != std::string::npos; b = e + 1) rows.push_back(wide.substr(b, e - b));
  ASSERT_EQ(rows.size(), 4u) << wide;
  for (const auto& r : rows) EXPECT_EQ(display_width(r), display_width(rows[0])) << r;
  EXPECT_EQ(rows[3].substr(rows[3].size() - 66), lines[3].substr(lines[3].size() - 66));
}

TEST(Plots, ValCommandWritesRunDirectoryAndTable) {
  data::SyntheticOptions o;
  o.train_images = 2;
  o.val_images = 4;
  o.width = 64;
  o.height = 64;
  o.num_classes = 2;
  o.threads = 1;
  const std::string root = test::temp_dir("plots_valcli");
  const std::string yaml = data::generate_synthetic_dataset(root + "/ds", o);
  const std::string project = root + "/runs";
  const std::string cmd = std::string(LIBREYOLO_CLI_PATH) + " val model=yolo9t data=" + yaml +
                          " imgsz=64 batch=4 workers=0 device=cpu project=" + project + " name=check";
  std::string out;
  ASSERT_EQ(test::run_command(cmd + " 2>/dev/null", &out), 0) << out;
  // The table on stdout: header, then the "all" row with 4 images.
  const auto header = out.find("Class");
  ASSERT_NE(header, std::string::npos) << out;
  for (const char* col : {"Images", "Instances", "mAP50-95"}) EXPECT_NE(out.find(col), std::string::npos) << col;
  EXPECT_NE(out.find("all          4"), std::string::npos) << out;
  const fs::path run = fs::path(project) / "check";
  EXPECT_NE(out.find("Results saved to " + run.string()), std::string::npos) << out;
  for (const char* f : {"metrics.json", "per_class.csv", "confusion_matrix.png", "PR_curve.png", "F1_curve.png",
                        "P_curve.png", "R_curve.png"})
    EXPECT_TRUE(fs::exists(run / f)) << f;
  std::ifstream csv(run / "per_class.csv");
  std::string first, all;
  std::getline(csv, first);
  std::getline(csv, all);
  EXPECT_EQ(first, "class,name,images,instances,precision,recall,mAP50,mAP50-95");
  EXPECT_EQ(all.rfind("-1,all,4,", 0), 0u) << all;
  // The same name again: the next free directory.
  ASSERT_EQ(test::run_command(cmd + " --json 2>/dev/null", &out), 0) << out;
  EXPECT_TRUE(fs::exists(fs::path(project) / "check2" / "metrics.json"));
  EXPECT_NE(out.find("\"save_dir\""), std::string::npos) << out;
}
