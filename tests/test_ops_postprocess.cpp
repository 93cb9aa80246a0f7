// YOLO post-processing on hand-made prediction tensors; expected outputs reasoned out below.
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include <libreyolo/errors.hpp>

#include "ops/postprocess.hpp"
#include "support.hpp"

namespace ops = libreyolo::ops;

namespace {

struct Anchor {
  std::array<float, 4> box;
  std::vector<float> scores;
};

// [4 + nc, A] as the model emits it.
torch::Tensor make_pred(const std::vector<Anchor>& anchors) {
  const int64_t nc = static_cast<int64_t>(anchors.at(0).scores.size());
  auto pred = torch::empty({4 + nc, static_cast<int64_t>(anchors.size())});
  auto a = pred.accessor<float, 2>();
  for (size_t i = 0; i < anchors.size(); ++i) {
    for (int k = 0; k < 4; ++k) a[k][i] = anchors[i].box[k];
    for (int64_t c = 0; c < nc; ++c) a[4 + c][i] = anchors[i].scores[c];
  }
  return pred;
}

void expect_detection(const ops::Detections& d, int64_t i, std::array<float, 4> box, float score,
                      int64_t cls) {
  ASSERT_LT(i, d.scores.size(0));
  for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(d.boxes[i][k].item<float>(), box[k]) << i << "," << k;
  EXPECT_FLOAT_EQ(d.scores[i].item<float>(), score) << i;
  EXPECT_EQ(d.classes[i].item<int64_t>(), cls) << i;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Original image 100 x 120 (w x h) letterboxed at ratio 0.5: boxes double on the way out.
std::vector<Anchor> scene() {
  return {
      {{5, 5, 25, 25}, {0.9f, 0.1f, 0.3f}},    // a0: class 0 and class 2 (multi-label)
      {{6, 6, 26, 26}, {0.8f, 0.0f, 0.0f}},    // a1: class 0, IoU 361/439 = 0.82 with a0
      {{30, 5, 40, 15}, {0.1f, 0.25f, 0.2f}},  // a2: 0.25 is not > 0.25: nothing
      {{40, 50, 70, 70}, {0.0f, 0.0f, 0.6f}},  // a3: [80,100,140,140] clipped to [80,100,100,120]
      {{55, 65, 60, 70}, {0.7f, 0.0f, 0.0f}},  // a4: clipped to a line at the corner: dropped
      {{6, 6, 26, 26}, {0.0f, 0.5f, 0.0f}},    // a5: like a1 but class 1: not suppressed by a0
  };
}

}  // namespace

TEST(Postprocess, HandMadeScene) {
  const auto pred = make_pred(scene());
  auto d = ops::postprocess_yolo(pred, 0.25, 0.45, 300, {0.5, 0.5, 120, 100});
  ASSERT_EQ(d.boxes.sizes(), torch::IntArrayRef({4, 4}));
  EXPECT_EQ(d.boxes.scalar_type(), torch::kFloat32);
  EXPECT_EQ(d.classes.scalar_type(), torch::kInt64);
  expect_detection(d, 0, {10, 10, 50, 50}, 0.9f, 0);
  expect_detection(d, 1, {80, 100, 100, 120}, 0.6f, 2);
  expect_detection(d, 2, {12, 12, 52, 52}, 0.5f, 1);
  expect_detection(d, 3, {10, 10, 50, 50}, 0.3f, 2);

  // max_det keeps the best.
  auto top2 = ops::postprocess_yolo(pred, 0.25, 0.45, 2, {0.5, 0.5, 120, 100});
  ASSERT_EQ(top2.scores.size(0), 2);
  expect_detection(top2, 1, {80, 100, 100, 120}, 0.6f, 2);
  // A looser IoU lets a1 through; a higher conf leaves only a0's class 0.
  auto loose = ops::postprocess_yolo(pred, 0.25, 0.9, 300, {0.5, 0.5, 120, 100});
  ASSERT_EQ(loose.scores.size(0), 5);
  expect_detection(loose, 1, {12, 12, 52, 52}, 0.8f, 0);
  auto strict = ops::postprocess_yolo(pred, 0.85, 0.45, 300, {0.5, 0.5, 120, 100});
  ASSERT_EQ(strict.scores.size(0), 1);
  expect_detection(strict, 0, {10, 10, 50, 50}, 0.9f, 0);
  // A batch of one is accepted too, and float64 predictions.
  auto batched = ops::postprocess_yolo(pred.unsqueeze(0).to(torch::kFloat64), 0.25, 0.45, 300, {0.5, 0.5, 120, 100});
  EXPECT_TRUE(torch::equal(batched.classes, d.classes));
  EXPECT_TRUE(torch::allclose(batched.boxes, d.boxes));
}

TEST(Postprocess, NonFiniteRowsAndEmptyResults) {
  const auto pred = make_pred({
      {{kNaN, 0, 10, 10}, {0.9f}},   // NaN coordinate: dropped
      {{0, 0, kInf, 10}, {0.8f}},    // infinite x2 clips to the image width: kept
      {{20, 20, 30, 30}, {kInf}},    // infinite score: dropped
      {{30, 30, 35, 35}, {kNaN}},    // NaN score is never > conf
  });
  auto d = ops::postprocess_yolo(pred, 0.25, 0.45, 300, {0.5, 0.5, 120, 100});
  ASSERT_EQ(d.scores.size(0), 1);
  expect_detection(d, 0, {0, 0, 100, 20}, 0.8f, 0);

  auto none = ops::postprocess_yolo(make_pred({{{0, 0, 5, 5}, {0.1f, 0.2f}}}), 0.25, 0.45, 300, {1.0, 1.0, 10, 10});
  EXPECT_EQ(none.boxes.sizes(), torch::IntArrayRef({0, 4}));
  EXPECT_EQ(none.scores.sizes(), torch::IntArrayRef({0}));
  EXPECT_EQ(none.classes.scalar_type(), torch::kInt64);
  // Candidates that are all degenerate after clipping.
  auto outside = ops::postprocess_yolo(make_pred({{{20, 20, 30, 30}, {0.9f}}}), 0.25, 0.45, 300, {1.0, 1.0, 10, 10});
  EXPECT_EQ(outside.scores.size(0), 0);
}

TEST(Postprocess, CandidateCap) {
  // 30001 copies of one box with falling scores, then a separate box with the lowest score.
  // Only the top 30000 candidates reach NMS, so the separate box is cut before it could
  // survive; NMS then reduces the copies to one.
  const int64_t copies = 30001;
  auto pred = torch::empty({5, copies + 1});
  pred.slice(1, 0, copies).select(0, 0).fill_(0);
  pred.slice(1, 0, copies).select(0, 1).fill_(0);
  pred.slice(1, 0, copies).select(0, 2).fill_(10);
  pred.slice(1, 0, copies).select(0, 3).fill_(10);
  pred.slice(1, 0, copies).select(0, 4).copy_(torch::linspace(0.99, 0.5, copies));
  pred.select(1, copies).copy_(torch::tensor({20.0f, 20.0f, 30.0f, 30.0f, 0.3f}));
  auto d = ops::postprocess_yolo(pred, 0.25, 0.45, 300, {1.0, 1.0, 100, 100});
  ASSERT_EQ(d.scores.size(0), 1);
  expect_detection(d, 0, {0, 0, 10, 10}, 0.99f, 0);
  // Without the cap (fewer copies) the separate box survives.
  auto few = ops::postprocess_yolo(pred.slice(1, copies - 100), 0.25, 0.45, 300, {1.0, 1.0, 100, 100});
  EXPECT_EQ(few.scores.size(0), 2);
  // A max_det above the cap raises the cap to max_det.
  auto wide = ops::postprocess_yolo(pred, 0.25, 0.45, 40000, {1.0, 1.0, 100, 100});
  EXPECT_EQ(wide.scores.size(0), 2);
  // The generic (ATen) path used for other dtypes and devices caps the same way.
  auto generic = ops::postprocess_yolo(pred.to(torch::kFloat64), 0.25, 0.45, 300, {1.0, 1.0, 100, 100});
  EXPECT_EQ(generic.scores.size(0), 1);
}

TEST(Postprocess, FastAndGenericPathsAgree) {
  // A head-like output: 2100 anchors, 20 classes, mostly low scores, overlapping boxes.
  torch::manual_seed(5);
  auto pred = torch::empty({24, 2100});
  auto xy = torch::rand({2, 2100}) * 300;
  pred.slice(0, 0, 2).copy_(xy);
  pred.slice(0, 2, 4).copy_(xy + torch::rand({2, 2100}) * 60 + 2);
  pred.slice(0, 4).copy_(torch::sigmoid(torch::randn({20, 2100}) * 2 - 4));
  for (const auto& t : {ops::kPredictThresholds, ops::kValThresholds}) {
    auto fast = ops::postprocess_yolo(pred, t.conf, t.iou, t.max_det, {0.8, 0.8, 250, 380});
    auto generic = ops::postprocess_yolo(pred.to(torch::kFloat64), t.conf, t.iou, t.max_det, {0.8, 0.8, 250, 380});
    ASSERT_GT(fast.scores.size(0), 10);
    ASSERT_EQ(fast.scores.sizes(), generic.scores.sizes());
    EXPECT_TRUE(torch::equal(fast.classes, generic.classes));
    EXPECT_TRUE(torch::allclose(fast.boxes, generic.boxes, 1e-5, 1e-4));
    // Sorted by descending score, inside the image.
    EXPECT_TRUE(torch::equal(std::get<0>(fast.scores.sort(0, true)), fast.scores));
    EXPECT_LE(fast.boxes.select(1, 2).max().item<float>(), 380.0f);
    EXPECT_LE(fast.boxes.select(1, 3).max().item<float>(), 250.0f);
  }
}

// The batched entry (a device batch's candidates gathered at once) gives each image what the
// one-image call gives it: float64 on the CPU takes the batched ATen path, float32 the per-image one.
TEST(Postprocess, BatchEqualsImageByImage) {
  torch::manual_seed(6);
  const int64_t batch = 3, anchors = 1500, nc = 12;
  auto pred = torch::empty({batch, 4 + nc, anchors});
  auto xy = torch::rand({batch, 2, anchors}) * 300;
  pred.slice(1, 0, 2).copy_(xy);
  pred.slice(1, 2, 4).copy_(xy + torch::rand({batch, 2, anchors}) * 60 + 2);
  pred.slice(1, 4).copy_(torch::sigmoid(torch::randn({batch, nc, anchors}) * 2 - 4));
  pred[1].slice(0, 4).fill_(0.01f);  // an image without candidates at the predict threshold
  const std::vector<ops::ImageGeometry> geo = {{0.8, 0.8, 250, 380}, {1.0, 1.0, 300, 300}, {0.5, 0.5, 600, 700}};
  for (const auto& t : {ops::kPredictThresholds, ops::kValThresholds}) {
    for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
      const auto all = ops::postprocess_yolo_batch(pred.to(dtype), t.conf, t.iou, t.max_det, geo);
      ASSERT_EQ(all.size(), 3u);
      int64_t total = 0;
      for (int64_t i = 0; i < batch; ++i) {
        const auto one = ops::postprocess_yolo(pred[i].to(dtype), t.conf, t.iou, t.max_det, geo[i]);
        const auto& b = all[static_cast<size_t>(i)];
        ASSERT_EQ(b.scores.sizes(), one.scores.sizes()) << "image " << i;
        EXPECT_TRUE(torch::equal(b.classes, one.classes)) << "image " << i;
        EXPECT_TRUE(torch::equal(b.boxes, one.boxes)) << "image " << i;
        EXPECT_TRUE(torch::equal(b.scores, one.scores)) << "image " << i;
        total += b.scores.size(0);
      }
      EXPECT_GT(total, 20);
      if (t.conf > 0.1) EXPECT_EQ(all[1].scores.size(0), 0);
    }
  }
  EXPECT_THROW(ops::postprocess_yolo_batch(pred, 0.25, 0.45, 300, {geo[0]}), libreyolo::UsageError);
}

