// YOLOX-n on CUDA: fixture parity in float32 (TF32 off) within 1e-3 (network, SimOTA, loss with
// L1 off and on, gradients), bf16 autocast keeping the loss in float32, the loss plus its
// backward captured in a CUDA graph (no host synchronisation anywhere in SimOTA), and whole
// training steps replayed from graphs equal to eager bit for bit across the L1 switch.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "engine/step.hpp"
#include "io/pickle.hpp"
#include "families/yolox/loss.hpp"
#include "models/detector.hpp"
#include "step_check.hpp"
#include "support.hpp"

#ifdef LIBREYOLO_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

using libreyolo::test::rel_err;
namespace models = libreyolo::models;
namespace io = libreyolo::io;
using libreyolo::loss::YoloxLoss;

using libreyolo::test::NoTF32;

namespace {

struct Fixture {
  io::PyValuePtr checkpoint, expect;
  std::shared_ptr<models::Detector> model;
  torch::Tensor expected(const std::string& key) const { return expect->get(key)->tensor; }
};

Fixture load_fixture(const std::string& dir) {
  Fixture f;
  f.checkpoint = io::load_torch_file(dir + "/yoloxn_nc80_s320.pt");
  f.expect = io::load_torch_file(dir + "/yoloxn_nc80_s320_expect.pt");
  auto sd = io::to_state_dict(*f.checkpoint->get("model"));
  const models::Family* fam = models::detect_family(sd);
  f.model = fam->build_like(sd, 80);
  models::load_state_dict(*f.model, sd, true);
  return f;
}

// (class, cx, cy, w, h) pixels, zero padding -> (class, x1, y1, x2, y2) normalised, class -1 padding.
torch::Tensor library_targets(const torch::Tensor& t, int64_t h, int64_t w) {
  auto cls = t.select(2, 0), cx = t.select(2, 1), cy = t.select(2, 2), bw = t.select(2, 3), bh = t.select(2, 4);
  auto pad = t.sum(2) <= 0;
  auto out = torch::stack({cls, (cx - bw / 2) / w, (cy - bh / 2) / h, (cx + bw / 2) / w, (cy + bh / 2) / h}, 2);
  return torch::where(pad.unsqueeze(2), torch::tensor({-1.f, 0.f, 0.f, 0.f, 0.f}), out);
}

double item(const torch::Tensor& t) { return t.detach().to(torch::kCPU, torch::kDouble).item<double>(); }

}  // namespace

