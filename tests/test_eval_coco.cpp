#include <cmath>
#include <cstdio>
#include <fstream>
#include <libreyolo/errors.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "eval/coco_eval.hpp"
#include "support.hpp"

using libreyolo::eval::CocoEvaluator;
using libreyolo::eval::CocoStats;
using libreyolo::eval::DetBox;
using libreyolo::eval::GtBox;

namespace {

constexpr double kNa = -1.0;  // COCOeval's "undefined"

void expect_stats(const CocoStats& s, const std::array<double, 12>& want, double tol = 1e-12) {
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(s.stats[i], want[i], tol) << "stats[" << i << "]";
}

GtBox gt(int64_t img, int cat, double x, double y, double w, double h) {
  return {img, cat, x, y, w, h, w * h};
}
DetBox det(int64_t img, int cat, double x, double y, double w, double h, double score) {
  return {img, cat, x, y, w, h, score};
}

// ------------------------------------------------------------------ hand-computable cases

TEST(CocoEval, PerfectDetectorScoresOne) {
  CocoEvaluator ev;
  // Small (16x16), medium (50x50) and large (200x150) boxes over two images and two classes.
  std::vector<GtBox> gts = {gt(1, 0, 10, 10, 16, 16), gt(1, 1, 100, 100, 50, 50),
                            gt(2, 0, 0, 0, 200, 150), gt(2, 1, 300, 20, 16, 40)};
  std::vector<DetBox> dets;
  double score = 0.9;
  for (const auto& g : gts)
    dets.push_back(det(g.image_id, g.category, g.x, g.y, g.w, g.h, score -= 0.1));
  ev.add_ground_truth(gts);
  ev.add_detections(dets);
  // AR@1 is 1 too: no image has two boxes of one class.
  expect_stats(ev.evaluate(), {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
}

TEST(CocoEval, FalsePositiveRankedAboveTruePositive) {
  CocoEvaluator ev;
  ev.add_ground_truth({gt(5, 3, 0, 0, 50, 50)});        // medium
  ev.add_detections({det(5, 3, 200, 200, 50, 50, 0.9),  // no overlap
                     det(5, 3, 0, 0, 50, 50, 0.8)});    // exact
  // Ranked: FP then TP, precision [0, 1/2], recall [0, 1]; the envelope makes every recall
  // threshold read 1/2 at every IoU. AR@1 sees only the FP.
  expect_stats(ev.evaluate(), {0.5, 0.5, 0.5, kNa, 0.5, kNa, 0, 1, 1, kNa, 1, kNa});
}

TEST(CocoEval, PartialOverlapCountsOnlyLowThresholds) {
  CocoEvaluator ev;
  ev.add_ground_truth({gt(1, 0, 0, 0, 100, 100)});
  ev.add_detections({det(1, 0, 0, 0, 100, 62, 0.5)});  // IoU 0.62: matches at .50 .55 .60
  expect_stats(ev.evaluate(), {0.3, 1, 0, kNa, kNa, 0.3, 0.3, 0.3, 0.3, kNa, kNa, 0.3});
}

TEST(CocoEval, NothingDetectedGivesZero) {
  CocoEvaluator ev;
  ev.add_ground_truth({gt(1, 0, 0, 0, 10, 10), gt(2, 1, 0, 0, 100, 100)});
  expect_stats(ev.evaluate(), {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  // Detections outside the evaluated images do not count either.
  ev.add_detections({det(3, 0, 0, 0, 10, 10, 0.9)});
  expect_stats(ev.evaluate(std::vector<int64_t>{1, 2}), {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  // Over all images the ground truth is simply missed; there is no medium GT at all.
  expect_stats(ev.evaluate(), {0, 0, 0, 0, kNa, 0, 0, 0, 0, 0, kNa, 0});
}

TEST(CocoEval, NoGroundTruthIsUndefined) {
  CocoEvaluator ev;
  ev.add_detections({det(1, 0, 0, 0, 10, 10, 0.9)});
  expect_stats(ev.evaluate(), {kNa, kNa, kNa, kNa, kNa, kNa, kNa, kNa, kNa, kNa, kNa, kNa});
}

TEST(CocoEval, OnlyTopHundredDetectionsPerImageAndClass) {
  CocoEvaluator ev;
  std::vector<GtBox> gts;
  std::vector<DetBox> dets;
  for (int i = 0; i < 101; ++i) {
    gts.push_back(gt(7, 2, 20.0 * i, 0, 10, 10));
    dets.push_back(det(7, 2, 20.0 * i, 0, 10, 10, 1.0 - 0.001 * i));
  }
  ev.add_ground_truth(gts);
  ev.add_detections(dets);
  // 100 of 101 found, all at precision 1; recall threshold 1.0 is never reached.
  const double r = 100.0 / 101.0;
  expect_stats(ev.evaluate(), {r, r, r, r, kNa, kNa, 1.0 / 101, 10.0 / 101, r, r, kNa, kNa});
}

// Two overlapping GTs at exactly equal IoU (1560/1640) to the first detection: COCOeval gives it
// the later one, which leaves the earlier GT to the second detection (its exact box; IoU with
// the later GT would be only 1520/1680, below .95).
void add_equal_iou_cluster(std::vector<GtBox>& gts, std::vector<DetBox>& dets, int64_t img,
                           int cat) {
  gts.push_back(gt(img, cat, 100, 100, 40, 40));
  gts.push_back(gt(img, cat, 102, 100, 40, 40));
  dets.push_back(det(img, cat, 101, 100, 40, 40, 0.95));
  dets.push_back(det(img, cat, 100, 100, 40, 40, 0.94));
}

TEST(CocoEval, EqualIouGoesToLaterGroundTruth) {
  CocoEvaluator ev;
  std::vector<GtBox> gts;
  std::vector<DetBox> dets;
  add_equal_iou_cluster(gts, dets, 1, 0);
  ev.add_ground_truth(gts);
  ev.add_detections(dets);
  // Both detections are true positives at every threshold; had the first taken the earlier GT,
  // AP at IoU .95 would be 51/101.
  expect_stats(ev.evaluate(), {1, 1, 1, kNa, 1, kNa, 0.5, 1, 1, kNa, 1, kNa});
}

// One detection (32x32) over a small GT (30x30, IoU 900/1024) and a medium one (33x33,
// IoU 1024/1089). Within the small range the medium GT is ignored: a regular match must not be
// given up for an ignored GT with a higher IoU.
void add_ignored_gt_cluster(std::vector<GtBox>& gts, std::vector<DetBox>& dets, int64_t img,
                            int cat) {
  gts.push_back(gt(img, cat, 500, 500, 30, 30));
  gts.push_back(gt(img, cat, 500, 500, 33, 33));
  dets.push_back(det(img, cat, 500, 500, 32, 32, 0.9));
}

TEST(CocoEval, RegularMatchIsNotTradedForIgnoredGroundTruth) {
  CocoEvaluator ev;
  std::vector<GtBox> gts;
  std::vector<DetBox> dets;
  add_ignored_gt_cluster(gts, dets, 1, 0);
  ev.add_ground_truth(gts);
  ev.add_detections(dets);
  // all: the detection takes the medium GT up to IoU .90, then nothing: AP 51/101 at 9 of 10
  //      thresholds, recall 1/2 there.
  // small: true positive up to .85 (8 thresholds); ignored at .90 (it matches the ignored GT);
  //      a false positive at .95 (unmatched, its area 1024 is within the small range).
  // medium: true positive up to .90, false positive at .95.
  const double a = 51.0 / 101.0;
  expect_stats(ev.evaluate(), {0.9 * a, a, a, 0.8, 0.9, kNa, 0.45, 0.45, 0.45, 0.8, 0.9, kNa});
}

TEST(CocoEval, MetricsUseLibreYoloKeys) {
  CocoEvaluator ev;
  ev.add_ground_truth({gt(5, 3, 0, 0, 50, 50)});
  ev.add_detections({det(5, 3, 200, 200, 50, 50, 0.9), det(5, 3, 0, 0, 50, 50, 0.8)});
  const auto m = ev.evaluate().metrics();
  const std::vector<std::string> keys = {
      "metrics/mAP50-95",   "metrics/mAP50",     "metrics/mAP75",     "metrics/mAP_small",
      "metrics/mAP_medium", "metrics/mAP_large", "metrics/AR1",       "metrics/AR10",
      "metrics/AR100",      "metrics/AR_small",  "metrics/AR_medium", "metrics/AR_large",
      "metrics/precision",  "metrics/recall"};
  ASSERT_EQ(m.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(m[i].first, keys[i]);
  EXPECT_DOUBLE_EQ(m[0].second, 0.5);
  EXPECT_DOUBLE_EQ(m[6].second, 0.0);
  // At the best F1 (both detections kept): precision 1/2, recall 1.
  EXPECT_DOUBLE_EQ(m[12].second, 0.5);
  EXPECT_DOUBLE_EQ(m[13].second, 1.0);
}

TEST(CocoEval, PrecisionAndRecallAtBestF1Confidence) {
  // Class 0: two objects in image 1, one in image 2; class 4: one object in image 2.
  CocoEvaluator ev;
  ev.add_ground_truth({gt(1, 0, 0, 0, 40, 40), gt(1, 0, 100, 100, 40, 40), gt(2, 0, 0, 0, 40, 40),
                       gt(2, 4, 200, 0, 40, 40)});
  // Class 0 ranked: TP .9, FP .8, TP .3 (third object missed). Class 4: one FP at .95 and the TP
  // at .5.
  ev.add_detections({det(1, 0, 0, 0, 40, 40, 0.9), det(1, 0, 300, 300, 40, 40, 0.8),
                     det(1, 0, 100, 100, 40, 40, 0.3), det(2, 4, 500, 500, 40, 40, 0.95),
                     det(2, 4, 200, 0, 40, 40, 0.5)});
  const CocoStats s = ev.evaluate();
  // Mean F1 over the two classes by confidence x: x <= .3: (P 2/3 R 2/3 -> 2/3, P 1/2 R 1 -> 2/3);
  // .3 < x <= .5: (1/2 R 1/3 -> 0.4, 2/3); .5 < x <= .8: (F1 of P 1/2 R 1/3 = 0.4, 0); higher: less.
  // Best: x in (0, .3], the highest grid point there is 299/999.
  EXPECT_NEAR(s.best_conf, 299.0 / 999.0, 1e-12);
  EXPECT_NEAR(s.best_f1, 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(s.precision, (2.0 / 3.0 + 0.5) / 2, 1e-12);
  EXPECT_NEAR(s.recall, (2.0 / 3.0 + 1.0) / 2, 1e-12);
  // They are not the COCO numbers any more, and metrics() reports them.
  EXPECT_GT(std::abs(s.precision - s.stats[0]), 0.03);
  const auto m = s.metrics();
  EXPECT_EQ(m[12].first, "metrics/precision");
  EXPECT_DOUBLE_EQ(m[12].second, s.precision);
  EXPECT_DOUBLE_EQ(m[13].second, s.recall);

  // Table rows: images and instances per class; per-class APs average to the COCO stats.
  ASSERT_EQ(s.classes.size(), 2u);
  EXPECT_EQ(s.images, 2);
  EXPECT_EQ(s.instances, 4);
  EXPECT_EQ(s.classes[0].category, 0);
  EXPECT_EQ(s.classes[0].images, 2);
  EXPECT_EQ(s.classes[0].instances, 3);
  EXPECT_EQ(s.classes[1].category, 4);
  EXPECT_EQ(s.classes[1].images, 1);
  EXPECT_EQ(s.classes[1].instances, 1);
  EXPECT_NEAR(s.classes[0].precision, 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(s.classes[1].recall, 1.0, 1e-12);
  EXPECT_NEAR((s.classes[0].ap50 + s.classes[1].ap50) / 2, s.stats[1], 1e-12);
  EXPECT_NEAR((s.classes[0].ap50_95 + s.classes[1].ap50_95) / 2, s.stats[0], 1e-12);
  // Class 4: FP above the TP -> interpolated precision 1/2 at every recall threshold.
  EXPECT_NEAR(s.classes[1].ap50, 0.5, 1e-12);

  // Curves: 1000 confidences, the per-class step curves, COCO's PR curve at IoU .5.
  ASSERT_EQ(s.curves.conf.size(), 1000u);
  ASSERT_EQ(s.curves.f1.size(), 2u);
  EXPECT_NEAR(s.curves.precision[0][0], 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(s.curves.recall[0][400], 1.0 / 3.0, 1e-12);  // x = .4004: only the .9 TP and .8 FP
  EXPECT_NEAR(s.curves.precision[1][999], 0.0, 1e-12);     // nothing scores 1.0
  ASSERT_EQ(s.curves.pr[1].size(), 101u);
  EXPECT_NEAR(s.curves.pr[1][100], 0.5, 1e-12);
}

TEST(CocoEval, ClassRowsWithoutDetections) {
  CocoEvaluator ev;
  ev.add_ground_truth({gt(1, 2, 0, 0, 10, 10), gt(1, 2, 20, 0, 10, 10)});
  ev.add_image(7, 10, 10, torch::empty({0, 4}), torch::empty({0}), torch::empty({0, 4}), torch::empty({0}),
               torch::empty({0}));
  const CocoStats s = ev.evaluate();
  EXPECT_EQ(s.images, 2);
  ASSERT_EQ(s.classes.size(), 1u);
  EXPECT_EQ(s.classes[0].instances, 2);
  EXPECT_EQ(s.classes[0].images, 1);
  EXPECT_EQ(s.precision, 0.0);
  EXPECT_EQ(s.recall, 0.0);
  EXPECT_EQ(s.curves.pr.size(), 1u);
}

TEST(CocoEval, AddImageClipsAndDropsGroundTruth) {
  CocoEvaluator ev;
  // 100x80 image. GT 0 sticks out on the left: clipped to [0,0,20,40], area 800 (small; unclipped
  // it would be 4800, medium). GT 1 lies right of the image and vanishes when clipped.
  auto gt_xyxy = torch::tensor({-100.f, 0.f, 20.f, 40.f, 150.f, 10.f, 200.f, 50.f}).view({2, 4});
  auto gt_cls = torch::tensor({1, 1}, torch::kInt32);
  auto det_xyxy = torch::tensor({0.0, 0.0, 20.0, 40.0}, torch::kDouble).view({1, 4});
  auto det_scores = torch::tensor({0.7f});
  auto det_cls = torch::tensor({1}, torch::kLong);
  ev.add_image(0, 80, 100, gt_xyxy, gt_cls, det_xyxy, det_scores, det_cls);
  // An image with neither still counts as seen (and changes nothing here).
  ev.add_image(1, 80, 100, torch::empty({0, 4}), torch::empty({0}), torch::empty({0, 4}),
               torch::empty({0}), torch::empty({0}));
  EXPECT_EQ(ev.num_ground_truth(), 1u);
  expect_stats(ev.evaluate(), {1, 1, 1, 1, kNa, kNa, 1, 1, 1, 1, kNa, kNa});
}

TEST(CocoEval, BadInputIsRejected) {
  CocoEvaluator ev;
  const double nan = std::nan("");
  EXPECT_THROW(ev.add_ground_truth({gt(1, 0, nan, 0, 10, 10)}), libreyolo::DataError);
  EXPECT_THROW(ev.add_ground_truth({gt(1, 0, 0, 0, -1, 10)}), libreyolo::DataError);
  EXPECT_THROW(ev.add_detections({det(1, 0, 0, 0, 10, 10, nan)}), libreyolo::DataError);
  EXPECT_THROW(ev.add_image(1, 10, 10, torch::zeros({2, 3}), torch::zeros({2}),
                            torch::empty({0, 4}), torch::empty({0}), torch::empty({0})),
               libreyolo::UsageError);
  EXPECT_THROW(ev.add_image(1, 10, 10, torch::zeros({2, 4}), torch::zeros({3}),
                            torch::empty({0, 4}), torch::empty({0}), torch::empty({0})),
               libreyolo::UsageError);
  EXPECT_THROW(ev.add_image(1, 0, 10, torch::empty({0, 4}), torch::empty({0}), torch::empty({0, 4}),
                            torch::empty({0}), torch::empty({0})),
               libreyolo::UsageError);
  EXPECT_EQ(ev.num_ground_truth(), 0u);
  EXPECT_EQ(ev.num_detections(), 0u);
}

// ------------------------------------------------------------------ against pycocotools

struct DataSet {
  std::vector<int64_t> images;
  std::vector<int> categories;
  std::vector<GtBox> gts;
  std::vector<DetBox> dets;
  std::optional<std::vector<int64_t>> img_ids;
};

// Random ground truth and detections exercising what COCOeval is sensitive to: all three area
// buckets (and their exact boundaries), images without GT or without detections, a class with
// GT but no detections and one the other way round, duplicate GT (equal-IoU ties), score ties,
// more than 100 detections of one class in an image, images added out of id order.
DataSet random_set(uint32_t seed, int n_images, int n_classes, bool tied_scores) {
  std::mt19937 rng(seed);
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  auto chance = [&](double p) { return uni(0, 1) < p; };
  auto score = [&] {
    return tied_scores ? std::round(uni(0, 1) * 8) / 8 : std::round(uni(0, 1) * 1e4) / 1e4;
  };
  const int gt_only_class = n_classes - 2, det_only_class = n_classes - 1;

  DataSet s;
  for (int c = 0; c < n_classes; ++c) s.categories.push_back(c);
  for (int i = 0; i < n_images; ++i) s.images.push_back(1000 + 7 * i);
  std::shuffle(s.images.begin(), s.images.end(), rng);

  for (size_t ii = 0; ii < s.images.size(); ++ii) {
    const int64_t img = s.images[ii];
    const double W = uni(200, 900), H = uni(200, 900);
    const bool special = ii == 3 || ii == 5;  // the crowded image, the equal-IoU one
    const bool no_gt = !special && chance(0.1), no_det = !special && chance(0.1);
    auto random_box = [&](double& x, double& y, double& w, double& h) {
      // Side lengths log-uniform over 4..400 px: small, medium and large all occur.
      w = std::exp(uni(std::log(4.0), std::log(400.0)));
      h = std::min(H, w * std::exp(uni(-0.7, 0.7)));
      w = std::min(W, w);
      x = uni(0, W - w);
      y = uni(0, H - h);
    };
    std::vector<GtBox> img_gts;
    if (!no_gt) {
      const int n = pick(12);
      for (int k = 0; k < n; ++k) {
        GtBox g{img, pick(n_classes - 1), 0, 0, 0, 0, 0};  // never the detection-only class
        random_box(g.x, g.y, g.w, g.h);
        if (chance(0.05)) g.w = g.h = chance(0.5) ? 32 : 96;  // area on a bucket boundary
        g.area = chance(0.2) ? g.w * g.h * uni(0.5, 1.0) : g.w * g.h;
        img_gts.push_back(g);
        if (chance(0.05)) img_gts.push_back(g);  // duplicate: ties in IoU
      }
      if (ii == 3) {  // a crowded image for the 100-detection cut
        for (int k = 0; k < 30; ++k) {
          GtBox g{img, 1, 0, 0, 0, 0, 0};
          random_box(g.x, g.y, g.w, g.h);
          g.area = g.w * g.h;
          img_gts.push_back(g);
        }
      }
    }
    s.gts.insert(s.gts.end(), img_gts.begin(), img_gts.end());
    if (no_det) continue;

    std::vector<DetBox> img_dets;
    for (const auto& g : img_gts) {
      if (g.category == gt_only_class || chance(0.25)) continue;
      const int copies = 1 + pick(3);
      for (int k = 0; k < copies; ++k) {
        // Jitter from none to a lot, so IoUs spread over all thresholds.
        const double j = chance(0.1) ? 0.0 : uni(0, 0.35);
        DetBox d{img,
                 chance(0.1) ? pick(n_classes - 2) : g.category,
                 g.x + uni(-j, j) * g.w,
                 g.y + uni(-j, j) * g.h,
                 g.w * (1 + uni(-j, j)),
                 g.h * (1 + uni(-j, j)),
                 score()};
        img_dets.push_back(d);
      }
    }
    const int n_fp = pick(8) + (ii == 3 ? 120 : 0);
    for (int k = 0; k < n_fp; ++k) {
      DetBox d{
          img,    ii == 3 && k < 120 ? 1 : (chance(0.2) ? det_only_class : pick(n_classes - 2)),
          0,      0,
          0,      0,
          score()};
      random_box(d.x, d.y, d.w, d.h);
      img_dets.push_back(d);
    }
    std::shuffle(img_dets.begin(), img_dets.end(), rng);
    if (ii == 5) {
      add_equal_iou_cluster(s.gts, img_dets, img, 0);
      add_ignored_gt_cluster(s.gts, img_dets, img, 1);
    }
    s.dets.insert(s.dets.end(), img_dets.begin(), img_dets.end());
  }
  return s;
}

void write_json(std::FILE* f, const DataSet& s) {
  std::fprintf(f, "{\"images\":[");
  for (size_t i = 0; i < s.images.size(); ++i)
    std::fprintf(f, "%s%lld", i ? "," : "", static_cast<long long>(s.images[i]));
  std::fprintf(f, "],\"categories\":[");
  for (size_t i = 0; i < s.categories.size(); ++i)
    std::fprintf(f, "%s%d", i ? "," : "", s.categories[i]);
  std::fprintf(f, "],\"gt\":[");
  for (size_t i = 0; i < s.gts.size(); ++i) {
    const auto& g = s.gts[i];
    std::fprintf(f, "%s[%lld,%d,%.17g,%.17g,%.17g,%.17g,%.17g]", i ? "," : "",
                 static_cast<long long>(g.image_id), g.category, g.x, g.y, g.w, g.h, g.area);
  }
  std::fprintf(f, "],\"dt\":[");
  for (size_t i = 0; i < s.dets.size(); ++i) {
    const auto& d = s.dets[i];
    std::fprintf(f, "%s[%lld,%d,%.17g,%.17g,%.17g,%.17g,%.17g]", i ? "," : "",
                 static_cast<long long>(d.image_id), d.category, d.x, d.y, d.w, d.h, d.score);
  }
  std::fprintf(f, "],\"img_ids\":");
  if (s.img_ids) {
    std::fprintf(f, "[");
    for (size_t i = 0; i < s.img_ids->size(); ++i)
      std::fprintf(f, "%s%lld", i ? "," : "", static_cast<long long>((*s.img_ids)[i]));
    std::fprintf(f, "]");
  } else {
    std::fprintf(f, "null");
  }
  std::fprintf(f, "}");
}

TEST(CocoEval, MatchesPycocotoolsOnRandomSets) {
  auto py = libreyolo::test::python_with_torch();
  if (!py) GTEST_SKIP() << "no python with torch for the pycocotools comparison";
  if (libreyolo::test::run_command(*py + " -c 'import pycocotools.cocoeval'") != 0)
    GTEST_SKIP() << "pycocotools is not installed in " << *py;

  std::vector<DataSet> sets;
  sets.push_back(random_set(1, 50, 20, false));
  sets.push_back(random_set(2, 50, 20, true));
  sets.push_back(random_set(3, 80, 6, false));
  sets.push_back(random_set(4, 12, 20, true));
  {  // COCOeval over a subset of the images (plus an id nobody has).
    DataSet sub = random_set(5, 50, 20, false);
    std::vector<int64_t> ids;
    for (size_t i = 0; i < sub.images.size(); i += 2) ids.push_back(sub.images[i]);
    ids.push_back(999999);
    sub.img_ids = ids;
    sets.push_back(sub);
  }

  // The sets must really contain what they are meant to exercise.
  {
    const DataSet& s = sets[0];
    std::set<int64_t> with_gt, with_det;
    std::set<int> gt_cls, det_cls;
    int small = 0, medium = 0, large = 0;
    for (const auto& g : s.gts) {
      with_gt.insert(g.image_id);
      gt_cls.insert(g.category);
      (g.area < 32 * 32 ? small : g.area < 96 * 96 ? medium : large)++;
    }
    std::map<std::pair<int64_t, int>, int> per_img_cls;
    for (const auto& d : s.dets) {
      with_det.insert(d.image_id);
      det_cls.insert(d.category);
      per_img_cls[{d.image_id, d.category}]++;
    }
    int max_per = 0;
    for (const auto& kv : per_img_cls) max_per = std::max(max_per, kv.second);
    EXPECT_GT(small, 10);
    EXPECT_GT(medium, 10);
    EXPECT_GT(large, 10);
    EXPECT_LT(with_gt.size(), s.images.size());
    EXPECT_LT(with_det.size(), s.images.size());
    EXPECT_TRUE(gt_cls.count(18) && !det_cls.count(18));
    EXPECT_TRUE(det_cls.count(19) && !gt_cls.count(19));
    EXPECT_GT(max_per, 100);
  }

  const std::string dir = libreyolo::test::temp_dir("cocoeval");
  const std::string path = dir + "/sets.json";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "{\"sets\":[");
  for (size_t i = 0; i < sets.size(); ++i) {
    if (i) std::fprintf(f, ",");
    write_json(f, sets[i]);
  }
  std::fprintf(f, "]}");
  std::fclose(f);

  const std::string script = std::string(LIBREYOLO_SOURCE_DIR) + "/tests/python/coco_reference.py";
  const std::string out_path = dir + "/reference.json";
  std::string log;
  ASSERT_EQ(libreyolo::test::run_command(
                "(" + *py + " " + script + " " + path + " > " + out_path + ")", &log),
            0)
      << log;
  nlohmann::json ref;
  std::ifstream(out_path) >> ref;
  ASSERT_EQ(ref["results"].size(), sets.size());

  for (size_t i = 0; i < sets.size(); ++i) {
    SCOPED_TRACE("set " + std::to_string(i));
    CocoEvaluator ev;
    // Images first, then in pieces: the evaluator must not care how data arrives.
    const auto& s = sets[i];
    ev.add_detections({s.dets.begin(), s.dets.begin() + s.dets.size() / 2});
    ev.add_ground_truth(s.gts);
    ev.add_detections({s.dets.begin() + s.dets.size() / 2, s.dets.end()});
    const CocoStats got = ev.evaluate(s.img_ids);
    const auto& want = ref["results"][i];
    for (int k = 0; k < 12; ++k)
      EXPECT_NEAR(got.stats[k], want["stats"][k].get<double>(), 1e-6) << "stats[" << k << "]";
    const auto m = got.metrics();
    // The means of COCOeval's precision / recall arrays are mAP50-95 and AR100 (what these two
    // columns used to be); metrics/precision and metrics/recall are now P and R at the best-F1
    // confidence (PrecisionAndRecallAtBestF1Confidence checks them by hand).
    EXPECT_NEAR(got.stats[0], want["precision"].get<double>(), 1e-6);
    EXPECT_NEAR(got.stats[8], want["recall"].get<double>(), 1e-6);
    EXPECT_DOUBLE_EQ(m[12].second, got.precision);
    EXPECT_DOUBLE_EQ(m[13].second, got.recall);
    EXPECT_GT(got.precision, 0.0);
    EXPECT_LE(got.precision, 1.0);
    EXPECT_GT(got.recall, 0.0);
    EXPECT_LE(got.recall, 1.0);
    // The stats must be informative, not a degenerate 0 / -1 pattern.
    EXPECT_GT(got.stats[0], 0.05);
    EXPECT_LT(got.stats[0], 0.95);
  }
}

}  // namespace
