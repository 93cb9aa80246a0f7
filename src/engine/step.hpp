// One training step (forward, loss, backward and, at the end of an accumulation window, the
// optimizer step, loss-scale update, EMA update and learning-rate update). Shared by the trainer
// and the step benchmark; the CUDA-graph and profiler work wraps this class.
#pragma once
#include <torch/torch.h>

#include <memory>

#include <libreyolo/hooks.hpp>

#include "engine/amp.hpp"
#include "engine/ema.hpp"
#include "engine/optimizer.hpp"
#include "engine/schedule.hpp"
#include "loss/loss.hpp"
#include "models/detector.hpp"

namespace libreyolo::engine {

// Receives the phases of each step (to_device, forward, loss, backward, optimizer). StepRunner
// reports them only while an observer is set: nothing is done per phase otherwise.
class PhaseObserver {
 public:
  virtual ~PhaseObserver() = default;
  virtual void phase_begin(Phase p) = 0;
  virtual void phase_end(Phase p) = 0;
};

// Reports one phase to an observer, if there is one, for the lifetime of the scope.
class PhaseScope {
 public:
  PhaseScope(PhaseObserver* obs, Phase p) : obs_(obs), p_(p) {
    if (obs_) obs_->phase_begin(p_);
  }
  ~PhaseScope() {
    if (obs_) obs_->phase_end(p_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseObserver* obs_;
  Phase p_;
};

struct StepConfig {
  torch::Device device{torch::kCPU};
  AmpPlan amp;
  bool channels_last = false;
  double clip_max_norm = 0.0;
  models::InputSpec input;  // the family's input convention
};

class StepRunner {
 public:
  StepRunner(std::shared_ptr<models::Detector> model, std::unique_ptr<DetectionLoss> loss,
             std::unique_ptr<Optimizer> optimizer, std::unique_ptr<GradScaler> scaler, ModelEMA* ema,
             const LrSchedule& schedule, StepConfig cfg);

  // images: [B, S, S, 3] uint8 (host, ideally pinned, or already on the device);
  // targets: [B, T, 5] float. loss_divisor: accumulation window size.
  // Returns the loss terms (device tensors, no synchronisation).
  LossOutput forward_backward(const torch::Tensor& images, const torch::Tensor& targets, double loss_divisor = 1.0);
  // Optimizer step (skipped on the device when AMP found inf/NaN), scaler update, zero grads,
  // EMA update, lr <- schedule(global_step + 1).
  void optimizer_step();

  int64_t global_step() const { return global_step_; }
  void set_global_step(int64_t s);  // also sets the lr to schedule(s)
  Optimizer& optimizer() { return *optimizer_; }
  GradScaler& scaler() { return *scaler_; }
  const StepConfig& config() const { return cfg_; }
  void set_phase_observer(PhaseObserver* obs) { phases_ = obs; }
  PhaseObserver* phase_observer() const { return phases_; }
  DetectionLoss& loss() { return *loss_; }
  // NHWC uint8 on any device -> the network's float NCHW input on the training device, in the step's layout.
  torch::Tensor prepare_images(const torch::Tensor& images) const;

 private:
  std::shared_ptr<models::Detector> model_;
  std::unique_ptr<DetectionLoss> loss_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<GradScaler> scaler_;
  ModelEMA* ema_;
  LrSchedule schedule_;
  StepConfig cfg_;
  int64_t global_step_ = 0;
  PhaseObserver* phases_ = nullptr;
};

// Converts every 4-d parameter to channels_last in place (grads will follow that layout).
void to_channels_last(torch::nn::Module& m);

}  // namespace libreyolo::engine
