// CUDA inputs to NMS and post-processing give the CPU results.
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "ops/nms.hpp"
#include "ops/postprocess.hpp"
#include "support.hpp"

namespace ops = libreyolo::ops;

TEST(GpuPostprocess, CudaMatchesCpu) {
  LY_REQUIRE_CUDA();
  torch::manual_seed(9);
  auto pred = torch::empty({84, 8400});
  auto xy = torch::rand({2, 8400}) * 600;
  pred.slice(0, 0, 2).copy_(xy);
  pred.slice(0, 2, 4).copy_(xy + torch::rand({2, 8400}) * 100 + 4);
  pred.slice(0, 4).copy_(torch::sigmoid(torch::randn({80, 8400}) * 2 - 5));
  for (const auto& t : {ops::kPredictThresholds, ops::kValThresholds}) {
    auto cpu = ops::postprocess_yolo(pred, t.conf, t.iou, t.max_det, {0.5, 0.5, 1280, 1280});
    for (auto dtype : {torch::kFloat32, torch::kFloat16}) {
      auto gpu = ops::postprocess_yolo(pred.to(torch::kCUDA, dtype), t.conf, t.iou, t.max_det, {0.5, 0.5, 1280, 1280});
      EXPECT_TRUE(gpu.boxes.device().is_cpu());
      if (dtype == torch::kFloat32) {
        ASSERT_EQ(gpu.scores.sizes(), cpu.scores.sizes());
        EXPECT_TRUE(torch::equal(gpu.classes, cpu.classes));
        EXPECT_TRUE(torch::allclose(gpu.boxes, cpu.boxes));
      } else {
        // Half precision shifts scores and boxes a little; the result is still close in size.
        EXPECT_NEAR(gpu.scores.size(0), cpu.scores.size(0), 0.1 * cpu.scores.size(0) + 5);
      }
    }
  }
}

TEST(GpuPostprocess, NmsOnCudaTensors) {
  LY_REQUIRE_CUDA();
  torch::manual_seed(3);
  auto xy = torch::rand({3000, 2}) * 500;
  auto boxes = torch::cat({xy, xy + torch::rand({3000, 2}) * 60 + 1}, 1);
  auto scores = torch::rand({3000});
  auto classes = torch::randint(0, 10, {3000}, torch::kInt64);
  auto cpu = ops::batched_nms(boxes, scores, classes, 0.5);
  auto gpu = ops::batched_nms(boxes.cuda(), scores.cuda(), classes.cuda(), 0.5);
  EXPECT_TRUE(gpu.is_cuda());
  EXPECT_TRUE(torch::equal(gpu.cpu(), cpu));
  EXPECT_TRUE(torch::equal(ops::nms(boxes.cuda(), scores.cuda(), 0.5).cpu(),
                           ops::nms(boxes, scores, 0.5)));
}

// The batched postprocess on a CUDA batch (all images' candidates gathered on the device, one copy)
// equals the one-image call on each image's CUDA rows, for float32 and float16 predictions.
TEST(GpuPostprocess, CudaBatchEqualsImageByImage) {
  LY_REQUIRE_CUDA();
  torch::manual_seed(8);
  const int64_t batch = 4, anchors = 8400, nc = 20;  // fewer candidates than the 30,000 cap
  auto pred = torch::empty({batch, 4 + nc, anchors});
  auto xy = torch::rand({batch, 2, anchors}) * 600;
  pred.slice(1, 0, 2).copy_(xy);
  pred.slice(1, 2, 4).copy_(xy + torch::rand({batch, 2, anchors}) * 80 + 2);
  pred.slice(1, 4).copy_(torch::sigmoid(torch::randn({batch, nc, anchors}) * 2 - 7));
  const std::vector<libreyolo::ops::ImageGeometry> geo = {
      {1.0, 1.0, 480, 640}, {0.5, 0.5, 1280, 960}, {1.0, 1.0, 640, 640}, {0.8, 0.8, 700, 800}};
  for (const auto dtype : {torch::kFloat32, torch::kHalf}) {
    const torch::Tensor p = pred.to(torch::kCUDA).to(dtype);
    for (const double conf : {0.25, 0.01}) {
      const auto all = libreyolo::ops::postprocess_yolo_batch(p, conf, 0.6, 300, geo);
      ASSERT_EQ(all.size(), geo.size());
      for (int64_t i = 0; i < batch; ++i) {
        const auto& g = geo[static_cast<size_t>(i)];
        const auto one = libreyolo::ops::postprocess_yolo(p[i], conf, 0.6, 300, g);
        const auto& b = all[static_cast<size_t>(i)];
        ASSERT_EQ(b.scores.sizes(), one.scores.sizes()) << "image " << i << " conf " << conf;
        EXPECT_TRUE(torch::equal(b.boxes, one.boxes)) << "image " << i;
        EXPECT_TRUE(torch::equal(b.scores, one.scores)) << "image " << i;
        EXPECT_TRUE(torch::equal(b.classes, one.classes)) << "image " << i;
      }
    }
  }
}

