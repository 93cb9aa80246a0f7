// Shared by the CPU and GPU step tests: a YOLOv9-t training step set up through
// make_step_runner (accumulation, EMA, loss scaler), the trainer's window arithmetic, and the
// list of every tensor a captured step must keep in place.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/step.hpp"
#include "models/detector.hpp"

namespace libreyolo::test {

struct StepRig {
  std::shared_ptr<models::Detector> model, ema_model;
  std::unique_ptr<engine::ModelEMA> ema;
  engine::StepSetup setup;
  int64_t batches_per_epoch = 1;

  engine::StepRunner& runner() { return *setup.runner; }
};

// YOLOv9-t, 2 classes, built from seed 0 on `device`, in training mode, with an EMA copy.
inline StepRig make_step_rig(const TrainConfig& cfg, const torch::Device& device, const engine::AmpPlan& amp,
                             bool channels_last, int64_t batches_per_epoch, bool with_ema = true) {
  const models::Family* fam = models::find_family("yolo9");
  StepRig r;
  torch::manual_seed(0);
  r.model = fam->build("t", 2);
  r.model->to(device);
  if (channels_last) engine::to_channels_last(*r.model);
  r.model->train();
  if (with_ema) {
    r.ema_model = fam->build("t", 2);
    models::load_state_dict(*r.ema_model, models::state_dict(*r.model), true);
    r.ema_model->to(device);
    if (channels_last) engine::to_channels_last(*r.ema_model);
    r.ema = std::make_unique<engine::ModelEMA>(r.ema_model, *r.model, cfg.ema_decay, cfg.ema_tau);
  }
  r.batches_per_epoch = batches_per_epoch;
  r.setup = engine::make_step_runner(cfg, r.model, fam->make_loss(*r.model), r.ema.get(), device, amp,
                                     channels_last, batches_per_epoch);
  return r;
}

// A batch of `b` random images (NHWC uint8, s x s) with two boxes each, padded to 4 rows.
inline std::pair<torch::Tensor, torch::Tensor> step_batch(int seed, int64_t b = 2, int64_t s = 64) {
  torch::manual_seed(seed);
  auto images = torch::randint(0, 256, {b, s, s, 3}, torch::kUInt8);
  auto targets = torch::zeros({b, 4, 5});
  targets.select(2, 0).fill_(-1);
  for (int64_t i = 0; i < b; ++i) {
    targets[i][0] = torch::tensor({static_cast<float>(i % 2), 0.1f, 0.1f, 0.6f, 0.5f});
    targets[i][1] = torch::tensor({static_cast<float>((i + 1) % 2), 0.3f, 0.2f, 0.9f, 0.8f});
  }
  return {images, targets};
}

// A family's training step run `batches.size()` times (each micro-step followed by an optimizer
// step, bf16 autocast, channels_last, no EMA) on a model from `build` (seed 0), eager or with the
// step graphs on (of `scope`); before step `close_mosaic_at` the family's on_close_mosaic runs and its answer
// invalidates the graphs. What came out: each step's total and terms, the parameters after, the
// graph counters. A graphed run of a family that declares capture_train_step must equal its
// eager run bit for bit (under deterministic cuDNN).
struct FamilyStepRun {
  std::vector<torch::Tensor> losses, params;
  engine::StepGraphStats stats;
};
// make_loss: the loss (empty: the family's; a classifier's is the task's, loss::ClassificationLoss).
inline FamilyStepRun run_family_steps(const models::Family& fam,
                                      const std::function<std::shared_ptr<models::Detector>()>& build,
                                      const TrainConfig& cfg,
                                      const std::vector<std::pair<torch::Tensor, torch::Tensor>>& batches,
                                      const torch::Device& device, bool graphs, int close_mosaic_at = -1,
                                      engine::GraphScope scope = engine::GraphScope::Step,
                                      const std::function<std::unique_ptr<TrainingLoss>()>& make_loss = {}) {
  torch::manual_seed(0);
  auto model = build();
  model->to(device);
  engine::to_channels_last(*model);
  model->train();
  const auto amp = engine::plan_amp(true, "bfloat16", device);
  auto setup = engine::make_step_runner(cfg, model, make_loss ? make_loss() : fam.make_loss(*model), nullptr, device,
                                        amp, true, 3, &fam);
  auto& runner = *setup.runner;
  if (graphs) EXPECT_EQ(runner.enable_cuda_graphs(3, scope), "");
  FamilyStepRun r;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (static_cast<int>(i) == close_mosaic_at && fam.on_close_mosaic && fam.on_close_mosaic(*model, runner.loss()))
      runner.invalidate_cuda_graphs("mosaic closed");
    auto out = runner.forward_backward(batches[i].first, batches[i].second, 1.0);
    r.losses.push_back(torch::cat({out.total.reshape({1}).to(torch::kFloat), out.terms.to(torch::kFloat)}).cpu());
    runner.optimizer_step();
  }
  torch::cuda::synchronize();
  for (const auto& p : model->parameters()) r.params.push_back(p.detach().cpu());
  r.stats = runner.graph_stats();
  return r;
}

