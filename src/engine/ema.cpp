#include "engine/ema.hpp"

#include <cmath>

#include <libreyolo/errors.hpp>

namespace libreyolo::engine {

std::vector<torch::Tensor> ModelEMA::float_state(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.named_parameters(true)) out.push_back(p.value());
  for (const auto& b : m.named_buffers(true))
    if (b.value().is_floating_point()) out.push_back(b.value());
  return out;
}

ModelEMA::ModelEMA(std::shared_ptr<torch::nn::Module> ema_model, const torch::nn::Module& model,
                   double decay, double tau, long long updates)
    : ema_(std::move(ema_model)), decay_(decay), tau_(tau), updates_(updates), source_(&model) {
  ema_->eval();
  for (auto& p : ema_->parameters()) p.set_requires_grad(false);
  ema_state_ = float_state(*ema_);
  source_state_ = float_state(model);
  bool same = ema_state_.size() == source_state_.size();
  for (size_t i = 0; same && i < ema_state_.size(); ++i)
    same = ema_state_[i].sizes() == source_state_[i].sizes();
  if (!same) throw RuntimeError("EMA model does not have the same structure as the trained model");
}

double ModelEMA::decay_at(long long n) const {
  return tau_ > 0 ? decay_ * (1.0 - std::exp(-static_cast<double>(n) / tau_)) : decay_;
}

void ModelEMA::update(const torch::nn::Module& model) {
  if (&model != source_) throw RuntimeError("ModelEMA::update called with a different model");
  torch::NoGradGuard ng;
  ++updates_;
  const double d = decay_at(updates_);
  // ema = d * ema + (1 - d) * model  ==  lerp(ema, model, 1 - d)
  at::_foreach_lerp_(ema_state_, source_state_, at::Scalar(1.0 - d));
}

}  // namespace libreyolo::engine
