// Graphed training steps of the dense families without a test of their own (RTMDet, PicoDet) and
// of the classifiers (ResNet, MobileNetV4, EfficientNetV2; the classify task's loss):
// a fresh model of the family's smallest size, 24 steps eager and 24 with the step captured and
// replayed, under deterministic cuDNN. Equal losses and parameters bit for bit are what a family
// needs before it declares capture_train_step (YOLOv9's, YOLOX's and YOLOv7's steps are checked
// in their own files; every family's inference replay in gpu_test_inference_graph.cpp).
#include <ATen/Context.h>

#include <cstdio>
#include <string>

#include "loss/classify.hpp"
#include "models/detector.hpp"
#include "step_check.hpp"
#include "support.hpp"

namespace models = libreyolo::models;

namespace {

// A fresh model of the family's smallest size trained `batches.size()` steps eager and again with the
// step graphs on (deterministic cuDNN): every loss and every parameter must be equal bit for bit.
void expect_graphed_equals_eager(const models::Family& fam, int nc, const libreyolo::TrainConfig& cfg,
                                 const std::vector<std::pair<torch::Tensor, torch::Tensor>>& batches,
                                 const std::function<std::unique_ptr<libreyolo::TrainingLoss>()>& make_loss = {}) {
  const libreyolo::test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true,
                                           at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  ASSERT_FALSE(fam.sizes.empty());
  const std::string size = fam.sizes.front();
  std::printf("[ REPORT   ] %s-%s declares capture_train_step: %s\n", fam.name.c_str(), size.c_str(),
              fam.capture_train_step ? "yes" : "not yet");
  const auto build = [&] { return fam.build(size, nc); };
  const auto scope = libreyolo::engine::GraphScope::Step;
  const auto eager = libreyolo::test::run_family_steps(fam, build, cfg, batches, dev, false, -1, scope, make_loss);
  const auto graphed = libreyolo::test::run_family_steps(fam, build, cfg, batches, dev, true, -1, scope, make_loss);
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
              fam.name.c_str(), size.c_str(), unequal_steps, eager.losses.size(), unequal_params,
              eager.params.size(), static_cast<long long>(graphed.stats.replayed_micro_steps));
}

}  // namespace

class GpuFamilyStepGraph : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuFamilyStepGraph, GraphedTrainingStepsEqualEagerBitForBit) {
  LY_REQUIRE_CUDA();
  const models::Family* fam = models::find_family(GetParam());
  ASSERT_NE(fam, nullptr) << GetParam();
  libreyolo::TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  cfg.warmup_epochs = 1;
  expect_graphed_equals_eager(*fam, 2, cfg, libreyolo::test::pinned_step_batches(24, 3000, 4, 128));
}

INSTANTIATE_TEST_SUITE_P(Dense, GpuFamilyStepGraph, ::testing::Values("rtmdet", "picodet"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// The classifiers' step through the same runner: class ids as targets, the task's loss.
class GpuClassifierStepGraph : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuClassifierStepGraph, GraphedTrainingStepsEqualEagerBitForBit) {
  LY_REQUIRE_CUDA();
  const models::Family* fam = models::find_family(GetParam());
  ASSERT_NE(fam, nullptr) << GetParam();
  libreyolo::TrainConfig cfg;
  cfg.batch = 8;
  cfg.epochs = 10;
  cfg.warmup_epochs = 1;
  cfg.optimizer = "adamw";
  cfg.lr0 = 1e-3;
  cfg.weight_decay = 1e-4;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  for (int i = 0; i < 24; ++i) {
    torch::manual_seed(4000 + i);
    auto images = torch::randint(0, 256, {8, 96, 96, 3}, torch::kByte);
    auto labels = torch::randint(0, 5, {8}, torch::kLong);
    batches.emplace_back(images.pin_memory(), labels.pin_memory());
  }
  expect_graphed_equals_eager(*fam, 5, cfg, batches,
                              [] { return std::make_unique<libreyolo::loss::ClassificationLoss>(); });
}

INSTANTIATE_TEST_SUITE_P(Classify, GpuClassifierStepGraph, ::testing::Values("resnet", "mobilenetv4", "efficientnetv2"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// A model built like a state dict whose tensors live on the GPU (an EMA copy of a model already on
// its device, a checkpoint mapped there): the same modules as built from the host copy. RT-DETRv2
// read its points-per-level buffer through a host pointer into device memory (a segmentation fault
// in every CUDA training).
TEST(GpuFamilies, EveryFamilyBuildsLikeAStateDictOnTheGpu) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  int covered = 0;
  for (const models::Family* fam : models::families()) {
    const int nc = fam->task == "classify" ? 5 : 80;
    torch::manual_seed(0);
    auto model = fam->build(fam->default_size, nc);
    const auto host_sd = models::state_dict(*model);
    model->to(dev);
    const auto device_sd = models::state_dict(*model);
    const auto from_host = models::state_dict(*fam->build_like(host_sd, nc));
    const auto from_device = models::state_dict(*fam->build_like(device_sd, nc));
    ASSERT_EQ(from_host.size(), from_device.size()) << fam->name;
    for (size_t i = 0; i < from_host.size(); ++i) {
      EXPECT_EQ(from_host[i].first, from_device[i].first) << fam->name;
      EXPECT_EQ(from_host[i].second.sizes(), from_device[i].second.sizes()) << fam->name << " " << from_host[i].first;
    }
    ++covered;
  }
  EXPECT_GE(covered, 13) << "every registered family";
}