TEST(YoloxGpuParity, Float32NetworkSimOtaLossAndGradients) {
  LY_REQUIRE_CUDA();
  LY_REQUIRE_FIXTURES(dir);
  NoTF32 fp32;
  for (bool l1 : {false, true}) {
    SCOPED_TRACE(l1 ? "L1 on" : "L1 off");
    auto f = load_fixture(dir);
    f.model->to(torch::kCUDA);
    const auto x = f.expected("input").to(torch::kCUDA);
    f.model->eval();
    {
      torch::NoGradGuard ng;
      const auto raw = f.model->forward_raw(x);
      for (int i = 0; i < 3; ++i) {
        const auto want = f.expected("eval_out_" + std::to_string(i));
        EXPECT_LE(rel_err(raw[i].narrow(1, 0, 4), want.narrow(1, 0, 4)), 1e-3);
        EXPECT_LE(rel_err(torch::sigmoid(raw[i].narrow(1, 4, 81)), want.narrow(1, 4, 81)), 1e-3);
      }
    }
    f.model->train();
    YoloxLoss loss(80);
    loss.set_use_l1(l1);
    const auto raw = f.model->forward_raw(x);
    for (int i = 0; i < 3; ++i)
      EXPECT_LE(rel_err(raw[i], f.expected("train_raw_" + std::to_string(i))), 1e-3) << i;
    const auto t = library_targets(f.expected("targets"), 320, 320).to(torch::kCUDA);
    const auto out = loss.compute(raw, t, 320, 320);
    const std::string p = l1 ? "loss_l1on_" : "loss_";
    EXPECT_NEAR(item(out.total), item(f.expected(p + "total_loss")), 1e-3 * item(f.expected(p + "total_loss")));
    for (const char* term : {"iou", "obj", "cls"})
      EXPECT_NEAR(item(out.term(term)), item(f.expected(p + term + "_loss")), 1e-3 * item(f.expected(p + term + "_loss")))
          << term;
    if (l1) {
      EXPECT_NEAR(item(out.term("l1")), item(f.expected("loss_l1on_l1_loss")), 1e-3 * item(f.expected("loss_l1on_l1_loss")));
    }
    // The assignment itself.
    const auto [cells, strides] = loss.grid(raw);
    auto gt = f.expected("targets").clone();
    gt.select(2, 0).masked_fill_(gt.sum(2) <= 0, -1);
    const auto a = loss.assign(loss.decode(loss.flatten(raw), cells, strides), gt.to(torch::kCUDA), cells, strides);
    EXPECT_TRUE(torch::equal(a.fg.cpu(), f.expected("simota_fg_mask")));
    EXPECT_TRUE(torch::equal(a.matched_gt.cpu(), f.expected("simota_matched_gt")));
    EXPECT_TRUE(torch::equal(a.dynamic_k.cpu(), f.expected("simota_dynamic_k")));
    out.total.backward();
    const auto params = f.model->named_parameters();
    int checked = 0;
    const std::string gp = l1 ? "grad_l1on." : "grad.";
    for (const auto& [key, value] : f.expect->dict) {
      const std::string name = key->as_string();
      if (name.rfind(gp, 0) != 0) continue;
      const auto* prm = params.find(name.substr(gp.size()));
      ASSERT_NE(prm, nullptr) << name;
      EXPECT_LE(rel_err(prm->grad(), value->tensor), 1e-3) << name;
      ++checked;
    }
    EXPECT_EQ(checked, 5);
  }
}

TEST(YoloxGpuParity, Bf16AutocastTrainStepKeepsTheLossInFloat32) {
  LY_REQUIRE_CUDA();
  LY_REQUIRE_FIXTURES(dir);
  auto f = load_fixture(dir);
  f.model->to(torch::kCUDA);
  f.model->train();
  YoloxLoss loss(80);
  const auto x = f.expected("input").to(torch::kCUDA);
  const auto t = library_targets(f.expected("targets"), 320, 320).to(torch::kCUDA);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  const auto raw = f.model->forward_raw(x);
  const auto out = loss.compute(raw, t, 320, 320);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  EXPECT_EQ(out.total.scalar_type(), torch::kFloat);
  // bf16 network outputs: the loss is close to the float32 one, not equal.
  EXPECT_NEAR(item(out.total), item(f.expected("loss_total_loss")), 0.05 * item(f.expected("loss_total_loss")));
  out.total.backward();
  for (const auto& p : f.model->parameters()) ASSERT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
}

