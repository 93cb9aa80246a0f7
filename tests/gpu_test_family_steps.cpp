// Graphed training steps of the dense families without a test of their own (RTMDet, PicoDet):
// a fresh model of the family's smallest size, 24 steps eager and 24 with the step captured and
// replayed, under deterministic cuDNN. Equal losses and parameters bit for bit are what a family
// needs before it declares capture_train_step (YOLOv9's, YOLOX's and YOLOv7's steps are checked
// in their own files; every family's inference replay in gpu_test_inference_graph.cpp).
#include <ATen/Context.h>

#include <cstdio>
#include <string>

#include "models/detector.hpp"
#include "step_check.hpp"
#include "support.hpp"

namespace models = libreyolo::models;

class GpuFamilyStepGraph : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuFamilyStepGraph, GraphedTrainingStepsEqualEagerBitForBit) {
  LY_REQUIRE_CUDA();
  const libreyolo::test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true,
                                           at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  const models::Family* fam = models::find_family(GetParam());
  ASSERT_NE(fam, nullptr) << GetParam();
  ASSERT_FALSE(fam->sizes.empty());
  const std::string size = fam->sizes.front();
  std::printf("[ REPORT   ] %s-%s declares capture_train_step: %s\n", fam->name.c_str(), size.c_str(),
              fam->capture_train_step ? "yes" : "not yet");
  libreyolo::TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  cfg.warmup_epochs = 1;
  const auto batches = libreyolo::test::pinned_step_batches(24, 3000, 4, 128);
  const auto build = [&] { return fam->build(size, 2); };
  const auto eager = libreyolo::test::run_family_steps(*fam, build, cfg, batches, dev, false);
  const auto graphed = libreyolo::test::run_family_steps(*fam, build, cfg, batches, dev, true);
  ASSERT_EQ(eager.losses.size(), graphed.losses.size());
  int unequal_steps = 0;
  for (size_t i = 0; i < eager.losses.size(); ++i) {
    EXPECT_TRUE(torch::isfinite(eager.losses[i]).all().item<bool>()) << "step " << i;
    if (!torch::equal(eager.losses[i], graphed.losses[i])) {
      if (unequal_steps++ == 0)
        ADD_FAILURE() << "first unequal step " << i << ": eager " << eager.losses[i] << " graphed " << graphed.losses[i];
    }
  }
  EXPECT_EQ(unequal_steps, 0);
  ASSERT_EQ(eager.params.size(), graphed.params.size());
  int unequal_params = 0;
  for (size_t i = 0; i < eager.params.size(); ++i) unequal_params += torch::equal(eager.params[i], graphed.params[i]) ? 0 : 1;
  EXPECT_EQ(unequal_params, 0) << "of " << eager.params.size() << " parameters";
  EXPECT_GE(graphed.stats.replayed_micro_steps, 18);
  EXPECT_EQ(graphed.stats.invalidations, 0);
  std::printf("[ REPORT   ] %s-%s: %d of %zu steps and %d of %zu parameters differ graphed vs eager; %lld replays\n",
              fam->name.c_str(), size.c_str(), unequal_steps, eager.losses.size(), unequal_params,
              eager.params.size(), static_cast<long long>(graphed.stats.replayed_micro_steps));
}

INSTANTIATE_TEST_SUITE_P(Dense, GpuFamilyStepGraph, ::testing::Values("rtmdet", "picodet"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
