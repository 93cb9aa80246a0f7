// CUDA graphs of the whole training step: a graphed run equals the eager run bit for
// bit (losses, weights, EMA, optimizer and scaler state) over 100 steps in bf16 and in fp16 with
// forced overflow skips; accumulation; shapes captured on their third occurrence while others run
// eager; invalidation and recapture; a failed capture falls back to eager with nothing lost; a
// loader thread pinning memory during the capture does not break it.
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <thread>

#include "core/cuda_graph.hpp"
#include "loss/loss.hpp"
#include "layers/conv_bn_act.hpp"
#include "step_check.hpp"
#include "support.hpp"

using namespace libreyolo;

namespace {

// A loss whose value depends on host-side state (as YOLOX's L1 switch does): `factor` scales the
// wrapped loss; `sync_on_call` makes one call read a value on the host (illegal in a capture).
class SwitchLoss : public TrainingLoss {
 public:
  explicit SwitchLoss(std::unique_ptr<TrainingLoss> inner) : inner_(std::move(inner)) {}
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t h,
                     int64_t w) override {
    ++calls;
    LossOutput out = inner_->compute(raw, targets, h, w);
    if (calls == sync_on_call) (void)out.total.item<float>();
    if (factor != 1.0) {
      out.total = out.total * factor;
      out.terms = out.terms * factor;
    }
    return out;
  }
  const std::vector<std::string>& term_names() const override { return inner_->term_names(); }
  std::vector<std::shared_ptr<const void>> capture_keep_alive() const override { return inner_->capture_keep_alive(); }
  double factor = 1.0;
  int calls = 0;
  int sync_on_call = -1;

 private:
  std::unique_ptr<TrainingLoss> inner_;
};

// A YOLOv9-t rig like test::make_step_rig, with the SwitchLoss around the family's loss.
struct Rig {
  test::StepRig r;
  SwitchLoss* loss = nullptr;
};

Rig make_rig(const TrainConfig& cfg, const torch::Device& dev, const engine::AmpPlan& amp, int64_t batches_per_epoch) {
  Rig rig;
  const models::Family* fam = models::find_family("yolo9");
  torch::manual_seed(0);
  rig.r.model = fam->build("t", 2);
  rig.r.model->to(dev);
  engine::to_channels_last(*rig.r.model);
  rig.r.model->train();
  rig.r.ema_model = fam->build("t", 2);
  models::load_state_dict(*rig.r.ema_model, models::state_dict(*rig.r.model), true);
  rig.r.ema_model->to(dev);
  engine::to_channels_last(*rig.r.ema_model);
  rig.r.ema = std::make_unique<engine::ModelEMA>(rig.r.ema_model, *rig.r.model, cfg.ema_decay, cfg.ema_tau);
  rig.r.batches_per_epoch = batches_per_epoch;
  auto loss = std::make_unique<SwitchLoss>(fam->make_loss(*rig.r.model));
  rig.loss = loss.get();
  rig.r.setup = engine::make_step_runner(cfg, rig.r.model, std::move(loss), rig.r.ema.get(), dev, amp,
                                         /*channels_last=*/true, batches_per_epoch);
  return rig;
}

struct Batch {
  torch::Tensor images, targets;
};

// `n` pinned batches; batch i has `sizes[i % sizes.size()]` images.
std::vector<Batch> make_batches(int n, std::vector<int64_t> sizes, int64_t imgsz) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    auto [images, targets] = test::step_batch(1000 + i, sizes[static_cast<size_t>(i) % sizes.size()], imgsz);
    out.push_back({images.pin_memory(), targets.pin_memory()});
  }
  return out;
}

// Trains over `batches` with the trainer's window arithmetic; returns each micro-step's loss
// total and terms (copied to the host after the step). `before_step(i)` may change the rig.
std::vector<torch::Tensor> train(Rig& rig, const std::vector<Batch>& batches,
                                 const std::function<void(int)>& before_step = {}) {
  auto& runner = rig.r.runner();
  std::vector<torch::Tensor> losses;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (before_step) before_step(static_cast<int>(i));
    const int64_t bi = static_cast<int64_t>(i) % rig.r.batches_per_epoch;
    const auto w = test::window_of(bi, rig.r.batches_per_epoch, rig.r.setup.accumulate);
    LossOutput out = runner.forward_backward(batches[i].images, batches[i].targets, static_cast<double>(w.size));
    // The graph's outputs are overwritten by the next replay: copy now.
    losses.push_back(torch::cat({out.total.reshape({1}).to(torch::kFloat), out.terms.to(torch::kFloat)}).cpu());
    if (w.optimizer_step) runner.optimizer_step();
  }
  torch::cuda::synchronize();
  return losses;
}

