// CUDA inputs to NMS and post-processing give the CPU results.
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
    auto cpu = ops::postprocess_yolo(pred, t.conf, t.iou, t.max_det, 0.5, 1280, 1280);
    for (auto dtype : {torch::kFloat32, torch::kFloat16}) {
      auto gpu = ops::postprocess_yolo(pred.to(torch::kCUDA, dtype), t.conf, t.iou, t.max_det, 0.5,
                                       1280, 1280);
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
      {1.0, 480, 640}, {0.5, 1280, 960}, {1.0, 640, 640}, {0.8, 700, 800}};
  for (const auto dtype : {torch::kFloat32, torch::kHalf}) {
    const torch::Tensor p = pred.to(torch::kCUDA).to(dtype);
    for (const double conf : {0.25, 0.01}) {
      const auto all = libreyolo::ops::postprocess_yolo_batch(p, conf, 0.6, 300, geo);
      ASSERT_EQ(all.size(), geo.size());
      for (int64_t i = 0; i < batch; ++i) {
        const auto& g = geo[static_cast<size_t>(i)];
        const auto one = libreyolo::ops::postprocess_yolo(p[i], conf, 0.6, 300, g.ratio, g.orig_h, g.orig_w);
        const auto& b = all[static_cast<size_t>(i)];
        ASSERT_EQ(b.scores.sizes(), one.scores.sizes()) << "image " << i << " conf " << conf;
        EXPECT_TRUE(torch::equal(b.boxes, one.boxes)) << "image " << i;
        EXPECT_TRUE(torch::equal(b.scores, one.scores)) << "image " << i;
        EXPECT_TRUE(torch::equal(b.classes, one.classes)) << "image " << i;
      }
    }
  }
}