namespace {

// Predictions [batch, 4 + nc, anchors] (CPU float32) whose candidates stress the GPU
// post-processing: `hits[i]` (anchor, class) scores of image i above 0.25 in steps of 1/64 (many
// equal scores), several classes on one anchor, boxes crowded around a few centres (much
// suppression), boxes leaving the image (clipping), degenerate boxes, a NaN and an infinite
// coordinate, an infinite score (a candidate that is then dropped) and a NaN score (never one),
// and scores exactly 0.25 (not above a 0.25 threshold). Everything else scores 1/128.
torch::Tensor crowded_pred(const std::vector<int64_t>& hits, int64_t nc, int64_t anchors, uint64_t seed) {
  torch::manual_seed(seed);
  const auto batch = static_cast<int64_t>(hits.size());
  auto pred = torch::full({batch, 4 + nc, anchors}, 1.0 / 128);
  const auto centre = torch::randint(0, 8, {batch, anchors}).to(torch::kFloat32) * 90 - 20;  // 8 clusters
  const auto cx = centre + torch::randn({batch, anchors}) * 12, cy = centre * 0.7 + torch::randn({batch, anchors}) * 12;
  const auto w = torch::rand({batch, anchors}) * 120 + 8, h = torch::rand({batch, anchors}) * 120 + 8;
  pred.select(1, 0).copy_(cx - w / 2), pred.select(1, 1).copy_(cy - h / 2);
  pred.select(1, 2).copy_(cx + w / 2), pred.select(1, 3).copy_(cy + h / 2);
  auto acc = pred.accessor<float, 3>();
  for (int64_t b = 0; b < batch; ++b) {
    const auto anchor = torch::randint(0, anchors, {hits[static_cast<size_t>(b)]});
    const auto cls = torch::randint(0, nc, {hits[static_cast<size_t>(b)]});
    const auto level = torch::randint(16, 64, {hits[static_cast<size_t>(b)]});  // 16/64 = 0.25: at the threshold
    for (int64_t k = 0; k < anchor.size(0); ++k)
      acc[b][4 + cls[k].item<int64_t>()][anchor[k].item<int64_t>()] = static_cast<float>(level[k].item<int64_t>()) / 64;
    if (anchors < 8 || hits[static_cast<size_t>(b)] == 0) continue;
    acc[b][2][0] = acc[b][0][0] - 1;  // degenerate
    acc[b][4][0] = 0.75f;
    acc[b][1][1] = std::nanf("");  // NaN coordinate
    acc[b][5][1] = 0.75f;
    acc[b][2][2] = INFINITY;  // clipped to the image width
    acc[b][4][2] = 0.5f;
    acc[b][4 + nc - 1][3] = INFINITY;  // a candidate, dropped as non-finite
    acc[b][4][4] = std::nanf("");  // never a candidate
    acc[b][4][5] = 0.75f, acc[b][5][5] = 0.75f;  // two classes, the same score, one anchor
  }
  return pred;
}

size_t count_synchronisations(const std::function<void()>& work) {
  struct Counter : c10::WarningHandler {
    size_t n = 0;
    void process(const c10::Warning& w) override {
      if (w.msg().find("synchroniz") != std::string::npos) ++n;
    }
  } counter;
  c10::WarningUtils::WarningHandlerGuard guard(&counter);
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  work();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  return counter.n;
}

void expect_same(const std::vector<ops::Detections>& got, const std::vector<ops::Detections>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].scores.sizes(), want[i].scores.sizes()) << what << ", image " << i;
    EXPECT_TRUE(torch::equal(got[i].boxes, want[i].boxes)) << what << ", image " << i;
    EXPECT_TRUE(torch::equal(got[i].scores, want[i].scores)) << what << ", image " << i;
    EXPECT_TRUE(torch::equal(got[i].classes, want[i].classes)) << what << ", image " << i;
  }
}

}  // namespace

