#include "engine/step.hpp"

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
      cfg_(cfg) {
  optimizer_->set_lr(schedule_.at(0));
}

void StepRunner::set_global_step(int64_t s) {
  global_step_ = s;
  optimizer_->set_lr(schedule_.at(s));
}

torch::Tensor StepRunner::prepare_images(const torch::Tensor& images) const {
  return models::to_network_input(images, cfg_.input, cfg_.device, cfg_.channels_last);
}

LossOutput StepRunner::forward_backward(const torch::Tensor& images, const torch::Tensor& targets,
                                        double loss_divisor) {
  const int64_t S_h = images.size(1), S_w = images.size(2);
  torch::Tensor x, t;
  {
    PhaseScope ps(phases_, Phase::ToDevice);
    x = prepare_images(images);
    t = targets.to(cfg_.device, /*non_blocking=*/true);
  }
  LossOutput out;
  {
    AutocastGuard ac(cfg_.device, cfg_.amp.enabled, cfg_.amp.dtype);
    std::vector<torch::Tensor> raw;
    {
      PhaseScope ps(phases_, Phase::Forward);
      raw = model_->forward_raw(x);
    }
    PhaseScope ps(phases_, Phase::Loss);
    out = loss_->compute(raw, t, S_h, S_w);
  }
  PhaseScope ps(phases_, Phase::Backward);
  torch::Tensor loss = loss_divisor != 1.0 ? out.total / loss_divisor : out.total;
  models::DeferredWeightGrads weight_grads;
  scaler_->scale(loss).backward();
  weight_grads.flush();
  out.total = out.total.detach();
  return out;
}

void StepRunner::optimizer_step() {
  PhaseScope ps(phases_, Phase::Optimizer);
  std::vector<torch::Tensor> grads = optimizer_->grads();
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
  if (ema_) ema_->update(*model_);
  ++global_step_;
  optimizer_->set_lr(schedule_.at(global_step_));
}

}  // namespace libreyolo::engine
