// RT-DETR's contrastive denoising group: its layout (groups, slots, positives, the attention
// mask, label and box noise) for chosen random numbers, and against LibreYOLO 1.6.0 (the narrow
// fixture): the group built from the recorded draws, the draws of torch's generator after the
// recorded seed, and the training forward with the group decoded in front of the matching
// queries (every layer's matching and denoising outputs), packed in forward_train's layout.
#include <cmath>

#include "families/rtdetr/denoising.hpp"
#include "rtdetr_fixture.hpp"

namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::test::check_rel;

namespace {

rtdetr::ImageTargets image(std::vector<int64_t> labels, std::vector<float> cxcywh) {
  const int64_t n = static_cast<int64_t>(labels.size());
  return {torch::tensor(labels, torch::kLong), torch::tensor(cxcywh, torch::kFloat).view({n, 4})};
}

// Draws of constant value (label_u, new label, sign bit, part_u).
rtdetr::DenoisingSource constant_draws(float u, int label, float bit, float part) {
  return [=](int64_t b, int64_t n, int64_t, const torch::Device&) {
    return rtdetr::DenoisingDraws{torch::full({b, n}, u), torch::full({b, n}, label, torch::kInt),
                                  torch::full({b, n, 4}, bit), torch::full({b, n, 4}, part)};
  };
}

using libreyolo::test::recorded_draws;  // the draws the reference recorded under a prefix

}  // namespace

TEST(RtdetrDenoising, GroupLayoutAndNoise) {
  // 7 and 3 boxes: m = 7, G = 100 / 7 = 14, N = 196.
  std::vector<float> seven;
  for (int i = 0; i < 7; ++i) seven.insert(seven.end(), {0.2f + 0.08f * i, 0.5f, 0.1f, 0.2f});
  const std::vector<rtdetr::ImageTargets> gts = {
      image({0, 1, 2, 3, 4, 5, 6}, seven),
      image({9, 8, 7}, {0.3f, 0.3f, 0.2f, 0.4f, 0.7f, 0.6f, 0.4f, 0.2f, 0.5f, 0.5f, 0.8f, 0.8f})};
  const int64_t nc = 10, q = 5;
  // No flips, sign +1, u = 0.5: positives move each edge by half of half the size, negatives by 1.5.
  auto g = rtdetr::make_denoising_group(gts, nc, q, {}, constant_draws(1.0f, 0, 1.0f, 0.5f));
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->max_gt, 7);
  EXPECT_EQ(g->groups, 14);
  EXPECT_EQ(g->queries, 196);
  const std::vector<int64_t> first = {0, 1, 2, 14, 15, 16, 28, 29, 30};
  EXPECT_TRUE(torch::equal(g->positive_idx[1].narrow(0, 0, 9), torch::tensor(first)));
  EXPECT_EQ(g->positive_idx[0].size(0), 98);
  EXPECT_EQ(g->positive_idx[1].size(0), 42);
  EXPECT_TRUE(torch::equal(g->positive_gt[1].narrow(0, 0, 6), torch::tensor(std::vector<int64_t>{0, 1, 2, 0, 1, 2})));
  for (int64_t s = 0; s < 196; ++s) {
    const int64_t r = s % 14, gt = r % 7;
    const bool negative = r >= 7;
    for (int64_t b = 0; b < 2; ++b) {
      if (gt >= gts[b].size()) {  // padding: class nc, a zero box
        EXPECT_EQ(g->labels[b][s].item<int64_t>(), nc);
        EXPECT_EQ(g->boxes[b][s].abs().sum().item<double>(), 0.0);
        continue;
      }
      EXPECT_EQ(g->labels[b][s].item<int64_t>(), gts[b].labels[gt].item<int64_t>());
      const auto box = gts[b].boxes[gt];
      const auto xyxy = rtdetr::cxcywh_to_xyxy(box);
      const double f = negative ? 1.5 : 0.5;
      const auto half = torch::cat({box.narrow(0, 2, 2), box.narrow(0, 2, 2)}) * 0.5;
      const auto want = rtdetr::xyxy_to_cxcywh((xyxy + f * half).clamp(0, 1));
      EXPECT_TRUE(torch::allclose(g->boxes[b][s], want, 0, 1e-6)) << b << " " << s;
    }
  }
  EXPECT_TRUE(torch::allclose(g->box_unact, rtdetr::inverse_sigmoid(g->boxes)));
  // The mask: matching rows see no denoising column, each group only itself and the matching queries.
  const auto mask = g->attn_mask;
  ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{201, 201}));
  auto blocked = [&](int64_t i, int64_t j) {
    if (j >= 196) return false;
    if (i >= 196) return true;
    return i / 14 != j / 14;
  };
  int64_t wrong = 0;
  const auto m = mask.accessor<bool, 2>();
  for (int64_t i = 0; i < 201; ++i)
    for (int64_t j = 0; j < 201; ++j) wrong += m[i][j] != blocked(i, j);
  EXPECT_EQ(wrong, 0);

  // Every draw below the flip probability: real slots take the new label, padding keeps nc.
  g = rtdetr::make_denoising_group(gts, nc, q, {}, constant_draws(0.0f, 4, 0.0f, 0.0f));
  EXPECT_EQ(g->labels[0].eq(4).sum().item<int64_t>(), 196);
  EXPECT_EQ(g->labels[1].eq(4).sum().item<int64_t>(), 84);
  EXPECT_EQ(g->labels[1].eq(nc).sum().item<int64_t>(), 196 - 84);
  // Label noise off: no flip even with draws of 0; u = 0 leaves the positives exactly in place.
  rtdetr::DenoisingOptions quiet;
  quiet.label_noise = 0;
  g = rtdetr::make_denoising_group(gts, nc, q, quiet, constant_draws(0.0f, 4, 0.0f, 0.0f));
  EXPECT_EQ(g->labels[0][0].item<int64_t>(), 0);
  EXPECT_TRUE(torch::allclose(g->boxes[0][3], gts[0].boxes[3], 0, 1e-6));

  // More boxes than denoising queries: one group of 2m.
  std::vector<int64_t> many(120, 1);
  std::vector<float> boxes;
  for (int i = 0; i < 120; ++i) boxes.insert(boxes.end(), {0.5f, 0.5f, 0.1f, 0.1f});
  g = rtdetr::make_denoising_group({image(many, boxes)}, nc, q, {}, constant_draws(1.0f, 0, 1.0f, 0.5f));
  EXPECT_EQ(g->groups, 1);
  EXPECT_EQ(g->queries, 240);
  // No box in the batch, or no denoising queries wanted: no group.
  const std::vector<rtdetr::ImageTargets> empty = {image({}, {}), image({}, {})};
  EXPECT_FALSE(rtdetr::make_denoising_group(empty, nc, q, {}).has_value());
  rtdetr::DenoisingOptions off;
  off.count = 0;
  EXPECT_FALSE(rtdetr::make_denoising_group(gts, nc, q, off).has_value());
}

