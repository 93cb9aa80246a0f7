// RT-DETR as a registered family: names and weights are recognised, sizes and class counts read
// back, upstream key names mapped, the optimizer groups of LibreYOLO's recipe, and the
// postprocess of decoded predictions under a stretched input.
#include <algorithm>

#include <libreyolo/errors.hpp>
#include <libreyolo/libreyolo.hpp>

#include "engine/optimizer.hpp"
#include "io/checkpoint.hpp"
#include "families/rtdetr/model.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::io::StateDict;

TEST(RtdetrFamily, RegisteredAndRecognisedFromItsWeights) {
  const models::Family* f = models::find_family("rtdetr");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->input.fit, libreyolo::ops::Fit::Stretch);
  EXPECT_FALSE(f->capture_train_step);
  auto m = f->build("r18", 5);
  const StateDict sd = models::state_dict(*m);
  EXPECT_EQ(models::detect_family(sd), f);
  EXPECT_EQ(f->infer_size(sd).value_or(""), "r18");
  EXPECT_EQ(f->infer_num_classes(sd).value_or(-1), 5);
  // Another family's weights are not taken for RT-DETR's, nor RT-DETR's for theirs.
  for (const models::Family* other : models::families()) {
    if (other == f) continue;
    EXPECT_FALSE(f->can_load(models::state_dict(*other->build(other->default_size, 3)))) << other->name;
    EXPECT_FALSE(other->can_load(sd)) << other->name;
  }
  // Upstream names of the encoder's input projections load as LibreYOLO's.
  StateDict upstream;
  for (const auto& [k, v] : sd) {
    std::string key = "module." + k;
    const std::string p = "module.encoder.input_proj.1.";
    if (key.rfind(p + "0.", 0) == 0) key = p + "conv." + key.substr(p.size() + 2);
    if (key.rfind(p + "1.", 0) == 0) key = p + "norm." + key.substr(p.size() + 2);
    upstream.emplace_back(key, v);
  }
  EXPECT_TRUE(f->can_load(upstream));
  StateDict back = upstream;
  f->normalize_keys(back);
  ASSERT_EQ(back.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ(back[i].first, sd[i].first);
  auto like = f->build_like(upstream, 0);
  EXPECT_EQ(like->num_classes(), 5);
}

// A fresh model is the from-scratch build: trainable backbone norms for every size (the state dict
// entry counts of LibreYOLO's scratch builds), read back as the same size from its weights.
TEST(RtdetrFamily, FreshModelsTrainTheirBackboneNorms) {
  const models::Family* f = models::find_family("rtdetr");
  ASSERT_NE(f, nullptr);
  const std::vector<std::pair<std::string, size_t>> sizes = {{"r18", 533}, {"r50", 791}, {"r50m", 815},
                                                             {"r101", 1097}, {"l", 941}, {"x", 1241}};
  for (const auto& [size, entries] : sizes) {
    SCOPED_TRACE(size);
    auto m = f->build(size, 80);
    const StateDict sd = models::state_dict(*m);
    EXPECT_EQ(sd.size(), entries);
    EXPECT_EQ(f->infer_size(sd).value_or(""), size);
    int64_t norm_weights = 0;  // trainable norm scales of the backbone (PResNet "norm", HGNetv2 "bn")
    for (const auto& p : m->named_parameters()) {
      const std::string& k = p.key();
      if (k.rfind("backbone.", 0) == 0 &&
          (k.find("norm.weight") != std::string::npos || k.find("bn.weight") != std::string::npos))
        ++norm_weights;
    }
    EXPECT_GT(norm_weights, 0) << "backbone norms have no trainable weight";
  }
}

