// YOLOv7's training loss and recipe against LibreYOLO 1.6.0: the loss of the fixture's maps
// (tests/data/yolo7_reference.pt) against its ground truth, term by term, the positives of the
// assignment with their ground-truth rows and IoUs, and the maps' gradients; an image without
// boxes; the recipe's options and optimizer groups.
#include <cstdio>
#include <map>
#include <utility>

#include "core/config_schema.hpp"
#include "engine/optimizer.hpp"
#include "engine/schedule.hpp"
#include "families/yolo7/loss.hpp"
#include "families/yolo7/model.hpp"
#include "io/pickle.hpp"
#include "support.hpp"
#include "yolo7_fixture.hpp"

namespace io = libreyolo::io;
namespace models = libreyolo::models;
namespace yolo7 = libreyolo::models::yolo7;
using libreyolo::test::check_rel;
using libreyolo::test::rel_err;

namespace {

torch::Tensor expected(const std::string& key) { return libreyolo::test::yolo7_expected(key); }

std::vector<torch::Tensor> maps() {
  std::vector<torch::Tensor> raw;
  for (int i = 0; i < 3; ++i) raw.push_back(expected("raw_" + std::to_string(i)).clone().requires_grad_(true));
  return raw;
}

// The loss of the fixture's maps for `kase`: its terms against the reference's, and its positives
// (flat index -> ground-truth row, IoU) against the reference's assignment.
std::vector<torch::Tensor> check_case(const std::string& kase) {
  yolo7::Yolo7Loss loss(3);
  auto raw = maps();
  const auto targets = expected(kase + "targets");
  const auto out = loss.compute(raw, targets, 320, 320);
  check_rel(kase + "iou", out.term("iou"), expected(kase + "iou").to(torch::kFloat), 1e-5);
  check_rel(kase + "obj", out.term("obj"), expected(kase + "obj").to(torch::kFloat), 1e-5);
  check_rel(kase + "cls", out.term("cls"), expected(kase + "cls").to(torch::kFloat), 1e-5);
  check_rel(kase + "total", out.total.detach(), expected(kase + "total").to(torch::kFloat), 1e-5);

  const auto index = expected(kase + "pos_index"), gt = expected(kase + "pos_gt"), iou = expected(kase + "pos_iou");
  std::map<int64_t, std::pair<int64_t, float>> want;
  for (int64_t i = 0; i < index.size(0); ++i)
    want[index[i].item<int64_t>()] = {gt[i].item<int64_t>(), iou[i].item<float>()};
  // The assignment of the same predictions.
  const int64_t rows = targets.size(1);
  auto px = torch::zeros({2, rows, 5});
  px.select(2, 0).copy_(targets.select(2, 0));
  px.select(2, 1).copy_((targets.select(2, 1) + targets.select(2, 3)) * 160);
  px.select(2, 2).copy_((targets.select(2, 2) + targets.select(2, 4)) * 160);
  px.select(2, 3).copy_((targets.select(2, 3) - targets.select(2, 1)) * 320);
  px.select(2, 4).copy_((targets.select(2, 4) - targets.select(2, 2)) * 320);
  const auto pred = loss.predictions(raw);
  const auto grid = yolo7::make_grid({{40, 40}, {20, 20}, {10, 10}}, torch::kCPU);
  const auto a = loss.assign(pred, px, grid.cells.t().contiguous(), grid.strides.reshape({-1}));
  const auto fg = a.fg.reshape({-1}).nonzero().reshape({-1});
  EXPECT_EQ(fg.size(0), static_cast<int64_t>(want.size())) << kase;
  for (int64_t k = 0; k < fg.size(0); ++k) {
    const int64_t f = fg[k].item<int64_t>();
    const auto it = want.find(f);
    EXPECT_NE(it, want.end()) << kase << ": prediction " << f << " is a positive here only";
    if (it == want.end()) continue;
    EXPECT_EQ(a.matched_gt.reshape({-1})[f].item<int64_t>(), it->second.first) << kase << " " << f;
    EXPECT_NEAR(a.pred_iou.reshape({-1})[f].item<float>(), it->second.second, 1e-5) << kase << " " << f;
  }
  // Positives per image over the batch, as the interface counts them.
  EXPECT_NEAR(out.num_fg.item<double>(), static_cast<double>(want.size()) / 2, 1e-9);
  const double boxes = (targets.select(2, 0) >= 0).sum().item<double>();
  EXPECT_NEAR(expected(kase + "num_fg_per_gt").item<double>(), static_cast<double>(want.size()) / boxes, 1e-9);
  out.total.backward();
  return {raw[0].grad(), raw[1].grad(), raw[2].grad()};
}

}  // namespace

TEST(Yolo7Loss, TermsAssignmentAndGradientsMatchTheReference) {
  const auto grads = check_case("loss.");
  check_rel("d/d raw_1", grads[1], expected("loss.grad_1"), 1e-4);
  check_rel("d/d raw_2", grads[2], expected("loss.grad_2"), 1e-4);
  using torch::indexing::Slice;
  check_rel("d/d raw_0 (top-left)", grads[0].index({Slice(), Slice(), Slice(0, 20), Slice(0, 20)}),
            expected("loss.grad_0_crop"), 1e-4);
}

