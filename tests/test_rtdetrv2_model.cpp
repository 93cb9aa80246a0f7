// RT-DETRv2 (RT-DETR's network with RT-DETRv2's decoder options) as a network and a registered
// family: state-dict names, shapes and dtypes of every size against LibreYOLO 1.6.0's
// (tests/data/rtdetrv2_state_dict_*_nc80.tsv, written by tests/python/make_rtdetrv2_state_dicts.py),
// its parameter counts, the configuration read back from weights, the v2 decoder's buffers and
// initialisation, the query-selection options, RT-DETR and RT-DETRv2 weights told apart, model
// names in the API and the CLI, and a weights round trip through a checkpoint.
#include <cmath>
#include <filesystem>

#include <libreyolo/errors.hpp>
#include <libreyolo/libreyolo.hpp>

#include "engine/optimizer.hpp"
#include "families/rtdetr/loss.hpp"
#include "families/rtdetr/model.hpp"
#include "io/pickle.hpp"
#include "models/detector.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::io::StateDict;

namespace {

StateDict reference_state_dict(const std::string& size) {
  return libreyolo::test::reference_state_dict_tsv("rtdetrv2_state_dict_" + size + "_nc80.tsv");
}

const torch::Tensor& entry(const StateDict& sd, const std::string& key) {
  return libreyolo::test::state_dict_entry(sd, key);
}

int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// A narrow RT-DETRv2-r18 (fast on the CPU) with the given decoder options on top of v2's.
rtdetr::Config narrow_v2(int nc = 5) {
  auto c = rtdetr::v2_size_config("r18", nc);
  c.size.clear();
  c.stem = 8;
  c.stages = {8, 16, 32, 64};
  c.hidden = c.dec_hidden = 32;
  c.enc_ffn = c.dec_ffn = 64;
  c.v2.anchor_size = 128;
  return c;
}

}  // namespace

TEST(RtdetrV2Model, StateDictEqualsTheReferenceForEverySize) {
  // LibreYOLO 1.6.0's default builds (frozen backbone norms for r50, r50m, r101) and their
  // parameter counts; the scratch builds add one num_batches_tracked per backbone norm.
  struct Row {
    const char* size;
    int64_t params, scratch_params;
    size_t scratch_entries;
  };
  const Row rows[] = {{"r18", 20184464, 20184464, 538},
                      {"r34", 31441668, 31441668, 665},
                      {"r50", 42891372, 42944620, 799},
                      {"r50m", 36593772, 36647020, 823},
                      {"r101", 76556268, 76661740, 1105}};
  ASSERT_EQ(rtdetr::v2_size_names(), (std::vector<std::string>{"r18", "r34", "r50", "r50m", "r101"}));
  for (const Row& r : rows) {
    SCOPED_TRACE(r.size);
    const auto ref = reference_state_dict(r.size);
    rtdetr::RtdetrModel m(rtdetr::v2_size_config(r.size, 80));
    EXPECT_EQ(m.family_name(), "rtdetrv2");
    const auto mine = models::state_dict(m);
    ASSERT_EQ(mine.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(mine[i].first, ref[i].first) << "entry " << i;
      EXPECT_EQ(mine[i].second.sizes(), ref[i].second.sizes()) << ref[i].first;
      EXPECT_EQ(mine[i].second.scalar_type(), ref[i].second.scalar_type()) << ref[i].first;
    }
    EXPECT_EQ(parameter_count(m), r.params);
    // The configuration read back from the shapes is the size's, with v2's options.
    const auto cfg = rtdetr::config_from_state_dict(ref);
    ASSERT_TRUE(cfg.has_value());
    EXPECT_EQ(cfg->size, r.size);
    EXPECT_EQ(cfg->family, "rtdetrv2");
    EXPECT_EQ(cfg->v2, rtdetr::v2_size_config(r.size, 80).v2);
    EXPECT_EQ(cfg->v2.level_points, (std::vector<int>{4, 4, 4}));
    EXPECT_EQ(cfg->v2.anchor_size, 640);
    EXPECT_EQ(cfg->last_layer(), std::string(r.size) == "r50m" ? 2 : cfg->dec_layers - 1);
    auto scratch = rtdetr::v2_size_config(r.size, 80);
    scratch.frozen_norm = false;
    rtdetr::RtdetrModel s(scratch);
    EXPECT_EQ(parameter_count(s), r.scratch_params);
    EXPECT_EQ(models::state_dict(s).size(), r.scratch_entries);
  }
  // The HGNetv2 sizes are RT-DETR's only.
  for (const char* size : {"l", "x", "h"}) EXPECT_THROW(rtdetr::v2_size_config(size, 80), libreyolo::UsageError) << size;
}

