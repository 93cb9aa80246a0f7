// RT-DETRv2 parity with LibreYOLO 1.6.0 on the CPU, from tests/data/rtdetrv2_r18narrow_nc20_s320
// (tests/python/make_rtdetrv2_fixture.py: the r18 topology at reduced widths, 20 classes, 4/3/2
// sampling points on the three levels, anchors for its 320 input): the weights load strictly into
// a network built from their shapes; the eval forward (query selection from the anchor buffers,
// predictions); the attention core with bilinear and discrete sampling; the training-mode forward
// without and with (recorded) denoising queries, every level's matches, every loss term (the
// encoder's "_enc_0" included) and 20 gradients.
//
// Bounds: the network runs in float32 and the reference sums in other orders (convolutions,
// matrix products, reductions over up to 2100 tokens), each step adding a relative error of a
// few float32 epsilons (1.2e-7) that the deformable sampling and 3 decoder layers amplify to
// about 1e-6 of the largest value: 1e-4 leaves two orders of magnitude on any x86-64 CPU (SSE,
// AVX2 or AVX-512 kernels), as for RT-DETR's parity. The same bound holds for each loss term (sums
// of the same outputs); gradients pass back through the whole network once more and through
// IoU/GIoU ratios of small boxes: 1e-3. The attention core alone is one weighted sum: 1e-5.
#include "rtdetr_fixture.hpp"
#include "fold_check.hpp"

using libreyolo::test::check_rel;
using libreyolo::test::rel_err;
namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::loss::RtdetrLoss;

namespace {

constexpr double kEvalBound = 1e-4;
constexpr double kLossBound = 1e-4;
constexpr double kGradBound = 1e-3;
constexpr double kCoreBound = 1e-5;
constexpr int kClasses = 20;

libreyolo::test::RtdetrFixture load_fixture() {
  return libreyolo::test::load_rtdetr_fixture_files(std::string(LIBREYOLO_SOURCE_DIR) +
                                                    "/tests/data/rtdetrv2_r18narrow_nc20_s320");
}

// The matches of every level (last, aux 0, aux 1, encoder) in the reference's query order.
void expect_matches(const libreyolo::test::RtdetrFixture& f, const std::string& tag,
                    const libreyolo::loss::RtdetrLossTerms& t, const torch::Tensor& order) {
  ASSERT_EQ(t.matches.size(), 4u);
  for (size_t l = 0; l < 4; ++l)
    for (int b = 0; b < 2; ++b) {
      const std::string p = "match_" + tag + ".level" + std::to_string(l) + ".img" + std::to_string(b) + ".";
      const auto [query, by] = order[b].index_select(0, t.matches[l][b].query).sort();
      EXPECT_TRUE(torch::equal(query, f.expected(p + "pred"))) << p;
      EXPECT_TRUE(torch::equal(t.matches[l][b].gt.index_select(0, by), f.expected(p + "gt"))) << p;
    }
}

// Training-mode outputs of the matching queries (every layer, the encoder level) against the
// recorded ones under train_<tag>; returns our query order in the reference's.
torch::Tensor expect_train_outputs(const libreyolo::test::RtdetrFixture& f, const std::string& tag,
                                   const rtdetr::CriterionInputs& in) {
  const std::string r = "train_" + tag + ".";
  EXPECT_EQ(in.aux.size(), 2u);
  EXPECT_EQ(in.enc.size(), 1u);
  const auto order = libreyolo::test::recorded_query_order(
      in.enc[0].boxes, in.enc[0].logits, f.expected(r + "enc_aux_outputs.0.pred_boxes"),
      f.expected(r + "enc_aux_outputs.0.pred_logits"), kEvalBound);
  const auto want = [&](const std::string& key) { return libreyolo::test::in_order(f.expected(r + key), order); };
  check_rel(tag + " pred_logits", in.last.logits, want("pred_logits"), kEvalBound);
  check_rel(tag + " pred_boxes", in.last.boxes, want("pred_boxes"), kEvalBound);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "aux_outputs." + std::to_string(l) + ".";
    check_rel(tag + " " + p + "pred_logits", in.aux[l].logits, want(p + "pred_logits"), kEvalBound);
    check_rel(tag + " " + p + "pred_boxes", in.aux[l].boxes, want(p + "pred_boxes"), kEvalBound);
  }
  check_rel(tag + " encoder logits", in.enc[0].logits, want("enc_aux_outputs.0.pred_logits"), kEvalBound);
  check_rel(tag + " encoder boxes", in.enc[0].boxes, want("enc_aux_outputs.0.pred_boxes"), kEvalBound);
  return order;
}

}  // namespace

