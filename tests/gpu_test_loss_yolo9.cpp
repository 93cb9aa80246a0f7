// YOLOv9 loss on CUDA: agreement with the CPU, fixture parity, bf16 autocast, graph capture.
#include <ATen/autocast_mode.h>

#include <string>
#include <vector>

#include "io/pickle.hpp"
#include "families/yolo9/loss.hpp"
#include "support.hpp"

#ifdef LIBREYOLO_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

namespace ll = libreyolo::loss;
using torch::Tensor;

std::vector<Tensor> random_raw(int64_t B, int64_t img, int nc, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<Tensor> raw;
  for (int64_t s : {8, 16, 32}) raw.push_back(torch::randn({B, 64 + nc, img / s, img / s}) * 2);
  return raw;
}

Tensor random_targets(int64_t B, int64_t gt, int nc, uint64_t seed) {
  torch::manual_seed(seed);
  auto t = torch::zeros({B, 100, 5});
  t.select(2, 0).fill_(-1);
  auto xy = torch::rand({B, gt, 2}) * 0.7;
  auto wh = torch::rand({B, gt, 2}) * 0.5 + 0.05;
  t.narrow(1, 0, gt).select(2, 0).copy_(torch::randint(nc, {B, gt}).to(torch::kFloat));
  t.narrow(1, 0, gt).narrow(2, 1, 2).copy_(xy);
  t.narrow(1, 0, gt).narrow(2, 3, 2).copy_((xy + wh).clamp_max(1.0));
  return t;
}

std::vector<Tensor> leaves(const std::vector<Tensor>& raw, const torch::Device& d,
                           torch::ScalarType dtype = torch::kFloat) {
  std::vector<Tensor> out;
  for (const auto& r : raw) out.push_back(r.to(d, dtype).detach().requires_grad_(true));
  return out;
}

double val(const Tensor& t) { return t.to(torch::kCPU, torch::kDouble).item<double>(); }

// Turns CUDA autocast on (bf16) for the scope.
struct AutocastBf16 {
  AutocastBf16() {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  }
  ~AutocastBf16() {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
};

}  // namespace

TEST(Yolo9LossGpu, CudaMatchesCpu) {
  LY_REQUIRE_CUDA();
  const int nc = 80;
  const auto raw = random_raw(4, 320, nc, 1);
  const auto targets = random_targets(4, 12, nc, 2);
  ll::Yolo9Loss loss(nc);
  auto cpu = leaves(raw, torch::kCPU);
  auto gpu = leaves(raw, torch::kCUDA);
  const auto a = loss.compute(cpu, targets, 320, 320);
  const auto b = loss.compute(gpu, targets.cuda(), 320, 320);
  a.total.backward();
  b.total.backward();
  for (auto [x, y] : {std::make_pair(a.total, b.total), std::make_pair(a.term("box"), b.term("box")),
                      std::make_pair(a.term("dfl"), b.term("dfl")), std::make_pair(a.term("cls"), b.term("cls"))})
    EXPECT_NEAR(val(y), val(x), 1e-5 * std::abs(val(x)));
  EXPECT_EQ(val(a.num_fg), val(b.num_fg));
  for (size_t l = 0; l < raw.size(); ++l)
    EXPECT_LT(libreyolo::test::rel_err(gpu[l].grad(), cpu[l].grad()), 1e-4) << "level " << l;
}

TEST(Yolo9LossGpu, FixtureParity) {
  LY_REQUIRE_CUDA();
  LY_REQUIRE_FIXTURES(dir);
  const auto expect = libreyolo::io::load_torch_file(dir + "/yolo9t_nc80_s320_expect.pt");
  std::vector<Tensor> raw;
  for (int l = 0; l < 3; ++l)
    raw.push_back(expect->get("train_raw_" + std::to_string(l))->tensor.cuda());
  ll::Yolo9Loss loss(80);
  const auto out = loss.compute(raw, expect->get("targets")->tensor.cuda(), 320, 320);
  for (auto [name, got] :
       {std::make_pair("total_loss", out.total), std::make_pair("box_loss", out.term("box")),
        std::make_pair("dfl_loss", out.term("dfl")), std::make_pair("cls_loss", out.term("cls"))}) {
    const double want = expect->get(std::string("loss_") + name)->tensor.item<double>();
    EXPECT_NEAR(val(got), want, 1e-4 * std::abs(want)) << name;
  }
}

TEST(Yolo9LossGpu, Bf16AutocastKeepsTheLossInFloat32) {
  LY_REQUIRE_CUDA();
  const int nc = 80;
  // bf16 head outputs, as an autocast forward produces them.
  const auto raw = random_raw(2, 320, nc, 3);
  std::vector<Tensor> bf16_values;
  for (const auto& r : raw) bf16_values.push_back(r.to(torch::kBFloat16).to(torch::kFloat));
  const auto targets = random_targets(2, 10, nc, 4).cuda();
  ll::Yolo9Loss loss(nc);
  auto ref_in = leaves(bf16_values, torch::kCUDA);
  const auto ref = loss.compute(ref_in, targets, 320, 320);
  auto in = leaves(raw, torch::kCUDA, torch::kBFloat16);
  libreyolo::LossOutput out;
  {
    AutocastBf16 autocast;
    const auto probe = torch::ones({8, 8}, torch::kCUDA);
    ASSERT_EQ(at::mm(probe, probe).scalar_type(), torch::kBFloat16) << "autocast is not on";
    out = loss.compute(in, targets, 320, 320);
  }
  EXPECT_EQ(out.total.scalar_type(), torch::kFloat);
  ASSERT_TRUE(std::isfinite(val(out.total)));
  // The loss upcasts first, so bf16 inputs give the float32 result on the same values.
  EXPECT_NEAR(val(out.total), val(ref.total), 1e-5 * std::abs(val(ref.total)));
  EXPECT_EQ(val(out.num_fg), val(ref.num_fg));
  out.total.backward();
  for (const auto& r : in) {
    EXPECT_EQ(r.grad().scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::isfinite(r.grad()).all().item<bool>());
  }
}