TEST(RtdetrV2Model, DecoderBuffersAndInitialisation) {
  rtdetr::RtdetrModel m(rtdetr::v2_size_config("r18", 80));
  const auto sd = models::state_dict(m);
  // Anchors of the 640 input as persistent buffers: the logit-space anchors and their valid mask.
  const auto [anchors, valid] = rtdetr::make_anchors({{80, 80}, {40, 40}, {20, 20}}, torch::kCPU);
  EXPECT_TRUE(torch::equal(entry(sd, "decoder.anchors"), anchors));
  EXPECT_TRUE(torch::equal(entry(sd, "decoder.valid_mask"), valid));
  EXPECT_EQ(entry(sd, "decoder.valid_mask").scalar_type(), torch::kBool);
  // 1/4 for each of the 4 points of the 3 levels.
  EXPECT_TRUE(torch::equal(entry(sd, "decoder.decoder.layers.2.cross_attn.num_points_scale"), torch::full({12}, 0.25f)));
  const double prior = -std::log(0.99 / 0.01);
  EXPECT_NEAR(entry(sd, "decoder.enc_score_head.bias").mean().item<double>(), prior, 1e-6);
  EXPECT_EQ(entry(sd, "decoder.dec_bbox_head.1.layers.2.weight").abs().max().item<double>(), 0.0);
  // Xavier-uniform FFN weights: bounded by sqrt(6 / (fan_in + fan_out)); PyTorch's default
  // (kaiming-uniform, a = sqrt 5) bound 1/sqrt(fan_in) is smaller for linear2 (fan_in 1024).
  // The bounds as the float32 the draws are made in: a draw may land on the rounded bound itself.
  const auto as_float = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  const double xavier = std::sqrt(6.0 / (256 + 1024));
  const auto l2 = entry(sd, "decoder.decoder.layers.0.linear2.weight");
  EXPECT_LE(l2.abs().max().item<double>(), as_float(xavier));
  EXPECT_GT(l2.abs().max().item<double>(), 1.0 / std::sqrt(1024.0));
  const auto proj = entry(sd, "decoder.input_proj.0.conv.weight");
  EXPECT_GT(proj.abs().max().item<double>(), 1.0 / std::sqrt(256.0));  // xavier's bound is sqrt(6/512)
  EXPECT_LE(proj.abs().max().item<double>(), as_float(std::sqrt(6.0 / 512)));

  // Per-level point counts: the offsets' biases count 1..n within each level, the scale is 1/n.
  auto c = narrow_v2();
  c.v2.level_points = {4, 3, 2};
  rtdetr::RtdetrModel p(c);
  const auto psd = models::state_dict(p);
  const auto scale = entry(psd, "decoder.decoder.layers.0.cross_attn.num_points_scale");
  EXPECT_TRUE(torch::allclose(scale, torch::tensor({0.25f, 0.25f, 0.25f, 0.25f, 1 / 3.f, 1 / 3.f, 1 / 3.f, 0.5f, 0.5f}),
                              0, 0));
  const auto bias = entry(psd, "decoder.decoder.layers.0.cross_attn.sampling_offsets.bias").reshape({8, 9, 2});
  EXPECT_EQ(bias.size(0), 8);
  // Head 0 points along +x: x offsets 1,2,3,4 | 1,2,3 | 1,2.
  EXPECT_TRUE(torch::equal(bias[0].select(1, 0), torch::tensor({1.f, 2.f, 3.f, 4.f, 1.f, 2.f, 3.f, 1.f, 2.f})));
  EXPECT_EQ(entry(psd, "decoder.decoder.layers.0.cross_attn.attention_weights.weight").size(0), 8 * 9);
  const auto back = rtdetr::config_from_state_dict(psd);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->v2.level_points, (std::vector<int>{4, 3, 2}));
  EXPECT_EQ(back->v2.anchor_size, 128);
  EXPECT_EQ(back->size, "");
  // Discrete sampling gives the offsets no gradient.
  c.v2.sampling = rtdetr::Sampling::Discrete;
  rtdetr::RtdetrModel d(c);
  EXPECT_FALSE(d.decoder->layers[0]->cross_attn->sampling_offsets->weight.requires_grad());
  EXPECT_TRUE(d.decoder->layers[0]->cross_attn->attention_weights->weight.requires_grad());
}

