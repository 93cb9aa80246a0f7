// RT-DETR (r18 topology at reduced width) parity with LibreYOLO 1.6.0 on the CPU (the
// rtdetr_r18narrow_nc80_s320 files of LIBREYOLO_FIXTURES): the checkpoint's weights load
// strictly into a network built from their shapes, and the eval forward (backbone maps, encoder
// maps, encoder proposals, anchors, the top-k query selection, the final logits and boxes), the
// postprocess and the training-mode forward without denoising (every decoder layer, the encoder
// top-k, the BatchNorm statistics it leaves) match the recorded tensors.
#include <algorithm>
#include <cmath>
#include <map>

#include "rtdetr_fixture.hpp"
#include "fold_check.hpp"

using libreyolo::test::check_rel;
using libreyolo::test::rel_err;
namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;

namespace {

libreyolo::test::RtdetrFixture load_fixture(const std::string& dir) {
  return libreyolo::test::load_rtdetr_fixture(dir);
}

// Relative errors bound of the eval outputs (max |got - want| / max |want|).
constexpr double kEvalBound = 1e-4;

}  // namespace

TEST(RtdetrParity, WeightsLoadStrictlyIntoANetworkOfTheirWidths) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  EXPECT_EQ(f.checkpoint->get("model_family")->as_string(), "rtdetr");
  // The widths read from the shapes are the ones the checkpoint records for its narrow build.
  const auto arch = f.checkpoint->get("fixture_arch");
  ASSERT_TRUE(arch && arch->is_dict());
  EXPECT_EQ(f.cfg.hidden, arch->get("hidden_dim")->as_int());
  EXPECT_EQ(f.cfg.enc_ffn, arch->get("dim_feedforward")->as_int());
  EXPECT_EQ(f.cfg.dec_ffn, arch->get("decoder_dim_feedforward")->as_int());
  EXPECT_EQ(f.cfg.dec_hidden, f.cfg.hidden);
  EXPECT_EQ(f.cfg.stem, 16);
  EXPECT_EQ(f.cfg.stages, (std::array<int64_t, 4>{16, 32, 64, 128}));
  EXPECT_EQ(f.cfg.depth, 18);
  EXPECT_FALSE(f.cfg.frozen_norm);
  EXPECT_EQ(f.cfg.expansion, 0.5);
  EXPECT_EQ(f.cfg.dec_layers, 3);
  EXPECT_EQ(f.cfg.last_layer(), 2);
  EXPECT_EQ(f.cfg.points, 4);
  EXPECT_EQ(f.cfg.nc, 80);
  EXPECT_EQ(f.cfg.size, "");  // r18's topology, not its widths
  // Same names in the same order, every tensor copied.
  const auto mine = models::state_dict(*f.model);
  ASSERT_EQ(mine.size(), 533u);
  ASSERT_EQ(mine.size(), f.weights.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, f.weights[i].first);
    EXPECT_TRUE(torch::equal(mine[i].second, f.weights[i].second)) << mine[i].first;
  }
  // One key fewer is an error under strict loading.
  auto fewer = f.weights;
  fewer.pop_back();
  rtdetr::RtdetrModel other(f.cfg);
  EXPECT_ANY_THROW(models::load_state_dict(other, fewer, /*strict=*/true));
}

TEST(RtdetrParity, EvalBackboneAndEncoderMaps) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  torch::NoGradGuard no_grad;
  const libreyolo::test::FoldSwitch unfolded(false);  // the reference's op order (top-k scores 6e-6 apart)
  const auto t = f.model->forward_trace(f.input());
  for (int i = 0; i < 3; ++i) {
    check_rel("backbone_feat_" + std::to_string(i), t.backbone[i],
              f.expected("eval.backbone_feat_" + std::to_string(i)), kEvalBound);
    check_rel("encoder_out_" + std::to_string(i), t.encoder[i], f.expected("eval.encoder_out_" + std::to_string(i)),
              kEvalBound);
  }
}

