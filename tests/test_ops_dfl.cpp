// Anchor points and DFL box decoding (ops/dfl.hpp), and that the YOLOv9 model and its loss
// decode through this one implementation.
#include <libreyolo/errors.hpp>

#include "families/yolo9/loss.hpp"
#include "families/yolo9/model.hpp"
#include "ops/dfl.hpp"
#include "support.hpp"

namespace {

namespace ops = libreyolo::ops;

std::vector<float> values(const torch::Tensor& t) {
  auto c = t.to(torch::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

TEST(Dfl, CellCentresUseTheIntegerHalfStride) {
  EXPECT_EQ(values(ops::cell_centres(3, 8, torch::kCPU)), (std::vector<float>{4, 12, 20}));
  // s // 2 as in the reference's generate_anchors, not s / 2.
  EXPECT_EQ(values(ops::cell_centres(3, 3, torch::kCPU)), (std::vector<float>{1, 4, 7}));
  EXPECT_EQ(ops::cell_centres(0, 8, torch::kCPU).numel(), 0);
}

TEST(Dfl, AnchorPointsAreLevelMajorThenRowMajor) {
  const auto a = ops::make_anchor_points({{2, 3}, {1, 2}}, {8, 16}, 5, torch::kCPU);
  ASSERT_EQ(a.xy.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(a.xy.scalar_type(), torch::kFloat);
  EXPECT_EQ(values(a.xy[0]), (std::vector<float>{4, 12, 20, 4, 12, 20, 8, 24}));
  EXPECT_EQ(values(a.xy[1]), (std::vector<float>{4, 4, 4, 12, 12, 12, 8, 8}));
  EXPECT_EQ(values(a.stride), (std::vector<float>{8, 8, 8, 8, 8, 8, 16, 16}));
  EXPECT_EQ(values(a.bins), (std::vector<float>{0, 1, 2, 3, 4}));
  EXPECT_THROW(ops::make_anchor_points({{2, 2}}, {8, 16}, 16, torch::kCPU), libreyolo::UsageError);
}

TEST(Dfl, PeakedLogitsGiveTheirBinTimesTheStride) {
  const auto a = ops::make_anchor_points({{1, 2}}, {16}, 4, torch::kCPU);  // anchors (8,8), (24,8)
  auto logits = torch::zeros({1, 4, 4, 2});
  const int64_t bin[2][4] = {{1, 2, 3, 0}, {0, 0, 2, 1}};  // per anchor: l, t, r, b
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t side = 0; side < 4; ++side) logits[0][side][bin[k][side]][k] = 60.0;
  const auto boxes = ops::dfl_boxes(logits, a);
  ASSERT_EQ(boxes.sizes(), (std::vector<int64_t>{1, 4, 2}));
  const auto got = values(boxes[0].t().contiguous());  // anchor-major: x1 y1 x2 y2 per anchor
  const std::vector<float> want = {8 - 16, 8 - 32, 8 + 48, 8 + 0, 24 - 0, 8 - 0, 24 + 32, 8 + 16};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << i;
}

TEST(Dfl, UniformLogitsGiveTheMiddleBin) {
  const auto a = ops::make_anchor_points({{2, 2}}, {32}, 16, torch::kCPU);
  const auto boxes = ops::dfl_boxes(torch::zeros({2, 4, 16, 4}, torch::kDouble), a);
  EXPECT_EQ(boxes.scalar_type(), torch::kDouble);  // float32 constants promote
  const auto xy = a.xy.to(torch::kDouble).unsqueeze(0);
  const auto half = 7.5 * 32;
  EXPECT_LT((boxes.narrow(1, 0, 2) - (xy - half)).abs().max().item<double>(), 1e-12);
  EXPECT_LT((boxes.narrow(1, 2, 2) - (xy + half)).abs().max().item<double>(), 1e-12);
}

TEST(Dfl, GradientsReachTheLogits) {
  const auto a = ops::make_anchor_points({{2, 2}}, {8}, 16, torch::kCPU);
  auto logits = torch::randn({1, 4, 16, 4}, torch::kDouble).requires_grad_();
  ops::dfl_boxes(logits, a).sum().backward();
  ASSERT_TRUE(logits.grad().defined());
  EXPECT_GT(logits.grad().abs().max().item<double>(), 1e-3);
}

TEST(Dfl, RejectsLogitsOfTheWrongShape) {
  const auto a = ops::make_anchor_points({{2, 2}}, {8}, 16, torch::kCPU);
  EXPECT_THROW(ops::dfl_boxes(torch::zeros({1, 4, 15, 4}), a), libreyolo::UsageError);
  EXPECT_THROW(ops::dfl_boxes(torch::zeros({1, 4, 16, 5}), a), libreyolo::UsageError);
  EXPECT_THROW(ops::dfl_boxes(torch::zeros({4, 16, 4}), a), libreyolo::UsageError);
}

// The model's decode and the loss's decoder are one implementation: the same raw maps give the
// same boxes, bit for bit, in float32 and float64.
TEST(Dfl, Yolo9ModelAndLossDecodeTheSameBoxes) {
  const int nc = 3;
  libreyolo::models::yolo9::Yolo9Model model("t", nc);
  libreyolo::loss::Yolo9Loss loss(nc);
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    torch::manual_seed(5);
    std::vector<torch::Tensor> raw;
    std::vector<std::array<int64_t, 2>> level_hw;
    for (int64_t hw : {8, 4, 2}) {
      raw.push_back(torch::randn({2, 64 + nc, hw, hw + 1}, dtype) * 3);
      level_hw.push_back({hw, hw + 1});
    }
    const auto pred = model.decode(raw);
    const auto d = loss.decode(raw, loss.anchor_grid(level_hw, torch::kCPU));
    ASSERT_EQ(pred.scalar_type(), dtype);
    ASSERT_EQ(d.boxes.scalar_type(), dtype);
    EXPECT_TRUE(torch::equal(pred.narrow(1, 0, 4), d.boxes));
    EXPECT_TRUE(torch::equal(pred.narrow(1, 4, nc), torch::sigmoid(d.cls_logits)));
  }
}

}  // namespace
