// Greedy NMS against a brute-force reference written here, and hand-made cases.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>

#include <libreyolo/errors.hpp>

#include "ops/nms.hpp"
#include "support.hpp"

namespace ops = libreyolo::ops;

namespace {

double iou(const float* a, const float* b) {
  const double w = std::max(0.0, double(std::min(a[2], b[2])) - std::max(a[0], b[0]));
  const double h = std::max(0.0, double(std::min(a[3], b[3])) - std::max(a[1], b[1]));
  const double inter = w * h;
  const double area_a = double(a[2] - a[0]) * (a[3] - a[1]);
  const double area_b = double(b[2] - b[0]) * (b[3] - b[1]);
  return inter / (area_a + area_b - inter);
}

// The definition: walk by descending score (ties by index); a box survives unless an already
// kept box of the same class overlaps it by more than the threshold.
std::vector<int64_t> reference(const torch::Tensor& boxes, const torch::Tensor& scores,
                               const torch::Tensor& classes, double thr) {
  const int64_t n = boxes.size(0);
  auto b = boxes.contiguous();
  auto s = scores.contiguous();
  auto c = classes.to(torch::kInt64).contiguous();
  const float* bp = b.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const int64_t* cp = c.data_ptr<int64_t>();
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t i, int64_t j) { return sp[i] > sp[j]; });
  std::vector<int64_t> kept;
  for (int64_t i : idx) {
    bool survive = true;
    for (int64_t k : kept)
      if (cp[k] == cp[i] && iou(bp + 4 * k, bp + 4 * i) > thr) survive = false;
    if (survive) kept.push_back(i);
  }
  return kept;
}

std::vector<int64_t> to_vec(const torch::Tensor& t) {
  EXPECT_EQ(t.scalar_type(), torch::kInt64);
  auto c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

torch::Tensor random_boxes(int64_t n, double extent, double max_size) {
  auto xy = torch::rand({n, 2}) * extent;
  auto wh = torch::rand({n, 2}) * max_size + 0.5;
  return torch::cat({xy, xy + wh}, 1);
}

torch::Tensor boxes_of(std::initializer_list<std::array<float, 4>> list) {
  auto t = torch::empty({int64_t(list.size()), 4});
  int64_t i = 0;
  for (const auto& b : list) {
    for (int k = 0; k < 4; ++k) t[i][k] = b[k];
    ++i;
  }
  return t;
}

}  // namespace

TEST(Nms, HandMadeCases) {
  // A suppresses B (IoU 81/119); D overlaps A by 64/136 < 0.5 and B by 0.68, but B is gone, so
  // D stays (greedy, not "any higher box"); C is far away.
  auto boxes = boxes_of({{0, 0, 10, 10}, {1, 1, 11, 11}, {20, 20, 30, 30}, {2, 2, 12, 12}});
  auto scores = torch::tensor({0.9f, 0.8f, 0.7f, 0.6f});
  EXPECT_EQ(to_vec(ops::nms(boxes, scores, 0.5)), (std::vector<int64_t>{0, 2, 3}));
  // At 0.7 nothing overlaps enough.
  EXPECT_EQ(to_vec(ops::nms(boxes, scores, 0.7)), (std::vector<int64_t>{0, 1, 2, 3}));
  // Output follows the scores, not the input order.
  auto rev = torch::tensor({0.1f, 0.95f, 0.5f, 0.2f});
  EXPECT_EQ(to_vec(ops::nms(boxes, rev, 0.5)), (std::vector<int64_t>{1, 2}));
}

TEST(Nms, ThresholdIsStrict) {
  // IoU exactly 1/2: [0,0,2,1] contains [0,0,1,1].
  auto boxes = boxes_of({{0, 0, 2, 1}, {0, 0, 1, 1}});
  auto scores = torch::tensor({0.9f, 0.8f});
  EXPECT_EQ(to_vec(ops::nms(boxes, scores, 0.5)).size(), 2u);
  EXPECT_EQ(to_vec(ops::nms(boxes, scores, 0.4999)), (std::vector<int64_t>{0}));
  // IoU is a float compared with a double threshold, as in torchvision: 1/10 in float is
  // 0.100000001 > 0.1, so it suppresses; 7/10 in float is 0.699999988 < 0.7, so it does not.
  auto tenth = boxes_of({{0, 0, 10, 1}, {0, 0, 1, 1}});
  EXPECT_EQ(to_vec(ops::nms(tenth, scores, 0.1)).size(), 1u);
  auto seven = boxes_of({{0, 0, 10, 1}, {0, 0, 7, 1}});
  EXPECT_EQ(to_vec(ops::nms(seven, scores, 0.7)).size(), 2u);
  EXPECT_EQ(to_vec(ops::nms(seven, scores, 0.6999999)).size(), 1u);
}