TEST(RtdetrV2Model, EvalAtTheAnchorSizeReadsTheBuffersElsewhereComputesThem) {
  torch::manual_seed(0);
  rtdetr::RtdetrModel m(narrow_v2());
  m.eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::rand({1, 3, 128, 128});
  const auto [memory, shapes] = m.decoder->encoder_memory(m.encoder->forward(m.backbone_forward(x)));
  const auto computed = rtdetr::make_anchors(shapes, torch::kCPU);
  EXPECT_TRUE(torch::equal(m.decoder->select_queries(memory, shapes).anchors, computed.first));
  // The buffers are what the eval forward at 128 reads: changed, the selection follows them.
  m.decoder->anchors.index_put_({0, 0}, torch::tensor({0.f, 0.f, 0.f, 0.f}));
  m.decoder->valid_mask.fill_(true);
  const auto buffered = m.decoder->select_queries(memory, shapes);
  EXPECT_TRUE(torch::equal(buffered.anchors, m.decoder->anchors));
  EXPECT_FALSE(torch::equal(buffered.anchors, computed.first));
  EXPECT_TRUE(buffered.valid.all().item<bool>());
  // Training, and other sizes, compute them.
  m.train();
  EXPECT_TRUE(torch::equal(m.decoder->select_queries(memory, shapes).anchors, computed.first));
  m.eval();
  const auto x160 = torch::rand({1, 3, 160, 160});
  const auto [mem160, shapes160] = m.decoder->encoder_memory(m.encoder->forward(m.backbone_forward(x160)));
  EXPECT_TRUE(torch::equal(m.decoder->select_queries(mem160, shapes160).anchors,
                           rtdetr::make_anchors(shapes160, torch::kCPU).first));
}

TEST(RtdetrV2Model, QuerySelectionOptions) {
  torch::manual_seed(1);
  auto c = narrow_v2(6);
  c.v2.query_select = rtdetr::QuerySelect::OneToMany;
  rtdetr::RtdetrModel m(c);
  m.eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::rand({2, 3, 128, 128});
  const auto [memory, shapes] = m.decoder->encoder_memory(m.encoder->forward(m.backbone_forward(x)));
  const auto s = m.decoder->select_queries(memory, shapes);
  // Each selected (token, class) pair's token: the top-300 scores over token x class.
  const auto pairs = std::get<1>(torch::topk(s.enc_logits.flatten(1), 300, 1));
  EXPECT_TRUE(torch::equal(s.topk_ind, torch::div(pairs, 6, "floor")));
  EXPECT_TRUE(torch::equal(s.topk_logits, s.enc_logits.gather(1, s.topk_ind.unsqueeze(-1).expand({-1, -1, 6}))));
  // The best-class selection takes each token at most once.
  c.v2.query_select = rtdetr::QuerySelect::BestClass;
  rtdetr::RtdetrModel b(c);
  b.eval();
  const auto [bm, bs] = b.decoder->encoder_memory(b.encoder->forward(b.backbone_forward(x)));
  const auto best = b.decoder->select_queries(bm, bs);
  EXPECT_EQ(std::get<0>(torch::_unique(best.topk_ind[0])).numel(), 300);
  EXPECT_TRUE(torch::equal(best.topk_ind, std::get<1>(torch::topk(std::get<0>(best.enc_logits.max(-1)), 300, 1))));

  // Class-agnostic selection: a one-output encoder score head, read back from the weights, and
  // the encoder level scored against GT of one class.
  c.v2.query_select = rtdetr::QuerySelect::Agnostic;
  rtdetr::RtdetrModel a(c);
  const auto sd = models::state_dict(a);
  EXPECT_EQ(entry(sd, "decoder.enc_score_head.weight").size(0), 1);
  const auto back = rtdetr::config_from_state_dict(sd);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->v2.query_select, rtdetr::QuerySelect::Agnostic);
  EXPECT_EQ(back->nc, 6);
  a.train();
  torch::NoGradGuard again;
  auto targets = torch::full({2, 4, 5}, -1.0f);
  targets[0][0] = torch::tensor({3.f, 0.1f, 0.1f, 0.5f, 0.6f});
  targets[1][0] = torch::tensor({5.f, 0.3f, 0.2f, 0.9f, 0.7f});
  const auto raw = a.forward_train(x, targets);
  const auto in = rtdetr::unpack_train_outputs(raw);
  ASSERT_EQ(in.enc.size(), 1u);
  EXPECT_EQ(in.enc[0].logits.size(-1), 1);
  libreyolo::loss::RtdetrLoss loss(6);
  const auto t = loss.terms(in, rtdetr::split_targets(targets));
  EXPECT_TRUE(std::isfinite(t.value("loss_vfl_enc_0").item<double>()));
  EXPECT_GT(t.value("loss_giou_enc_0").item<double>(), 0.0);
}