// A CUDA batch is post-processed on the GPU (kernels/detect_nms: candidates, sort, class-aware
// NMS, one copy of the result rows): the same detections, bit for bit, as the host path on the
// same predictions moved to the CPU, for float32, float16 and bfloat16 predictions, thresholds
// whose float32 value is not the dtype's (0.3), a max_det that truncates, and an image with more
// candidates than the kernel sorts (5,000 > 4,096: that image takes the host path in the same call).
TEST(GpuPostprocess, KernelEqualsHostPathBitForBit) {
  LY_REQUIRE_CUDA();
  const int64_t nc = 80, anchors = 8400;
  const auto pred = crowded_pred({300, 0, 3000, 5000, 40}, nc, anchors, 21);
  const std::vector<ops::ImageGeometry> geo = {
      {1.0, 1.0, 480, 640}, {0.5, 0.5, 1280, 960}, {1.0, 1.0, 640, 640}, {0.8, 0.8, 700, 800}, {1.0 / 3.0, 1.0 / 3.0, 1900, 1500}};
  struct Case {
    double conf, iou;
    int max_det;
  };
  for (const auto dtype : {torch::kFloat32, torch::kHalf, torch::kBFloat16}) {
    const torch::Tensor host = pred.to(dtype);
    const torch::Tensor device = host.to(torch::kCUDA);
    for (const Case c : {Case{0.25, 0.45, 300}, Case{0.3, 0.7, 300}, Case{0.25, 0.45, 7}, Case{0.26, 0.0, 300}}) {
      const std::string what = std::string(c10::toString(dtype)) + " conf " + std::to_string(c.conf) + " iou " +
                               std::to_string(c.iou) + " max_det " + std::to_string(c.max_det);
      const auto want = ops::postprocess_yolo_batch(host, c.conf, c.iou, c.max_det, geo);
      const auto got = ops::postprocess_yolo_batch(device, c.conf, c.iou, c.max_det, geo);
      expect_same(got, want, what);
      size_t kept = 0;
      for (const auto& d : want) kept += static_cast<size_t>(d.scores.size(0));
      EXPECT_GT(kept, 20u) << what;  // the case has detections to compare
    }
  }
}

// More images than one launch of the NMS kernel takes (64), few anchors and classes; one image
// post-processed alone (postprocess_yolo on a CUDA image goes through the same kernel).
TEST(GpuPostprocess, KernelHandlesManyImagesAndSingleImages) {
  LY_REQUIRE_CUDA();
  std::vector<int64_t> hits;
  std::vector<ops::ImageGeometry> geo;
  for (int i = 0; i < 70; ++i) {
    hits.push_back(i % 9 == 0 ? 0 : 20 + i);
    geo.push_back({1.0 + 0.01 * i, 1.0 + 0.01 * i, 500 + i, 600 - i});
  }
  const auto pred = crowded_pred(hits, 3, 300, 5);
  const auto want = ops::postprocess_yolo_batch(pred, 0.25, 0.45, 300, geo);
  expect_same(ops::postprocess_yolo_batch(pred.cuda(), 0.25, 0.45, 300, geo), want, "70 images");
  for (const int64_t i : {1, 65}) {
    const auto& g = geo[static_cast<size_t>(i)];
    const auto one = ops::postprocess_yolo(pred[i].cuda(), 0.25, 0.45, 300, g);
    expect_same({one}, {want[static_cast<size_t>(i)]}, "image " + std::to_string(i) + " alone");
  }
}

// The GPU path synchronises with the host once (the copy of the result rows); the host path
// synchronises more (nonzero's count, then the candidates' copy). Counted through PyTorch's
// synchronisation debug mode.
TEST(GpuPostprocess, KernelPathSynchronisesOnce) {
  LY_REQUIRE_CUDA();
  const std::vector<ops::ImageGeometry> geo(4, ops::ImageGeometry{1.0, 1.0, 640, 640});
  const auto pred = crowded_pred({100, 200, 0, 50}, 80, 8400, 2).cuda();
  ops::postprocess_yolo_batch(pred, 0.25, 0.45, 300, geo);  // warm
  libreyolo::synchronize(pred.device());
  std::vector<ops::Detections> got;
  const size_t syncs = count_synchronisations([&] { got = ops::postprocess_yolo_batch(pred, 0.25, 0.45, 300, geo); });
  EXPECT_EQ(syncs, 1u);
  size_t kept = 0;
  for (const auto& d : got) kept += static_cast<size_t>(d.scores.size(0));
  EXPECT_GT(kept, 0u);
}
