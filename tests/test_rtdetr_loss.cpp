// RT-DETR's criterion against LibreYOLO 1.6.0 (the narrow fixture): every loss term (varifocal,
// L1, GIoU of the last layer, the auxiliary decoder layers, the encoder top-k and the denoising
// groups) and the gradients of their sum for 20 parameters, with denoising off and on, and for a
// batch whose second image has no box; the TrainingLoss interface's summed terms; a batch
// without any box.
#include <cmath>
#include <map>

#include "families/rtdetr/loss.hpp"
#include "rtdetr_fixture.hpp"

namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::loss::RtdetrLoss;
using libreyolo::loss::RtdetrLossTerms;
using libreyolo::test::check_rel;
using libreyolo::test::rel_err;

namespace {

constexpr double kLossBound = 1e-4;  // relative, per term
constexpr double kGradBound = 1e-3;  // relative (max |d| / max |want|), per parameter

using libreyolo::test::recorded_draws;

void expect_terms(const libreyolo::test::RtdetrFixture& f, const std::string& prefix, const RtdetrLossTerms& t,
                  size_t count) {
  libreyolo::test::expect_loss_terms(f, prefix, t, count, kLossBound);
}

void expect_grads(const libreyolo::test::RtdetrFixture& f, const std::string& prefix, torch::nn::Module& model) {
  libreyolo::test::expect_gradients(f, prefix, model, 20, kGradBound);
}

// Every level's matches against the recorded ones, in the reference's query order (training
// mode can order two near-tied queries the other way round: test::recorded_query_order, from the
// encoder top-k of `in` against the `recorded` forward's).
void expect_matches(const libreyolo::test::RtdetrFixture& f, const std::string& prefix, const RtdetrLossTerms& t,
                    const rtdetr::CriterionInputs& in, const std::string& recorded) {
  const auto order = libreyolo::test::recorded_query_order(
      in.aux.back().boxes, in.aux.back().logits, f.expected(recorded + ".aux_outputs.2.pred_boxes"),
      f.expected(recorded + ".aux_outputs.2.pred_logits"), kLossBound);
  ASSERT_EQ(t.matches.size(), 4u);
  for (size_t l = 0; l < 4; ++l)
    for (int b = 0; b < 2; ++b) {
      const std::string p = prefix + ".level" + std::to_string(l) + ".img" + std::to_string(b) + ".";
      const auto [query, by] = order[b].index_select(0, t.matches[l][b].query).sort();
      EXPECT_TRUE(torch::equal(query, f.expected(p + "pred"))) << p;
      EXPECT_TRUE(torch::equal(t.matches[l][b].gt.index_select(0, by), f.expected(p + "gt"))) << p;
    }
}

}  // namespace

TEST(RtdetrLoss, EveryTermAndGradientWithoutDenoising) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->train();
  const auto raw = f.model->forward_train(f.input(), {});
  RtdetrLoss loss(80);
  const auto in = rtdetr::unpack_train_outputs(raw);
  const auto t = loss.terms(in, f.targets());
  expect_terms(f, "loss_nodn", t, 12);
  expect_matches(f, "match_nodn", t, in, "train_nodn");
  EXPECT_TRUE(t.dn_matches.empty());
  EXPECT_EQ(t.num_boxes.item<double>(), 10.0);
  t.total.backward();
  expect_grads(f, "grad_nodn", *f.model);
}

TEST(RtdetrLoss, EveryTermAndGradientWithDenoising) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->train();
  f.model->set_denoising_source(recorded_draws(f, "cdn"));
  const auto raw = f.model->forward_train(f.input(), f.expected("targets_padded"));
  RtdetrLoss loss(80);
  const auto in = rtdetr::unpack_train_outputs(raw);
  const auto t = loss.terms(in, f.targets());
  expect_terms(f, "loss_dn", t, 21);
  expect_matches(f, "match_dn", t, in, "train_dn");
  ASSERT_EQ(t.dn_matches.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    const std::string p = "match_dn.dn.img" + std::to_string(b) + ".";
    EXPECT_TRUE(torch::equal(t.dn_matches[b].query, f.expected(p + "pred"))) << p;
    EXPECT_TRUE(torch::equal(t.dn_matches[b].gt, f.expected(p + "gt"))) << p;
  }
  t.total.backward();
  expect_grads(f, "grad_dn", *f.model);
}

