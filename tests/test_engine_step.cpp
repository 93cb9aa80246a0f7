// The shared training step: gradient accumulation over micro-batches, gradient clipping, the
// static buffers a captured step needs, the gradient-sync seam, and bit-equality with the eager
// step it replaced.
#include "engine/step.hpp"
#include "layers/conv_bn_act.hpp"
#include "models/detector.hpp"
#include "step_check.hpp"
#include "support.hpp"

using namespace libreyolo;
using test::step_batch;

namespace {

// The test recipe: plain SGD at a constant rate, no accumulation.
TrainConfig constant_lr_config(double clip = 0.0, double lr = 0.01, double momentum = 0.937) {
  TrainConfig c;
  c.lr0 = lr;
  c.momentum = momentum;
  c.weight_decay = 0.0;
  c.clip_max_norm = clip;
  c.warmup_epochs = 0;
  c.min_lr_ratio = 1.0;  // constant learning rate
  c.nbs = 0;
  c.batch = 2;
  c.epochs = 1;
  return c;
}

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
  s.runner = engine::make_step_runner(constant_lr_config(clip, lr, momentum), s.model, fam->make_loss(*s.model), nullptr,
                                      torch::Device(torch::kCPU), engine::AmpPlan{}, false, 1)
                 .runner;
  return s;
}

size_t trainable(models::Detector& m) {
  size_t n = 0;
  for (const auto& p : m.parameters()) n += p.requires_grad() ? 1 : 0;
  return n;
}

std::vector<torch::Tensor> grads(models::Detector& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return out;
}

// The recipe with warm-up (the lr changes every step), decay, and accumulation over 2 batches
// in epochs of 5 (windows of 2, 2 and 1).
TrainConfig accumulating_config() {
  TrainConfig c;
  c.batch = 2;
  c.nbs = 4;
  c.epochs = 10;
  c.warmup_epochs = 1;
  return c;
}

}  // namespace