TEST(Postprocess, DefaultThresholds) {
  EXPECT_DOUBLE_EQ(ops::kPredictThresholds.conf, 0.25);
  EXPECT_DOUBLE_EQ(ops::kPredictThresholds.iou, 0.45);
  EXPECT_EQ(ops::kPredictThresholds.max_det, 300);
  EXPECT_DOUBLE_EQ(ops::kValThresholds.conf, 0.001);
  EXPECT_DOUBLE_EQ(ops::kValThresholds.iou, 0.6);
  EXPECT_EQ(ops::kValThresholds.max_det, 300);
  EXPECT_DOUBLE_EQ(ops::kTrainValThresholds.conf, 0.001);
  EXPECT_DOUBLE_EQ(ops::kTrainValThresholds.iou, 0.65);
  EXPECT_EQ(ops::kTrainValThresholds.max_det, 300);
  EXPECT_EQ(ops::kMaxNmsCandidates, 30000);
}

TEST(Postprocess, BadArguments) {
  const auto pred = make_pred(scene());
  using libreyolo::UsageError;
  EXPECT_THROW(ops::postprocess_yolo(pred.slice(0, 0, 4), 0.25, 0.45, 300, {1.0, 1.0, 10, 10}), UsageError);
  EXPECT_THROW(ops::postprocess_yolo(pred.unsqueeze(0).repeat({2, 1, 1}), 0.25, 0.45, 300, {1.0, 1.0, 10, 10}),
               UsageError);
  EXPECT_THROW(ops::postprocess_yolo(pred.to(torch::kInt64), 0.25, 0.45, 300, {1.0, 1.0, 10, 10}), UsageError);
  EXPECT_THROW(ops::postprocess_yolo(pred, 0.25, 0.45, 0, {1.0, 1.0, 10, 10}), UsageError);
  EXPECT_THROW(ops::postprocess_yolo(pred, 0.25, 0.45, 300, {0.0, 0.0, 10, 10}), UsageError);
  EXPECT_THROW(ops::postprocess_yolo(pred, 0.25, 0.45, 300, {1.0, 1.0, 0, 10}), UsageError);
}