TEST(RtdetrV2Family, RegisteredAndToldApartFromRtdetr) {
  const models::Family* v2 = models::find_family("rtdetrv2");
  const models::Family* v1 = models::find_family("rtdetr");
  ASSERT_NE(v2, nullptr);
  ASSERT_NE(v1, nullptr);
  EXPECT_EQ(v2->sizes, rtdetr::v2_size_names());
  EXPECT_EQ(v2->default_size, "r18");
  EXPECT_EQ(v2->input.fit, libreyolo::ops::Fit::Stretch);
  // Same recipe and capture flags as RT-DETR (AMP on; the head seam on for both after their GPU tests).
  EXPECT_EQ(v2->train_defaults, v1->train_defaults);
  EXPECT_TRUE(v2->default_amp);
  EXPECT_EQ(v2->capture_train_step, v1->capture_train_step);
  EXPECT_EQ(v2->capture_inference, v1->capture_inference);
  EXPECT_TRUE(v1->capture_train_head);
  EXPECT_TRUE(v2->capture_train_head);
  EXPECT_EQ(v2->param_rules.size(), v1->param_rules.size());

  auto m = v2->build("r18", 5);
  EXPECT_EQ(m->family_name(), "rtdetrv2");
  const StateDict sd = models::state_dict(*m);
  EXPECT_EQ(models::detect_family(sd), v2);
  EXPECT_EQ(v2->infer_size(sd).value_or(""), "r18");
  EXPECT_EQ(v2->infer_num_classes(sd).value_or(-1), 5);
  EXPECT_FALSE(v1->can_load(sd));
  const StateDict v1_sd = models::state_dict(*v1->build("r18", 5));
  EXPECT_FALSE(v2->can_load(v1_sd));
  EXPECT_EQ(models::detect_family(v1_sd), v1);
  for (const models::Family* other : models::families()) {
    if (other == v2) continue;
    EXPECT_FALSE(other->can_load(sd)) << other->name;
  }
  EXPECT_EQ(v2->build_like(sd, 0)->family_name(), "rtdetrv2");
  EXPECT_EQ(v2->build_like(sd, 0)->num_classes(), 5);
  // A fresh model's backbone norms train (LibreYOLO's scratch build).
  EXPECT_EQ(models::state_dict(*v2->build("r50", 80)).size(), 799u);
  EXPECT_ANY_THROW(v2->build("l", 80));
}

TEST(RtdetrV2Family, OptimizerGroupsAreTheReferences) {
  // LibreYOLO 1.6.0's RT-DETRv2-r18 groups (its trainer's grouping run on its network): scratch
  // build 46 backbone norms, 23 other backbone tensors, 160 encoder/decoder norms and biases, 97
  // others; its default build freezes the stem: 40 and 20. One more no-decay tensor than RT-DETR
  // (159/98): the proposal LayerNorm is named "enc_output.norm", which the rule sees.
  const models::Family* f = models::find_family("rtdetrv2");
  ASSERT_NE(f, nullptr);
  auto m = f->build("r18", 80);
  const auto count = [&](bool decay, double ratio) {
    size_t n = 0;
    for (const auto& g : libreyolo::engine::make_param_groups(*m, 1e-4, f->param_rules, 0.05))
      if (g.decay_group == decay && g.lr_ratio == ratio) n += g.params.size();
    return n;
  };
  EXPECT_EQ(count(false, 0.05), 46u);
  EXPECT_EQ(count(true, 0.05), 23u);
  EXPECT_EQ(count(false, 1.0), 160u);
  EXPECT_EQ(count(true, 1.0), 97u);
  for (auto& p : m->named_parameters())
    if (p.key().rfind("backbone.conv1.", 0) == 0) p.value().set_requires_grad(false);
  EXPECT_EQ(count(false, 0.05), 40u);
  EXPECT_EQ(count(true, 0.05), 20u);
}