#ifdef LIBREYOLO_CUDA
TEST(YoloxGpuParity, LossAndBackwardCaptureInACudaGraph) {
  LY_REQUIRE_CUDA();
  // A host synchronisation anywhere in SimOTA, the loss or its backward makes the capture fail.
  const int nc = 80;
  YoloxLoss loss(nc);
  loss.set_use_l1(true);
  auto make_raw = [&](uint64_t seed) {
    torch::manual_seed(seed);
    std::vector<torch::Tensor> raw;
    for (int64_t s : {8, 16, 32}) raw.push_back(torch::randn({2, 5 + nc, 320 / s, 320 / s}) * 0.5);
    return raw;
  };
  auto make_targets = [&](uint64_t seed, int gt) {
    torch::manual_seed(seed);
    auto t = torch::zeros({2, 50, 5});
    t.select(2, 0).fill_(-1);
    auto xy = torch::rand({2, gt, 2}) * 0.6;
    auto wh = torch::rand({2, gt, 2}) * 0.3 + 0.05;
    t.narrow(1, 0, gt).select(2, 0).copy_(torch::randint(nc, {2, gt}).to(torch::kFloat));
    t.narrow(1, 0, gt).narrow(2, 1, 2).copy_(xy);
    t.narrow(1, 0, gt).narrow(2, 3, 2).copy_(xy + wh);
    return t;
  };
  std::vector<torch::Tensor> raw;
  for (const auto& r : make_raw(1)) raw.push_back(r.cuda().requires_grad_(true));
  auto targets = make_targets(2, 8).cuda();
  auto side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  libreyolo::LossOutput captured;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) {
      for (auto& r : raw) r.mutable_grad() = torch::Tensor();
      loss.compute(raw, targets, 320, 320).total.backward();
    }
    for (auto& r : raw) r.mutable_grad() = torch::Tensor();
    graph.capture_begin();
    captured = loss.compute(raw, targets, 320, 320);
    captured.total.backward();
    graph.capture_end();
  }
  const auto fresh = make_raw(3);
  const auto fresh_t = make_targets(4, 12);
  {
    torch::NoGradGuard ng;
    for (size_t l = 0; l < raw.size(); ++l) raw[l].copy_(fresh[l].cuda());
    targets.copy_(fresh_t.cuda());
  }
  graph.replay();
  torch::cuda::synchronize();
  std::vector<torch::Tensor> eager_in;
  for (const auto& r : fresh) eager_in.push_back(r.cuda().requires_grad_(true));
  const auto eager = loss.compute(eager_in, fresh_t.cuda(), 320, 320);
  eager.total.backward();
  EXPECT_NEAR(item(captured.total), item(eager.total), 1e-6 * std::abs(item(eager.total)));
  EXPECT_EQ(item(captured.num_fg), item(eager.num_fg));
  EXPECT_GT(item(eager.num_fg), 0.0);
  for (size_t l = 0; l < raw.size(); ++l) EXPECT_LT(rel_err(raw[l].grad(), eager_in[l].grad()), 1e-5) << l;
}
#endif

#ifdef LIBREYOLO_CUDA
TEST(YoloxGpuStepGraph, GraphedStepsEqualEagerBitForBitAcrossTheL1Switch) {
  LY_REQUIRE_CUDA();
  const libreyolo::test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  const models::Family* fam = models::find_family("yolox");
  libreyolo::TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  cfg.warmup_epochs = 1;
  cfg.momentum = 0.9;
  cfg.scheduler = "yoloxwarmcos";
  cfg.no_aug_epochs = 2;
  const auto batches = libreyolo::test::pinned_step_batches(30, 2000, 4, 128);
  const auto build = [&] { return fam->build("n", 2); };
  const auto eager = libreyolo::test::run_family_steps(*fam, build, cfg, batches, dev, false, 15);
  const auto graphed = libreyolo::test::run_family_steps(*fam, build, cfg, batches, dev, true, 15);
  ASSERT_EQ(eager.losses.size(), graphed.losses.size());
  for (size_t i = 0; i < eager.losses.size(); ++i) EXPECT_TRUE(torch::equal(eager.losses[i], graphed.losses[i])) << i;
  for (size_t i = 0; i < eager.params.size(); ++i) EXPECT_TRUE(torch::equal(eager.params[i], graphed.params[i])) << i;
  EXPECT_EQ(graphed.stats.invalidations, 1);
  EXPECT_GE(graphed.stats.replayed_micro_steps, 20);
  EXPECT_EQ(eager.losses[5][4].item<float>(), 0.0f);  // l1 term before the switch
  EXPECT_GT(eager.losses[20][4].item<float>(), 0.0f);  // and after
}
#endif
