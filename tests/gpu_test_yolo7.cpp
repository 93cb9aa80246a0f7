// YOLOv7 on CUDA against LibreYOLO 1.6.0's fixture (tests/data/yolo7_reference.pt): the eval maps
// and decode in float32 (TF32 off), the detections of the GPU postprocess, the loss and its
// gradients; and graphed training steps equal to eager ones bit for bit (what the family needs
// before it declares capture_train_step; its inference replay is checked with every family's in
// gpu_test_inference_graph.cpp).
#include <ATen/Context.h>

#include <cstdio>
#include <map>

#include "families/yolo7/loss.hpp"
#include "families/yolo7/model.hpp"
#include "io/pickle.hpp"
#include "models/loaded_model.hpp"
#include "step_check.hpp"
#include "support.hpp"
#include "yolo7_fixture.hpp"

namespace io = libreyolo::io;
namespace models = libreyolo::models;
namespace yolo7 = libreyolo::models::yolo7;
using libreyolo::test::check_rel;
using libreyolo::test::detections;
using libreyolo::test::expect_same_detections;
using libreyolo::test::rel_err;

namespace {


io::PyValuePtr fixture() { return libreyolo::test::yolo7_fixture(); }

torch::Tensor expected(const std::string& key) { return libreyolo::test::yolo7_expected(key); }

}  // namespace

TEST(GpuYolo7, EvalMapsDecodeAndDetectionsMatchTheReference) {
  LY_REQUIRE_CUDA();
  const libreyolo::test::CudnnSettings exact(/*benchmark=*/false, /*deterministic=*/true, /*allow_tf32=*/false);
  const libreyolo::test::NoTF32 fp32;
  auto lm = models::model_from_checkpoint(fixture(), libreyolo::test::yolo7_fixture_path());
  const torch::Device dev(torch::kCUDA, 0);
  lm->to(dev);
  lm->model->eval();
  torch::NoGradGuard no_grad;
  const auto x = (expected("input_u8").to(torch::kFloat) / 255.0).to(dev);
  const auto raw = lm->model->forward_raw(x);
  for (int i = 0; i < 3; ++i)
    check_rel("raw_" + std::to_string(i), raw[static_cast<size_t>(i)], expected("raw_" + std::to_string(i)), 1e-4);
  const auto pred = lm->model->decode(raw);
  check_rel("decoded", pred, expected("decoded"), 1e-4);
  const auto orig = expected("orig_size");
  for (const std::string set : {"predict", "val", "whole"}) {
    std::vector<models::PostprocessArgs> args;
    for (int i = 0; i < 2; ++i) {
      models::PostprocessArgs a;
      a.conf = expected(set + ".conf").item<double>();
      a.iou = expected(set + ".iou").item<double>();
      const int w = set == "whole" ? 320 : static_cast<int>(orig[i][0].item<int64_t>());
      const int h = set == "whole" ? 320 : static_cast<int>(orig[i][1].item<int64_t>());
      const auto box = libreyolo::ops::fit_box(h, w, 320, libreyolo::ops::Fit::Letterbox);
      a.geometry = {box.sx, box.sy, h, w};
      args.push_back(a);
    }
    const auto dets = lm->family->postprocess_batch(pred, args);
    for (size_t i = 0; i < 2; ++i) {
      const std::string p = set + ".img" + std::to_string(i) + ".";
      const auto& d = dets[i];
      expect_same_detections(detections(d.boxes, d.scores, d.classes),
                             detections(expected(p + "boxes"), expected(p + "scores"), expected(p + "classes")), p);
    }
  }
}

TEST(GpuYolo7, LossMatchesTheReference) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  yolo7::Yolo7Loss loss(3);
  std::vector<torch::Tensor> raw;
  for (int i = 0; i < 3; ++i) raw.push_back(expected("raw_" + std::to_string(i)).to(dev).requires_grad_(true));
  const auto out = loss.compute(raw, expected("loss.targets").to(dev), 320, 320);
  for (const std::string term : {"iou", "obj", "cls"})
    check_rel("loss." + term, out.term(term), expected("loss." + term).to(torch::kFloat), 1e-5);
  EXPECT_NEAR(out.num_fg.item<double>(), expected("loss.pos_index").size(0) / 2.0, 1e-9);
  out.total.backward();
  check_rel("d/d raw_1", raw[1].grad(), expected("loss.grad_1"), 1e-4);
  check_rel("d/d raw_2", raw[2].grad(), expected("loss.grad_2"), 1e-4);
}

TEST(GpuYolo7, GraphedTrainingStepsEqualEagerBitForBit) {
  LY_REQUIRE_CUDA();
  const libreyolo::test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true,
                                           at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  const models::Family* fam = models::find_family("yolo7");
  ASSERT_NE(fam, nullptr);
  std::printf("[ REPORT   ] yolo7 declares capture_train_step: %s\n", fam->capture_train_step ? "yes" : "not yet");
  libreyolo::TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  cfg.warmup_epochs = 1;
  cfg.momentum = 0.937;
  cfg.scheduler = "yoloxwarmcos";
  const auto batches = libreyolo::test::pinned_step_batches(24, 3000, 4, 128);
  const auto build = [] { return std::shared_ptr<models::Detector>(std::make_shared<yolo7::Yolo7Model>(2, 2)); };
  const auto eager = libreyolo::test::run_family_steps(*fam, build, cfg, batches, dev, false);
  const auto graphed = libreyolo::test::run_family_steps(*fam, build, cfg, batches, dev, true);
  ASSERT_EQ(eager.losses.size(), graphed.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_TRUE(torch::equal(eager.losses[i], graphed.losses[i])) << "step " << i;
    EXPECT_TRUE(torch::isfinite(eager.losses[i]).all().item<bool>()) << "step " << i;
  }
  for (size_t i = 0; i < eager.params.size(); ++i) EXPECT_TRUE(torch::equal(eager.params[i], graphed.params[i])) << i;
  EXPECT_GE(graphed.stats.replayed_micro_steps, 18);
  EXPECT_EQ(graphed.stats.invalidations, 0);
}
