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
  const torch::Device device = source_state_.empty() ? torch::Device(torch::kCPU) : source_state_[0].device();
  weight_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  weights_.assign(ema_state_.size(), weight_);
}

double ModelEMA::decay_at(long long n) const {
  return tau_ > 0 ? decay_ * (1.0 - std::exp(-static_cast<double>(n) / tau_)) : decay_;
}

void ModelEMA::stage() { weight_.fill_(1.0 - decay_at(updates_ + 1)); }

void ModelEMA::apply(const torch::nn::Module& model) {
  if (&model != source_) throw RuntimeError("ModelEMA::update called with a different model");
  torch::NoGradGuard ng;
  if (ema_state_.empty()) return;
  // ema = d * ema + (1 - d) * model  ==  lerp(ema, model, 1 - d), with 1 - d read from weight_.
  if (weight_.is_cpu()) {
    // Per tensor lerp with a 0-dim float weight: the CPU kernel computes exactly what the
    // scalar-weight lerp computes with the same float weight.
    at::_foreach_lerp_(ema_state_, source_state_, weights_);
  } else {
    // A tensor weight of another shape takes foreach lerp's slow path (a kernel per tensor) on
    // CUDA: three multi-tensor kernels instead, ema += w * (model - ema).
    auto diff = at::_foreach_sub(source_state_, ema_state_);
    at::_foreach_mul_(diff, weight_);
    at::_foreach_add_(ema_state_, diff);
  }
}

void ModelEMA::update(const torch::nn::Module& model) {
  if (&model != source_) throw RuntimeError("ModelEMA::update called with a different model");
  stage();
  apply(model);
  ++updates_;
}

}  // namespace libreyolo::engine
