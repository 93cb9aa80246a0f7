// RTMDet training on the CPU: the head's convolutions shared across levels are one tensor to the
// optimizer, the EMA and the memory estimate (named_parameters lists them under each level's
// name), and a short run through the public API trains, validates and saves weights whose
// aliased names hold one tensor.
#include <filesystem>
#include <unordered_set>

#include <libreyolo/libreyolo.hpp>

#include "data/synthetic.hpp"
#include "engine/ema.hpp"
#include "engine/optimizer.hpp"
#include "io/checkpoint.hpp"
#include "io/pickle.hpp"
#include "models/detector.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
namespace models = libreyolo::models;
namespace engine = libreyolo::engine;

TEST(RtmdetTrain, SharedHeadConvolutionsAreOneTensorToTheOptimizerAndTheEma) {
  const models::Family* f = models::find_family("rtmdet");
  ASSERT_NE(f, nullptr);
  auto m = f->build("t", 80);
  const auto unique = models::unique_named_parameters(*m);
  EXPECT_GT(m->named_parameters(true).size(), unique.size()) << "the head shares no convolution";
  int64_t count = 0;
  for (const auto& p : unique) count += p.second.numel();
  EXPECT_EQ(count, 4896168);  // LibreYOLO's rtmdet-t at 80 classes
  // The optimizer's groups hold every trainable tensor once.
  const auto groups = engine::make_param_groups(*m, 0.05, f->param_rules, 1.0);
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t grouped = 0;
  for (const auto& g : groups)
    for (const auto& p : g.params) {
      EXPECT_TRUE(seen.insert(p.unsafeGetTensorImpl()).second) << "a tensor in two places of the groups";
      grouped += p.numel();
    }
  EXPECT_EQ(grouped, count);
  // The EMA averages each tensor once per update: from zeros towards ones, a shared convolution
  // moves as far as a convolution of one level (three lerps would move it 1 - (1 - w)^3).
  auto ema_model = f->build("t", 80);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : ema_model->parameters()) p.zero_();
    for (auto& p : m->parameters()) p.fill_(1.0);
  }
  engine::ModelEMA ema(ema_model, *m, 0.9, 0);
  ema.update(*m);
  const auto ema_sd = models::state_dict(*ema_model);
  const double shared = libreyolo::test::state_dict_entry(ema_sd, "head.cls_convs.1.0.conv.weight").flatten()[0].item<double>();
  const double single = libreyolo::test::state_dict_entry(ema_sd, "head.rtm_cls.1.weight").flatten()[0].item<double>();
  EXPECT_NEAR(single, 0.1, 1e-6);
  EXPECT_NEAR(shared, single, 1e-6);
}

TEST(RtmdetTrain, AShortRunTrainsValidatesAndSavesOneTensorUnderEveryAlias) {
  libreyolo::data::SyntheticOptions o;
  o.train_images = 16;
  o.val_images = 4;
  o.width = 96;
  o.height = 96;
  o.num_classes = 2;
  o.threads = 1;
  const std::string project = libreyolo::test::temp_dir("rtmdet_train");
  const std::string yaml = libreyolo::data::generate_synthetic_dataset(project + "/data", o);
  libreyolo::LibreYOLO model = libreyolo::LibreYOLO::create("rtmdet", "t", 2, "cpu");
  const libreyolo::Kwargs kw = {{"data", yaml},        {"epochs", "2"},        {"batch", "8"},       {"imgsz", "96"},
                                {"workers", "0"},      {"device", "cpu"},      {"no_aug_epochs", "1"},
                                {"project", project},  {"name", "run"},        {"exist_ok", "true"},
                                {"verbose", "false"},  {"save_period", "0"},   {"eval_interval", "1"}};
  const auto r = model.train(kw);
  ASSERT_EQ(r.epochs.size(), 2u);
  for (const auto& e : r.epochs) {
    EXPECT_TRUE(std::isfinite(e.loss)) << "epoch " << e.epoch;
    EXPECT_GE(e.loss_term("cls", -1), 0.0);
    EXPECT_GE(e.loss_term("bbox", -1), 0.0);
  }
  const fs::path last = fs::path(project) / "run" / "weights" / "last.pt";
  ASSERT_TRUE(fs::exists(last));
  // The saved weights name the shared convolutions under every level, with level 0's values.
  const auto ck = libreyolo::io::read_checkpoint(last.string());
  const auto sd = libreyolo::io::to_state_dict(*ck.root->get("model"), "model");
  EXPECT_TRUE(torch::equal(libreyolo::test::state_dict_entry(sd, "head.cls_convs.0.0.conv.weight"),
                           libreyolo::test::state_dict_entry(sd, "head.cls_convs.2.0.conv.weight")));
  // And the trained weights predict through the API.
  libreyolo::LibreYOLO trained(last.string(), "cpu");
  EXPECT_EQ(trained.info().family, "rtmdet");
}