TEST(Postprocess, EachAxisIsDividedByItsOwnScale) {
  // A stretched input: an original of 200 (w) x 400 (h) shown at 100 x 100, so x was scaled by
  // 0.5 and y by 0.25.
  const auto pred = make_pred({{{10, 20, 50, 60}, {0.9f}}, {{40, 90, 99, 99}, {0.8f}}});
  const auto d = ops::postprocess_yolo(pred, 0.25, 0.45, 300, {0.5, 0.25, 400, 200});
  ASSERT_EQ(d.boxes.size(0), 2);
  expect_detection(d, 0, {20, 80, 100, 240}, 0.9f, 0);
  expect_detection(d, 1, {80, 360, 198, 396}, 0.8f, 0);
  // Each axis clips to its own side: x to the width 200, y to the height 400.
  const auto wide = make_pred({{{60, 20, 150, 120}, {0.9f}}});
  expect_detection(ops::postprocess_yolo(wide, 0.25, 0.45, 300, {0.5, 0.25, 400, 200}), 0, {120, 80, 200, 400},
                   0.9f, 0);
  // The batch path takes the same geometry.
  const auto batch = ops::postprocess_yolo_batch(pred.unsqueeze(0), 0.25, 0.45, 300, {{0.5, 0.25, 400, 200}});
  EXPECT_TRUE(torch::equal(batch.at(0).boxes, d.boxes));
  EXPECT_THROW(ops::postprocess_yolo(pred, 0.25, 0.45, 300, {0.5, 0.0, 400, 200}), libreyolo::UsageError);
}
