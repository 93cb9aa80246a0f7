// An RAII autocast region (LibTorch has none): enables autocast for a device type with a dtype,
// restoring the previous state on exit, as torch.autocast does. Used by training (engine) and by
// inference (models' captured forwards).
#pragma once
#include <torch/torch.h>

namespace libreyolo {

class AutocastGuard {
 public:
  // cache=false is required while capturing CUDA graphs.
  AutocastGuard(const torch::Device& device, bool enabled, torch::ScalarType dtype, bool cache = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType type_;
  bool prev_enabled_ = false;
  torch::ScalarType prev_dtype_ = torch::kFloat;
  bool prev_cache_ = true;
};

}  // namespace libreyolo