TEST(Yolo7Loss, AnImageWithoutBoxesHasOnlyObjectnessTerms) {
  const auto grads = check_case("loss_one_empty.");
  // Image 1 has no positive: its maps' gradients are the objectness term's alone (the box and
  // class channels get none).
  for (const auto& g : grads) {
    const auto per_anchor = g[1].reshape({3, 8, -1});
    EXPECT_EQ(per_anchor.narrow(1, 0, 4).abs().max().item<double>(), 0.0);
    EXPECT_EQ(per_anchor.narrow(1, 5, 3).abs().max().item<double>(), 0.0);
    EXPECT_GT(per_anchor.select(1, 4).abs().max().item<double>(), 0.0);
  }
  // No boxes anywhere: only the objectness term, divided by 1.
  yolo7::Yolo7Loss loss(3);
  const auto none = torch::full({2, 4, 5}, -1.0);
  const auto out = loss.compute(maps(), none, 320, 320);
  EXPECT_EQ(out.term("iou").item<double>(), 0.0);
  EXPECT_EQ(out.term("cls").item<double>(), 0.0);
  EXPECT_EQ(out.num_fg.item<double>(), 0.0);
  double obj = 0;
  for (int i = 0; i < 3; ++i) {
    const auto r = expected("raw_" + std::to_string(i)).reshape({2, 3, 8, -1}).select(2, 4);
    obj += torch::binary_cross_entropy_with_logits(r, torch::zeros_like(r), {}, {}, at::Reduction::Sum).item<double>();
  }
  EXPECT_NEAR(out.term("obj").item<double>(), obj, 1e-5 * obj);
  EXPECT_ANY_THROW(loss.compute(maps(), torch::zeros({2, 4, 4}), 320, 320));
}

TEST(Yolo7Family, RecipeAndOptimizerGroups) {
  const models::Family* f = models::find_family("yolo7");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->default_sync_bn);
  EXPECT_TRUE(f->default_amp);
  libreyolo::TrainConfig cfg;
  libreyolo::train_schema().apply(cfg, f->train_defaults, "train");
  libreyolo::validate(cfg);
  // LibreYOLO's YOLOv7Config.
  EXPECT_EQ(cfg.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(cfg.lr0, 0.01);
  EXPECT_DOUBLE_EQ(cfg.momentum, 0.937);
  EXPECT_DOUBLE_EQ(cfg.warmup_momentum, 0.937);
  EXPECT_TRUE(cfg.nesterov);
  EXPECT_DOUBLE_EQ(cfg.weight_decay, 5e-4);
  EXPECT_EQ(libreyolo::engine::lr_shape(cfg.scheduler, f->scheduler_names), libreyolo::engine::LrShape::CosineFlat);
  EXPECT_DOUBLE_EQ(cfg.warmup_epochs, 3);
  EXPECT_DOUBLE_EQ(cfg.warmup_lr_start, 0);
  EXPECT_DOUBLE_EQ(cfg.min_lr_ratio, 0.05);
  EXPECT_EQ(cfg.no_aug_epochs, 15);
  EXPECT_DOUBLE_EQ(cfg.mosaic_prob, 1.0);
  EXPECT_DOUBLE_EQ(cfg.mixup_prob, 1.0);
  EXPECT_DOUBLE_EQ(cfg.degrees, 10);
  EXPECT_DOUBLE_EQ(cfg.translate, 0.1);
  EXPECT_DOUBLE_EQ(cfg.shear, 2);
  EXPECT_EQ(cfg.mosaic_scale, "0.1,2.0");
  EXPECT_DOUBLE_EQ(cfg.ema_decay, 0.9999);
  EXPECT_EQ(cfg.eval_interval, 10);
  EXPECT_EQ(cfg.workers, 4);
  EXPECT_DOUBLE_EQ(cfg.aux_weight, 0);
  EXPECT_EQ(cfg.name, "yolo7_exp");
  EXPECT_EQ(f->augment.max_labels, 100);
  EXPECT_EQ(f->augment.drop_box_side, 2.0);
  EXPECT_EQ(f->augment.mixup, libreyolo::data::Mixup::Blend);
  // The reference's groups of b: 92 BatchNorm weights, 92 BatchNorm and 3 head biases and the 6
  // implicit tensors without decay (the two no-decay groups of the reference are one here), the
  // 95 convolution weights with it; every parameter in one group.
  yolo7::Yolo7Model m(32, 80);
  const auto groups = libreyolo::engine::make_param_groups(m, 5e-4, f->param_rules, 1.0);
  ASSERT_EQ(groups.size(), 2u);
  size_t decayed = 0, plain = 0;
  for (const auto& g : groups) (g.decay_group ? decayed : plain) += g.params.size();
  EXPECT_EQ(plain, 92u + 95u + 6u);
  EXPECT_EQ(decayed, 95u);
  EXPECT_EQ(decayed + plain, m.parameters().size());
  for (const auto& g : groups) EXPECT_EQ(g.weight_decay, g.decay_group ? 5e-4 : 0.0);
  // The loss is the family's.
  auto loss = f->make_loss(m);
  EXPECT_NE(dynamic_cast<yolo7::Yolo7Loss*>(loss.get()), nullptr);
  EXPECT_EQ(loss->term_names(), (std::vector<std::string>{"iou", "obj", "cls"}));
}