// Every persistent tensor of the step (params, grads, BN buffers, optimizer, scaler, EMA), labelled.
std::vector<std::pair<std::string, torch::Tensor>> state_of(Rig& rig) { return test::step_tensors(rig.r); }

// Bitwise comparison; returns the number of differing tensors and names the first few.
int count_differences(const std::vector<std::pair<std::string, torch::Tensor>>& a,
                      const std::vector<std::pair<std::string, torch::Tensor>>& b, std::string* first) {
  EXPECT_EQ(a.size(), b.size());
  int n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i].first.rfind("staged", 0) == 0) continue;  // staging buffers: per-shape, compared by the losses
    if (!torch::equal(a[i].second.cpu(), b[i].second.cpu())) {
      if (n < 3 && first) *first += a[i].first + " ";
      ++n;
    }
  }
  return n;
}

int count_loss_differences(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, int* first) {
  EXPECT_EQ(a.size(), b.size());
  int n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (!torch::equal(a[i], b[i])) {
      if (n == 0 && first) *first = static_cast<int>(i);
      ++n;
    }
  return n;
}

// The two runs' losses and final states equal bit for bit (failures name the first step and the
// first tensors that differ).
void expect_same_run(const std::vector<torch::Tensor>& losses_a, const std::vector<std::pair<std::string, torch::Tensor>>& state_a,
                     const std::vector<torch::Tensor>& losses_b, const std::vector<std::pair<std::string, torch::Tensor>>& state_b) {
  int first = -1;
  EXPECT_EQ(count_loss_differences(losses_a, losses_b, &first), 0) << "first differing step " << first;
  std::string names;
  EXPECT_EQ(count_differences(state_a, state_b, &names), 0) << names;
}

// Batch 4, 10 epochs with 1 of warm-up: the runs compared below.
TrainConfig short_run_config() {
  TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  cfg.warmup_epochs = 1;
  return cfg;
}

void expect_bitwise_equal(const char* dtype, bool force_overflow) {
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  TrainConfig cfg = short_run_config();
  // "float32": AMP off (the trainer's amp=false), no loss scaler.
  const bool fp32 = std::string(dtype) == "float32";
  const engine::AmpPlan amp = engine::plan_amp(!fp32, fp32 ? "bfloat16" : dtype, dev);
  const auto batches = make_batches(100, {4}, 160);
  auto run = [&](bool graphs, double* final_scale) {
    Rig rig = make_rig(cfg, dev, amp, /*batches_per_epoch=*/20);
    if (force_overflow) {
      // A scale far too large: the first steps overflow in fp16 and must be skipped (found_inf),
      // halving the scale each time, inside the graph as in eager.
      auto st = rig.r.runner().scaler().state_tensors();
      EXPECT_FALSE(st.empty());
      if (!st.empty()) st[0].fill_(std::ldexp(1.0, 40));
    }
    if (graphs) EXPECT_EQ(rig.r.runner().enable_cuda_graphs(), "");
    auto losses = train(rig, batches);
    const auto gs = rig.r.runner().graph_stats();
    if (graphs) {
      EXPECT_TRUE(gs.enabled) << gs.off_reason;
      EXPECT_EQ(gs.captured_shapes, 1);
      EXPECT_TRUE(gs.update_captured);
      EXPECT_EQ(gs.replayed_micro_steps, 98);
      EXPECT_EQ(gs.replayed_updates, 98);
    } else {
      EXPECT_EQ(gs.replayed_micro_steps, 0);
    }
    if (final_scale) *final_scale = rig.r.runner().scaler().current_scale();
    return std::make_pair(losses, state_of(rig));
  };
  double scale_eager = 0, scale_graph = 0;
  auto [l_eager, s_eager] = run(false, &scale_eager);
  auto [l_graph, s_graph] = run(true, &scale_graph);
  expect_same_run(l_eager, s_eager, l_graph, s_graph);
  EXPECT_EQ(scale_eager, scale_graph);
  if (force_overflow) {
    EXPECT_LT(scale_graph, std::ldexp(1.0, 40)) << "no overflow step was skipped";
    std::cerr << "[ info ] fp16 scale 2^40 -> " << scale_graph << " (" << std::log2(std::ldexp(1.0, 40) / scale_graph)
              << " skipped steps)\n";
  }
  for (const auto& l : l_graph) EXPECT_TRUE(torch::isfinite(l).all().item<bool>());
}

}  // namespace

TEST(GpuStepGraph, HundredBf16StepsEqualEagerBitForBit) {
  LY_REQUIRE_CUDA();
  expect_bitwise_equal("bfloat16", false);
}

// AMP off: the path of the trainer's amp=false runs (fp32 weight gradients are taken as they
// come from the fused node on the first backward, not copied). Added after graphed fp32 runs
// through the CLI differed from eager (see GpuTrainGraph in gpu_test_dist.cpp).
TEST(GpuStepGraph, HundredFp32StepsEqualEagerBitForBit) {
  LY_REQUIRE_CUDA();
  expect_bitwise_equal("float32", false);
}