TEST(RtdetrFamily, OptimizerGroupsAreTheReferences) {
  // LibreYOLO's r18 groups: 40 backbone norm tensors (backbone lr, no decay), 20 other backbone
  // tensors (backbone lr, decayed), 159 encoder/decoder norms and biases (no decay), 98 others, in
  // its default build, which freezes the stem (3 convolutions, 3 norms). Trained from scratch, as
  // here, the stem trains too: 46 and 23.
  const models::Family* f = models::find_family("rtdetr");
  ASSERT_NE(f, nullptr);
  auto m = f->build("r18", 80);
  const auto groups = libreyolo::engine::make_param_groups(*m, 1e-4, f->param_rules, 0.05);
  ASSERT_EQ(groups.size(), 4u);
  const auto find = [&](bool decay, double ratio) -> const libreyolo::engine::ParamGroup& {
    for (const auto& g : groups)
      if (g.decay_group == decay && g.lr_ratio == ratio) return g;
    throw std::runtime_error("no such group");
  };
  EXPECT_EQ(find(false, 0.05).params.size(), 46u);
  EXPECT_EQ(find(false, 0.05).weight_decay, 0.0);
  EXPECT_EQ(find(true, 0.05).params.size(), 23u);
  EXPECT_EQ(find(true, 0.05).weight_decay, 1e-4);
  EXPECT_EQ(find(false, 1.0).params.size(), 159u);
  EXPECT_EQ(find(false, 1.0).weight_decay, 0.0);
  EXPECT_EQ(find(true, 1.0).params.size(), 98u);
  EXPECT_EQ(find(true, 1.0).weight_decay, 1e-4);
  // With the stem frozen, the reference's counts.
  for (auto& p : m->named_parameters())
    if (p.key().rfind("backbone.conv1.", 0) == 0) p.value().set_requires_grad(false);
  const auto frozen = libreyolo::engine::make_param_groups(*m, 1e-4, f->param_rules, 0.05);
  size_t backbone_norms = 0, backbone_rest = 0;
  for (const auto& g : frozen)
    if (g.lr_ratio == 0.05) (g.decay_group ? backbone_rest : backbone_norms) = g.params.size();
  EXPECT_EQ(backbone_norms, 40u);
  EXPECT_EQ(backbone_rest, 20u);
}

TEST(RtdetrFamily, HgnetSizesAreRecognisedAndGrouped) {
  const models::Family* f = models::find_family("rtdetr");
  ASSERT_NE(f, nullptr);
  for (const char* size : {"l", "x"}) {
    SCOPED_TRACE(size);
    EXPECT_NE(std::find(f->sizes.begin(), f->sizes.end(), size), f->sizes.end());
    auto m = f->build(size, 7);
    const StateDict sd = models::state_dict(*m);
    EXPECT_EQ(models::detect_family(sd), f);
    EXPECT_EQ(f->infer_size(sd).value_or(""), size);
    EXPECT_EQ(f->infer_num_classes(sd).value_or(-1), 7);
    EXPECT_EQ(f->build_like(sd, 0)->size(), size);
  }
  // LibreYOLO's l groups: its pretrained build has frozen backbone norms (buffers), so the
  // backbone gives only its 80 convolution weights (75 with the stem frozen, as the reference's
  // default build has it); the encoder's and decoder's 205 norms and biases and 130 other tensors.
  std::shared_ptr<models::Detector> m = std::make_shared<rtdetr::RtdetrModel>(rtdetr::size_config("l", 80));
  const auto count = [&](bool decay, double ratio) {
    size_t n = 0;
    for (const auto& g : libreyolo::engine::make_param_groups(*m, 1e-4, f->param_rules, 0.05))
      if (g.decay_group == decay && g.lr_ratio == ratio) n += g.params.size();
    return n;
  };
  EXPECT_EQ(count(false, 0.05), 0u);
  EXPECT_EQ(count(true, 0.05), 80u);
  EXPECT_EQ(count(false, 1.0), 205u);
  EXPECT_EQ(count(true, 1.0), 130u);
  for (auto& p : m->named_parameters())
    if (p.key().rfind("backbone.stem.", 0) == 0) p.value().set_requires_grad(false);
  EXPECT_EQ(count(true, 0.05), 75u);
  // A fresh model's trainable backbone norms ("bn") fall in the backbone's no-decay group: 160 in
  // the l network.
  m = f->build("l", 80);
  EXPECT_EQ(count(false, 0.05), 160u);
  EXPECT_EQ(count(true, 0.05), 80u);
}