#ifdef LIBREYOLO_CUDA
TEST(Yolo9LossGpu, ForwardAndBackwardCaptureInACudaGraph) {
  LY_REQUIRE_CUDA();
  // A host synchronisation anywhere in compute() or its backward makes the capture fail.
  const int nc = 80;
  ll::Yolo9Loss loss(nc);
  auto raw = leaves(random_raw(2, 320, nc, 5), torch::kCUDA);
  auto targets = random_targets(2, 10, nc, 6).cuda();
  auto side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  libreyolo::LossOutput captured;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) {  // warm-up (also fills the anchor-grid cache)
      for (auto& r : raw) r.mutable_grad() = Tensor();
      loss.compute(raw, targets, 320, 320).total.backward();
    }
    for (auto& r : raw) r.mutable_grad() = Tensor();
    graph.capture_begin();
    captured = loss.compute(raw, targets, 320, 320);
    captured.total.backward();
    graph.capture_end();
  }
  // New inputs in the captured buffers, then replay.
  const auto fresh = random_raw(2, 320, nc, 7);
  const auto fresh_targets = random_targets(2, 14, nc, 8);
  {
    torch::NoGradGuard no_grad;
    for (size_t l = 0; l < raw.size(); ++l) raw[l].copy_(fresh[l].cuda());
    targets.copy_(fresh_targets.cuda());
  }
  graph.replay();
  torch::cuda::synchronize();
  auto eager_in = leaves(fresh, torch::kCUDA);
  const auto eager = loss.compute(eager_in, fresh_targets.cuda(), 320, 320);
  eager.total.backward();
  EXPECT_NEAR(val(captured.total), val(eager.total), 1e-6 * std::abs(val(eager.total)));
  EXPECT_NEAR(val(captured.term("box")), val(eager.term("box")), 1e-6 * std::abs(val(eager.term("box"))));
  EXPECT_EQ(val(captured.num_fg), val(eager.num_fg));
  for (size_t l = 0; l < raw.size(); ++l)
    EXPECT_LT(libreyolo::test::rel_err(raw[l].grad(), eager_in[l].grad()), 1e-5) << "level " << l;
}
#endif

// The assigner's metrics from one kernel (kernels/assign.hpp) agree with the composed ops to float32
// rounding: CIoU clamped to [0, 1] and sigmoid(logit)^0.5 * iou^6, with padding rows (zero boxes)
// and class logits read through a view into a wider tensor, as decode() hands them over.
TEST(Yolo9LossGpu, PairMetricsKernelMatchesTheComposedOps) {
  LY_REQUIRE_CUDA();
  const int64_t B = 3, T = 17, A = 1000, nc = 80;
  torch::manual_seed(11);
  const auto dev = torch::Device(torch::kCUDA, 0);
  auto xy = torch::rand({B, T, 2}) * 500, wh = torch::rand({B, T, 2}) * 150 + 2;
  auto gt = torch::cat({xy, xy + wh}, 2);
  gt.narrow(1, 12, 5).zero_();  // padding rows
  // Predictions near the ground truths and far from them.
  auto pxy = torch::rand({B, 2, A}) * 600, pwh = torch::rand({B, 2, A}) * 120 + 1;
  const auto pred = torch::cat({pxy, pxy + pwh}, 1).to(dev);
  const auto decoded = torch::randn({B, 64 + nc, A}).mul_(3).to(dev);
  const auto cls_logits = decoded.narrow(1, 64, nc);
  const auto gt_cls = torch::randint(nc, {B, T}, torch::kLong).to(dev);
  const auto gt_dev = gt.to(dev);
  ll::Yolo9Loss loss(static_cast<int>(nc));
  const auto [iou, align] = loss.pair_metrics(gt_dev, pred, cls_logits, gt_cls);
  const auto want_iou = ll::pairwise_ciou(gt_dev, pred).clamp_(0, 1);
  const auto want_align = cls_logits.sigmoid().pow_(0.5).gather(1, gt_cls.unsqueeze(2).expand({B, T, A})) *
                          want_iou.pow(6.0);
  ASSERT_EQ(iou.sizes(), want_iou.sizes());
  ASSERT_EQ(align.sizes(), want_align.sizes());
  EXPECT_GT(want_iou.gt(0.3).sum().item<int64_t>(), 0);  // some real overlaps among the pairs
  EXPECT_LT((iou - want_iou).abs().max().item<double>(), 2e-6);
  EXPECT_LT((align - want_align).abs().max().item<double>(), 2e-6);
  EXPECT_EQ(iou.narrow(1, 12, 5).abs().max().item<double>(), 0.0);  // padding never matches
}