TEST(GpuStepGraph, HundredFp16StepsWithOverflowSkipsEqualEagerBitForBit) {
  LY_REQUIRE_CUDA();
  expect_bitwise_equal("float16", true);
}

// The weight gradients on a side stream of the backward in a captured step
// (models::set_wgrad_stream): the graphed run with them (a parallel branch in the graph) equals
// the eager run with everything on one stream, bit for bit, as does the graphed run without them.
// Eager steps keep them on one stream.
TEST(GpuStepGraph, WeightGradientsOnASideStreamEqualOneStream) {
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  TrainConfig cfg = short_run_config();
  const engine::AmpPlan amp = engine::plan_amp(true, "bfloat16", dev);
  const auto batches = make_batches(30, {4}, 160);
  auto run = [&](bool side, bool graphs) {
    models::set_wgrad_stream(side);
    const int64_t before = models::wgrad_side_tasks();
    Rig rig = make_rig(cfg, dev, amp, /*batches_per_epoch=*/10);
    if (graphs) EXPECT_EQ(rig.r.runner().enable_cuda_graphs(), "");
    auto losses = train(rig, batches);
    const int64_t tasks = models::wgrad_side_tasks() - before;
    if (side && graphs) {
      EXPECT_GT(tasks, 0) << "no weight gradient ran on the side stream";
    } else if (!side) {
      EXPECT_EQ(tasks, 0);
    }
    if (graphs) EXPECT_EQ(rig.r.runner().graph_stats().replayed_micro_steps, 28);
    return std::make_tuple(losses, state_of(rig), tasks);
  };
  auto [l_one, s_one, t_one] = run(false, false);
  auto [l_side, s_side, t_side] = run(true, true);
  auto [l_graph_one, s_graph_one, t_graph_one] = run(false, true);
  auto [l_eager, s_eager, t_eager] = run(true, false);
  models::set_wgrad_stream(true);
  expect_same_run(l_one, s_one, l_side, s_side);
  expect_same_run(l_one, s_one, l_graph_one, s_graph_one);
  expect_same_run(l_one, s_one, l_eager, s_eager);
  // Only the capture queues them (once per weight gradient of the network); eager steps none.
  std::cerr << "[ info ] side-stream weight gradients in the graphed run: " << t_side << "\n";
  EXPECT_EQ(t_eager, 0);
}

TEST(GpuStepGraph, AccumulationAndAnOddLastBatchEqualEager) {
  // Accumulation windows of 2 with 5 batches per epoch (windows 2, 2, 1), and every fifth batch
  // smaller (a last partial batch): that shape occurs often enough to be captured too.
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  TrainConfig cfg = short_run_config();
  cfg.nbs = 8;
  const engine::AmpPlan amp = engine::plan_amp(true, "bfloat16", dev);
  const auto batches = make_batches(30, {4, 4, 4, 4, 3}, 128);
  auto run = [&](bool graphs) {
    Rig rig = make_rig(cfg, dev, amp, 5);
    EXPECT_EQ(rig.r.setup.accumulate, 2);
    if (graphs) EXPECT_EQ(rig.r.runner().enable_cuda_graphs(), "");
    auto losses = train(rig, batches);
    return std::make_tuple(losses, state_of(rig), rig.r.runner().graph_stats());
  };
  auto [l_eager, s_eager, g_eager] = run(false);
  auto [l_graph, s_graph, g_graph] = run(true);
  expect_same_run(l_eager, s_eager, l_graph, s_graph);
  // 24 batches of 4 (captured on the 3rd), 6 of 3 (captured on the 3rd): 4 + 2 eager.
  EXPECT_EQ(g_graph.captured_shapes, 2);
  EXPECT_EQ(g_graph.eager_micro_steps, 4);
  EXPECT_EQ(g_graph.replayed_micro_steps, 26);
}

