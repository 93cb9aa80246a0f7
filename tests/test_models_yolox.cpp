// YOLOX model and family: names and shapes for every size, counts, init, the family's rules
// (recognition, size, classes, names), decode and postprocess, the loss's behaviour, the L1
// switch, the recipe and its LR schedule.
#include <libreyolo/errors.hpp>

#include <cmath>
#include <array>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/config_schema.hpp"
#include "engine/schedule.hpp"
#include "families/yolox/loss.hpp"
#include "models/detector.hpp"
#include "models/loaded_model.hpp"
#include "families/yolox/model.hpp"
#include "support.hpp"

using libreyolo::UsageError;
using libreyolo::io::StateDict;
using libreyolo::loss::YoloxLoss;
using libreyolo::models::yolox::YoloxModel;
namespace models = libreyolo::models;

namespace {

// The reference state_dict listing (key, shape, dtype) written by LibreYOLO itself.
std::vector<libreyolo::test::TsvEntry> read_reference(const std::string& size) {
  return libreyolo::test::read_state_dict_tsv("yolox_state_dict_" + size + "_nc80.tsv");
}

StateDict reference_state_dict(const std::string& size) {
  return libreyolo::test::reference_state_dict_tsv("yolox_state_dict_" + size + "_nc80.tsv");
}

const models::Family& yolox_family() {
  const models::Family* f = models::find_family("yolox");
  if (!f) throw std::runtime_error("yolox family not registered");
  return *f;
}

torch::Tensor param(const torch::nn::Module& m, const std::string& key) {
  const auto params = m.named_parameters();
  const auto* t = params.find(key);
  if (!t) throw std::runtime_error("no parameter " + key);
  return *t;
}

}  // namespace

class YoloxSizes : public ::testing::TestWithParam<std::string> {};

TEST_P(YoloxSizes, StateDictEqualsReferenceListing) {
  const std::string size = GetParam();
  const auto ref = read_reference(size);
  YoloxModel model(size, 80);
  const StateDict sd = models::state_dict(model);
  ASSERT_EQ(sd.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(sd[i].first, ref[i].key) << "entry " << i;
    EXPECT_EQ(sd[i].second.sizes().vec(), ref[i].shape) << ref[i].key;
    EXPECT_EQ(sd[i].second.scalar_type(), ref[i].dtype == "int64" ? torch::kLong : torch::kFloat) << ref[i].key;
  }
  // The family tells size and classes from these keys alone, and nothing else claims them.
  const StateDict zeros = reference_state_dict(size);
  EXPECT_EQ(models::detect_family(zeros), &yolox_family());
  EXPECT_EQ(yolox_family().infer_size(zeros).value_or("?"), size);
  EXPECT_EQ(yolox_family().infer_num_classes(zeros).value_or(0), 80);
}

INSTANTIATE_TEST_SUITE_P(Yolox, YoloxSizes, ::testing::Values("n", "t", "s", "m", "l", "x"));

TEST(YoloxModel, ParameterCountsMatchReference) {
  // The reference's counts: totals and the CSPDarknet / neck / head split, nc = 80.
  const std::map<std::string, std::array<int64_t, 3>> split = {
      {"n", {459968, 347424, 104767}},       {"t", {2372304, 1596096, 1087455}},
      {"s", {4212672, 2834688, 1920895}},    {"m", {12352992, 8679168, 4294335}},
      {"l", {27075968, 19523072, 7609855}},  {"x", {50301600, 36902400, 11867455}}};
  for (const auto& [size, want] : split) {
    YoloxModel m(size, 80);
    int64_t dark = 0, neck = 0, head = 0;
    for (const auto& p : m.named_parameters()) {
      const auto& k = p.key();
      (k.rfind("backbone.backbone.", 0) == 0 ? dark : k.rfind("backbone.", 0) == 0 ? neck : head) += p.value().numel();
    }
    EXPECT_EQ(dark, want[0]) << size;
    EXPECT_EQ(neck, want[1]) << size;
    EXPECT_EQ(head, want[2]) << size;
  }
}

