// YOLOv9-t parity with the Python reference on the CPU (fixtures/README.md): eval predictions,
// train-mode raw maps and the BatchNorm running statistics after one train forward.
#include "loss/loss.hpp"
#include "families/yolo9/model.hpp"
#include "support.hpp"
#include "yolo9_fixture.hpp"

using libreyolo::test::load_yolo9_fixture;
using libreyolo::test::score_logits;
using libreyolo::test::rel_err;
namespace models = libreyolo::models;

TEST(Yolo9Parity, CheckpointMetadataAndNames) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_yolo9_fixture(dir);
  EXPECT_EQ(f.checkpoint->get("model_family")->as_string(), "yolo9");
  EXPECT_EQ(f.model->size(), f.checkpoint->get("size")->as_string());
  EXPECT_EQ(f.model->num_classes(), 80);
  // The model names its tensors exactly as the file does, in the same order.
  const auto mine = models::state_dict(*f.model);
  ASSERT_EQ(mine.size(), f.weights.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, f.weights[i].first);
    EXPECT_TRUE(torch::equal(mine[i].second, f.weights[i].second)) << mine[i].first;
  }
}

TEST(Yolo9Parity, EvalPredictions) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_yolo9_fixture(dir);
  f.model->eval();
  torch::NoGradGuard no_grad;
  const auto got = f.model->predict_tensor(f.expected("input"));
  const auto want = f.expected("eval_predictions");
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_LE(rel_err(got, want), 1e-4);
  EXPECT_LE(rel_err(got.narrow(1, 0, 4), want.narrow(1, 0, 4)), 1e-4);
  EXPECT_LE(rel_err(score_logits(got.narrow(1, 4, 80)), score_logits(want.narrow(1, 4, 80))), 1e-4);
}

TEST(Yolo9Parity, TrainRawMapsAndBatchNormUpdate) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_yolo9_fixture(dir);
  f.model->train();
  const auto raw = f.model->forward_raw(f.expected("input"));
  ASSERT_EQ(raw.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto want = f.expected("train_raw_" + std::to_string(i));
    ASSERT_EQ(raw[i].sizes(), want.sizes()) << i;
    EXPECT_LE(rel_err(raw[i], want), 1e-4) << "level " << i;
  }
  torch::Tensor mean;
  for (const auto& [k, v] : models::state_dict(*f.model)) {
    if (k == "backbone.conv0.bn.running_mean") mean = v;
  }
  const auto want = f.expected("bn_running_mean_after_train_forward.backbone.conv0.bn");
  EXPECT_LE(rel_err(mean, want), 1e-4);
  // The statistics really moved away from the checkpoint's values.
  torch::Tensor before;
  for (const auto& [k, v] : f.weights) {
    if (k == "backbone.conv0.bn.running_mean") before = v;
  }
  EXPECT_GT((mean - before).abs().max().item<double>(), 1e-6);
}

// Model and the family's loss together: the train-mode loss and its gradients.
TEST(Yolo9Parity, FamilyLossAndGradients) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_yolo9_fixture(dir);
  const models::Family* family = models::find_family("yolo9");
  ASSERT_TRUE(family->make_loss);
  auto loss = family->make_loss(*f.model);
  f.model->train();
  const auto x = f.expected("input");
  const auto out = loss->compute(f.model->forward_raw(x), f.expected("targets"), x.size(2), x.size(3));
  EXPECT_LE(rel_err(out.total.reshape({1}), f.expected("loss_total_loss")), 1e-4);
  EXPECT_LE(rel_err(out.term("box").reshape({1}), f.expected("loss_box_loss")), 1e-4);
  EXPECT_LE(rel_err(out.term("dfl").reshape({1}), f.expected("loss_dfl_loss")), 1e-4);
  EXPECT_LE(rel_err(out.term("cls").reshape({1}), f.expected("loss_cls_loss")), 1e-4);
  out.total.backward();
  const auto params = f.model->named_parameters();
  int checked = 0;
  for (const auto& [key, value] : f.expect->dict) {
    const std::string name = key->as_string();
    if (name.rfind("grad.", 0) != 0) continue;
    const auto* p = params.find(name.substr(5));
    ASSERT_NE(p, nullptr) << name;
    ASSERT_TRUE(p->grad().defined()) << name;
    EXPECT_LE(rel_err(p->grad(), value->tensor), 1e-3) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}
