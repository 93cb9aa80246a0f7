// CUDA graphs of the inference forward: capture and replay equal eager bit for bit
// on two probe inputs from different distributions (fp32 and bf16 autocast), for every family; auto captures on
// the third use; invalidation (train mode, dtype change, device move, training); the API; a
// family that does not declare it is refused by name.
#include <ATen/Context.h>

#include <libreyolo/libreyolo.hpp>

#include <filesystem>
#include <fstream>

#include "io/image.hpp"
#include "io/sample_image.hpp"
#include "layers/concat.hpp"
#include "layers/fold.hpp"
#include "layers/cudnn_fusion.hpp"
#include "models/forward_graphs.hpp"
#include "models/input.hpp"
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
  // Every family, captured through a copy of its entry with the flag set: the evidence a family
  // needs before it declares capture_inference (the report says which do).
  int covered = 0;
  for (const models::Family* registered : models::families()) {
  models::Family copy = *registered;
  copy.capture_inference = true;
  const models::Family* fam = &copy;
  const std::string family = fam->name;
  std::printf("[ REPORT   ] %s declares capture_inference: %s\n", family.c_str(),
              registered->capture_inference ? "yes" : "not yet");
  ++covered;
  torch::manual_seed(0);
  auto model = fam->build(fam->default_size, fam->task == "classify" ? 5 : 80);
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
  EXPECT_GE(covered, 9) << "every registered family: the detectors and the three classifiers";
}

// Concatenations assembled in place (layers/concat.hpp) against torch::cat, v9-t graphed
// at bf16 and fp16: with cuDNN's fused convolutions reading and writing channel slices the plans
// differ from the packed ones (and a slice input no longer falls back to convolution + epilogue),
// so the predictions agree within rounding, not bit for bit. With the fusion in the build, no
// convolution configuration of the in-place forward is declined.
TEST(GpuInferenceGraph, ConcatInPlaceMatchesTorchCat) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  const models::Family* fam = models::find_family("yolo9");
  ASSERT_NE(fam, nullptr);
  torch::manual_seed(0);
  auto model = fam->build("t", 80);
  model->to(dev);
  model->eval();
  const auto probe = probes(2, 320)[1];
  const bool was = models::common::concat_in_place();
  for (const auto& [dt, tol] : std::vector<std::pair<torch::ScalarType, double>>{{torch::kBFloat16, 3e-2}, {torch::kHalf, 5e-3}}) {
    models::ForwardSpec spec;
    spec.device = dev;
    spec.amp = true;
    spec.amp_dtype = dt;
    torch::Tensor out[2];
    int64_t declined[2] = {0, 0};
    for (int in_place = 0; in_place < 2; ++in_place) {
      models::common::set_concat_in_place(in_place == 1);
      const auto before = models::cudnn_fusion_stats();
      models::ForwardGraphs graphs;
      graphs.forward(*model, *fam, probe, spec, models::GraphMode::On);
      out[in_place] = graphs.forward(*model, *fam, probe, spec, models::GraphMode::On).clone();
      declined[in_place] = models::cudnn_fusion_stats().declined - before.declined;
    }
    models::common::set_concat_in_place(was);
    const double e = test::rel_err(out[1], out[0]);
    std::cout << "[ REPORT   ] v9-t graphed " << c10::toString(dt) << ": concatenations in place vs torch::cat rel err " << e
              << "; fused configurations declined: " << declined[0] << " (cat), " << declined[1] << " (in place)\n";
    EXPECT_LE(e, tol) << c10::toString(dt);
    EXPECT_GT(out[1].abs().sum().item<double>(), 0.0);
    if (models::cudnn_fusion_enabled()) EXPECT_EQ(declined[1], 0) << c10::toString(dt);
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
  const auto eager = model.predict("SAMPLE_IMAGE", {{"imgsz", "320"}, {"conf", "0.000001"}});
  const auto graphed = model.predict("SAMPLE_IMAGE", {{"imgsz", "320"}, {"conf", "0.000001"}, {"cuda_graph", "true"}});
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

// predict() over a folder on the GPU (decoding a batch ahead into a pinned batch, graphed
// forward): batch 4 gives the images of batch 1 in the same order with the same detections (to a
// tolerance: cuDNN's algorithms differ between batch sizes), the unreadable file skipped in both;
// and a repeated predict() of one image does not refold the BatchNorms (the 20+ ms per call that
// the first H200 measurement of bench_predict showed).
TEST(GpuPredict, FolderAtBatchFourEqualsBatchOneAndRepeatedCallsDoNotRefold) {
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, /*allow_tf32=*/false);
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(test::temp_dir("gpu_predict_folder")) / "imgs";
  fs::create_directories(dir);
  for (int i = 0; i < 7; ++i)
    io::save_image((dir / ("img" + std::to_string(i) + ".jpg")).string(),
                   io::make_sample_image(240 + 16 * i, 320).roll({i * 29}, {1}).contiguous(), 90);
  std::ofstream(dir / "img3b.jpg") << "not an image";
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cuda:0");
  const Kwargs common = {{"imgsz", "320"}, {"conf", "0.000001"}, {"cuda_graph", "true"}};
  auto with = [&](const char* batch) {
    Kwargs kw = common;
    kw.push_back({"batch", batch});
    return model.predict(dir.string(), kw);
  };
  const auto one = with("1"), four = with("4");
  ASSERT_EQ(one.size(), 7u);
  ASSERT_EQ(four.size(), one.size());
  size_t boxes = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].source, four[i].source);
    const size_t n = std::min(one[i].detections.size(), four[i].detections.size());
    boxes += n;
    // Each of batch 1's top detections has its twin in batch 4's (order may differ between nearly
    // equal scores; a box at the threshold may come and go).
    for (size_t k = 0; k < std::min<size_t>(n, 20); ++k) {
      const Detection& d = one[i].detections[k];
      bool found = false;
      for (const Detection& e : four[i].detections)
        found = found || (e.class_id == d.class_id && std::abs(e.x1 - d.x1) < 0.05 && std::abs(e.y1 - d.y1) < 0.05 &&
                          std::abs(e.x2 - d.x2) < 0.05 && std::abs(e.score - d.score) < 1e-4);
      EXPECT_TRUE(found) << one[i].source << " detection #" << k;
    }
  }
  EXPECT_GT(boxes, 0u);
  const uint64_t folds = models::common::fold_computations();
  for (int i = 0; i < 3; ++i) model.predict((dir / "img0.jpg").string(), common);
  EXPECT_EQ(models::common::fold_computations(), folds);
}