// `n` pinned batches of step_batch(first_seed + i, b, s).
inline std::vector<std::pair<torch::Tensor, torch::Tensor>> pinned_step_batches(int n, int first_seed, int64_t b,
                                                                                int64_t s) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  for (int i = 0; i < n; ++i) {
    auto [im, t] = step_batch(first_seed + i, b, s);
    out.emplace_back(im.pin_memory(), t.pin_memory());
  }
  return out;
}

// The trainer's accumulation arithmetic for micro-batch `bi` of an epoch of `nb` batches.
struct Window {
  int64_t size;
  bool optimizer_step;
};
inline Window window_of(int64_t bi, int64_t nb, int accumulate) {
  const int64_t start = (bi / accumulate) * accumulate;
  return {std::min<int64_t>(accumulate, nb - start), (bi + 1) % accumulate == 0 || bi == nb - 1};
}

// Every tensor a captured step reads or writes in place, labelled for messages.
inline std::vector<std::pair<std::string, torch::Tensor>> step_tensors(StepRig& r) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : r.model->named_parameters(true)) {
    out.emplace_back("param " + p.key(), p.value());
    if (p.value().grad().defined()) out.emplace_back("grad " + p.key(), p.value().grad());
  }
  for (const auto& b : r.model->named_buffers(true)) out.emplace_back("buffer " + b.key(), b.value());
  auto& runner = r.runner();
  size_t k = 0;
  for (const auto& t : runner.optimizer().state_tensors()) out.emplace_back("optimizer state " + std::to_string(k++), t);
  out.emplace_back("lr", runner.optimizer().lr_tensor());
  k = 0;
  for (const auto& t : runner.scaler().state_tensors()) out.emplace_back("scaler " + std::to_string(k++), t);
  if (r.ema) {
    for (const auto& p : r.ema_model->named_parameters(true)) out.emplace_back("ema " + p.key(), p.value());
    for (const auto& b : r.ema_model->named_buffers(true)) out.emplace_back("ema buffer " + b.key(), b.value());
    out.emplace_back("ema weight", r.ema->weight());
  }
  out.emplace_back("staged images", runner.staged_images());
  out.emplace_back("staged input", runner.staged_input());
  out.emplace_back("staged targets", runner.staged_targets());
  out.emplace_back("loss divisor", runner.loss_divisor());
  return out;
}

inline std::vector<const void*> data_pointers(const std::vector<std::pair<std::string, torch::Tensor>>& ts) {
  std::vector<const void*> out;
  for (const auto& [name, t] : ts) out.push_back(t.defined() ? t.data_ptr() : nullptr);
  return out;
}

}  // namespace libreyolo::test