TEST(RtdetrV2Parity, WeightsLoadStrictlyIntoANetworkOfTheirWidths) {
  auto f = load_fixture();
  EXPECT_EQ(f.checkpoint->get("model_family")->as_string(), "rtdetrv2");
  EXPECT_EQ(f.cfg.family, "rtdetrv2");
  EXPECT_EQ(f.cfg.stem, 8);
  EXPECT_EQ(f.cfg.stages, (std::array<int64_t, 4>{8, 16, 32, 64}));
  EXPECT_EQ(f.cfg.hidden, 32);
  EXPECT_EQ(f.cfg.dec_hidden, 32);
  EXPECT_EQ(f.cfg.enc_ffn, 64);
  EXPECT_EQ(f.cfg.dec_ffn, 64);
  EXPECT_EQ(f.cfg.dec_layers, 3);
  EXPECT_EQ(f.cfg.nc, kClasses);
  EXPECT_EQ(f.cfg.v2.level_points, (std::vector<int>{4, 3, 2}));
  EXPECT_EQ(f.cfg.v2.anchor_size, 320);
  EXPECT_TRUE(f.cfg.v2.named_enc_output);
  EXPECT_FALSE(f.cfg.v2.ffn_clamp);
  EXPECT_TRUE(f.cfg.v2.enc_aux_level);
  EXPECT_EQ(f.cfg.size, "");  // r18's topology, not its widths
  const auto mine = models::state_dict(*f.model);
  ASSERT_EQ(mine.size(), f.weights.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, f.weights[i].first);
    EXPECT_TRUE(torch::equal(mine[i].second, f.weights[i].second)) << mine[i].first;
  }
  // The family recognises these weights as RT-DETRv2's, not RT-DETR's.
  EXPECT_EQ(models::detect_family(f.weights), models::find_family("rtdetrv2"));
}

TEST(RtdetrV2Parity, EvalQuerySelectionAndPredictions) {
  auto f = load_fixture();
  torch::NoGradGuard no_grad;
  const libreyolo::test::FoldSwitch unfolded(false);  // the reference's op order (top-k scores 6e-6 apart)
  const auto t = f.model->forward_trace(f.input());
  // At the anchors' input size the buffers are read: the recorded anchors and mask.
  EXPECT_TRUE(torch::equal(t.selection.anchors, f.expected("eval.anchors")));
  EXPECT_TRUE(torch::equal(t.selection.valid, f.expected("eval.valid_mask")));
  // The top-k boundary and the scores within it are 5e-4 and 9e-6 apart: the same queries in
  // the same order.
  EXPECT_TRUE(torch::equal(t.selection.topk_ind, f.expected("eval.topk_ind")));
  check_rel("selected encoder logits", t.selection.topk_logits, f.expected("eval.topk_logits"), kEvalBound);
  check_rel("pred_logits", t.pred_logits, f.expected("eval.pred_logits"), kEvalBound);
  check_rel("pred_boxes", t.pred_boxes, f.expected("eval.pred_boxes"), kEvalBound);
  const auto raw = f.model->forward_raw(f.input());
  EXPECT_TRUE(torch::equal(raw[0], t.pred_logits));
}