// Image 1 without boxes: it has denoising slots (all padding) but no positives and no matches.
TEST(RtdetrLoss, ImageWithoutBoxes) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->train();
  f.model->set_denoising_source(recorded_draws(f, "cdn_bg"));
  auto targets = f.expected("targets_padded").clone();
  targets[1].zero_();
  targets[1].select(1, 0).fill_(-1);
  const auto raw = f.model->forward_train(f.input(), targets);
  const auto in = rtdetr::unpack_train_outputs(raw);
  check_rel("train_dn_bg dn last logits", in.dn.back().logits,
            f.expected("train_dn_bg.dn_aux_outputs.last.pred_logits"), kLossBound);
  RtdetrLoss loss(80);
  const auto gts = rtdetr::split_targets(targets);
  ASSERT_EQ(gts[1].size(), 0);
  const auto t = loss.terms(in, gts);
  expect_terms(f, "loss_dn_bg", t, 21);
  expect_matches(f, "match_dn_bg", t, in, "train_nodn");
  EXPECT_EQ(t.dn_matches[1].size(), 0);
  EXPECT_EQ(t.num_boxes.item<double>(), 7.0);
}

// The engine's view: compute() on forward_train's vector gives the total and the terms summed
// by kind over every level (vfl, bbox, giou), and matched queries per image.
TEST(RtdetrLoss, DetectionLossInterfaceSumsTheTermsByKind) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->train();
  f.model->set_denoising_source(recorded_draws(f, "cdn"));
  const auto targets = f.expected("targets_padded");
  const auto raw = f.model->forward_train(f.input(), targets);
  RtdetrLoss loss(80);
  const auto out = loss.compute(raw, targets, 320, 320);
  ASSERT_NE(out.names, nullptr);
  EXPECT_EQ(*out.names, (std::vector<std::string>{"vfl", "bbox", "giou"}));
  ASSERT_EQ(out.terms.numel(), 3);
  EXPECT_FALSE(out.terms.requires_grad());
  EXPECT_TRUE(out.total.requires_grad());
  const double want_total = f.expected("loss_dn.total_loss").item<double>();
  EXPECT_NEAR(out.total.item<double>(), want_total, kLossBound * want_total);
  EXPECT_NEAR(out.terms.sum().item<double>(), out.total.item<double>(), 1e-5 * want_total);
  for (const std::string kind : {"vfl", "bbox", "giou"}) {
    double want = 0;
    for (const auto& [key, value] : f.expect->dict) {
      const std::string name = key->as_string();
      if (name == "loss_dn.loss_" + kind || name.rfind("loss_dn.loss_" + kind + "_", 0) == 0)
        want += value->tensor.item<double>();
    }
    EXPECT_NEAR(out.term(kind).item<double>(), want, kLossBound * want) << kind;
  }
  EXPECT_EQ(out.num_fg.item<double>(), 5.0);  // 10 boxes matched over 2 images
  // A vector that is not the training layout is refused.
  f.model->eval();
  torch::NoGradGuard no_grad;
  EXPECT_ANY_THROW(loss.compute(f.model->forward_raw(f.input()), targets, 320, 320));
}

// A batch without any box: no denoising, no matches; the box terms are zero (with a gradient
// path), the class terms push every score down.
TEST(RtdetrLoss, BatchWithoutBoxes) {
  rtdetr::Config cfg;
  cfg.depth = 18;
  cfg.stem = 8;
  cfg.stages = {8, 16, 32, 64};
  cfg.hidden = cfg.dec_hidden = 32;
  cfg.enc_ffn = cfg.dec_ffn = 64;
  cfg.queries = 20;
  cfg.nc = 5;
  torch::manual_seed(0);
  rtdetr::RtdetrModel model(cfg);
  model.train();
  auto targets = torch::zeros({2, 4, 5});
  targets.select(2, 0).fill_(-1);
  const auto raw = model.forward_train(torch::rand({2, 3, 64, 64}), targets);
  EXPECT_EQ(raw.size(), 4u + 2 * 3);  // no denoising entries
  RtdetrLoss loss(5);
  const auto out = loss.compute(raw, targets, 64, 64);
  EXPECT_GT(out.term("vfl").item<double>(), 0.0);
  EXPECT_EQ(out.term("bbox").item<double>(), 0.0);
  EXPECT_EQ(out.term("giou").item<double>(), 0.0);
  EXPECT_EQ(out.num_fg.item<double>(), 0.0);
  EXPECT_TRUE(std::isfinite(out.total.item<double>()));
  out.total.backward();
  const auto g = model.decoder->dec_score_head[2]->bias.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g.min().item<double>(), 0.0);  // every logit pushed down
}