TEST(GpuStepGraph, InvalidationRecapturesWhatTheStepNowComputes) {
  // A host-side switch at step 12 (as a family's close-mosaic action): with invalidation the
  // graphed run equals eager; without it the old graph keeps computing the old loss.
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  const engine::AmpPlan amp = engine::plan_amp(true, "bfloat16", dev);
  const auto batches = make_batches(24, {4}, 128);
  auto run = [&](bool graphs, bool invalidate) {
    Rig rig = make_rig(cfg, dev, amp, 24);
    if (graphs) EXPECT_EQ(rig.r.runner().enable_cuda_graphs(), "");
    auto losses = train(rig, batches, [&](int i) {
      if (i != 12) return;
      rig.loss->factor = 2.0;
      if (invalidate) rig.r.runner().invalidate_cuda_graphs("test switch");
    });
    return std::make_tuple(losses, state_of(rig), rig.r.runner().graph_stats());
  };
  auto [l_eager, s_eager, g_eager] = run(false, false);
  auto [l_graph, s_graph, g_graph] = run(true, true);
  expect_same_run(l_eager, s_eager, l_graph, s_graph);
  EXPECT_EQ(g_graph.invalidations, 1);
  EXPECT_EQ(g_graph.captured_shapes, 1);
  // Steps 0-1 eager, 2-11 replayed, 12-13 eager again, 14-23 replayed.
  EXPECT_EQ(g_graph.eager_micro_steps, 4);
  EXPECT_EQ(g_graph.replayed_micro_steps, 20);
  auto [l_stale, s_stale, g_stale] = run(true, false);
  int first = -1;
  EXPECT_GT(count_loss_differences(l_eager, l_stale, &first), 0) << "the test cannot see a stale graph";
  EXPECT_EQ(first, 12);
}

TEST(GpuStepGraph, FailedCaptureTrainsOnEagerWithNothingLost) {
  // The loss reads a value on the host during the capture (3rd call): the capture fails, the run
  // goes on eager and ends equal to a run that never tried.
  LY_REQUIRE_CUDA();
  const test::CudnnSettings det(/*benchmark=*/false, /*deterministic=*/true, at::globalContext().allowTF32CuDNN());
  const torch::Device dev(torch::kCUDA, 0);
  TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  const engine::AmpPlan amp = engine::plan_amp(true, "bfloat16", dev);
  const auto batches = make_batches(8, {4}, 128);
  Rig eager = make_rig(cfg, dev, amp, 8);
  auto l_eager = train(eager, batches);
  Rig rig = make_rig(cfg, dev, amp, 8);
  rig.loss->sync_on_call = 3;
  ASSERT_EQ(rig.r.runner().enable_cuda_graphs(), "");
  testing::internal::CaptureStderr();
  auto l_graph = train(rig, batches);
  const std::string log = testing::internal::GetCapturedStderr();
  const auto gs = rig.r.runner().graph_stats();
  EXPECT_FALSE(gs.enabled);
  EXPECT_NE(gs.off_reason.find("capturing the step"), std::string::npos) << gs.off_reason;
  EXPECT_EQ(gs.replayed_micro_steps, 0);
  EXPECT_EQ(gs.eager_micro_steps, 8);
  EXPECT_NE(log.find("the rest of the run trains eager"), std::string::npos) << log;
  expect_same_run(l_eager, state_of(eager), l_graph, state_of(rig));
}

TEST(GpuStepGraph, LoaderThreadPinningMemoryDoesNotBreakTheCapture) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  TrainConfig cfg;
  cfg.batch = 4;
  cfg.epochs = 10;
  const engine::AmpPlan amp = engine::plan_amp(true, "bfloat16", dev);
  const auto batches = make_batches(6, {4}, 128);
  Rig rig = make_rig(cfg, dev, amp, 6);
  ASSERT_EQ(rig.r.runner().enable_cuda_graphs(), "");
  std::atomic<bool> stop{false};
  std::atomic<int64_t> pinned{0};
  // New sizes every time, so the host allocator keeps calling cudaHostAlloc.
  std::thread loader([&] {
    int64_t i = 0;
    while (!stop.load()) {
      auto t = torch::empty({(1 << 16) + 4096 * (i++ % 512)}, torch::kUInt8).pin_memory();
      pinned.fetch_add(1);
    }
  });
  auto losses = train(rig, batches);
  stop = true;
  loader.join();
  const auto gs = rig.r.runner().graph_stats();
  EXPECT_TRUE(gs.enabled) << gs.off_reason;
  EXPECT_EQ(gs.captured_shapes, 1);
  EXPECT_EQ(gs.replayed_micro_steps, 4);
  EXPECT_GT(pinned.load(), 0);
  for (const auto& l : losses) EXPECT_TRUE(torch::isfinite(l).all().item<bool>());
}

TEST(GpuStepGraph, CapturedRegionFailureLeavesTheDeviceUsable) {
  LY_REQUIRE_CUDA();
  const torch::Device dev(torch::kCUDA, 0);
  auto x = torch::ones({1024}, torch::TensorOptions().device(dev));
  EXPECT_THROW(CapturedGraph::capture(dev, [&] { (void)(x * 2).sum().item<float>(); }), CaptureError);
  torch::Tensor y;
  auto g = CapturedGraph::capture(dev, [&] { y = x * 3; });
  x.fill_(2);
  g->replay();
  torch::cuda::synchronize();
  EXPECT_EQ(y[0].item<float>(), 6.0f);
  EXPECT_EQ(g->replays(), 1);
}