// Two micro-batches with loss divisor 2 accumulate to the mean of their separate gradients.
TEST(Step, AccumulationAveragesMicroBatchGradients) {
  auto [i1, t1] = step_batch(1);
  auto [i2, t2] = step_batch(2);
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
  auto [img, tgt] = step_batch(3);
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

// The one TrainConfig mapping: accumulation round(nbs / batch), optimizer steps per epoch, the
// schedule counted in optimizer steps, the optimizer's settings.
TEST(Step, MakeStepRunnerMapsTheConfig) {
  TrainConfig c = accumulating_config();
  c.nbs = 64;
  c.batch = 24;  // 64 / 24 = 2.67 -> 3
  c.warmup_epochs = 2.5;
  c.optimizer = "adamw";
  c.lr0 = 0.002;
  auto rig = test::make_step_rig(c, torch::kCPU, engine::AmpPlan{}, false, /*batches_per_epoch=*/10, false);
  EXPECT_EQ(rig.setup.accumulate, 3);
  EXPECT_EQ(rig.setup.steps_per_epoch, 4);  // ceil(10 / 3)
  EXPECT_EQ(rig.setup.schedule.warmup_iters, 10);
  EXPECT_EQ(rig.setup.schedule.total_iters, 40);
  EXPECT_EQ(rig.runner().optimizer().name(), "AdamW");
  EXPECT_DOUBLE_EQ(rig.runner().optimizer().lr(), rig.setup.schedule.at(0));
  EXPECT_DOUBLE_EQ(rig.runner().optimizer().lr_tensor().item<double>(), rig.setup.schedule.at(0));
  c.nbs = 0;
  EXPECT_EQ(test::make_step_rig(c, torch::kCPU, engine::AmpPlan{}, false, 10, false).setup.accumulate, 1);
}

// The acceptance test of the capture-ready step on the CPU: 30 micro-batches through the
// trainer's window arithmetic (the first optimizer step, accumulation windows of 2 and a last
// window of 1), with EMA and the loss scaler on. From step 3 on, every parameter, gradient,
// optimizer state, EMA tensor, scaler tensor, schedule tensor and input buffer keeps its storage.
TEST(Step, NoTensorIsReallocatedAfterTheSecondStep) {
  engine::AmpPlan amp;
  amp.scaler = true;  // dynamic loss scaling in fp32: exercises the scaler's tensors on the CPU
  auto rig = test::make_step_rig(accumulating_config(), torch::kCPU, amp, false, /*batches_per_epoch=*/5);
  ASSERT_EQ(rig.setup.accumulate, 2);
  auto& runner = rig.runner();
  std::vector<std::pair<std::string, torch::Tensor>> ref;
  std::vector<const void*> ref_ptrs;
  std::vector<double> lrs;
  int64_t updates = 0;
  for (int step = 1; step <= 30; ++step) {
    const int64_t bi = (step - 1) % rig.batches_per_epoch;
    const auto w = test::window_of(bi, rig.batches_per_epoch, rig.setup.accumulate);
    auto [images, targets] = step_batch(100 + step);
    LossOutput out = runner.forward_backward(images, targets, static_cast<double>(w.size));
    ASSERT_TRUE(std::isfinite(out.total.item<double>())) << "step " << step;
    if (w.optimizer_step) {
      runner.optimizer_step();
      ++updates;
      lrs.push_back(runner.optimizer().lr());
    }
    if (step == 2) {
      ref = test::step_tensors(rig);
      ref_ptrs = test::data_pointers(ref);
    } else if (step > 2) {
      auto now = test::step_tensors(rig);
      ASSERT_EQ(now.size(), ref.size()) << "step " << step << ": tensors appeared or disappeared";
      auto ptrs = test::data_pointers(now);
      for (size_t k = 0; k < now.size(); ++k) {
        ASSERT_EQ(now[k].first, ref[k].first);
        EXPECT_EQ(ptrs[k], ref_ptrs[k]) << "step " << step << ": " << now[k].first << " was reallocated";
      }
    }
  }
  EXPECT_EQ(updates, 18);  // 6 epochs of 3 windows
  EXPECT_EQ(runner.global_step(), 18);
  EXPECT_EQ(rig.ema->updates(), 18);
  EXPECT_NE(lrs.front(), lrs.back());  // the learning rate moved (warm-up), through the same tensor
  EXPECT_DOUBLE_EQ(runner.optimizer().lr_tensor().item<double>(), rig.setup.schedule.at(18));
  EXPECT_DOUBLE_EQ(runner.scaler().current_scale(), 65536.0);
  // Every trainable parameter got a gradient: the check above covered them all.
  for (const auto& p : rig.model->parameters()) EXPECT_EQ(p.grad().defined(), p.requires_grad());
}

// Behaviour unchanged: the static-buffer step equals, bit for bit, the eager step it replaced
// (fresh input tensors, the divisor applied only when not 1, gradients set to none, lazily
// created momentum buffers with torch's first-step rule, a double learning rate, EMA lerp with
// a scalar weight), written out here with the same ATen calls.
TEST(Step, EqualsTheEagerStepBitForBit) {
  // A constant momentum: the reference below calls the fused kernel as the step does without a
  // warm-up (the warm-up's arithmetic is Optimizer.SgdFollowsAChangingMomentum's).
  TrainConfig cfg = accumulating_config();
  cfg.warmup_momentum = cfg.momentum;
  const int64_t nb = 5;
  auto rig = test::make_step_rig(cfg, torch::kCPU, engine::AmpPlan{}, false, nb);
  auto ref = test::make_step_rig(cfg, torch::kCPU, engine::AmpPlan{}, false, nb);  // for its model, EMA, schedule
  const models::Family* fam = models::find_family("yolo9");
  auto ref_loss = fam->make_loss(*ref.model);
  auto groups = engine::make_param_groups(*ref.model, cfg.weight_decay);
  std::vector<std::vector<torch::Tensor>> bufs;
  for (const auto& g : groups) bufs.emplace_back(g.params.size());
  auto float_state = [](const torch::nn::Module& m) {
    std::vector<torch::Tensor> out;
    for (const auto& p : m.named_parameters(true)) out.push_back(p.value());
    for (const auto& b : m.named_buffers(true))
      if (b.value().is_floating_point()) out.push_back(b.value());
    return out;
  };
  auto ema_state = float_state(*ref.ema_model), src_state = float_state(*ref.model);
  int64_t ref_step = 0;
  for (int64_t i = 0; i < 2 * nb; ++i) {
    const int64_t bi = i % nb;
    const auto w = test::window_of(bi, nb, rig.setup.accumulate);
    auto [images, targets] = step_batch(200 + static_cast<int>(i));
    LossOutput got = rig.runner().forward_backward(images, targets, static_cast<double>(w.size));
    if (w.optimizer_step) rig.runner().optimizer_step();

    // The eager step, as before.
    torch::Tensor x = images.permute({0, 3, 1, 2})
                          .to(torch::TensorOptions().dtype(torch::kFloat), false, false, at::MemoryFormat::Contiguous)
                          .div_(255.0);
    auto raw = ref.model->forward_raw(x);
    LossOutput want = ref_loss->compute(raw, targets, 64, 64);
    torch::Tensor loss = w.size != 1 ? want.total / static_cast<double>(w.size) : want.total;
    {
      models::DeferredWeightGrads wg;
      loss.backward();
      wg.flush();
    }
    if (w.optimizer_step) {
      torch::NoGradGuard ng;
      const double lr = ref.setup.schedule.at(ref_step);
      for (size_t gi = 0; gi < groups.size(); ++gi) {
        std::vector<torch::Tensor> sp, sg, sb, fp, fg, fb;
        for (size_t k = 0; k < groups[gi].params.size(); ++k) {
          auto& p = groups[gi].params[k];
          if (!p.grad().defined()) continue;
          const bool fresh = !bufs[gi][k].defined();
          if (fresh) bufs[gi][k] = torch::zeros_like(p, at::MemoryFormat::Preserve);
          (fresh ? fp : sp).push_back(p);
          (fresh ? fg : sg).push_back(p.grad());
          (fresh ? fb : sb).push_back(bufs[gi][k]);
        }
        const double wd = groups[gi].weight_decay;
        if (!sp.empty())
          at::_fused_sgd_(sp, sg, sb, wd, cfg.momentum, lr, 0.0, cfg.nesterov, false, false);
        if (!fp.empty())
          at::_fused_sgd_(fp, fg, fb, wd, cfg.momentum, lr, 0.0, cfg.nesterov, false, true);
      }
      for (auto& p : ref.model->parameters()) p.mutable_grad().reset();
      ++ref_step;
      at::_foreach_lerp_(ema_state, src_state, at::Scalar(1.0 - ref.ema->decay_at(ref_step)));
    }
    ASSERT_TRUE(torch::equal(got.total, want.total.detach())) << "micro-batch " << i;
  }
  auto a = rig.model->named_parameters(true), b = ref.model->named_parameters(true);
  for (const auto& p : a) EXPECT_TRUE(torch::equal(p.value(), *b.find(p.key()))) << p.key();
  auto ab = rig.model->named_buffers(true), bb = ref.model->named_buffers(true);
  for (const auto& p : ab) EXPECT_TRUE(torch::equal(p.value(), *bb.find(p.key()))) << p.key();
  auto ea = float_state(*rig.ema_model);
  ASSERT_EQ(ea.size(), ema_state.size());
  for (size_t k = 0; k < ea.size(); ++k) EXPECT_TRUE(torch::equal(ea[k], ema_state[k])) << "EMA tensor " << k;
}

// The data-parallel seam: called once per optimizer step with every gradient, after the last
// backward of the window and before the update (a sync that zeroes them leaves plain SGD with
// no decay nothing to do).
TEST(Step, GradSyncRunsOncePerUpdateBeforeTheStep) {
  struct ZeroingSync : engine::GradSync {
    int calls = 0;
    size_t count = 0;
    void after_backward(std::vector<torch::Tensor>& grads) override {
      ++calls;
      count = grads.size();
      for (auto& g : grads) g.zero_();
    }
  };
  TrainConfig c = constant_lr_config(0.0, 0.1, 0.0);
  c.nbs = 4;  // two micro-batches per update
  auto rig = test::make_step_rig(c, torch::kCPU, engine::AmpPlan{}, false, 4, false);
  auto sync = std::make_unique<ZeroingSync>();
  ZeroingSync* seen = sync.get();
  rig.runner().set_grad_sync(std::move(sync));
  std::vector<torch::Tensor> before;
  for (const auto& p : rig.model->parameters()) before.push_back(p.detach().clone());
  for (int i = 0; i < 4; ++i) {
    auto [images, targets] = step_batch(300 + i);
    rig.runner().forward_backward(images, targets, 2.0);
    if (i % 2 == 1) rig.runner().optimizer_step();
  }
  EXPECT_EQ(seen->calls, 2);
  EXPECT_EQ(seen->count, trainable(*rig.model));
  auto params = rig.model->parameters();
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(torch::equal(params[k], before[k]));
  // Back to the default: the next update moves the weights.
  rig.runner().set_grad_sync(nullptr);
  auto [images, targets] = step_batch(310);
  rig.runner().forward_backward(images, targets, 1.0);
  rig.runner().optimizer_step();
  bool moved = false;
  for (size_t k = 0; k < params.size(); ++k) moved = moved || !torch::equal(params[k], before[k]);
  EXPECT_TRUE(moved);
}

// The first optimizer step is the same code path as the others: momentum state exists from the
// start, but (as torch.optim) only parameters that took part in a step appear in the state dict.
TEST(Step, OptimizerStateExistsUpFrontButIsSavedOnlyOnceUsed) {
  auto rig = test::make_step_rig(constant_lr_config(), torch::kCPU, engine::AmpPlan{}, false, 1, false);
  auto& opt = rig.runner().optimizer();
  auto state = opt.state_tensors();
  ASSERT_EQ(state.size(), trainable(*rig.model));
  for (const auto& t : state) EXPECT_EQ(t.abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(opt.state_dict()->get("state")->dict.empty());
  auto [images, targets] = step_batch(400);
  rig.runner().forward_backward(images, targets);
  rig.runner().optimizer_step();
  EXPECT_EQ(opt.state_dict()->get("state")->dict.size(), state.size());
  auto after = opt.state_tensors();
  for (size_t k = 0; k < state.size(); ++k) EXPECT_EQ(after[k].data_ptr(), state[k].data_ptr());
}

// CUDA graphs on the CPU: enabling says why not and the step stays eager (bit-equal to a runner
// that was never asked).
TEST(StepGraphs, OnTheCpuEnablingSaysWhyAndTheStepStaysEager) {
  const TrainConfig cfg = accumulating_config();
  auto rig = test::make_step_rig(cfg, torch::kCPU, engine::AmpPlan{}, false, 5);
  auto ref = test::make_step_rig(cfg, torch::kCPU, engine::AmpPlan{}, false, 5);
  const std::string why = rig.runner().enable_cuda_graphs();
  EXPECT_NE(why.find("CUDA device"), std::string::npos) << why;
  for (int i = 0; i < 5; ++i) {
    auto [images, targets] = step_batch(300 + i);
    const auto w = test::window_of(i, 5, rig.setup.accumulate);
    LossOutput a = rig.runner().forward_backward(images, targets, static_cast<double>(w.size));
    LossOutput b = ref.runner().forward_backward(images, targets, static_cast<double>(w.size));
    ASSERT_TRUE(torch::equal(a.total, b.total)) << i;
    if (w.optimizer_step) {
      rig.runner().optimizer_step();
      ref.runner().optimizer_step();
    }
  }
  const auto st = rig.runner().graph_stats();
  EXPECT_FALSE(st.enabled);
  EXPECT_EQ(st.off_reason, why);
  EXPECT_EQ(st.replayed_micro_steps, 0);
  EXPECT_EQ(st.eager_micro_steps, 5);
  EXPECT_EQ(st.eager_updates, 3);
  EXPECT_EQ(st.eager_shapes, std::vector<std::string>{"2x3x64x64"});
}

// Each input shape has its own staged buffers (a captured step keeps reading its shape's): going
// back to a shape finds its buffers where they were; the oldest of more than eight goes.
TEST(StepGraphs, EachShapeKeepsItsOwnStagedBuffers) {
  auto rig = test::make_step_rig(constant_lr_config(), torch::kCPU, engine::AmpPlan{}, false, 1, false);
  auto& r = rig.runner();
  auto [i2, t2] = step_batch(1, 2, 64);
  auto [i1, t1] = step_batch(2, 1, 64);
  r.stage(i2, t2);
  const void* images2 = r.staged_images().data_ptr();
  const void* input2 = r.staged_input().data_ptr();
  r.stage(i1, t1);
  EXPECT_NE(r.staged_images().data_ptr(), images2);
  r.stage(i2, t2);
  EXPECT_EQ(r.staged_images().data_ptr(), images2);
  EXPECT_EQ(r.staged_input().data_ptr(), input2);
  for (int64_t s = 1; s <= 8; ++s) {
    auto [im, tg] = step_batch(3, 1, 32 * (s + 2));
    r.stage(im, tg);
  }
  r.stage(i2, t2);  // evicted by eight newer shapes: staged again into new buffers
  EXPECT_TRUE(torch::equal(r.staged_images(), i2));
}
