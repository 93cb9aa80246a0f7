// RT-DETR network structure and its parts: state-dict names and shapes of every size (PResNet and
// HGNetv2) against LibreYOLO 1.6.0's (tests/data/rtdetr_state_dict_*_nc80.tsv), parameter counts,
// the configuration read
// back from weights, the reference initialisation, anchors, the transposed position embedding,
// the deformable-attention sampling, the class-count change and the flat top-k postprocess.
#include <cmath>

#include "families/rtdetr/model.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::io::StateDict;

namespace {

StateDict reference_state_dict(const std::string& size) { return libreyolo::test::reference_state_dict_tsv(std::string("rtdetr_state_dict_") + size + "_nc80.tsv"); }

const torch::Tensor& param(const StateDict& sd, const std::string& key) { return libreyolo::test::state_dict_entry(sd, key); }

}  // namespace

TEST(RtdetrModel, StateDictEqualsTheReferenceForEverySize) {
  for (const auto& size : rtdetr::size_names()) {
    SCOPED_TRACE(size);
    const auto ref = reference_state_dict(size);
    rtdetr::RtdetrModel m(rtdetr::size_config(size, 80));
    const auto mine = models::state_dict(m);
    ASSERT_EQ(mine.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(mine[i].first, ref[i].first) << "entry " << i;
      EXPECT_EQ(mine[i].second.sizes(), ref[i].second.sizes()) << ref[i].first;
      EXPECT_EQ(mine[i].second.scalar_type(), ref[i].second.scalar_type()) << ref[i].first;
    }
    // The configuration read back from the shapes is the size's.
    const auto cfg = rtdetr::config_from_state_dict(ref);
    ASSERT_TRUE(cfg.has_value());
    EXPECT_EQ(cfg->size, size);
    EXPECT_EQ(cfg->last_layer(), size == "r50m" ? 2 : cfg->dec_layers - 1);
    EXPECT_EQ(cfg->frozen_norm, size != "r18" && size != "r34");
    EXPECT_EQ(cfg->hgnet.has_value(), size == "l" || size == "x");
    EXPECT_EQ(cfg->nc, 80);
    // A network built from the read-back configuration has the same entries.
    rtdetr::RtdetrModel like(*cfg);
    EXPECT_EQ(models::state_dict(like).size(), ref.size());
  }
  EXPECT_ANY_THROW(rtdetr::size_config("h", 80));
}

// LibreYOLO's parameter counts (nc 80): the default build (frozen backbone norms: buffers) and a
// build with trainable backbone norms, which adds one num_batches_tracked per norm.
TEST(RtdetrModel, HgnetSizesParameterCountsAndTrainableNorms) {
  struct Row {
    const char* size;
    int64_t frozen, trainable;
    size_t entries, trainable_entries;
  };
  for (const Row& r : {Row{"l", 32925036, 32970732, 861, 941}, Row{"x", 67374188, 67468108, 1111, 1241}}) {
    SCOPED_TRACE(r.size);
    auto cfg = rtdetr::size_config(r.size, 80);
    ASSERT_TRUE(cfg.hgnet.has_value());
    int64_t n = 0;
    {
      rtdetr::RtdetrModel m(cfg);
      for (const auto& p : m.parameters()) n += p.numel();
      EXPECT_EQ(n, r.frozen);
    }
    cfg.frozen_norm = false;
    rtdetr::RtdetrModel m(cfg);
    n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    EXPECT_EQ(n, r.trainable);
    const auto sd = models::state_dict(m);
    EXPECT_EQ(sd.size(), r.trainable_entries);
    // Such weights (BatchNorm keys, num_batches_tracked) are recognised as the same size, with
    // trainable norms, and load strictly into the network built from them.
    auto back = rtdetr::config_from_state_dict(sd);
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(back->size, r.size);
    EXPECT_FALSE(back->frozen_norm);
    rtdetr::RtdetrModel like(*back);
    EXPECT_NO_THROW(models::load_state_dict(like, sd, /*strict=*/true));
    // The frozen build's entries are the reference's (checked key by key above).
    EXPECT_EQ(models::state_dict(rtdetr::RtdetrModel(rtdetr::size_config(r.size, 80))).size(), r.entries);
  }
}