TEST(RtdetrV2Family, NamesInTheApiAndTheCli) {
  for (const char* name : {"rtdetrv2-r18", "rtdetrv2_r34", "LibreRTDETRv2r18"}) {
    SCOPED_TRACE(name);
    libreyolo::LibreYOLO model(name, "cpu");
    EXPECT_EQ(model.info().family, "rtdetrv2");
  }
  EXPECT_EQ(libreyolo::LibreYOLO("rtdetrv2", "cpu").info().size, "r18");
  EXPECT_EQ(libreyolo::LibreYOLO("rtdetr-r18", "cpu").info().family, "rtdetr");
  EXPECT_ANY_THROW(libreyolo::LibreYOLO("rtdetrv2-l", "cpu"));
  const auto info = libreyolo::LibreYOLO::create("rtdetrv2", "r50m", 80, "cpu").info();
  EXPECT_EQ(info.size, "r50m");
  EXPECT_EQ(info.parameters, 36647020);  // the scratch build (trainable backbone norms)
  std::string out;
  ASSERT_EQ(libreyolo::test::run_command(std::string("'") + LIBREYOLO_CLI_PATH + "' info model=rtdetrv2-r18", &out), 0)
      << out;
  EXPECT_NE(out.find("family: rtdetrv2"), std::string::npos) << out;
  EXPECT_NE(out.find("size: r18"), std::string::npos) << out;
  EXPECT_NE(out.find("parameters: 20184464"), std::string::npos) << out;
}

TEST(RtdetrV2Family, WeightsRoundTripThroughACheckpoint) {
  const std::string dir = libreyolo::test::temp_dir("rtdetrv2_weights");
  const std::string path = dir + "/v2.pt";
  auto fresh = libreyolo::LibreYOLO::create("rtdetrv2", "r18", 3, "cpu");
  fresh.save(path);
  auto root = libreyolo::io::load_torch_file(path);
  EXPECT_EQ(root->get("model_family")->as_string(), "rtdetrv2");
  auto loaded = models::model_from_checkpoint(root, path);
  EXPECT_EQ(loaded->family->name, "rtdetrv2");
  EXPECT_EQ(loaded->model->size(), "r18");
  EXPECT_EQ(loaded->model->num_classes(), 3);
  // Every entry (anchors with their infinities, the bool mask, num_points_scale) read back.
  const auto saved = libreyolo::io::to_state_dict(*root->get("model"));
  const auto mine = models::state_dict(*loaded->model);
  ASSERT_EQ(mine.size(), saved.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    EXPECT_EQ(mine[i].first, saved[i].first);
    EXPECT_EQ(mine[i].second.scalar_type(), saved[i].second.scalar_type()) << mine[i].first;
    EXPECT_TRUE(torch::equal(mine[i].second, saved[i].second)) << mine[i].first;
  }
  EXPECT_TRUE(std::isinf(entry(mine, "decoder.anchors")[0][0][0].item<float>()));
  // The same predictions as a second load of the file, and the API's reload names the family.
  auto again = models::model_from_checkpoint(libreyolo::io::load_torch_file(path), path);
  loaded->model->eval();
  again->model->eval();
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  const auto x = torch::rand({1, 3, 128, 128});
  const auto a = loaded->model->forward_raw(x), b = again->model->forward_raw(x);
  EXPECT_TRUE(torch::equal(a[0], b[0]));
  EXPECT_TRUE(torch::equal(a[1], b[1]));
  EXPECT_EQ(libreyolo::LibreYOLO(path, "cpu").info().family, "rtdetrv2");
}
