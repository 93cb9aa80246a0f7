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

// A plan padded to a box count per image scores as the exact one: the same terms and gradients,
// for RT-DETR (denoising, an image without boxes) and RT-DETRv2's class-agnostic encoder level;
// its index, target and weight tensors have the same shapes for batches with different box
// counts, so that the scoring can be replayed from a graph.
namespace {

struct PlanCase {
  const char* name;
  bool v2;
};

rtdetr::Config tiny_config(bool v2) {
  rtdetr::Config c = v2 ? rtdetr::v2_size_config("r18", 5) : rtdetr::Config{};
  c.size.clear();
  c.depth = 18;
  c.stem = 8;
  c.stages = {8, 16, 32, 64};
  c.hidden = c.dec_hidden = 32;
  c.enc_ffn = c.dec_ffn = 64;
  c.queries = 20;
  c.nc = 5;
  c.denoising = 12;
  if (v2) {
    c.v2.anchor_size = 128;
    c.v2.query_select = rtdetr::QuerySelect::Agnostic;
  }
  return c;
}

// Three images: 3 boxes, none, 1 box (normalised xyxy rows, class -1 padding).
torch::Tensor plan_targets(int64_t first_count) {
  auto t = torch::full({3, 4, 5}, -1.0f);
  const float rows[4][5] = {{0, 0.1f, 0.1f, 0.3f, 0.4f}, {3, 0.5f, 0.2f, 0.9f, 0.6f}, {4, 0.2f, 0.6f, 0.4f, 0.9f},
                            {1, 0.3f, 0.3f, 0.7f, 0.8f}};
  for (int64_t r = 0; r < first_count; ++r)
    for (int k = 0; k < 5; ++k) t[0][r][k] = rows[r][k];
  for (int k = 0; k < 5; ++k) t[2][0][k] = rows[3][k];
  return t;
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> g;
  for (auto& p : m.parameters()) {
    g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    p.mutable_grad() = torch::Tensor();
  }
  return g;
}

}  // namespace

class RtdetrLossPlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(RtdetrLossPlan, PaddedPlanScoresAsTheExactOne) {
  torch::manual_seed(0);
  rtdetr::RtdetrModel model(tiny_config(GetParam().v2));
  model.train();
  RtdetrLoss loss(5);
  const auto x = torch::rand({3, 3, 64, 64});
  std::vector<int64_t> shapes_seen;
  for (const int64_t first : {3, 2}) {
    SCOPED_TRACE("first image with " + std::to_string(first) + " boxes");
    const auto targets = plan_targets(first);
    torch::manual_seed(1);  // the same denoising draws for both forwards
    const auto raw = model.forward_train(x, targets);
    const auto in = rtdetr::unpack_train_outputs(raw);
    ASSERT_FALSE(in.dn.empty());
    ASSERT_EQ(in.enc.size(), GetParam().v2 ? 1u : 0u);
    const auto gts = rtdetr::split_targets(targets);
    const auto exact_plan = loss.plan(in, gts);
    const auto padded_plan = loss.plan(in, gts, /*pad=*/12);
    const auto exact = loss.planned_terms(in, exact_plan);
    exact.total.backward(torch::Tensor(), /*retain_graph=*/true);
    const auto exact_grads = grads_of(model);
    const auto padded = loss.planned_terms(in, padded_plan);
    padded.total.backward();
    const auto padded_grads = grads_of(model);

    ASSERT_EQ(padded.names, exact.names);
    for (size_t i = 0; i < exact.values.size(); ++i)
      EXPECT_NEAR(padded.values[i].item<double>(), exact.values[i].item<double>(),
                  1e-6 * std::max(1.0, std::abs(exact.values[i].item<double>())))
          << exact.names[i];
    EXPECT_GT(exact.value("loss_giou").item<double>(), 0.0);
    int compared = 0;
    for (size_t i = 0; i < exact_grads.size(); ++i) {
      ASSERT_EQ(exact_grads[i].defined(), padded_grads[i].defined()) << i;
      if (!exact_grads[i].defined()) continue;
      ++compared;
      EXPECT_TRUE(torch::isfinite(padded_grads[i]).all().item<bool>()) << i;
      const double scale = std::max(exact_grads[i].abs().max().item<double>(), 1e-12);
      EXPECT_LE((padded_grads[i] - exact_grads[i]).abs().max().item<double>() / scale, 1e-5) << "parameter " << i;
    }
    EXPECT_GT(compared, 50);

    // Every pair block is B pad wide whatever the boxes; the padding is weighted 0.
    for (const auto& g : padded_plan.groups) {
      EXPECT_EQ(g.pairs.per_level, 3 * 12);
      EXPECT_EQ(g.pairs.index.size(1), static_cast<int64_t>(g.levels.size()) * 3 * 12);
      ASSERT_TRUE(g.pairs.keep.defined());
      shapes_seen.push_back(g.pairs.index.size(1));
    }
    EXPECT_EQ(padded_plan.targets[0].labels.size(0), 3 * 12);
    // Of the matched levels' pairs, as many carry weight as the exact plan has pairs.
    EXPECT_EQ(padded_plan.groups[0].pairs.keep.sum().item<double>(),
              static_cast<double>(exact_plan.groups[0].pairs.index.size(1)));
    EXPECT_FALSE(exact_plan.groups[0].pairs.keep.defined());
  }
  // The second batch's plan has the first's shapes.
  ASSERT_EQ(shapes_seen.size() % 2, 0u);
  const size_t half = shapes_seen.size() / 2;
  for (size_t i = 0; i < half; ++i) EXPECT_EQ(shapes_seen[i], shapes_seen[half + i]);
  // An image with more boxes than the room asked for makes the room larger, never drops a box.
  const auto targets = plan_targets(3);
  const auto raw = model.forward_train(x, targets);
  const auto in = rtdetr::unpack_train_outputs(raw);
  const auto small = loss.plan(in, rtdetr::split_targets(targets), /*pad=*/2);
  EXPECT_EQ(small.targets[0].pad, 3);
}

INSTANTIATE_TEST_SUITE_P(Families, RtdetrLossPlan, ::testing::Values(PlanCase{"rtdetr", false}, PlanCase{"rtdetrv2", true}),
                         [](const ::testing::TestParamInfo<PlanCase>& i) { return std::string(i.param.name); });