TEST(RtdetrParity, EvalQuerySelection) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  torch::NoGradGuard no_grad;
  const libreyolo::test::FoldSwitch unfolded(false);  // the reference's op order (top-k scores 6e-6 apart)
  const auto s = f.model->forward_trace(f.input()).selection;
  const auto want_anchors = f.expected("eval.anchors_unact");
  ASSERT_EQ(s.anchors.sizes(), want_anchors.sizes());
  // Anchors: the same float32 arithmetic, so equal up to a rounding step; none is invalid at 320.
  EXPECT_TRUE(torch::equal(s.valid, f.expected("eval.valid_mask")));
  EXPECT_TRUE(s.valid.all().item<bool>());
  check_rel("anchors_unact", s.anchors, want_anchors, 1e-6);
  check_rel("enc_logits", s.enc_logits, f.expected("eval.enc_logits"), kEvalBound);
  check_rel("enc_delta", s.enc_delta, f.expected("eval.enc_delta"), kEvalBound);
  // The selected tokens and their order, up to swaps of near-equal scores (some lie 6e-6 apart,
  // which another CPU's rounding of the same float32 arithmetic can reorder).
  const auto want_ind = f.expected("eval.topk_ind");
  libreyolo::test::expect_same_selection(
      s.topk_ind, want_ind, std::get<0>(s.enc_logits.max(-1)),
      std::get<0>(f.expected("eval.enc_logits").max(-1)).gather(1, want_ind), "topk_ind");
  // What is gathered at the reference's selection is the proposal at those tokens.
  f.model->decoder->forced_topk_ind = want_ind;
  const auto forced = f.model->forward_trace(f.input()).selection;
  f.model->decoder->forced_topk_ind = torch::Tensor();
  EXPECT_TRUE(torch::equal(forced.topk_ind, want_ind));
  const auto idx4 = want_ind.unsqueeze(-1).expand({-1, -1, 4});
  const auto want_ref = f.expected("eval.enc_delta").gather(1, idx4) + want_anchors.expand({2, -1, -1}).gather(1, idx4);
  check_rel("reference boxes (logit space)", forced.ref_unact, want_ref, kEvalBound);
}

TEST(RtdetrParity, EvalPredictions) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  torch::NoGradGuard no_grad;
  const libreyolo::test::FoldSwitch unfolded(false);  // the reference's op order (top-k scores 6e-6 apart)
  // On the reference's queries (EvalQuerySelection checks ours against them, near-ties aside).
  f.model->decoder->forced_topk_ind = f.expected("eval.topk_ind");
  const auto raw = f.model->forward_raw(f.input());
  ASSERT_EQ(raw.size(), 3u);
  check_rel("pred_logits", raw[0], f.expected("eval.pred_logits"), kEvalBound);
  check_rel("pred_boxes", raw[1], f.expected("eval.pred_boxes"), kEvalBound);
  // decode: [B, 4 + nc, Q], xyxy in input pixels and sigmoid scores.
  const auto pred = f.model->decode(raw);
  ASSERT_EQ(pred.sizes(), (std::vector<int64_t>{2, 84, 300}));
  const auto wb = f.expected("eval.pred_boxes") * 320.0;
  const auto cx = wb.select(2, 0), cy = wb.select(2, 1), w = wb.select(2, 2), h = wb.select(2, 3);
  check_rel("decoded boxes", pred.narrow(1, 0, 4), torch::stack({cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2}, 1),
            kEvalBound);
  check_rel("decoded scores", pred.narrow(1, 4, 80), torch::sigmoid(f.expected("eval.pred_logits")).transpose(1, 2),
            kEvalBound);
}

// The postprocess of this forward against the recorded detections of both images (as sets:
// ranks can be 1.5e-8 apart; the threshold lies 1.3e-4 from every score).
TEST(RtdetrParity, Postprocess) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  torch::NoGradGuard no_grad;
  const libreyolo::test::FoldSwitch unfolded(false);  // the reference's op order (top-k scores 6e-6 apart)
  const auto raw = f.model->forward_raw(f.input());
  const double conf = f.expected("post.conf_thres").item<double>();
  const int max_det = static_cast<int>(f.expected("post.max_det").item<int64_t>());
  const auto wh = f.expected("post.original_wh");
  const int ow = static_cast<int>(wh[0].item<int64_t>()), oh = static_cast<int>(wh[1].item<int64_t>());
  for (int b = 0; b < 2; ++b) {
    const std::string p = "post.img" + std::to_string(b) + ".";
    const auto det = rtdetr::postprocess_topk(raw[0][b], raw[1][b], conf, max_det, oh, ow);
    const auto wb = f.expected(p + "boxes"), ws = f.expected(p + "scores"), wc = f.expected(p + "classes");
    ASSERT_GT(wb.size(0), 10);
    ASSERT_EQ(det.boxes.size(0), wb.size(0)) << "image " << b;
    EXPECT_TRUE(torch::equal(det.scores, std::get<0>(det.scores.sort(0, true))));
    EXPECT_GT(det.scores.min().item<double>(), conf);
    std::vector<bool> used(det.boxes.size(0), false);
    int matched = 0;
    double worst_box = 0, worst_score = 0;
    for (int64_t i = 0; i < wb.size(0); ++i) {
      for (int64_t j = 0; j < det.boxes.size(0); ++j) {
        if (used[j] || det.classes[j].item<int64_t>() != wc[i].item<int64_t>()) continue;
        const double ds = std::abs(det.scores[j].item<double>() - ws[i].item<double>());
        const double db = (det.boxes[j] - wb[i]).abs().max().item<double>() / std::max(ow, oh);
        if (ds > 1e-4 || db > 1e-4) continue;
        used[j] = true;
        ++matched;
        worst_box = std::max(worst_box, db);
        worst_score = std::max(worst_score, ds);
        break;
      }
    }
    EXPECT_EQ(matched, wb.size(0)) << "image " << b;
    std::printf("  image %d: %d detections matched, max |d score| %.3g, max |d box| / size %.3g\n", b, matched,
                worst_score, worst_box);
  }
}