TEST(RtdetrDenoising, GroupFromTheRecordedDrawsEqualsTheReference) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  for (const std::string prefix : {"cdn", "cdn_bg"}) {
    SCOPED_TRACE(prefix);
    auto gts = f.targets();
    if (prefix == "cdn_bg") gts[1] = {torch::zeros({0}, torch::kLong), torch::zeros({0, 4})};
    const auto g = rtdetr::make_denoising_group(gts, 80, 300, {}, recorded_draws(f, prefix));
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(g->groups, f.expected(prefix + ".num_group").item<int64_t>());
    const auto split = f.expected(prefix + ".num_split");
    EXPECT_EQ(g->queries, split[0].item<int64_t>());
    EXPECT_EQ(300, split[1].item<int64_t>());
    EXPECT_TRUE(torch::equal(g->labels, f.expected(prefix + ".noised_labels").to(torch::kLong)));
    check_rel(prefix + ".query_bbox_unact", g->box_unact, f.expected(prefix + ".query_bbox_unact"), 1e-6);
    // The mask of the background batch was not stored: its largest GT count is the same.
    EXPECT_TRUE(torch::equal(g->attn_mask, f.expected("cdn.attn_mask")));
    for (int b = 0; b < 2; ++b) {
      const auto idx = f.expected(prefix + ".positive_idx.img" + std::to_string(b));
      EXPECT_TRUE(torch::equal(g->positive_idx[b], idx)) << b;
      if (prefix != "cdn") continue;
      const std::string m = "match_dn.dn.img" + std::to_string(b) + ".";
      EXPECT_TRUE(torch::equal(g->positive_idx[b], f.expected(m + "pred")));
      EXPECT_TRUE(torch::equal(g->positive_gt[b], f.expected(m + "gt")));
    }
    if (prefix == "cdn") {
      const auto embed = f.model->decoder->denoising_class_embed->forward(g->labels);
      check_rel("cdn.query_class_embed", embed, f.expected("cdn.query_class_embed"), 0.0);
    }
  }
}

// The reference draws from torch's global generator right after the recorded seed: the default
// source does the same, in the same order, so an unmodified forward reproduces its group.
TEST(RtdetrDenoising, GlobalGeneratorDrawsMatchTheReferenceAfterItsSeed) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  torch::manual_seed(f.expected("cdn.seed").item<int64_t>());
  const auto d = rtdetr::global_generator_draws(2, 196, 80, torch::kCPU);
  EXPECT_TRUE(torch::equal(d.label_u, f.expected("cdn.rand_label_u")));
  EXPECT_TRUE(torch::equal(d.new_label, f.expected("cdn.rand_new_label")));
  EXPECT_TRUE(torch::equal(d.sign_bits, f.expected("cdn.rand_sign_bits")));
  EXPECT_TRUE(torch::equal(d.part_u, f.expected("cdn.rand_part_u")));
  EXPECT_EQ(d.new_label.scalar_type(), torch::kInt);
}

