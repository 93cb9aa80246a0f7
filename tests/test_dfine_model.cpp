// D-FINE as a network and a registered family: state-dict names, shapes and dtypes of every size
// against LibreYOLO 1.6.0's (tests/data/dfine_state_dict_*_nc80.tsv, written by
// tests/python/make_dfine_state_dicts.py), parameter counts of the default and from-scratch
// builds, the configuration read back from the weights, the decoder's buffers and
// initialisation, the weighting function, and D-FINE weights told apart from RT-DETR's.
#include <cmath>

#include <libreyolo/errors.hpp>

#include "families/rtdetr/dfine.hpp"
#include "families/rtdetr/model.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;
using libreyolo::io::StateDict;

namespace {

StateDict reference_state_dict(const std::string& size) {
  return libreyolo::test::reference_state_dict_tsv("dfine_state_dict_" + size + "_nc80.tsv");
}

const torch::Tensor& entry(const StateDict& sd, const std::string& key) {
  return libreyolo::test::state_dict_entry(sd, key);
}

// Parameters counted once each (up and reg_scale are listed under two names).
int64_t parameter_count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : models::unique_named_parameters(m)) n += p.second.numel();
  return n;
}

}  // namespace

TEST(DfineModel, StateDictEqualsTheReferenceForEverySize) {
  struct Row {
    const char* size;
    int64_t params, scratch_params;
    size_t scratch_entries;
  };
  // LibreYOLO 1.6.0's default builds (frozen backbone norms for l and x) and from-scratch builds.
  const Row rows[] = {{"n", 3782693, 3782693, 674},
                      {"s", 10321877, 10321877, 794},
                      {"m", 19590064, 19590064, 1053},
                      {"l", 31244152, 31289848, 1253},
                      {"x", 62621560, 62715480, 1571}};
  ASSERT_EQ(rtdetr::dfine_size_names(), (std::vector<std::string>{"n", "s", "m", "l", "x"}));
  for (const Row& r : rows) {
    SCOPED_TRACE(r.size);
    const auto ref = reference_state_dict(r.size);
    rtdetr::DfineModel m(rtdetr::dfine_size_config(r.size, 80));
    EXPECT_EQ(m.family_name(), "dfine");
    const auto mine = models::state_dict(m);
    ASSERT_EQ(mine.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(mine[i].first, ref[i].first) << "entry " << i;
      EXPECT_EQ(mine[i].second.sizes(), ref[i].second.sizes()) << ref[i].first;
      EXPECT_EQ(mine[i].second.scalar_type(), ref[i].second.scalar_type()) << ref[i].first;
    }
    EXPECT_EQ(parameter_count(m), r.params);
    // The configuration read back from the weights is the size's. The listing has shapes only:
    // the buffers whose values the reading needs (points per level, reg_scale) come from the build.
    auto valued = ref;
    for (auto& [key, value] : valued)
      if (key.find("num_points_scale") != std::string::npos || key == "decoder.reg_scale" ||
          key == "decoder.up")
        value = entry(mine, key).clone();
    const auto cfg = rtdetr::dfine_config_from_state_dict(valued);
    ASSERT_TRUE(cfg.has_value());
    EXPECT_EQ(cfg->size, r.size);
    EXPECT_TRUE(*cfg == rtdetr::dfine_size_config(r.size, 80));
    auto scratch = rtdetr::dfine_size_config(r.size, 80);
    scratch.frozen_norm = false;
    rtdetr::DfineModel s(scratch);
    EXPECT_EQ(parameter_count(s), r.scratch_params);
    EXPECT_EQ(models::state_dict(s).size(), r.scratch_entries);
    // The family recognises the weights (and RT-DETR's entries do not), tells the size and classes.
    const auto* fam = models::find_family("dfine");
    ASSERT_NE(fam, nullptr);
    EXPECT_EQ(models::detect_family(ref), fam);
    EXPECT_EQ(fam->infer_size(valued), std::optional<std::string>(r.size));
    EXPECT_EQ(fam->infer_num_classes(valued), std::optional<int>(80));
    // Weights of the reference's key set load strictly into the network the family builds from them.
    const auto like = fam->build_like(valued, 0);
    EXPECT_EQ(like->size(), r.size);
    EXPECT_NO_THROW(models::load_state_dict(*like, valued, /*strict=*/true));
    EXPECT_FALSE(models::find_family("rtdetr")->can_load(ref));
    EXPECT_FALSE(models::find_family("rtdetrv2")->can_load(ref));
  }
  EXPECT_THROW(rtdetr::dfine_size_config("r18", 80), libreyolo::UsageError);
  // RT-DETR weights are not D-FINE's.
  const auto rt = libreyolo::test::reference_state_dict_tsv("rtdetr_state_dict_l_nc80.tsv");
  EXPECT_FALSE(models::find_family("dfine")->can_load(rt));
  EXPECT_EQ(models::detect_family(rt), models::find_family("rtdetr"));
}