// Training mode without denoising queries: batch-statistics BatchNorm, every decoder layer's
// outputs (the last as pred_*, the others as aux_outputs.0/1), the encoder top-k as the last aux
// entry, and every BatchNorm buffer after this one forward.
TEST(RtdetrParity, TrainForwardWithoutDenoising) {
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  f.model->train();
  const auto t = f.model->forward_train_outputs(f.input());
  for (int i = 0; i < 3; ++i) {
    check_rel("train backbone_feat_" + std::to_string(i), t.backbone[i],
              f.expected("train_nodn.backbone_feat_" + std::to_string(i)), kEvalBound);
    check_rel("train encoder_out_" + std::to_string(i), t.encoder[i],
              f.expected("train_nodn.encoder_out_" + std::to_string(i)), kEvalBound);
  }
  ASSERT_EQ(t.logits.size(), 3u);
  ASSERT_EQ(t.boxes.size(), 3u);
  // The queries as the reference ordered them (self-attention treats them as a set).
  const auto order = libreyolo::test::recorded_query_order(t.enc_topk_boxes, t.enc_topk_logits,
                                                           f.expected("train_nodn.aux_outputs.2.pred_boxes"),
                                                           f.expected("train_nodn.aux_outputs.2.pred_logits"), kEvalBound);
  const auto want = [&](const std::string& key) { return libreyolo::test::in_order(f.expected(key), order); };
  check_rel("train pred_logits", t.logits[2], want("train_nodn.pred_logits"), kEvalBound);
  check_rel("train pred_boxes", t.boxes[2], want("train_nodn.pred_boxes"), kEvalBound);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "train_nodn.aux_outputs." + std::to_string(l) + ".";
    check_rel(p + "pred_logits", t.logits[l], want(p + "pred_logits"), kEvalBound);
    check_rel(p + "pred_boxes", t.boxes[l], want(p + "pred_boxes"), kEvalBound);
  }
  check_rel("train encoder top-k logits", t.enc_topk_logits, want("train_nodn.aux_outputs.2.pred_logits"), kEvalBound);
  check_rel("train encoder top-k boxes", t.enc_topk_boxes, want("train_nodn.aux_outputs.2.pred_boxes"), kEvalBound);
  // Gradient routing: layer i's recorded box reaches layer i-1's box head (refined from its
  // undetached box) but not layer i-2's; the decoder never reaches the encoder's proposal head
  // (content queries and references are detached); the encoder top-k boxes do.
  auto& dec = *f.model->decoder;
  auto reaches = [](const torch::Tensor& out, const torch::Tensor& param) {
    const auto g = torch::autograd::grad({out.sum()}, {param}, {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
    return g[0].defined() && g[0].abs().sum().item<double>() > 0;
  };
  EXPECT_TRUE(reaches(t.boxes[1], dec.dec_bbox_head[0]->layers[2]->weight));
  EXPECT_TRUE(reaches(t.boxes[2], dec.dec_bbox_head[1]->layers[2]->weight));
  EXPECT_FALSE(reaches(t.boxes[2], dec.dec_bbox_head[0]->layers[2]->weight));
  EXPECT_FALSE(reaches(t.boxes[2], dec.enc_linear->weight));
  EXPECT_FALSE(reaches(t.logits[2], dec.enc_bbox_head->layers[2]->weight));
  EXPECT_TRUE(reaches(t.enc_topk_boxes, dec.enc_bbox_head->layers[2]->weight));
  EXPECT_TRUE(reaches(t.logits[2], f.model->presnet->stem[0]->conv->weight));  // through the memory

  const std::string prefix = "bn_after_train_forward.";
  std::map<std::string, torch::Tensor> mine;
  for (const auto& [k, v] : models::state_dict(*f.model)) mine[k] = v;
  int checked = 0;
  double worst = 0;
  for (const auto& [key, value] : f.expect->dict) {
    const std::string name = key->as_string();
    if (name.rfind(prefix, 0) != 0) continue;
    const auto it = mine.find(name.substr(prefix.size()));
    ASSERT_NE(it, mine.end()) << name;
    if (value->tensor.scalar_type() == torch::kLong) {
      EXPECT_TRUE(torch::equal(it->second, value->tensor)) << name;
    } else {
      const double e = rel_err(it->second, value->tensor);
      EXPECT_LE(e, kEvalBound) << name;
      worst = std::max(worst, e);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 207);
  std::printf("  %d BatchNorm buffers after one train forward, worst rel err %.3g\n", checked, worst);
}