TEST(RtdetrDenoising, TrainForwardWithDenoisingEqualsTheReference) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  const double bound = 1e-4;
  f.model->train();
  f.model->set_denoising_source(recorded_draws(f, "cdn"));
  const auto t = f.model->forward_train_outputs(f.input(), f.targets());
  ASSERT_TRUE(t.denoising.has_value());
  ASSERT_EQ(t.logits.size(), 3u);
  ASSERT_EQ(t.dn_logits.size(), 3u);
  // The matching queries as the reference ordered them (libreyolo::test::recorded_query_order).
  const auto order = libreyolo::test::recorded_query_order(t.enc_topk_boxes, t.enc_topk_logits,
                                                           f.expected("train_dn.aux_outputs.2.pred_boxes"),
                                                           f.expected("train_dn.aux_outputs.2.pred_logits"), bound);
  const auto want = [&](const std::string& key) { return libreyolo::test::in_order(f.expected(key), order); };
  check_rel("train_dn.pred_logits", t.logits[2], want("train_dn.pred_logits"), bound);
  check_rel("train_dn.pred_boxes", t.boxes[2], want("train_dn.pred_boxes"), bound);
  std::vector<torch::Tensor> aux_logits = {t.logits[0], t.logits[1], t.enc_topk_logits};
  std::vector<torch::Tensor> aux_boxes = {t.boxes[0], t.boxes[1], t.enc_topk_boxes};
  for (int l = 0; l < 3; ++l) {
    const std::string a = "train_dn.aux_outputs." + std::to_string(l) + ".";
    check_rel(a + "pred_logits", aux_logits[l], want(a + "pred_logits"), bound);
    check_rel(a + "pred_boxes", aux_boxes[l], want(a + "pred_boxes"), bound);
    const std::string d = "train_dn.dn_aux_outputs." + std::to_string(l) + ".";
    check_rel(d + "pred_logits", t.dn_logits[l], f.expected(d + "pred_logits"), bound);
    check_rel(d + "pred_boxes", t.dn_boxes[l], f.expected(d + "pred_boxes"), bound);
  }
  // The mask keeps the matching queries blind to the denoising ones: their outputs are those of
  // the forward without denoising.
  check_rel("matching logits with vs without denoising", t.logits[2], want("train_nodn.pred_logits"), 1e-5);

  // The denoising embedding learns from the denoising outputs, its padding row never.
  t.dn_logits[2].sum().backward();
  const auto g = f.model->decoder->denoising_class_embed->weight.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g.narrow(0, 0, 80).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(g[80].abs().sum().item<double>(), 0.0);
}

TEST(RtdetrDenoising, ForwardTrainPacksTheCriterionInputs) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = libreyolo::test::load_rtdetr_fixture(dir);
  f.model->train();
  f.model->set_denoising_source(recorded_draws(f, "cdn"));
  const auto raw = f.model->forward_train(f.input(), f.expected("targets_padded"));
  ASSERT_EQ(raw.size(), 4u + 2 * 3 + 2 * 3 + 1);
  EXPECT_TRUE(torch::equal(raw[2], torch::tensor(std::vector<int64_t>{320, 320})));
  EXPECT_TRUE(torch::equal(raw[3], torch::tensor(std::vector<int64_t>{3, 3, 14})));
  const auto in = rtdetr::unpack_train_outputs(raw);
  EXPECT_EQ(in.input_h, 320);
  EXPECT_EQ(in.aux.size(), 3u);
  ASSERT_EQ(in.dn.size(), 3u);
  EXPECT_EQ(in.dn_groups, 14);
  ASSERT_EQ(in.dn_pairs.sizes(), (std::vector<int64_t>{140, 3}));
  // Image 1's pairs: the recorded positive slots and their GTs.
  const auto rows = in.dn_pairs.narrow(0, 98, 42);
  EXPECT_TRUE(rows.select(1, 0).eq(1).all().item<bool>());
  EXPECT_TRUE(torch::equal(rows.select(1, 1), f.expected("match_dn.dn.img1.pred")));
  EXPECT_TRUE(torch::equal(rows.select(1, 2), f.expected("match_dn.dn.img1.gt")));
  check_rel("packed dn layer 2 logits", in.dn[2].logits, f.expected("train_dn.dn_aux_outputs.2.pred_logits"), 1e-4);
  const auto order = libreyolo::test::recorded_query_order(in.aux[2].boxes, in.aux[2].logits,
                                                           f.expected("train_dn.aux_outputs.2.pred_boxes"),
                                                           f.expected("train_dn.aux_outputs.2.pred_logits"), 1e-4);
  check_rel("packed encoder top-k boxes", in.aux[2].boxes,
            libreyolo::test::in_order(f.expected("train_dn.aux_outputs.2.pred_boxes"), order), 1e-4);
  // Without targets: no denoising entries; in eval mode forward_raw's three entries.
  const auto plain = f.model->forward_train(f.input(), {});
  EXPECT_EQ(plain.size(), 4u + 2 * 3);
  EXPECT_TRUE(rtdetr::unpack_train_outputs(plain).dn.empty());
  f.model->eval();
  torch::NoGradGuard no_grad;
  EXPECT_EQ(f.model->forward_train(f.input(), f.expected("targets_padded")).size(), 3u);
  EXPECT_ANY_THROW(rtdetr::unpack_train_outputs(f.model->forward_raw(f.input())));
}
