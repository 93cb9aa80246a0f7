#include "engine/ema.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include <libreyolo/errors.hpp>

#include "core/env.hpp"
#include "models/detector.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "kernels/lerp_list.hpp"
#endif

namespace libreyolo::engine {

namespace {
EnvFlag ema_kernel_flag{"LIBREYOLO_EMA_KERNEL"};
}  // namespace

void set_ema_kernel(bool on) { ema_kernel_flag.store(on); }

std::vector<torch::Tensor> ModelEMA::float_state(const torch::nn::Module& m, const torch::nn::Module& source) {
  std::vector<torch::Tensor> out;
  for (const auto& p : models::unique_named_parameters(m)) out.push_back(p.second);
  // A floating-point buffer of the trained model holding infinities (a constant table such as
  // logit-space anchors, +inf where invalid) is left out: lerp(inf, inf, w) is NaN where the
  // reference's d * v + (1 - d) * m keeps inf; the EMA copy keeps its values, the model's.
  const auto theirs = models::unique_named_buffers(source);
  const auto mine = models::unique_named_buffers(m);
  for (size_t i = 0; i < mine.size(); ++i) {
    if (!mine[i].second.is_floating_point()) continue;
    if (i < theirs.size() && theirs[i].second.is_floating_point() &&
        !torch::isfinite(theirs[i].second).all().item<bool>())
      continue;
    out.push_back(mine[i].second);
  }
  return out;
}

ModelEMA::ModelEMA(std::shared_ptr<torch::nn::Module> ema_model, const torch::nn::Module& model,
                   double decay, double tau, long long updates)
    : ema_(std::move(ema_model)), decay_(decay), tau_(tau), updates_(updates), source_(&model) {
  ema_->eval();
  for (auto& p : ema_->parameters()) p.set_requires_grad(false);
  ema_state_ = float_state(*ema_, model);
  source_state_ = float_state(model, model);
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
  } else if (!apply_one_launch()) {
    // A tensor weight of another shape takes foreach lerp's slow path (a kernel per tensor) on
    // CUDA: three multi-tensor kernels instead, ema += w * (model - ema).
    auto diff = at::_foreach_sub(source_state_, ema_state_);
    at::_foreach_mul_(diff, weight_);
    at::_foreach_add_(ema_state_, diff);
  }
}

// The same update in one launch (kernels/lerp_list.hpp) when every tensor is a float32 CUDA tensor
// on weight_'s device. The work table is built outside captures; a capture that finds it stale
// (a tensor was replaced since) takes the multi-tensor ops instead. False: not done.
bool ModelEMA::apply_one_launch() {
#ifdef LIBREYOLO_CUDA_KERNELS
  if (!ema_kernel_flag.load() || !weight_.is_cuda()) return false;
  const auto stream = c10::cuda::getCurrentCUDAStream(weight_.device().index());
  bool fresh = !items_.defined() || item_addresses_.size() != 2 * ema_state_.size();
  for (size_t i = 0; !fresh && i < ema_state_.size(); ++i)
    fresh = item_addresses_[2 * i] != ema_state_[i].data_ptr() || item_addresses_[2 * i + 1] != source_state_[i].data_ptr();
  if (fresh) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream.stream(), &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone)
      return false;
    std::vector<kernels::LerpItem> items;
    std::vector<const void*> addresses;
    for (size_t i = 0; i < ema_state_.size(); ++i) {
      const torch::Tensor &d = ema_state_[i], &s = source_state_[i];
      if (d.scalar_type() != torch::kFloat || s.scalar_type() != torch::kFloat || d.device() != weight_.device() ||
          s.device() != weight_.device() || d.strides() != s.strides() || !d.is_non_overlapping_and_dense())
        return false;
      // Dense with the same strides (channels_last weights too): the same element order in memory.
      for (int64_t at = 0; at < d.numel(); at += kernels::kLerpItemElements)
        items.push_back({d.data_ptr<float>() + at, s.data_ptr<float>() + at,
                         std::min(kernels::kLerpItemElements, d.numel() - at)});
      addresses.push_back(d.data_ptr());
      addresses.push_back(s.data_ptr());
    }
    const auto bytes = static_cast<int64_t>(items.size() * sizeof(kernels::LerpItem));
    torch::Tensor host = torch::empty({bytes}, torch::kUInt8);
    std::memcpy(host.data_ptr(), items.data(), static_cast<size_t>(bytes));
    items_ = host.to(weight_.device());
    item_addresses_ = std::move(addresses);
    n_items_ = static_cast<int>(items.size());
  }
  c10::cuda::CUDAGuard guard(weight_.device());
  kernels::lerp_items(reinterpret_cast<const kernels::LerpItem*>(items_.data_ptr()), n_items_,
                      weight_.data_ptr<float>(), stream.stream());
  return true;
#else
  return false;
#endif
}

void ModelEMA::update(const torch::nn::Module& model) {
  if (&model != source_) throw RuntimeError("ModelEMA::update called with a different model");
  stage();
  apply(model);
  ++updates_;
}

}  // namespace libreyolo::engine
