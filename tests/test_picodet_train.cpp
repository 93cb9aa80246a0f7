// PicoDet training on the CPU: the recipe (LibreYOLO 1.6.0's PICODETConfig) through the API,
// each size training at its own input size; a few optimizer steps on one small batch lower the
// loss; a short run through the public API trains, validates and saves a checkpoint that loads
// back with the same weights.
#include <filesystem>

#include <libreyolo/libreyolo.hpp>

#include "data/synthetic.hpp"
#include "families/picodet/model.hpp"
#include "io/checkpoint.hpp"
#include "io/pickle.hpp"
#include "loss/loss.hpp"
#include "models/detector.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
namespace models = libreyolo::models;
namespace picodet = libreyolo::models::picodet;

TEST(PicodetTrain, RecipeAndInputSizeThroughTheApi) {
  libreyolo::LibreYOLO s("picodet-s", "cpu");
  const auto cfg = s.check_train({{"data", "builtin"}});
  EXPECT_EQ(cfg.imgsz, 320);
  EXPECT_EQ(cfg.optimizer, "sgd");
  EXPECT_DOUBLE_EQ(cfg.lr0, 0.01);
  EXPECT_DOUBLE_EQ(cfg.momentum, 0.9);
  EXPECT_DOUBLE_EQ(cfg.warmup_momentum, 0.9);
  EXPECT_TRUE(cfg.nesterov);
  EXPECT_DOUBLE_EQ(cfg.weight_decay, 4e-5);
  EXPECT_EQ(cfg.scheduler, "cos_flat");
  EXPECT_DOUBLE_EQ(cfg.warmup_epochs, 1);
  EXPECT_DOUBLE_EQ(cfg.warmup_lr_start, 0.001);
  EXPECT_DOUBLE_EQ(cfg.min_lr_ratio, 0.0);
  EXPECT_EQ(cfg.no_aug_epochs, 0);
  EXPECT_DOUBLE_EQ(cfg.mosaic_prob, 0.0);
  EXPECT_DOUBLE_EQ(cfg.mixup_prob, 0.0);
  EXPECT_DOUBLE_EQ(cfg.hsv_prob, 0.0);
  EXPECT_DOUBLE_EQ(cfg.flip_prob, 0.5);
  EXPECT_DOUBLE_EQ(cfg.ema_decay, 0.9998);
  EXPECT_TRUE(cfg.amp);
  EXPECT_TRUE(cfg.sync_bn);
  EXPECT_EQ(cfg.eval_interval, 10);
  EXPECT_EQ(cfg.name, "picodet_exp");
  EXPECT_FALSE(cfg.reduced_decode);  // full decodes, as predict's (family.cpp says why)
  EXPECT_TRUE(s.check_train({{"data", "builtin"}, {"reduced_decode", "true"}}).reduced_decode);
  // The caller's imgsz wins; m trains at its own size (l's 640: PicodetFamily.InputConvention).
  EXPECT_EQ(s.check_train({{"data", "builtin"}, {"imgsz", "256"}}).imgsz, 256);
  EXPECT_EQ(libreyolo::LibreYOLO("picodet-m", "cpu").check_train({{"data", "builtin"}}).imgsz, 416);
  const models::Family* f = models::find_family("picodet");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->augment.max_labels, 50);
  EXPECT_TRUE(f->default_amp);
}

TEST(PicodetTrain, AFewStepsLowerTheLoss) {
  torch::manual_seed(3);
  const models::Family* f = models::find_family("picodet");
  auto m = f->build("s", 2);
  m->train();
  auto loss = f->make_loss(*m);
  EXPECT_EQ(loss->term_names(), (std::vector<std::string>{"cls", "bbox", "dfl"}));
  // Two 96 x 96 images: a bright square of class 1 and a dark bar of class 0 on grey.
  auto x = torch::full({2, 3, 96, 96}, 0.0);
  x[0].narrow(1, 20, 40).narrow(2, 30, 40).fill_(2.0);
  x[1].narrow(1, 60, 16).narrow(2, 8, 80).fill_(-2.0);
  auto targets = torch::full({2, 2, 5}, -1.0);
  targets[0][0] = torch::tensor({1.0, 30 / 96.0, 20 / 96.0, 70 / 96.0, 60 / 96.0});
  targets[1][0] = torch::tensor({0.0, 8 / 96.0, 60 / 96.0, 88 / 96.0, 76 / 96.0});
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).nesterov(true));
  std::vector<double> totals;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    const auto out = loss->compute(m->forward_raw(x), targets, 96, 96);
    ASSERT_TRUE(std::isfinite(out.total.item<double>())) << "step " << step;
    EXPECT_GT(out.num_fg.item<double>(), 0.0);
    out.total.backward();
    opt.step();
    totals.push_back(out.total.item<double>());
  }
  const double first = (totals[0] + totals[1] + totals[2]) / 3, last = (totals[27] + totals[28] + totals[29]) / 3;
  std::printf("  loss %.4f -> %.4f\n", first, last);
  EXPECT_LT(last, 0.7 * first);
}

TEST(PicodetTrain, AShortRunTrainsValidatesAndSavesACheckpointThatLoadsBack) {
  libreyolo::data::SyntheticOptions o;
  o.train_images = 16;
  o.val_images = 4;
  o.width = 96;
  o.height = 96;
  o.num_classes = 2;
  o.threads = 1;
  const std::string project = libreyolo::test::temp_dir("picodet_train");
  const std::string yaml = libreyolo::data::generate_synthetic_dataset(project + "/data", o);
  libreyolo::LibreYOLO model = libreyolo::LibreYOLO::create("picodet", "s", 2, "cpu");
  const libreyolo::Kwargs kw = {{"data", yaml},       {"epochs", "2"},       {"batch", "8"},     {"imgsz", "96"},
                                {"workers", "0"},     {"device", "cpu"},     {"project", project},
                                {"name", "run"},      {"exist_ok", "true"},  {"verbose", "false"},
                                {"save_period", "0"}, {"eval_interval", "1"}};
  const auto r = model.train(kw);
  ASSERT_EQ(r.epochs.size(), 2u);
  for (const auto& e : r.epochs) {
    EXPECT_TRUE(std::isfinite(e.loss)) << "epoch " << e.epoch;
    for (const char* term : {"cls", "bbox", "dfl"}) EXPECT_GE(e.loss_term(term, -1), 0.0) << term;
    EXPECT_TRUE(e.validated);
  }
  const fs::path last = fs::path(project) / "run" / "weights" / "last.pt";
  ASSERT_TRUE(fs::exists(last));
  const auto ck = libreyolo::io::read_checkpoint(last.string());
  const auto saved = libreyolo::io::to_state_dict(*ck.root->get("model"), "model");
  auto back = models::load_model(last.string(), "cpu");
  EXPECT_EQ(back->family->name, "picodet");
  EXPECT_EQ(back->model->num_classes(), 2);
  EXPECT_EQ(back->imgsz, 96);
  const auto loaded = models::state_dict(*back->model);
  ASSERT_EQ(loaded.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(loaded[i].first, saved[i].first);
    EXPECT_TRUE(torch::equal(loaded[i].second, saved[i].second)) << saved[i].first;
  }
  libreyolo::LibreYOLO trained(last.string(), "cpu");
  EXPECT_EQ(trained.info().family, "picodet");
}