TEST(RtdetrV2Parity, AttentionCoreBilinearAndDiscrete) {
  auto f = load_fixture();
  const auto shapes_t = f.expected("discrete.shapes");
  rtdetr::LevelShapes shapes;
  for (int64_t l = 0; l < shapes_t.size(0); ++l)
    shapes.push_back({shapes_t[l][0].item<int64_t>(), shapes_t[l][1].item<int64_t>()});
  const std::vector<int64_t> points = {4, 3, 2};
  const auto value = f.expected("discrete.value"), loc = f.expected("discrete.locations");
  const auto w = f.expected("discrete.weights");
  check_rel("bilinear core", rtdetr::deformable_attention_core(value, shapes, loc, w, points, rtdetr::Sampling::Bilinear),
            f.expected("bilinear.out"), kCoreBound);
  // Discrete sampling reads whole cells (locations a fifth of a cell or more from any edge, some
  // outside the maps): the same cells, so the same sums up to their order.
  const auto discrete = rtdetr::deformable_attention_core(value, shapes, loc, w, points, rtdetr::Sampling::Discrete);
  check_rel("discrete core", discrete, f.expected("discrete.out"), kCoreBound);
  EXPECT_GT(rel_err(discrete, f.expected("bilinear.out")), 1e-2) << "the two samplings should differ";
}

TEST(RtdetrV2Parity, TrainingWithoutDenoising) {
  auto f = load_fixture();
  f.model->train();
  const auto raw = f.model->forward_train(f.input(), {});
  EXPECT_EQ(raw[3].numel(), 4);  // the encoder level counted on its own
  const auto in = rtdetr::unpack_train_outputs(raw);
  EXPECT_TRUE(in.dn.empty());
  const auto order = expect_train_outputs(f, "nodn", in);
  RtdetrLoss loss(kClasses);
  const auto t = loss.terms(in, f.targets());
  // 3 terms of the last layer, of each of the 2 auxiliary layers and of the encoder level.
  libreyolo::test::expect_loss_terms(f, "loss_nodn", t, 12, kLossBound);
  EXPECT_EQ(t.names.back(), "loss_giou_enc_0");
  expect_matches(f, "nodn", t, order);
  t.total.backward();
  // The encoder's proposal heads learn from the "_enc_0" terms only: their recorded gradients.
  libreyolo::test::expect_gradients(f, "grad_nodn", *f.model, 20, kGradBound);
}

TEST(RtdetrV2Parity, TrainingWithDenoising) {
  auto f = load_fixture();
  f.model->train();
  f.model->set_denoising_source(libreyolo::test::recorded_draws(f, "cdn"));
  const auto raw = f.model->forward_train(f.input(), f.expected("targets_padded"));
  const auto in = rtdetr::unpack_train_outputs(raw);
  EXPECT_EQ(in.dn_groups, f.expected("cdn.num_group").item<int64_t>());
  const auto order = expect_train_outputs(f, "dn", in);
  ASSERT_EQ(in.dn.size(), 3u);
  for (int l = 0; l < 3; ++l) {
    const std::string p = "train_dn.dn_aux_outputs." + std::to_string(l) + ".";
    check_rel(p + "pred_logits", in.dn[l].logits, f.expected(p + "pred_logits"), kEvalBound);
    check_rel(p + "pred_boxes", in.dn[l].boxes, f.expected(p + "pred_boxes"), kEvalBound);
  }
  RtdetrLoss loss(kClasses);
  const auto t = loss.terms(in, f.targets());
  libreyolo::test::expect_loss_terms(f, "loss_dn", t, 21, kLossBound);
  expect_matches(f, "dn", t, order);
  ASSERT_EQ(t.dn_matches.size(), 2u);
  for (int b = 0; b < 2; ++b) {
    const std::string p = "match_dn.dn.img" + std::to_string(b) + ".";
    EXPECT_TRUE(torch::equal(t.dn_matches[b].query, f.expected(p + "pred"))) << p;
    EXPECT_TRUE(torch::equal(t.dn_matches[b].gt, f.expected(p + "gt"))) << p;
  }
  t.total.backward();
  libreyolo::test::expect_gradients(f, "grad_dn", *f.model, 20, kGradBound);
}