// predict() on CUDA decodes JPEGs with nvJPEG on the device when it saves no pictures, with
// libjpeg-turbo on the host when it does (drawing needs the host pixels): the same images (one of
// them not at the model's size: resized), the same detections up to the two decoders' pixel
// differences; the unreadable file skipped by both.
TEST(GpuPredict, DeviceJpegDecodeMatchesHostDecode) {
  LY_REQUIRE_CUDA();
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(test::temp_dir("gpu_predict_nvjpeg")) / "imgs";
  fs::create_directories(dir);
  for (int i = 0; i < 3; ++i)
    io::save_image((dir / ("img" + std::to_string(i) + ".jpg")).string(),
                   io::make_sample_image(480 - 100 * i, 640).roll({i * 41}, {1}).contiguous(), 90);
  std::ofstream(dir / "img1b.jpg") << "not an image";
  LibreYOLO model = LibreYOLO::create("yolo9", "t", 80, "cuda:0");
  const Kwargs device_decode = {{"imgsz", "640"}, {"conf", "0.000001"}, {"batch", "4"}};
  Kwargs host_decode = device_decode;
  host_decode.push_back({"save", "true"});
  host_decode.push_back({"project", test::temp_dir("gpu_predict_nvjpeg_runs")});
  const auto dev = model.predict(dir.string(), device_decode), host = model.predict(dir.string(), host_decode);
  ASSERT_EQ(dev.size(), 3u);
  ASSERT_EQ(host.size(), 3u);
  double worst_box = 0, worst_score = 0;
  for (size_t i = 0; i < dev.size(); ++i) {
    EXPECT_EQ(dev[i].source, host[i].source);
    EXPECT_EQ(dev[i].height, host[i].height);
    EXPECT_EQ(dev[i].width, host[i].width);
    ASSERT_FALSE(host[i].detections.empty());
    ASSERT_FALSE(dev[i].detections.empty());
    // The host run's best detections have twins in the device run's.
    for (size_t k = 0; k < std::min<size_t>(host[i].detections.size(), 10); ++k) {
      const Detection& d = host[i].detections[k];
      double best = 1e9, score = 1e9;
      for (const Detection& e : dev[i].detections) {
        if (e.class_id != d.class_id) continue;
        const double m = std::max({std::abs(e.x1 - d.x1), std::abs(e.y1 - d.y1), std::abs(e.x2 - d.x2), std::abs(e.y2 - d.y2)});
        if (m < best) best = m, score = std::abs(e.score - d.score);
      }
      worst_box = std::max(worst_box, best);
      worst_score = std::max(worst_score, score);
    }
  }
  std::cout << "[ REPORT   ] predict, nvJPEG on the device vs libjpeg-turbo on the host: top-10 boxes within "
            << worst_box << " px, scores within " << worst_score << "\n";
  EXPECT_LE(worst_box, 1.0);
  EXPECT_LE(worst_score, 1e-3);
}

// The one-pass input kernel (models/input.hpp) equals the composed ops bit for bit: uint8 -> float32,
// channel flip, division by the divisor, one rounding to the dtype; both layouts, with and without a
// persistent buffer, on an odd size.
TEST(GpuNetworkInput, OneKernelEqualsTheComposedOpsBitForBit) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  torch::manual_seed(3);
  const auto images = torch::randint(0, 256, {3, 35, 21, 3}, torch::kUInt8);
  for (const models::InputSpec spec : {models::InputSpec{false, 255.0}, models::InputSpec{true, 1.0}}) {
    for (const bool cl : {true, false}) {
      for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
        torch::Tensor x = images.to(dev).permute({0, 3, 1, 2}).to(torch::kFloat);
        if (spec.bgr) x = x.flip(1);
        if (spec.divisor != 1.0) x = x.div(spec.divisor);
        const torch::Tensor want = x.to(dtype);
        const torch::Tensor got = models::to_network_input(images, spec, dev, cl, {}, dtype);
        const std::string what = std::string(spec.bgr ? "bgr" : "rgb") + (cl ? " channels_last " : " contiguous ") +
                                 c10::toString(dtype);
        ASSERT_EQ(got.scalar_type(), dtype) << what;
        EXPECT_TRUE(got.is_contiguous(cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous)) << what;
        EXPECT_TRUE(torch::equal(got, want)) << what;
        // Into a persistent buffer of that dtype: the same values, the same storage.
        const auto buffer = torch::empty_like(got);
        const auto again = models::to_network_input(images.to(dev), spec, dev, cl, buffer, dtype);
        EXPECT_TRUE(again.is_same(buffer)) << what;
        EXPECT_TRUE(torch::equal(again, want)) << what;
      }
    }
  }
}