TEST(YoloxModel, BiasPriorAndClassReset) {
  YoloxModel m("n", 80);
  const double prior = -std::log(0.99 / 0.01);
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(param(m, "head.cls_preds." + std::to_string(k) + ".bias").mean().item<double>(), prior, 1e-6);
    EXPECT_NEAR(param(m, "head.obj_preds." + std::to_string(k) + ".bias").max().item<double>(), prior, 1e-6);
  }
  const auto before = models::state_dict(m);
  m.reset_num_classes(3);
  EXPECT_EQ(m.num_classes(), 3);
  const auto after = models::state_dict(m);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].first, before[i].first);
    if (after[i].first.rfind("head.cls_preds.", 0) == 0) {
      EXPECT_EQ(after[i].second.size(0), 3) << after[i].first;
      // The new classifier starts at the prior (the reference leaves it random).
      if (after[i].first.find("bias") != std::string::npos) {
        EXPECT_NEAR(after[i].second.max().item<double>(), prior, 1e-6);
      }
    } else {
      EXPECT_TRUE(torch::equal(after[i].second, before[i].second)) << after[i].first;
    }
  }
  m.eval();
  torch::NoGradGuard ng;
  const auto raw = m.forward_raw(torch::rand({1, 3, 64, 96}) * 255);
  EXPECT_EQ(raw[0].sizes(), (std::vector<int64_t>{1, 8, 8, 12}));
  EXPECT_EQ(m.decode(raw).sizes(), (std::vector<int64_t>{1, 7, 96 + 24 + 6}));
}

TEST(YoloxModel, InputMustBeMultipleOf32) {
  YoloxModel m("n", 2);
  m.eval();
  torch::NoGradGuard ng;
  EXPECT_THROW(m.forward_raw(torch::zeros({1, 3, 330, 320})), UsageError);
  EXPECT_NO_THROW(m.forward_raw(torch::zeros({1, 3, 352, 320})));
}

TEST(YoloxModel, DecodeEqualsDirectComputation) {
  YoloxModel m("n", 2);
  torch::manual_seed(3);
  std::vector<torch::Tensor> raw = {torch::randn({2, 7, 4, 6}), torch::randn({2, 7, 2, 3}),
                                    torch::randn({2, 7, 1, 2})};
  const auto d = m.decode(raw);
  ASSERT_EQ(d.sizes(), (std::vector<int64_t>{2, 6, 24 + 6 + 2}));
  // Anchor 5 of level 1: cell (x 2, y 1) of a 2x3 map, stride 16 -> flat index 24 + 1*3 + 2.
  const int64_t a = 24 + 5;
  const auto r = raw[1].index({1, torch::indexing::Slice(), 1, 2});
  const double cx = (r[0].item<double>() + 2) * 16, cy = (r[1].item<double>() + 1) * 16;
  const double w = std::exp(r[2].item<double>()) * 16, h = std::exp(r[3].item<double>()) * 16;
  EXPECT_NEAR(d[1][0][a].item<double>(), cx - w / 2, 1e-4);
  EXPECT_NEAR(d[1][1][a].item<double>(), cy - h / 2, 1e-4);
  EXPECT_NEAR(d[1][2][a].item<double>(), cx + w / 2, 1e-4);
  EXPECT_NEAR(d[1][3][a].item<double>(), cy + h / 2, 1e-4);
  const double obj = 1 / (1 + std::exp(-r[4].item<double>()));
  EXPECT_NEAR(d[1][4][a].item<double>(), obj / (1 + std::exp(-r[5].item<double>())), 1e-6);
  EXPECT_NEAR(d[1][5][a].item<double>(), obj / (1 + std::exp(-r[6].item<double>())), 1e-6);
}

