// Mixed precision: an RAII autocast region (LibTorch has none) and a dynamic loss scaler
// built on ATen's AMP kernels, with no host synchronisation per step.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "core/autocast.hpp"
#include "io/pickle.hpp"

namespace libreyolo::engine {

// Resolves amp/amp_dtype for a device. bfloat16 requested where the device lacks it: logs a
// warning and falls back to float16 with loss scaling (the documented choice). CPU: no AMP.
struct AmpPlan {
  bool enabled = false;
  torch::ScalarType dtype = torch::kFloat;  // autocast dtype when enabled
  bool scaler = false;                      // float16 only
  std::string describe() const;
};
AmpPlan plan_amp(bool amp, const std::string& amp_dtype, const torch::Device& device);

using libreyolo::AutocastGuard;  // core/autocast.hpp

// Dynamic loss scaling as torch.amp.GradScaler: init 2^16, x2 after 2000 clean steps, x0.5 on
// inf/NaN. The step is skipped on the device (found_inf fed to the fused optimizer kernels).
class GradScaler {
 public:
  GradScaler(const torch::Device& device, bool enabled, double init_scale = 65536.0,
             double growth_factor = 2.0, double backoff_factor = 0.5, int64_t growth_interval = 2000);
  bool enabled() const { return enabled_; }
  torch::Tensor scale(const torch::Tensor& loss) const;  // loss * scale (loss when disabled)
  // Unscales the gradients in place and returns found_inf (0-dim float, device), or nullopt
  // when disabled. Call once per optimizer step, before clipping and stepping.
  std::optional<torch::Tensor> unscale(const std::vector<torch::Tensor>& grads);
  // Updates the scale from the found_inf of the last unscale().
  void update();
  double current_scale() const;  // host sync: for logs and tests only
  // The persistent device tensors (scale, growth tracker, found_inf); none when disabled.
  std::vector<torch::Tensor> state_tensors() const {
    return enabled_ ? std::vector<torch::Tensor>{scale_, growth_tracker_, found_inf_} : std::vector<torch::Tensor>{};
  }
  io::PyValuePtr state_dict() const;
  void load_state_dict(const io::PyValue& sd);

 private:
  bool enabled_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  torch::Tensor scale_, growth_tracker_, found_inf_;
};

}  // namespace libreyolo::engine