TEST(DfineModel, DecoderBuffersAndInitialisation) {
  rtdetr::DfineModel m(rtdetr::dfine_size_config("n", 80));
  const auto sd = models::state_dict(m);
  // Anchors of the 640 input on size n's two levels (strides 16, 32): all of them valid.
  const auto [anchors, valid] = rtdetr::make_anchors({{40, 40}, {20, 20}}, torch::kCPU, 1e4);
  EXPECT_TRUE(torch::equal(entry(sd, "decoder.anchors"), anchors));
  EXPECT_TRUE(torch::equal(entry(sd, "decoder.valid_mask"), valid));
  EXPECT_TRUE(valid.all().item<bool>());
  // Three levels (size s): the invalid ones (too close to the border) at 1e4, not +inf.
  rtdetr::DfineModel s3(rtdetr::dfine_size_config("s", 80));
  EXPECT_EQ(s3.decoder->anchors.size(1), 80 * 80 + 40 * 40 + 20 * 20);
  EXPECT_FALSE(s3.decoder->valid_mask.all().item<bool>());
  EXPECT_EQ(s3.decoder->anchors.max().item<float>(), 1e4f);
  EXPECT_TRUE(torch::equal(entry(sd, "decoder.decoder.layers.0.cross_attn.num_points_scale"),
                           torch::full({12}, 1.0f / 6)));
  // up and reg_scale: one tensor each under two names, without gradient.
  EXPECT_EQ(entry(sd, "decoder.up").data_ptr(), entry(sd, "decoder.decoder.up").data_ptr());
  EXPECT_EQ(entry(sd, "decoder.reg_scale").item<float>(), 4.0f);
  EXPECT_FALSE(m.decoder->up.requires_grad());
  EXPECT_EQ(rtdetr::DfineModel(rtdetr::dfine_size_config("x", 80)).decoder->reg_scale.item<float>(), 8.0f);
  const double prior = -std::log(0.99 / 0.01);
  EXPECT_NEAR(entry(sd, "decoder.enc_score_head.bias").mean().item<double>(), prior, 1e-6);
  EXPECT_NEAR(entry(sd, "decoder.dec_score_head.2.bias").mean().item<double>(), prior, 1e-6);
  for (const char* k : {"decoder.dec_bbox_head.1.layers.2.weight", "decoder.pre_bbox_head.layers.2.bias",
                        "decoder.enc_bbox_head.layers.2.weight", "decoder.decoder.lqe_layers.0.reg_conf.layers.1.weight",
                        "decoder.decoder.layers.0.gateway.gate.weight"})
    EXPECT_EQ(entry(sd, k).abs().max().item<double>(), 0.0) << k;
  // The gate starts at sigmoid(bias) = 1/2 for both inputs.
  EXPECT_NEAR(entry(sd, "decoder.decoder.layers.0.gateway.gate.bias").mean().item<double>(), 0.0, 1e-7);
  // The learnable affine blocks of sizes n-m start as the identity; l and x have none.
  EXPECT_EQ(entry(sd, "backbone.stem.stem1.lab.scale").item<float>(), 1.0f);
  EXPECT_EQ(entry(sd, "backbone.stem.stem1.lab.bias").item<float>(), 0.0f);
  // The padding row of the denoising embedding is zero.
  EXPECT_EQ(entry(sd, "decoder.denoising_class_embed.weight")[80].abs().max().item<double>(), 0.0);
}

TEST(DfineModel, WeightingFunctionAndEdgeDecoding) {
  const auto up = torch::full({1}, 0.5f);
  const auto w = rtdetr::weighting_function(32, up, torch::full({1}, 4.0f));
  ASSERT_EQ(w.numel(), 33);
  // -2a, ..., 0 at the centre, ..., 2a with a = |up| |reg_scale| = 2; symmetric and increasing.
  EXPECT_FLOAT_EQ(w[0].item<float>(), -4.0f);
  EXPECT_FLOAT_EQ(w[16].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(w[32].item<float>(), 4.0f);
  EXPECT_TRUE(torch::allclose(w, -w.flip(0), 0, 1e-6));
  EXPECT_TRUE((w.slice(0, 1) > w.slice(0, 0, 32)).all().item<bool>());
  // The step s = (a + 1)^(2 / 30): W(17) = s - 1, W(31) = s^15 - 1 = a.
  const double s = std::pow(3.0, 2.0 / 30.0);
  EXPECT_NEAR(w[17].item<double>(), s - 1, 1e-6);
  EXPECT_NEAR(w[31].item<double>(), 2.0, 1e-5);
  // Zero distances give the reference box itself.
  const auto ref = torch::tensor({{0.5f, 0.4f, 0.2f, 0.1f}});
  EXPECT_TRUE(torch::allclose(rtdetr::distance_to_box(ref, torch::zeros({1, 4}), torch::full({1}, 4.0f)), ref));
  // Uniform corner logits integrate to 0 (the weights are symmetric).
  EXPECT_LE(rtdetr::fdr_integral(torch::zeros({2, 3, 132}), w, 32).abs().max().item<double>(), 1e-6);
}