TEST(RtdetrModel, ReferenceInitialisation) {
  rtdetr::RtdetrModel m(rtdetr::size_config("r18", 80));
  const auto sd = models::state_dict(m);
  const double prior = -std::log(0.99 / 0.01);
  EXPECT_NEAR(param(sd, "decoder.enc_score_head.bias").mean().item<double>(), prior, 1e-6);
  EXPECT_NEAR(param(sd, "decoder.dec_score_head.2.bias").max().item<double>(), prior, 1e-6);
  EXPECT_EQ(param(sd, "decoder.dec_bbox_head.1.layers.2.weight").abs().max().item<double>(), 0.0);
  EXPECT_EQ(param(sd, "decoder.enc_bbox_head.layers.2.bias").abs().max().item<double>(), 0.0);
  // Offsets: head h points along (cos, sin)(2 pi h / 8) scaled to a unit max-norm, times the
  // point index 1..4, on every level; the weights start at zero.
  const auto bias = param(sd, "decoder.decoder.layers.0.cross_attn.sampling_offsets.bias").reshape({8, 3, 4, 2});
  EXPECT_TRUE(torch::allclose(bias[0][1][3], torch::tensor({4.f, 0.f}), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(bias[1][2][1], torch::tensor({2.f, 2.f}), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(bias[6][0][0], torch::tensor({0.f, -1.f}), 0, 1e-6));
  EXPECT_EQ(param(sd, "decoder.decoder.layers.0.cross_attn.sampling_offsets.weight").abs().max().item<double>(), 0.0);
  EXPECT_EQ(param(sd, "decoder.decoder.layers.0.cross_attn.attention_weights.bias").abs().max().item<double>(), 0.0);
  EXPECT_EQ(param(sd, "decoder.denoising_class_embed.weight")[80].abs().max().item<double>(), 0.0);  // padding row
}

TEST(RtdetrModel, AnchorsAndValidMask) {
  // 640 input: level 0's border ring (316 tokens) lies outside (0.01, 0.99); every other is valid.
  const auto [anchors, valid] = rtdetr::make_anchors({{80, 80}, {40, 40}, {20, 20}}, torch::kCPU);
  ASSERT_EQ(anchors.sizes(), (std::vector<int64_t>{1, 8400, 4}));
  EXPECT_EQ((~valid).sum().item<int64_t>(), 316);
  EXPECT_TRUE(anchors.masked_select(~valid).isinf().all().item<bool>());
  EXPECT_TRUE(anchors.masked_select(valid.expand_as(anchors)).isfinite().all().item<bool>());
  // Token 6400 + 41 is level 1's (x 1, y 1): centre 1.5 / 40, size 0.1, in logit space.
  const auto a = torch::sigmoid(anchors[0][6400 + 41]);
  EXPECT_TRUE(torch::allclose(a, torch::tensor({1.5f / 40, 1.5f / 40, 0.1f, 0.1f}), 1e-5, 1e-7));
  // Rectangular levels: x normalised by the width, y by the height, row-major.
  const auto [r, rv] = rtdetr::make_anchors({{2, 4}}, torch::kCPU);
  EXPECT_TRUE(torch::allclose(torch::sigmoid(r[0][5]).narrow(0, 0, 2), torch::tensor({1.5f / 4, 1.5f / 2}), 1e-5));
}

TEST(RtdetrModel, PositionEmbeddingIsTransposed) {
  // A 2 x 3 map: token t sits at (y, x) = (t div 3, t mod 3) but gets (u, v) = (t div 2, t mod 2).
  const int64_t c = 8, pd = 2;
  const auto pos = rtdetr::sincos_position_embedding(2, 3, c, torch::kCPU);
  ASSERT_EQ(pos.sizes(), (std::vector<int64_t>{1, 6, c}));
  for (int64_t t = 0; t < 6; ++t) {
    const double u = static_cast<double>(t / 2), v = static_cast<double>(t % 2);
    EXPECT_NEAR(pos[0][t][0].item<double>(), std::sin(u), 1e-6) << t;            // sin(u * 1)
    EXPECT_NEAR(pos[0][t][pd].item<double>(), std::cos(u), 1e-6) << t;           // cos(u * 1)
    EXPECT_NEAR(pos[0][t][2 * pd].item<double>(), std::sin(v), 1e-6) << t;       // sin(v * 1)
    EXPECT_NEAR(pos[0][t][3 * pd + 1].item<double>(), std::cos(v * 0.01), 1e-6) << t;  // w_1 = 1/10000^(1/2)
  }
}

TEST(RtdetrModel, DeformableSamplingReadsTheValueMaps) {
  // One batch, one head of width 1, two levels (2 x 2 and 1 x 2), one point per level.
  const auto value = torch::tensor({1.f, 2.f, 3.f, 4.f, 10.f, 20.f}).reshape({1, 6, 1, 1});
  const rtdetr::LevelShapes shapes{{2, 2}, {1, 2}};
  // Level 0 at pixel (x 1, y 0)'s centre -> 2; level 1 halfway between its two pixels -> 15.
  const auto loc = torch::tensor({0.75f, 0.25f, 0.5f, 0.5f}).reshape({1, 1, 1, 2, 1, 2});
  auto w = torch::tensor({0.25f, 0.75f}).reshape({1, 1, 1, 2, 1});
  auto out = rtdetr::deformable_attention_core(value, shapes, loc, w);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_NEAR(out.item<double>(), 0.25 * 2 + 0.75 * 15, 1e-5);
  // Outside the map: zero padding (half of the left pixel at x = 0 on level 1's left edge).
  const auto edge = torch::tensor({0.75f, 0.25f, 0.0f, 0.5f}).reshape({1, 1, 1, 2, 1, 2});
  out = rtdetr::deformable_attention_core(value, shapes, edge, w);
  EXPECT_NEAR(out.item<double>(), 0.25 * 2 + 0.75 * 5, 1e-5);
}

TEST(RtdetrModel, ForwardShapesAndClassCountChange) {
  auto cfg = rtdetr::size_config("r18", 80);
  cfg.stem = 16;
  cfg.stages = {16, 32, 64, 128};
  cfg.hidden = cfg.dec_hidden = 32;
  cfg.enc_ffn = cfg.dec_ffn = 64;
  cfg.queries = 20;
  rtdetr::RtdetrModel m(cfg);
  m.eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::rand({1, 3, 96, 128});
  auto raw = m.forward_raw(x);
  EXPECT_EQ(raw[0].sizes(), (std::vector<int64_t>{1, 20, 80}));
  EXPECT_EQ(raw[1].sizes(), (std::vector<int64_t>{1, 20, 4}));
  EXPECT_TRUE(((raw[1] >= 0) & (raw[1] <= 1)).all().item<bool>());
  m.reset_num_classes(3);
  EXPECT_EQ(m.num_classes(), 3);
  const auto sd = models::state_dict(m);
  EXPECT_EQ(param(sd, "decoder.enc_score_head.weight").size(0), 3);
  EXPECT_EQ(param(sd, "decoder.dec_score_head.2.bias").size(0), 3);
  EXPECT_EQ(param(sd, "decoder.denoising_class_embed.weight").size(0), 4);
  raw = m.forward_raw(x);
  EXPECT_EQ(raw[0].sizes(), (std::vector<int64_t>{1, 20, 3}));
  const auto pred = m.decode(raw);
  EXPECT_EQ(pred.sizes(), (std::vector<int64_t>{1, 7, 20}));
}

TEST(RtdetrModel, HgnetForwardShapes) {
  // A narrow HGNetv2 (plain and light stages, residual blocks) under a narrow encoder and decoder.
  auto cfg = rtdetr::size_config("l", 5);
  cfg.hgnet = rtdetr::HgNetSpec{8, 12, {{{8, 16, 1, false, false, 3, 2}, {8, 24, 2, true, false, 3, 2},
                                         {8, 32, 2, true, true, 5, 2}, {8, 40, 1, true, true, 5, 2}}}};
  cfg.hidden = cfg.dec_hidden = 32;
  cfg.enc_ffn = cfg.dec_ffn = 64;
  cfg.queries = 20;
  rtdetr::RtdetrModel m(cfg);
  EXPECT_TRUE(m.presnet.is_empty());
  ASSERT_FALSE(m.hgnet.is_empty());
  m.eval();
  torch::NoGradGuard no_grad;
  const auto t = m.forward_trace(torch::rand({2, 3, 96, 128}));
  const std::vector<int64_t> widths{24, 32, 40}, strides{8, 16, 32};
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(t.backbone[i].sizes(), (std::vector<int64_t>{2, widths[i], 96 / strides[i], 128 / strides[i]}));
  EXPECT_EQ(t.pred_logits.sizes(), (std::vector<int64_t>{2, 20, 5}));
  EXPECT_EQ(t.pred_boxes.sizes(), (std::vector<int64_t>{2, 20, 4}));
  // The narrow widths are read back from the weights; no stock size matches them.
  const auto back = rtdetr::config_from_state_dict(models::state_dict(m));
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->hgnet && *back->hgnet == *cfg.hgnet);
  EXPECT_EQ(back->size, "");
}

TEST(RtdetrModel, PostprocessIsAFlatTopKWithoutNms) {
  // 3 queries x 2 classes. Query 0 scores high in both classes: both are kept (no argmax, no NMS).
  auto p = torch::tensor({{0.9f, 0.8f}, {0.1f, 0.7f}, {0.3f, 0.05f}});
  const auto logits = torch::log(p) - torch::log1p(-p);
  const auto boxes = torch::tensor({{0.5f, 0.5f, 0.2f, 0.4f}, {0.1f, 0.2f, 0.2f, 0.2f}, {0.9f, 0.9f, 0.1f, 0.1f}});
  auto d = rtdetr::postprocess_topk(logits, boxes, /*conf=*/0.25, /*max_det=*/300, /*orig_h=*/100, /*orig_w=*/200);
  ASSERT_EQ(d.scores.size(0), 4);  // 0.9, 0.8, 0.7, 0.3
  EXPECT_TRUE(torch::allclose(d.scores, torch::tensor({0.9f, 0.8f, 0.7f, 0.3f}), 1e-6));
  EXPECT_TRUE(torch::equal(d.classes, torch::tensor({0, 1, 1, 0}, torch::kLong)));
  // Stretch undone: x by the original width, y by the height; no clipping.
  EXPECT_TRUE(torch::allclose(d.boxes[0], torch::tensor({80.f, 30.f, 120.f, 70.f}), 1e-5));
  EXPECT_TRUE(torch::allclose(d.boxes[2], torch::tensor({0.f, 10.f, 40.f, 30.f}), 1e-5));
  // The threshold applies after the top-k.
  d = rtdetr::postprocess_topk(logits, boxes, 0.25, /*max_det=*/2, 100, 200);
  EXPECT_EQ(d.scores.size(0), 2);
  d = rtdetr::postprocess_topk(logits, boxes, /*conf=*/0.75, 300, 100, 200);
  EXPECT_EQ(d.scores.size(0), 2);
  d = rtdetr::postprocess_topk(logits, boxes, /*conf=*/0.85, /*max_det=*/1, 100, 200);
  EXPECT_EQ(d.scores.size(0), 1);
}
