// D-FINE training on the CPU: a few optimizer steps on one tiny batch lower the criterion; the
// recipe (AMP off by default with its reason, flat_cosine, the optimizer settings); and a short
// run through the public API that trains, validates and saves a checkpoint that loads back as
// D-FINE, and loads again from its weights' shapes.
#include <cmath>
#include <filesystem>

#include <libreyolo/errors.hpp>
#include <libreyolo/libreyolo.hpp>

#include "data/synthetic.hpp"
#include "engine/optimizer.hpp"
#include "engine/schedule.hpp"
#include "families/rtdetr/dfine.hpp"
#include "families/rtdetr/dfine_loss.hpp"
#include "io/checkpoint.hpp"
#include "io/pickle.hpp"
#include "loss/loss.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;

namespace {

// A narrow three-level D-FINE (fast on the CPU).
rtdetr::DfineConfig narrow(int nc) {
  auto c = rtdetr::dfine_size_config("s", nc);
  c.size.clear();
  c.hgnet.stem_mid = 8;
  c.hgnet.stem_out = 8;
  const int64_t mids[4] = {8, 8, 16, 16}, outs[4] = {16, 32, 48, 64};
  for (int i = 0; i < 4; ++i) {
    c.hgnet.stages[i].mid = mids[i];
    c.hgnet.stages[i].out = outs[i];
    c.hgnet.stages[i].layers = 2;
  }
  c.hidden = c.dec_hidden = 32;
  c.enc_ffn = c.dec_ffn = 64;
  c.elan_hidden = 16;
  c.queries = 100;
  c.denoising = 20;
  c.anchor_size = 128;
  return c;
}

}  // namespace

TEST(DfineTrain, AFewStepsOnATinyBatchLowerTheLoss) {
  torch::manual_seed(0);
  auto model = std::make_shared<rtdetr::DfineModel>(narrow(3));
  model->train();
  const auto x = torch::rand({2, 3, 128, 128});
  auto targets = torch::full({2, 3, 5}, -1.0f);
  targets[0][0] = torch::tensor({0.f, 0.10f, 0.15f, 0.45f, 0.60f});
  targets[0][1] = torch::tensor({2.f, 0.55f, 0.50f, 0.90f, 0.85f});
  targets[1][0] = torch::tensor({1.f, 0.20f, 0.30f, 0.70f, 0.75f});
  const models::Family* f = models::find_family("dfine");
  ASSERT_NE(f, nullptr);
  auto loss = f->make_loss(*model);
  EXPECT_EQ(loss->term_names(), (std::vector<std::string>{"vfl", "bbox", "giou", "fgl", "ddf"}));
  std::vector<torch::Tensor> params;
  for (const auto& p : models::unique_named_parameters(*model))
    if (p.second.requires_grad()) params.push_back(p.second);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(2e-3).weight_decay(1e-4));
  std::vector<double> losses;
  const int steps = 20;
  for (int step = 0; step < steps; ++step) {
    const auto raw = model->forward_train(x, targets);
    const auto out = loss->compute(raw, targets, 128, 128);
    ASSERT_TRUE(std::isfinite(out.total.item<double>())) << "step " << step;
    losses.push_back(out.total.item<double>());
    opt.zero_grad();
    out.total.backward();
    torch::nn::utils::clip_grad_norm_(params, 0.1);
    opt.step();
  }
  const double first = (losses[0] + losses[1] + losses[2]) / 3;
  const double last = (losses[steps - 3] + losses[steps - 2] + losses[steps - 1]) / 3;
  std::printf("  loss (mean of 3 steps) %.4f -> %.4f\n", first, last);
  EXPECT_LT(last, 0.85 * first);
  // The weighting function's parameters are constants.
  EXPECT_FLOAT_EQ(model->decoder->up.item<float>(), 0.5f);
  EXPECT_FLOAT_EQ(model->decoder->reg_scale.item<float>(), 4.0f);
}

