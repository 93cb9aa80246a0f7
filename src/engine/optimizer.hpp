// Optimizers over LibreYOLO's three parameter groups, built on ATen's fused kernels
// (one launch per group instead of several per parameter), with state dicts in the layout of
// torch.optim (so checkpoints interoperate with the Python reference).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/pickle.hpp"
#include "models/detector.hpp"

namespace libreyolo::engine {

struct ParamGroup {
  std::vector<torch::Tensor> params;
  double weight_decay = 0.0;
  bool decay_group = false;  // the group carries the configured weight decay
  double lr_ratio = 1.0;     // the group's learning rate over the schedule's
  bool decay_explicit = false;  // weight_decay was set for this group (AdamW keeps a 0 then)
  std::string label;         // for logs
};

// Without rules, the reference's grouping: walk modules in registration order; BatchNorm
// weights -> group 0 (no decay), other modules' weights -> group 1 (decay), every bias -> group 2.
// With rules (a family's, models::ParamRule), each parameter in named_parameters() order goes to
// the group of the first rule that takes it (decay or none, lr ratio `backbone_ratio` or 1), one
// group per distinct (decay, ratio) in the order first met; a parameter no rule takes goes to
// "rest" (decayed, ratio 1). Parameters with requires_grad=false are left out. Empty groups are dropped.
std::vector<ParamGroup> make_param_groups(torch::nn::Module& model, double weight_decay,
                                          const std::vector<models::ParamRule>& rules = {},
                                          double backbone_ratio = 1.0);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update. found_inf (a 0-dim float tensor on the device), when given, makes the
  // kernels skip the update on every parameter if it is non-zero (AMP step skipping) without a
  // host synchronisation.
  // The step takes the same path every time (no lazy state, no first-step variant): the state
  // tensors exist from construction and are updated in place, so it can be captured.
  virtual void step(const std::optional<torch::Tensor>& found_inf = std::nullopt) = 0;
  // Zeroes the existing gradients in place (they stay the same tensors, which a captured step
  // needs); gradients that do not exist yet are left undefined.
  void zero_grad();
  // Sets the host value and writes it into every group's learning-rate tensor (an in-place fill,
  // outside any capture): lr times the group's ratio.
  void set_lr(double lr);
  double lr() const { return lr_; }
  // The momentum of the next updates (SGD's warm-up). Writes device state only (an in-place fill
  // outside any capture), so a captured update follows it. No effect on optimizers without one.
  virtual void set_momentum(double) {}
  // 0-dim device tensor the fused kernels read the learning rate from: float64 on the CPU (the
  // CPU kernels read it as a double, so results equal a double lr), float32 on CUDA (what the
  // CUDA kernels read).
  const torch::Tensor& lr_tensor() const { return lr_t_; }
  // Group gi's learning rate tensor (lr_tensor() itself for a ratio of 1).
  const torch::Tensor& group_lr(size_t gi) const { return group_lr_t_[gi]; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // All gradients in group order (undefined grads are skipped).
  std::vector<torch::Tensor> grads() const;

  // torch.optim-compatible {"state": {idx: {...}}, "param_groups": [{...,"params": [idx...]}]}.
  virtual io::PyValuePtr state_dict() const = 0;
  // Restores from such a dict; throws ModelError when the groups or shapes do not match.
  virtual void load_state_dict(const io::PyValue& sd) = 0;
  virtual std::string name() const = 0;
  // Every state tensor (momentum buffers; Adam's moments and step counts), for tests and capture.
  virtual std::vector<torch::Tensor> state_tensors() const = 0;

 protected:
  Optimizer(std::vector<ParamGroup> groups, double lr);
  // torch.optim's layout from the optimizer's parts: param_state(group, index) gives a parameter's
  // state (nullptr: none yet), group_options(group) a group's options in torch's key order; the
  // global parameter indices ("params", the state's keys) are numbered here.
  io::PyValuePtr torch_state_dict(const std::function<io::PyValuePtr(size_t, size_t)>& param_state,
                                  const std::function<io::PyValuePtr(size_t)>& group_options) const;
  std::vector<ParamGroup> groups_;
  double lr_;
  torch::Tensor lr_t_;
  std::vector<torch::Tensor> group_lr_t_;
};

struct OptimizerOptions {
  std::string name = "sgd";  // sgd, adam, adamw
  double lr = 0.01;
  double momentum = 0.937;
  // SGD: the momentum set_momentum() may lower it to (its warm-up start); when it differs from
  // `momentum` the update reads its momentum from device state, otherwise it is a constant.
  double warmup_momentum = 0.937;
  double weight_decay = 5e-4;
  bool nesterov = true;
  std::vector<models::ParamRule> rules;  // the family's grouping (empty: the shared one)
  double lr_backbone = 0.0;              // for rules with backbone_lr (0: lr)
  double backbone_lr_mult = 0.0;         // or lr times this, when lr_backbone is 0 (0: lr)
};

// Builds the optimizer over make_param_groups(model). Throws UsageError for an unknown name or
// when nothing is trainable.
std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerOptions& opt);

}  // namespace libreyolo::engine
