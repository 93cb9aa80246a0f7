#include "engine/step.hpp"

#include <algorithm>
#include <cmath>

#include "models/conv_bn_act.hpp"
#include "models/input.hpp"

namespace libreyolo::engine {

void to_channels_last(torch::nn::Module& m) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters())
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
}

StepRunner::StepRunner(std::shared_ptr<models::Detector> model, std::unique_ptr<DetectionLoss> loss,
                       std::unique_ptr<Optimizer> optimizer, std::unique_ptr<GradScaler> scaler, ModelEMA* ema,
                       const LrSchedule& schedule, StepConfig cfg)
    : model_(std::move(model)),
      loss_(std::move(loss)),
      optimizer_(std::move(optimizer)),
      scaler_(std::move(scaler)),
      ema_(ema),
      schedule_(schedule),
      cfg_(cfg),
      grad_sync_(std::make_unique<NoGradSync>()) {
  divisor_ = torch::ones({}, torch::TensorOptions().dtype(torch::kFloat).device(cfg_.device));
  optimizer_->set_lr(schedule_.at(0));
}

void StepRunner::set_global_step(int64_t s) {
  global_step_ = s;
  optimizer_->set_lr(schedule_.at(s));
}

void StepRunner::set_grad_sync(std::unique_ptr<GradSync> sync) {
  grad_sync_ = sync ? std::move(sync) : std::make_unique<NoGradSync>();
}

void StepRunner::stage_images(const torch::Tensor& images) {
  torch::NoGradGuard ng;
  if (!images_.defined() || images_.sizes() != images.sizes()) {
    images_ = torch::empty(images.sizes(), images.options().device(cfg_.device).pinned_memory(false));
    const auto fmt = cfg_.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    input_ = torch::empty({images.size(0), images.size(3), images.size(1), images.size(2)},
                          torch::TensorOptions().dtype(torch::kFloat).device(cfg_.device).memory_format(fmt));
  }
  images_.copy_(images, /*non_blocking=*/true);
  // Into the persistent input buffer, by the family's input convention.
  input_ = models::to_network_input(images_, cfg_.input, cfg_.device, cfg_.channels_last, input_);
}

torch::Tensor StepRunner::prepare_images(const torch::Tensor& images) {
  stage_images(images);
  return input_;
}

void StepRunner::stage(const torch::Tensor& images, const torch::Tensor& targets, double loss_divisor) {
  stage_images(images);
  torch::NoGradGuard ng;
  if (!targets_.defined() || targets_.sizes() != targets.sizes())
    targets_ = torch::empty(targets.sizes(), targets.options().device(cfg_.device).pinned_memory(false));
  targets_.copy_(targets, /*non_blocking=*/true);
  divisor_.fill_(loss_divisor);
}

LossOutput StepRunner::forward_backward(const torch::Tensor& images, const torch::Tensor& targets,
                                        double loss_divisor) {
  {
    PhaseScope ps(phases_, Phase::ToDevice);
    stage(images, targets, loss_divisor);
  }
  return forward_backward_staged();
}

LossOutput StepRunner::forward_backward_staged() {
  LossOutput out;
  {
    AutocastGuard ac(cfg_.device, cfg_.amp.enabled, cfg_.amp.dtype);
    std::vector<torch::Tensor> raw;
    {
      PhaseScope ps(phases_, Phase::Forward);
      raw = model_->forward_raw(input_);
    }
    PhaseScope ps(phases_, Phase::Loss);
    out = loss_->compute(raw, targets_, input_.size(2), input_.size(3));
  }
  PhaseScope ps(phases_, Phase::Backward);
  // Always divided (by 1 outside accumulation: the same values), so that the last, shorter
  // accumulation window is the same computation with another divisor.
  torch::Tensor loss = out.total / divisor_;
  models::DeferredWeightGrads weight_grads;
  scaler_->scale(loss).backward();
  weight_grads.flush();
  out.total = out.total.detach();
  return out;
}

void StepRunner::apply_update() {
  std::vector<torch::Tensor> grads = optimizer_->grads();
  grad_sync_->after_backward(grads);
  std::optional<torch::Tensor> found_inf = scaler_->unscale(grads);
  if (cfg_.clip_max_norm > 0 && !grads.empty()) {
    torch::NoGradGuard ng;
    auto total = torch::stack(at::_foreach_norm(grads, 2)).norm();
    auto coef = (cfg_.clip_max_norm / (total + 1e-6)).clamp_max(1.0);
    at::_foreach_mul_(grads, coef);
  }
  optimizer_->step(found_inf);
  scaler_->update();
  optimizer_->zero_grad();
  if (ema_) ema_->apply(*model_);
}

void StepRunner::optimizer_step() {
  PhaseScope ps(phases_, Phase::Optimizer);
  if (ema_) ema_->stage();
  apply_update();
  if (ema_) ema_->set_updates(ema_->updates() + 1);
  ++global_step_;
  optimizer_->set_lr(schedule_.at(global_step_));
}

StepSetup make_step_runner(const TrainConfig& cfg, std::shared_ptr<models::Detector> model,
                           std::unique_ptr<DetectionLoss> loss, ModelEMA* ema, const torch::Device& device,
                           const AmpPlan& amp, bool channels_last, int64_t batches_per_epoch,
                           const models::InputSpec& input) {
  OptimizerOptions oo;
  oo.name = cfg.optimizer;
  oo.lr = cfg.lr0;
  oo.momentum = cfg.momentum;
  oo.weight_decay = cfg.weight_decay;
  oo.nesterov = cfg.nesterov;
  auto optimizer = make_optimizer(*model, oo);
  StepSetup s;
  // Python's round() (half to even) of nbs / batch: nearbyint in the default rounding mode.
  if (cfg.nbs > 0 && cfg.batch > 0)
    s.accumulate = static_cast<int>(
        std::max(1LL, static_cast<long long>(std::nearbyint(static_cast<double>(cfg.nbs) / cfg.batch))));
  s.steps_per_epoch = std::max<int64_t>(1, (batches_per_epoch + s.accumulate - 1) / s.accumulate);
  s.schedule.kind = cfg.scheduler;
  s.schedule.lr0 = cfg.lr0;
  s.schedule.warmup_lr_start = cfg.warmup_lr_start;
  s.schedule.min_lr_ratio = cfg.min_lr_ratio;
  s.schedule.warmup_iters = static_cast<long long>(std::llround(cfg.warmup_epochs * s.steps_per_epoch));
  s.schedule.total_iters = static_cast<long long>(s.steps_per_epoch) * cfg.epochs;
  s.schedule.plateau_iters = static_cast<long long>(s.steps_per_epoch) * std::max(cfg.no_aug_epochs, 0);
  StepConfig sc;
  sc.device = device;
  sc.amp = amp;
  sc.channels_last = channels_last;
  sc.clip_max_norm = cfg.clip_max_norm;
  sc.input = input;
  s.runner = std::make_unique<StepRunner>(std::move(model), std::move(loss), std::move(optimizer),
                                          std::make_unique<GradScaler>(device, amp.scaler), ema, s.schedule, sc);
  return s;
}

}  // namespace libreyolo::engine