TEST(Nms, EmptyOneTiesAndDegenerate) {
  auto none = ops::nms(torch::empty({0, 4}), torch::empty({0}), 0.5);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.scalar_type(), torch::kInt64);
  EXPECT_EQ(ops::batched_nms(torch::empty({0, 4}), torch::empty({0}),
                             torch::empty({0}, torch::kInt64), 0.5).numel(), 0);
  EXPECT_EQ(to_vec(ops::nms(boxes_of({{1, 2, 3, 4}}), torch::tensor({0.3f}), 0.5)),
            (std::vector<int64_t>{0}));
  // Identical boxes with equal scores: the first in input order wins.
  auto same = boxes_of({{0, 0, 5, 5}, {0, 0, 5, 5}, {0, 0, 5, 5}});
  EXPECT_EQ(to_vec(ops::nms(same, torch::tensor({0.5f, 0.7f, 0.7f}), 0.5)),
            (std::vector<int64_t>{1}));
  // Zero-area boxes: IoU is 0/0, so they neither suppress nor get suppressed.
  auto flat = boxes_of({{1, 1, 1, 5}, {1, 1, 1, 5}});
  EXPECT_EQ(to_vec(ops::nms(flat, torch::tensor({0.9f, 0.8f}), 0.5)).size(), 2u);
  // NaN scores go last.
  EXPECT_EQ(to_vec(ops::nms(boxes_of({{0, 0, 1, 1}, {5, 5, 6, 6}}),
                            torch::tensor({std::nanf(""), 0.1f}), 0.5)),
            (std::vector<int64_t>{1, 0}));
}

TEST(Nms, RandomBoxesMatchReference) {
  torch::manual_seed(123);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t n = 50 + 60 * trial;
    auto boxes = random_boxes(n, 100, 30);
    // Scores on a coarse grid so that ties occur.
    auto scores = (torch::randint(0, 40, {n}) / 40.0).to(torch::kFloat);
    for (double thr : {0.3, 0.5, 0.7}) {
      auto zeros = torch::zeros({n}, torch::kInt64);
      EXPECT_EQ(to_vec(ops::nms(boxes, scores, thr)), reference(boxes, scores, zeros, thr))
          << "n=" << n << " thr=" << thr;
      auto classes = torch::randint(0, 4, {n}, torch::kInt64);
      EXPECT_EQ(to_vec(ops::batched_nms(boxes, scores, classes, thr)),
                reference(boxes, scores, classes, thr))
          << "batched n=" << n << " thr=" << thr;
    }
  }
}

TEST(Nms, ClassesDoNotSuppressEachOther) {
  auto boxes = boxes_of({{0, 0, 10, 10}, {0, 0, 10, 10}, {0, 0, 10, 10}, {0, 0, 9, 10}});
  auto scores = torch::tensor({0.9f, 0.8f, 0.7f, 0.6f});
  // Classes may be any integers, negative and large included, in any integer dtype.
  auto classes = torch::tensor({-3, 1000000, -3, 1000000}, torch::kInt32);
  EXPECT_EQ(to_vec(ops::batched_nms(boxes, scores, classes, 0.5)), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(to_vec(ops::batched_nms(boxes, scores, torch::tensor({0, 1, 2, 3}), 0.5)),
            (std::vector<int64_t>{0, 1, 2, 3}));
  // Double boxes are computed in double.
  EXPECT_EQ(to_vec(ops::batched_nms(boxes.to(torch::kFloat64), scores.to(torch::kFloat64),
                                    classes, 0.5)),
            (std::vector<int64_t>{0, 1}));
}

TEST(Nms, BadArguments) {
  auto b = torch::zeros({3, 4});
  auto s = torch::zeros({3});
  EXPECT_THROW(ops::nms(torch::zeros({3, 5}), s, 0.5), libreyolo::UsageError);
  EXPECT_THROW(ops::nms(b, torch::zeros({2}), 0.5), libreyolo::UsageError);
  EXPECT_THROW(ops::nms(b.to(torch::kInt64), s, 0.5), libreyolo::UsageError);
  EXPECT_THROW(ops::batched_nms(b, s, torch::zeros({3}), 0.5), libreyolo::UsageError);
  EXPECT_THROW(ops::batched_nms(b, s, torch::zeros({4}, torch::kInt64), 0.5),
               libreyolo::UsageError);
}
