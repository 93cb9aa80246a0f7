// Exponential moving average of a model's floating-point state (parameters and BN running
// statistics), decay d(n) = decay * (1 - exp(-n / tau)) after n updates.
// The update reads its weight (1 - d) from a device tensor written before it, so the part that
// touches the model's tensors (apply()) can be captured and replayed.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

namespace libreyolo::engine {

class ModelEMA {
 public:
  // `ema_model` is a separate copy of the model (same structure); it is put in eval mode.
  ModelEMA(std::shared_ptr<torch::nn::Module> ema_model, const torch::nn::Module& model,
           double decay = 0.9999, double tau = 2000.0, long long updates = 0);
  // `model` must be the module given to the constructor: its tensor list is cached there, so an
  // update costs one fused kernel and no name lookups.
  // Equals stage(); apply(model); then counts the update.
  void update(const torch::nn::Module& model);
  // Writes 1 - decay_at(updates() + 1) into weight() (an in-place fill, outside any capture).
  void stage();
  // ema <- lerp(ema, model, weight()) over every floating-point tensor. Touches no host state.
  void apply(const torch::nn::Module& model);
  const torch::Tensor& weight() const { return weight_; }
  double decay_at(long long updates) const;
  long long updates() const { return updates_; }
  void set_updates(long long n) { updates_ = n; }
  const std::shared_ptr<torch::nn::Module>& module() const { return ema_; }

 private:
  // m's parameters and floating-point buffers, without the buffers `source` holds non-finite.
  static std::vector<torch::Tensor> float_state(const torch::nn::Module& m, const torch::nn::Module& source);
  std::shared_ptr<torch::nn::Module> ema_;
  double decay_, tau_;
  long long updates_;
  const torch::nn::Module* source_;
  std::vector<torch::Tensor> ema_state_, source_state_;
  torch::Tensor weight_;                // 0-dim float32 on the model's device
  std::vector<torch::Tensor> weights_;  // weight_ once per tensor (the CPU lerp's argument)
  // CUDA, all float32: the one-launch update's work table (kernels/lerp_list.hpp) in device memory,
  // and the addresses it was built for (rebuilt when one moves; never while capturing).
  bool apply_one_launch();
  torch::Tensor items_;
  std::vector<const void*> item_addresses_;
  int n_items_ = 0;
};

// Whether the CUDA update may use the one-launch kernel (LIBREYOLO_EMA_KERNEL=0: ATen's multi-tensor
// ops). For tests and measurements; the result is the same bits either way.
void set_ema_kernel(bool on);

}  // namespace libreyolo::engine
