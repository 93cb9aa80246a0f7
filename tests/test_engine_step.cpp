// The shared training step: gradient accumulation over micro-batches and gradient clipping.
#include "engine/step.hpp"
#include "models/detector.hpp"
#include "support.hpp"

using namespace libreyolo;

namespace {
struct StepFixture {
  std::shared_ptr<models::Detector> model;
  std::unique_ptr<engine::StepRunner> runner;
};

StepFixture make(double clip = 0.0, double lr = 0.01, double momentum = 0.937) {
  torch::manual_seed(0);
  const models::Family* fam = models::find_family("yolo9");
  StepFixture s;
  s.model = fam->build("t", 2);
  s.model->eval();  // running statistics: each sample's gradient is independent of the others
  engine::StepConfig sc;
  sc.clip_max_norm = clip;
  engine::OptimizerOptions oo;
  oo.lr = lr;
  oo.momentum = momentum;
  oo.weight_decay = 0.0;
  engine::LrSchedule sched;
  sched.lr0 = lr;
  sched.warmup_iters = 0;
  sched.min_lr_ratio = 1.0;  // constant learning rate
  s.runner = std::make_unique<engine::StepRunner>(s.model, fam->make_loss(*s.model), engine::make_optimizer(*s.model, oo),
                                                  std::make_unique<engine::GradScaler>(torch::Device(torch::kCPU), false),
                                                  nullptr, sched, sc);
  return s;
}

std::pair<torch::Tensor, torch::Tensor> batch(int seed) {
  torch::manual_seed(seed);
  auto images = torch::randint(0, 256, {2, 64, 64, 3}, torch::kUInt8);
  auto targets = torch::zeros({2, 4, 5});
  targets.select(2, 0).fill_(-1);
  targets[0][0] = torch::tensor({0.f, 0.1f, 0.1f, 0.6f, 0.5f});
  targets[1][0] = torch::tensor({1.f, 0.3f, 0.2f, 0.9f, 0.8f});
  return {images, targets};
}

std::vector<torch::Tensor> grads(models::Detector& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return out;
}
}  // namespace

// Two micro-batches with loss divisor 2 accumulate to the mean of their separate gradients.
TEST(Step, AccumulationAveragesMicroBatchGradients) {
  auto [i1, t1] = batch(1);
  auto [i2, t2] = batch(2);
  StepFixture a = make();
  a.runner->forward_backward(i1, t1, 2.0);
  a.runner->forward_backward(i2, t2, 2.0);
  auto accumulated = grads(*a.model);

  StepFixture b = make();
  b.runner->forward_backward(i1, t1, 1.0);
  auto g1 = grads(*b.model);
  b.runner->optimizer().zero_grad();
  b.runner->forward_backward(i2, t2, 1.0);
  auto g2 = grads(*b.model);
  double worst = 0;
  for (size_t k = 0; k < accumulated.size(); ++k) {
    auto want = (g1[k] + g2[k]) / 2;
    if (want.abs().max().item<double>() == 0) continue;
    worst = std::max(worst, test::rel_err(accumulated[k], want));
  }
  EXPECT_LT(worst, 1e-4);
}

// With clipping, the update of plain SGD (lr 1, no momentum) has at most the clipping norm.
TEST(Step, ClippingBoundsTheUpdateNorm) {
  auto [img, tgt] = batch(3);
  StepFixture s = make(/*clip=*/0.5, /*lr=*/1.0, /*momentum=*/0.0);
  std::vector<torch::Tensor> before;
  for (const auto& p : s.model->parameters()) before.push_back(p.detach().clone());
  s.runner->forward_backward(img, tgt);
  double raw_norm = 0;
  for (const auto& g : grads(*s.model)) raw_norm += g.pow(2).sum().item<double>();
  raw_norm = std::sqrt(raw_norm);
  ASSERT_GT(raw_norm, 0.5) << "the test needs a gradient larger than the clipping norm";
  s.runner->optimizer_step();
  double step_norm = 0;
  auto params = s.model->parameters();
  for (size_t k = 0; k < params.size(); ++k) step_norm += (params[k] - before[k]).pow(2).sum().item<double>();
  EXPECT_NEAR(std::sqrt(step_norm), 0.5, 1e-3);
  EXPECT_EQ(s.runner->global_step(), 1);
}