TEST(RtdetrFamily, PostprocessOfDecodedPredictionsUndoesTheStretch) {
  // An original of 200 x 100 (w x h) stretched to 64 x 64: the family's postprocess of the decoded
  // predictions gives the detections of the raw top-k (cxcywh scaled by the original sides).
  torch::manual_seed(3);
  const models::Family* f = models::find_family("rtdetr");
  ASSERT_NE(f, nullptr);
  rtdetr::RtdetrModel model(rtdetr::size_config("r18", 4));
  const int64_t Q = 7;
  const auto logits = torch::randn({1, Q, 4}) * 3;
  const auto boxes = torch::rand({1, Q, 4}) * 0.5 + 0.2;
  const auto pred = model.decode({logits, boxes, torch::tensor({64, 64}, torch::kLong)});
  models::PostprocessArgs a;
  a.conf = 0.3;
  a.max_det = 10;
  a.geometry = {64.0 / 200.0, 64.0 / 100.0, 100, 200};
  const auto got = f->postprocess(pred[0], a);
  const auto want = rtdetr::postprocess_topk(logits[0], boxes[0], 0.3, 10, 100, 200);
  ASSERT_EQ(got.scores.size(0), want.scores.size(0));
  ASSERT_GT(got.scores.size(0), 0);
  EXPECT_TRUE(torch::allclose(got.scores, want.scores));
  EXPECT_TRUE(torch::equal(got.classes, want.classes));
  EXPECT_TRUE(torch::allclose(got.boxes, want.boxes, 1e-5, 1e-3));
  // Scores are not thresholded before the top-k: max_det bounds what conf then filters.
  a.conf = 0.0;
  a.max_det = 5;
  EXPECT_EQ(f->postprocess(pred[0], a).scores.size(0), 5);
}

// A checkpoint whose metadata says rtdetr but whose weights are YOLOv9's (and the other way round)
// is refused with both names, before any network is built from the wrong weights.
TEST(RtdetrFamily, CheckpointOfAnotherFamilysWeightsIsRefusedByName) {
  const std::string dir = libreyolo::test::temp_dir("rtdetr_mislabel");
  const auto write = [&](const std::string& family, const std::string& weights_family, const std::string& size) {
    const models::Family* f = models::find_family(weights_family);
    libreyolo::io::CheckpointMeta meta;
    meta.family = family;
    meta.size = size;
    meta.task = "detect";
    meta.nc = 2;
    meta.names = std::vector<std::string>{"a", "b"};
    meta.imgsz = 320;
    const std::string path = dir + "/" + family + "_with_" + weights_family + ".pt";
    libreyolo::io::write_checkpoint(path,
                                    *libreyolo::io::make_checkpoint(models::state_dict(*f->build(size, 2)), meta));
    return path;
  };
  const auto refusal = [](const std::string& path) -> std::string {
    try {
      libreyolo::LibreYOLO m(path, "cpu");
    } catch (const libreyolo::ModelError& e) {
      return std::string(e.code()) + ": " + e.what();
    }
    return "loaded";
  };
  const std::string a = refusal(write("rtdetr", "yolo9", "t"));
  EXPECT_NE(a.find("model_family_mismatch"), std::string::npos) << a;
  EXPECT_NE(a.find("'rtdetr' but the weights are yolo9's"), std::string::npos) << a;
  const std::string b = refusal(write("yolo9", "rtdetr", "r18"));
  EXPECT_NE(b.find("'yolo9' but the weights are rtdetr's"), std::string::npos) << b;
  // The right label loads.
  EXPECT_EQ(refusal(write("rtdetr", "rtdetr", "r18")), "loaded");
}