TEST(YoloxFamily, RegistryRecipeAndNames) {
  const auto& f = yolox_family();
  EXPECT_EQ(f.sizes, (std::vector<std::string>{"n", "t", "s", "m", "l", "x"}));
  EXPECT_TRUE(f.input.bgr);
  EXPECT_EQ(f.input.divisor, 1.0);
  EXPECT_TRUE(f.default_sync_bn);
  EXPECT_TRUE(f.default_amp);
  // The recipe applies cleanly over the defaults and validates.
  libreyolo::TrainConfig cfg;
  libreyolo::train_schema().apply(cfg, f.train_defaults, "train");
  libreyolo::validate(cfg);
  EXPECT_EQ(cfg.scheduler, "yoloxwarmcos");
  EXPECT_DOUBLE_EQ(cfg.momentum, 0.9);
  EXPECT_DOUBLE_EQ(cfg.warmup_epochs, 5);
  EXPECT_DOUBLE_EQ(cfg.warmup_lr_start, 0);
  EXPECT_DOUBLE_EQ(cfg.min_lr_ratio, 0.05);
  EXPECT_DOUBLE_EQ(cfg.lr0, 0.01);
  EXPECT_EQ(cfg.no_aug_epochs, 15);
  EXPECT_DOUBLE_EQ(cfg.ema_decay, 0.9998);
  // Integer augmentation magnitudes are fine.
  libreyolo::train_schema().apply(cfg, {{"degrees", "0"}, {"shear", "0"}, {"translate", "0"}}, "train");
  EXPECT_NO_THROW(libreyolo::validate(cfg));

  // Fresh model names through the generic model-name parsing.
  for (const auto& [name, size] : std::vector<std::pair<std::string, std::string>>{
           {"yoloxn", "n"}, {"yolox-t", "t"}, {"LibreYOLOXs", "s"}, {"yolox_m", "m"}, {"yoloxl", "l"}}) {
    auto lm = models::load_model(name, "cpu");
    EXPECT_EQ(lm->family, &f) << name;
    EXPECT_EQ(lm->model->size(), size) << name;
    EXPECT_EQ(lm->model->family_name(), "yolox");
  }
  // DDP-prefixed keys are recognised and normalised.
  StateDict sd = reference_state_dict("t");
  for (auto& kv : sd) kv.first = "module." + kv.first;
  EXPECT_EQ(models::detect_family(sd), &f);
  f.normalize_keys(sd);
  EXPECT_EQ(sd[0].first, "backbone.backbone.stem.conv.conv.weight");
  auto like = f.build_like(sd, 0);
  EXPECT_EQ(like->size(), "t");
  EXPECT_EQ(like->num_classes(), 80);
  // YOLOv9 keys are not YOLOX, and another family's marker key vetoes.
  YoloxModel n("n", 80);
  auto v9 = models::find_family("yolo9")->build("t", 80);
  EXPECT_FALSE(f.can_load(models::state_dict(*v9)));
  EXPECT_FALSE(models::find_family("yolo9")->can_load(models::state_dict(n)));
  StateDict marked = models::state_dict(n);
  marked.emplace_back("backbone.backbone._model.blocks.0.attn.gk_proj.0.weight", torch::zeros({1}));
  EXPECT_FALSE(f.can_load(marked));
}

TEST(YoloxFamily, PostprocessKeepsOneLabelPerAnchor) {
  // Two anchors; anchor 0 scores 0.9 for class 0 and 0.8 for class 1, anchor 1 only 0.6 for class 1.
  auto pred = torch::zeros({6, 2});
  pred.index_put_({torch::indexing::Slice(0, 4), 0}, torch::tensor({10.f, 10.f, 50.f, 50.f}));
  pred.index_put_({torch::indexing::Slice(0, 4), 1}, torch::tensor({100.f, 100.f, 140.f, 150.f}));
  pred[4][0] = 0.9f;
  pred[5][0] = 0.8f;
  pred[5][1] = 0.6f;
  models::PostprocessArgs a;
  a.conf = 0.5;
  a.geometry.sx = a.geometry.sy = 0.5;
  a.geometry.orig_h = 400;
  a.geometry.orig_w = 400;
  const auto d = yolox_family().postprocess(pred, a);
  ASSERT_EQ(d.boxes.size(0), 2);  // the generic multi-label rule would give 3
  EXPECT_EQ(d.classes[0].item<int64_t>(), 0);
  EXPECT_FLOAT_EQ(d.scores[0].item<float>(), 0.9f);
  EXPECT_EQ(d.classes[1].item<int64_t>(), 1);
  EXPECT_FLOAT_EQ(d.boxes[1][3].item<float>(), 300.f);  // divided by the ratio
  // Strict threshold.
  a.conf = 0.9;
  EXPECT_EQ(yolox_family().postprocess(pred, a).boxes.size(0), 0);
}

