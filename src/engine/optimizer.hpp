// Optimizers over LibreYOLO's three parameter groups, built on ATen's fused kernels
// (one launch per group instead of several per parameter), with state dicts in the layout of
// torch.optim (so checkpoints interoperate with the Python reference).
#pragma once
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "io/pickle.hpp"

namespace libreyolo::engine {

struct ParamGroup {
  std::vector<torch::Tensor> params;
  double weight_decay = 0.0;
  bool decay_group = false;  // the group that carries the configured weight decay
};

// The reference's grouping (yolo9.md §3.2): walk modules in registration order; BatchNorm
// weights -> group 0 (no decay), other modules' weights -> group 1 (decay), every bias -> group 2.
// Parameters with requires_grad=false are left out. Empty groups are dropped.
std::vector<ParamGroup> make_param_groups(torch::nn::Module& model, double weight_decay);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update. found_inf (a 0-dim float tensor on the device), when given, makes the
  // kernels skip the update on every parameter if it is non-zero (AMP step skipping) without a
  // host synchronisation.
  virtual void step(const std::optional<torch::Tensor>& found_inf = std::nullopt) = 0;
  void zero_grad();  // sets the gradients to none
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // All gradients in group order (undefined grads are skipped).
  std::vector<torch::Tensor> grads() const;

  // torch.optim-compatible {"state": {idx: {...}}, "param_groups": [{...,"params": [idx...]}]}.
  virtual io::PyValuePtr state_dict() const = 0;
  // Restores from such a dict; throws ModelError when the groups or shapes do not match.
  virtual void load_state_dict(const io::PyValue& sd) = 0;
  virtual std::string name() const = 0;

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups, double lr) : groups_(std::move(groups)), lr_(lr) {}
  std::vector<ParamGroup> groups_;
  double lr_;
};

struct OptimizerOptions {
  std::string name = "sgd";  // sgd, adam, adamw
  double lr = 0.01;
  double momentum = 0.937;
  double weight_decay = 5e-4;
  bool nesterov = true;
};

// Builds the optimizer over make_param_groups(model). Throws UsageError for an unknown name or
// when nothing is trainable.
std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerOptions& opt);

}  // namespace libreyolo::engine