TEST(DfineTrain, RecipeAmpOffWithItsReasonAndFlatCosine) {
  libreyolo::LibreYOLO model = libreyolo::LibreYOLO::create("dfine", "s", 2, "cpu");
  const auto info = model.info();
  EXPECT_EQ(info.family, "dfine");
  EXPECT_FALSE(info.amp_default);
  EXPECT_NE(info.amp_default_reason.find("LibreYOLO 1.6.0"), std::string::npos) << info.amp_default_reason;
  libreyolo::data::SyntheticOptions o;
  o.train_images = 2;
  o.val_images = 1;
  o.width = o.height = 128;
  o.num_classes = 2;
  o.threads = 1;
  const std::string yaml =
      libreyolo::data::generate_synthetic_dataset(libreyolo::test::temp_dir("dfine_recipe") + "/data", o);
  const libreyolo::Kwargs base = {{"data", yaml}, {"device", "cpu"}, {"workers", "0"}, {"imgsz", "128"}};
  const auto cfg = model.check_train(base);
  EXPECT_FALSE(cfg.amp);
  EXPECT_EQ(cfg.optimizer, "adamw");
  EXPECT_DOUBLE_EQ(cfg.lr0, 2e-4);
  EXPECT_DOUBLE_EQ(cfg.backbone_lr_mult, 0.5);
  EXPECT_EQ(cfg.scheduler, "flat_cosine");
  EXPECT_EQ(cfg.epochs, 132);
  auto with_amp = base;
  with_amp.emplace_back("amp", "true");
  EXPECT_TRUE(model.check_train(with_amp).amp);
  // Other families keep their defaults and say nothing.
  EXPECT_TRUE(libreyolo::LibreYOLO::create("rtdetr", "r18", 2, "cpu").info().amp_default_reason.empty());
  // Size n works on strides 16 and 32: 80 positions at 128 px, fewer than its 300 queries.
  auto n = models::find_family("dfine")->build("n", 2);
  n->eval();
  torch::NoGradGuard no_grad;
  EXPECT_THROW(n->forward_raw(torch::zeros({1, 3, 128, 128})), libreyolo::UsageError);

  // flat_cosine: linear warm-up, flat, a cosine over the last plateau_iters down to min_lr_ratio.
  libreyolo::engine::LrSchedule s;
  s.shape = libreyolo::engine::lr_shape("flat_cosine");
  s.lr0 = 2e-4;
  s.warmup_lr_start = 1e-6;
  s.min_lr_ratio = 0.05;
  s.warmup_iters = 20;
  s.total_iters = 100;
  s.plateau_iters = 40;
  EXPECT_DOUBLE_EQ(s.at(0), 1e-6);
  EXPECT_NEAR(s.at(10), 1e-6 + (2e-4 - 1e-6) * 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(30), 2e-4);
  EXPECT_DOUBLE_EQ(s.at(59), 2e-4);
  EXPECT_DOUBLE_EQ(s.at(60), 2e-4);
  EXPECT_NEAR(s.at(80), 1e-5 + 0.5 * (2e-4 - 1e-5), 1e-15);
  EXPECT_NEAR(s.at(100), 1e-5, 1e-15);
  // A run shorter than the tail: the cosine starts after warm-up.
  s.total_iters = 50;
  EXPECT_DOUBLE_EQ(s.at(20), 2e-4);
  EXPECT_NEAR(s.at(35), 1e-5 + 0.5 * (2e-4 - 1e-5), 1e-15);
}

TEST(DfineTrain, AShortRunTrainsValidatesAndSaves) {
  libreyolo::data::SyntheticOptions o;
  o.train_images = 8;
  o.val_images = 2;
  o.width = 128;
  o.height = 128;
  o.num_classes = 2;
  o.threads = 1;
  const std::string project = libreyolo::test::temp_dir("dfine_train");
  const std::string yaml = libreyolo::data::generate_synthetic_dataset(project + "/data", o);
  libreyolo::LibreYOLO model = libreyolo::LibreYOLO::create("dfine", "s", 2, "cpu");
  const libreyolo::Kwargs kw = {{"data", yaml},       {"epochs", "1"},      {"batch", "4"},     {"imgsz", "128"},
                                {"workers", "0"},     {"device", "cpu"},    {"project", project}, {"name", "run"},
                                {"exist_ok", "true"}, {"verbose", "false"}, {"save_period", "0"}};
  const auto r = model.train(kw);
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_TRUE(std::isfinite(r.epochs[0].loss));
  EXPECT_GT(r.epochs[0].loss_term("vfl", -1), 0.0);
  EXPECT_GT(r.epochs[0].loss_term("giou", -1), 0.0);
  EXPECT_GT(r.epochs[0].loss_term("fgl", -1), 0.0);
  const fs::path last = fs::path(project) / "run" / "weights" / "last.pt";
  ASSERT_TRUE(fs::exists(last));
  const auto ck = libreyolo::io::read_checkpoint(last.string());
  EXPECT_EQ(ck.root->get("model_family")->as_string(), "dfine");
  const auto sd = libreyolo::io::to_state_dict(*ck.root->get("model"), "model");
  // The reference's key set of size s.
  const auto listing = libreyolo::test::read_state_dict_tsv("dfine_state_dict_s_nc80.tsv");
  ASSERT_EQ(sd.size(), listing.size());
  for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ(sd[i].first, listing[i].key) << i;
  // The trained weights load back as D-FINE s.
  libreyolo::LibreYOLO trained(last.string(), "cpu");
  EXPECT_EQ(trained.info().family, "dfine");
  EXPECT_EQ(trained.info().size, "s");
  EXPECT_EQ(trained.info().num_classes, 2);
}