TEST(YoloxFamily, CloseMosaicSwitchesL1OnOnce) {
  const auto& f = yolox_family();
  YoloxModel m("n", 3);
  auto loss = f.make_loss(m);
  auto* yl = dynamic_cast<YoloxLoss*>(loss.get());
  ASSERT_NE(yl, nullptr);
  EXPECT_FALSE(yl->use_l1());
  EXPECT_TRUE(f.on_close_mosaic(m, *loss));
  EXPECT_TRUE(yl->use_l1());
  EXPECT_FALSE(f.on_close_mosaic(m, *loss));  // nothing changes a second time
}

TEST(YoloxLoss, TermsBackgroundAndL1) {
  torch::manual_seed(0);
  YoloxModel m("n", 3);
  m.train();
  YoloxLoss loss(3);
  const auto x = torch::rand({2, 3, 128, 128}) * 255;
  // Image 0: two boxes; image 1: background only (padding rows have class -1).
  auto t = torch::full({2, 4, 5}, 0.f);
  t.select(2, 0).fill_(-1);
  t[0][0] = torch::tensor({1.f, 0.1f, 0.1f, 0.5f, 0.6f});
  t[0][1] = torch::tensor({2.f, 0.55f, 0.3f, 0.95f, 0.9f});
  const auto raw = m.forward_raw(x);
  const auto off = loss.compute(raw, t, 128, 128);
  EXPECT_EQ(*off.names, (std::vector<std::string>{"iou", "obj", "cls", "l1"}));
  EXPECT_EQ(off.term("l1").item<double>(), 0.0);
  EXPECT_GT(off.term("iou").item<double>(), 0.0);
  EXPECT_GT(off.num_fg.item<double>(), 0.0);
  EXPECT_NEAR(off.total.item<double>(), off.terms.sum().item<double>(), 1e-5);
  loss.set_use_l1(true);
  const auto on = loss.compute(raw, t, 128, 128);
  EXPECT_GT(on.term("l1").item<double>(), 0.0);
  EXPECT_NEAR(on.total.item<double>() - on.term("l1").item<double>(), off.total.item<double>(), 1e-4);
  on.total.backward();
  for (const auto& p : m.named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
  // No targets at all: objectness only, no positives.
  const auto none = loss.compute(m.forward_raw(x), torch::zeros({2, 0, 5}), 128, 128);
  EXPECT_EQ(none.num_fg.item<double>(), 0.0);
  EXPECT_EQ(none.term("iou").item<double>(), 0.0);
  EXPECT_EQ(none.term("cls").item<double>(), 0.0);
  EXPECT_GT(none.term("obj").item<double>(), 0.0);
}

TEST(YoloxSchedule, WarmCosMatchesReferenceValues) {
  // The reference's values: ipe 100, 300 epochs, warm-up 5, no-aug 15, lr0 0.01, floor 5%.
  libreyolo::engine::LrSchedule s;
  s.shape = libreyolo::engine::lr_shape("yoloxwarmcos", libreyolo::models::find_family("yolox")->scheduler_names);
  s.lr0 = 0.01;
  s.warmup_lr_start = 0;
  s.min_lr_ratio = 0.05;
  s.warmup_iters = 500;
  s.total_iters = 30000;
  s.plateau_iters = 1500;
  const std::vector<std::pair<long long, double>> want = {{0, 0},          {50, 1.0e-4},     {250, 2.5e-3},
                                                          {500, 1e-2},     {1000, 9.9925e-3}, {15000, 4.984e-3},
                                                          {28499, 5.0e-4}, {28500, 5e-4},     {30000, 5e-4}};
  for (const auto& [it, lr] : want) EXPECT_NEAR(s.at(it), lr, std::max(1e-9, lr * 2e-4)) << it;
}
