// RT-DETRv2 training on the CPU: a few optimizer steps on one tiny batch lower the criterion (the
// encoder's "_enc_0" terms included, which alone train the proposal heads), the EMA leaves the
// anchor buffers' infinities alone, and a short run through the public API with the family's
// recipe trains, validates and saves a checkpoint that loads back as RT-DETRv2.
#include <cmath>
#include <filesystem>

#include <libreyolo/libreyolo.hpp>

#include "data/synthetic.hpp"
#include "engine/ema.hpp"
#include "families/rtdetr/loss.hpp"
#include "families/rtdetr/model.hpp"
#include "io/checkpoint.hpp"
#include "io/pickle.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
namespace models = libreyolo::models;
namespace rtdetr = libreyolo::models::rtdetr;

TEST(RtdetrV2Train, AFewStepsOnATinyBatchLowerTheLoss) {
  torch::manual_seed(0);
  auto c = rtdetr::v2_size_config("r18", 3);
  c.size.clear();
  c.stem = 8;
  c.stages = {8, 16, 32, 64};
  c.hidden = c.dec_hidden = 32;
  c.enc_ffn = c.dec_ffn = 64;
  c.queries = 100;  // of 336 positions at 128 px; 10 denoising groups of the 2 x 2 queries
  c.denoising = 20;
  auto model = std::make_shared<rtdetr::RtdetrModel>(c);
  model->train();
  const auto x = torch::rand({2, 3, 128, 128});
  auto targets = torch::full({2, 3, 5}, -1.0f);
  targets[0][0] = torch::tensor({0.f, 0.10f, 0.15f, 0.45f, 0.60f});
  targets[0][1] = torch::tensor({2.f, 0.55f, 0.50f, 0.90f, 0.85f});
  targets[1][0] = torch::tensor({1.f, 0.20f, 0.30f, 0.70f, 0.75f});
  const models::Family* f = models::find_family("rtdetrv2");
  ASSERT_NE(f, nullptr);
  auto loss = f->make_loss(*model);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(1e-4));
  std::vector<double> losses;
  const auto enc_head = model->decoder->enc_score_head->weight.detach().clone();
  const int steps = 20;
  for (int step = 0; step < steps; ++step) {
    const auto raw = model->forward_train(x, targets);
    const auto out = loss->compute(raw, targets, 128, 128);
    ASSERT_TRUE(std::isfinite(out.total.item<double>())) << "step " << step;
    losses.push_back(out.total.item<double>());
    opt.zero_grad();
    out.total.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 0.1);
    opt.step();
  }
  const double first = (losses[0] + losses[1] + losses[2]) / 3;
  const double last = (losses[steps - 3] + losses[steps - 2] + losses[steps - 1]) / 3;
  std::printf("  loss (mean of 3 steps) %.4f -> %.4f\n", first, last);
  EXPECT_LT(last, 0.85 * first);
  // The proposal heads are trained (by the encoder level's terms: the decoder's queries are
  // detached from them).
  EXPECT_FALSE(torch::equal(model->decoder->enc_score_head->weight.detach(), enc_head));
}

TEST(RtdetrV2Train, EmaKeepsTheAnchorBuffers) {
  const models::Family* f = models::find_family("rtdetrv2");
  ASSERT_NE(f, nullptr);
  auto m = f->build("r18", 3), e = f->build("r18", 3);
  libreyolo::engine::ModelEMA ema(e, *m, 0.9, 0);
  ema.update(*m);
  const auto sd = models::state_dict(*e);
  const auto& anchors = libreyolo::test::state_dict_entry(sd, "decoder.anchors");
  EXPECT_FALSE(torch::isnan(anchors).any().item<bool>());
  EXPECT_TRUE(torch::equal(anchors, libreyolo::test::state_dict_entry(models::state_dict(*m), "decoder.anchors")));
}

TEST(RtdetrV2Train, AShortRunTrainsValidatesAndSaves) {
  libreyolo::data::SyntheticOptions o;
  o.train_images = 8;
  o.val_images = 2;
  o.width = 128;
  o.height = 128;
  o.num_classes = 2;
  o.threads = 1;
  const std::string project = libreyolo::test::temp_dir("rtdetrv2_train");
  const std::string yaml = libreyolo::data::generate_synthetic_dataset(project + "/data", o);
  libreyolo::LibreYOLO model = libreyolo::LibreYOLO::create("rtdetrv2", "r18", 2, "cpu");
  const libreyolo::Kwargs kw = {{"data", yaml},       {"epochs", "1"},      {"batch", "4"},     {"imgsz", "128"},
                                {"workers", "0"},     {"device", "cpu"},    {"project", project}, {"name", "run"},
                                {"exist_ok", "true"}, {"verbose", "false"}, {"save_period", "0"}};
  const auto r = model.train(kw);
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_TRUE(std::isfinite(r.epochs[0].loss));
  EXPECT_GT(r.epochs[0].loss_term("vfl", -1), 0.0);
  EXPECT_GT(r.epochs[0].loss_term("giou", -1), 0.0);
  const fs::path last = fs::path(project) / "run" / "weights" / "last.pt";
  ASSERT_TRUE(fs::exists(last));
  const auto ck = libreyolo::io::read_checkpoint(last.string());
  EXPECT_EQ(ck.root->get("model_family")->as_string(), "rtdetrv2");
  // The saved (EMA) weights keep the anchor buffers as built.
  const auto sd = libreyolo::io::to_state_dict(*ck.root->get("model"), "model");
  const auto [anchors, valid] = rtdetr::make_anchors({{80, 80}, {40, 40}, {20, 20}}, torch::kCPU);
  EXPECT_TRUE(torch::equal(libreyolo::test::state_dict_entry(sd, "decoder.anchors"), anchors));
  EXPECT_TRUE(torch::equal(libreyolo::test::state_dict_entry(sd, "decoder.valid_mask"), valid));
  // The trained weights load back as RT-DETRv2 and predict.
  libreyolo::LibreYOLO trained(last.string(), "cpu");
  EXPECT_EQ(trained.info().family, "rtdetrv2");
  EXPECT_EQ(trained.info().num_classes, 2);
}