TEST(DfineTrain, OptimizerGroupsAreTheReferences) {
  // LibreYOLO's four groups of a from-scratch s: backbone norms, biases and affine scales (144,
  // half the rate, no decay), the other backbone tensors (42), the rest's norms and biases (191, no
  // decay) and the rest (111). up and reg_scale take no gradient and join no group.
  const models::Family* f = models::find_family("dfine");
  ASSERT_NE(f, nullptr);
  auto m = f->build("s", 80);
  const auto groups = libreyolo::engine::make_param_groups(*m, 1e-4, f->param_rules, 0.5);
  ASSERT_EQ(groups.size(), 4u);
  const auto find = [&](bool decay, double ratio) -> const libreyolo::engine::ParamGroup& {
    for (const auto& g : groups)
      if (g.decay_group == decay && g.lr_ratio == ratio) return g;
    throw std::runtime_error("no such group");
  };
  EXPECT_EQ(find(false, 0.5).params.size(), 144u);
  EXPECT_EQ(find(false, 0.5).weight_decay, 0.0);
  EXPECT_EQ(find(true, 0.5).params.size(), 42u);
  EXPECT_EQ(find(true, 0.5).weight_decay, 1e-4);
  EXPECT_EQ(find(false, 1.0).params.size(), 191u);
  EXPECT_EQ(find(true, 1.0).params.size(), 111u);
  EXPECT_EQ(find(true, 1.0).weight_decay, 1e-4);
}

// A plan padded to a box count per image scores as the exact one, for D-FINE's varifocal and
// DEIM's matchability-aware class terms: the same terms and gradients (the union's pairs, the
// denoising positives, the distillation's masks with padding), with fixed shapes for two batches
// of different box counts.
class DfineLossPlan : public ::testing::TestWithParam<const char*> {};

TEST_P(DfineLossPlan, PaddedPlanScoresAsTheExactOne) {
  torch::manual_seed(0);
  auto model = std::make_shared<rtdetr::DfineModel>(narrow(3));
  model->train();
  const auto* fam = models::find_family(GetParam());
  ASSERT_NE(fam, nullptr);
  auto owned = fam->make_loss(*model);
  auto* loss = dynamic_cast<libreyolo::loss::DfineLoss*>(owned.get());
  ASSERT_NE(loss, nullptr);
  const auto x = torch::rand({3, 3, 128, 128});
  std::vector<std::vector<int64_t>> shapes;
  for (const int first : {3, 1}) {
    SCOPED_TRACE("first image with " + std::to_string(first) + " boxes");
    auto targets = torch::full({3, 4, 5}, -1.0f);
    const float rows[3][5] = {{0, 0.10f, 0.15f, 0.45f, 0.60f}, {2, 0.55f, 0.50f, 0.90f, 0.85f}, {1, 0.3f, 0.1f, 0.6f, 0.4f}};
    for (int r = 0; r < first; ++r) targets[0][r] = torch::tensor(std::vector<float>(rows[r], rows[r] + 5));
    // Image 1: no box; image 2: three, so that the denoising group's shape (set by the largest
    // count) is the same in both batches.
    targets[2][0] = torch::tensor({1.f, 0.20f, 0.30f, 0.70f, 0.75f});
    targets[2][1] = torch::tensor({0.f, 0.05f, 0.05f, 0.25f, 0.30f});
    targets[2][2] = torch::tensor({2.f, 0.60f, 0.10f, 0.95f, 0.45f});
    const auto raw = model->forward_train(x, targets);
    const auto out = rtdetr::unpack_dfine_outputs(raw);
    ASSERT_FALSE(out.dn.logits.empty());
    const auto gts = rtdetr::split_targets(targets);
    const auto exact_plan = loss->plan(out, gts);
    const auto padded_plan = loss->plan(out, gts, /*pad=*/4);
    const auto exact = loss->planned_terms(out, exact_plan);
    const auto padded = loss->planned_terms(out, padded_plan);
    ASSERT_EQ(padded.names, exact.names);
    for (size_t i = 0; i < exact.values.size(); ++i)
      EXPECT_NEAR(padded.values[i].item<double>(), exact.values[i].item<double>(),
                  1e-6 * std::max(1.0, std::abs(exact.values[i].item<double>())))
          << exact.names[i];
    std::vector<torch::Tensor> params;
    for (auto& p : model->parameters())
      if (p.requires_grad()) params.push_back(p);
    const auto ge = torch::autograd::grad({exact.total}, params, {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
    const auto gp = torch::autograd::grad({padded.total}, params, {}, /*retain_graph=*/false, false, /*allow_unused=*/true);
    int compared = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(ge[i].defined(), gp[i].defined()) << i;
      if (!ge[i].defined()) continue;
      ++compared;
      EXPECT_TRUE(torch::isfinite(gp[i]).all().item<bool>()) << i;
      const double scale = std::max(ge[i].abs().max().item<double>(), 1e-12);
      EXPECT_LE((gp[i] - ge[i]).abs().max().item<double>() / scale, 1e-5) << "parameter " << i;
    }
    EXPECT_GT(compared, 50);
    std::vector<int64_t> s;
    for (const auto& t : padded_plan.tensors()) s.insert(s.end(), t.sizes().begin(), t.sizes().end());
    shapes.push_back(s);
    EXPECT_FALSE(exact_plan.own.keep.defined());
    EXPECT_EQ(padded_plan.own.keep.sum().item<double>(), static_cast<double>(exact_plan.own.index.size(1)));
  }
  EXPECT_EQ(shapes[0], shapes[1]);
}

INSTANTIATE_TEST_SUITE_P(Families, DfineLossPlan, ::testing::Values("dfine", "deim"));
