// CUDA graphs of the inference forward (SPEC G8-G11): capture and replay equal eager bit for bit
// on two probe inputs from different distributions (fp32 and bf16 autocast); auto captures on
// the third use; invalidation (train mode, dtype change, device move, training); the API; a
// family that does not declare it is refused by name.
#include <ATen/Context.h>

#include <libreyolo/libreyolo.hpp>

#include "models/forward_graphs.hpp"
#include "models/loaded_model.hpp"
#include "support.hpp"

using namespace libreyolo;

namespace {

// Two probes: uniform noise, and a smooth gradient with a bright square (another distribution).
std::vector<torch::Tensor> probes(int64_t b, int64_t s) {
  torch::manual_seed(7);
  auto noise = torch::randint(0, 256, {b, s, s, 3}, torch::kUInt8);
  auto ramp = torch::linspace(0, 255, s).view({1, 1, s, 1}).expand({b, s, s, 3}).clone();
  ramp.narrow(1, s / 4, s / 4).narrow(2, s / 4, s / 4).fill_(250);
  return {noise, ramp.to(torch::kUInt8)};
}

}  // namespace

TEST(GpuInferenceGraph, ReplayEqualsEagerBitForBitOnTwoProbes) {
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  for (const char* family : {"yolo9", "yolox"}) {
  const models::Family* fam = models::find_family(family);
  ASSERT_NE(fam, nullptr) << family;
  ASSERT_TRUE(fam->capture_inference) << family;
  torch::manual_seed(0);
  auto model = fam->build(fam->default_size, 80);
  model->to(dev);
  model->eval();
  for (const char* dtype : {"fp32", "bf16"}) {
    models::ForwardSpec spec;
    spec.device = dev;
    spec.amp = std::string(dtype) == "bf16";
    spec.amp_dtype = torch::kBFloat16;
    models::ForwardGraphs graphs;
    for (const auto& probe : probes(2, 320)) {
      const torch::Tensor want = graphs.forward(*model, *fam, probe, spec, models::GraphMode::Off).clone();
      const torch::Tensor got = graphs.forward(*model, *fam, probe, spec, models::GraphMode::On).clone();
      EXPECT_TRUE(torch::equal(want, got)) << family << " " << dtype << " max diff " << (want - got).abs().max().item<float>();
    }
    const auto info = graphs.info();
    EXPECT_EQ(info.captures, 1) << dtype;   // one shape, captured on the first graphed use
    EXPECT_EQ(info.replays, 2) << dtype;    // the first graphed call replays right after capturing
    EXPECT_EQ(info.captured.size(), 1u) << dtype;
  }
  }
}

TEST(GpuInferenceGraph, AutoCapturesOnTheThirdUseAndInvalidates) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  const models::Family* fam = models::find_family("yolo9");
  torch::manual_seed(0);
  auto model = fam->build("t", 80);
  model->to(dev);
  model->eval();
  models::ForwardSpec spec;
  spec.device = dev;
  models::ForwardGraphs graphs;
  const auto images = probes(1, 256)[0];
  for (int i = 0; i < 2; ++i) graphs.forward(*model, *fam, images, spec, models::GraphMode::Auto);
  EXPECT_EQ(graphs.info().captures, 0);
  graphs.forward(*model, *fam, images, spec, models::GraphMode::Auto);
  EXPECT_EQ(graphs.info().captures, 1);
  EXPECT_EQ(graphs.info().replays, 1);
  // Training mode: the graphs go, the forward runs eager.
  model->train();
  graphs.forward(*model, *fam, images, spec, models::GraphMode::Auto);
  EXPECT_TRUE(graphs.info().captured.empty());
  EXPECT_EQ(graphs.info().releases, 1);
  model->eval();
  graphs.forward(*model, *fam, images, spec, models::GraphMode::On);
  EXPECT_EQ(graphs.info().captured.size(), 1u);
  // Another parameter dtype: dropped, and the new dtype's forward captured (half parameters run
  // under float16 autocast: the float input is cast for each convolution).
  model->to(torch::kHalf);
  spec.amp = true;
  spec.amp_dtype = torch::kHalf;
  graphs.forward(*model, *fam, images, spec, models::GraphMode::On);
  EXPECT_EQ(graphs.info().releases, 2);
  EXPECT_EQ(graphs.info().captured.size(), 1u);
}

TEST(GpuInferenceGraph, ApiCapturePredictMoveAndTrainRelease) {
  LY_REQUIRE_CUDA();
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cuda:0");
  model.capture_graph(320, 1, "float32");
  ASSERT_EQ(model.graph_info().captured.size(), 1u);
  EXPECT_EQ(model.graph_info().captured[0], "1x3x320x320 fp32");
  const auto eager = model.predict("SAMPLE_IMAGE", {{"imgsz", "320"}, {"conf", "0.001"}});
  const auto graphed = model.predict("SAMPLE_IMAGE", {{"imgsz", "320"}, {"conf", "0.001"}, {"cuda_graph", "true"}});
  EXPECT_GE(model.graph_info().replays, 1);
  ASSERT_EQ(eager.size(), 1u);
  ASSERT_EQ(graphed.size(), 1u);
  ASSERT_EQ(eager[0].detections.size(), graphed[0].detections.size());
  for (size_t i = 0; i < eager[0].detections.size(); ++i) {
    EXPECT_EQ(eager[0].detections[i].x1, graphed[0].detections[i].x1);
    EXPECT_EQ(eager[0].detections[i].score, graphed[0].detections[i].score);
  }
  model.release_graphs();
  EXPECT_TRUE(model.graph_info().captured.empty());
  EXPECT_THROW(model.capture_graph(320, 1, "int8"), UsageError);
  EXPECT_THROW(model.capture_graph(300, 1, "float32"), UsageError);
  // Training changes the weights: graphs captured before are dropped.
  model.capture_graph(320, 1, "bfloat16");
  ASSERT_EQ(model.graph_info().captured.size(), 1u);
  model.train({{"data", "builtin"}, {"epochs", "1"}, {"imgsz", "64"}, {"batch", "8"}, {"val", "false"},
               {"workers", "0"}, {"project", test::temp_dir("infer_graph_train")}, {"verbose", "false"}});
  EXPECT_TRUE(model.graph_info().captured.empty());
}

TEST(GpuInferenceGraph, AFamilyThatDoesNotDeclareItIsRefusedByName) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  models::Family fam = *models::find_family("yolo9");
  fam.name = "undeclared";
  fam.capture_inference = false;
  auto model = fam.build("t", 80);
  model->to(dev);
  model->eval();
  models::ForwardSpec spec;
  spec.device = dev;
  models::ForwardGraphs graphs;
  const auto images = probes(1, 128)[0];
  try {
    graphs.forward(*model, fam, images, spec, models::GraphMode::On);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("undeclared"), std::string::npos) << e.what();
  }
  // auto stays eager for it.
  graphs.forward(*model, fam, images, spec, models::GraphMode::Auto);
  graphs.forward(*model, fam, images, spec, models::GraphMode::Auto);
  graphs.forward(*model, fam, images, spec, models::GraphMode::Auto);
  EXPECT_EQ(graphs.info().captures, 0);
}
