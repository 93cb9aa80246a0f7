#include "engine/optimizer.hpp"

#include <unordered_set>

#include "models/detector.hpp"

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "core/strings.hpp"

namespace libreyolo::engine {

namespace {

bool rule_takes(const models::ParamRule& r, const std::string& name) {
  for (const auto& s : r.all_of)
    if (name.find(s) == std::string::npos) return false;
  if (r.any_of.empty()) return true;
  for (const auto& s : r.any_of)
    if (name.find(s) != std::string::npos) return true;
  return false;
}

std::vector<ParamGroup> groups_by_rules(torch::nn::Module& model, double weight_decay,
                                        const std::vector<models::ParamRule>& rules, double backbone_ratio) {
  std::vector<ParamGroup> groups;
  auto group_for = [&](bool decay, double ratio) -> ParamGroup& {
    for (auto& g : groups)
      if (g.decay_group == decay && g.lr_ratio == ratio) return g;
    ParamGroup g;
    g.decay_group = decay;
    g.weight_decay = decay ? weight_decay : 0.0;
    g.decay_explicit = true;
    g.lr_ratio = ratio;
    g.label = std::string(ratio != 1.0 ? "backbone " : "") + (decay ? "decayed" : "no decay");
    groups.push_back(std::move(g));
    return groups.back();
  };
  for (const auto& item : models::unique_named_parameters(model)) {
    if (!item.second.requires_grad()) continue;
    bool decay = true, backbone = false;
    for (const auto& r : rules)
      if (rule_takes(r, item.first)) {
        decay = r.decay;
        backbone = r.backbone_lr;
        break;
      }
    group_for(decay, backbone ? backbone_ratio : 1.0).params.push_back(item.second);
  }
  return groups;
}

}  // namespace

std::vector<ParamGroup> make_param_groups(torch::nn::Module& model, double weight_decay,
                                          const std::vector<models::ParamRule>& rules, double backbone_ratio) {
  if (!rules.empty()) return groups_by_rules(model, weight_decay, rules, backbone_ratio);
  ParamGroup bn_weights, weights, biases;
  bn_weights.label = "BN weights";
  biases.label = "biases";
  weights.label = "decayed weights";
  weights.weight_decay = weight_decay;
  weights.decay_group = true;
  std::unordered_set<const c10::TensorImpl*> seen;  // a module registered under several names: once
  auto take = [&](ParamGroup& g, const torch::Tensor& t) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) g.params.push_back(t);
  };
  auto visit = [&](const torch::nn::Module& mod) {
    auto own = mod.named_parameters(/*recurse=*/false);
    const bool is_bn = models::is_batchnorm(mod);
    if (auto* b = own.find("bias"); b && b->defined() && b->requires_grad()) take(biases, *b);
    if (auto* w = own.find("weight"); w && w->defined() && w->requires_grad()) take(is_bn ? bn_weights : weights, *w);
  };
  // The root itself, then every submodule in registration order (named_modules with the root
  // included needs the root to live in a shared_ptr, which callers need not do).
  visit(model);
  for (const auto& item : model.named_modules("", /*include_self=*/false)) visit(*item.value());
  std::vector<ParamGroup> groups;
  for (auto* g : {&bn_weights, &weights, &biases})
    if (!g->params.empty()) groups.push_back(std::move(*g));
  return groups;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, double lr) : groups_(std::move(groups)), lr_(lr) {
  torch::Device device(torch::kCPU);
  for (const auto& g : groups_)
    if (!g.params.empty()) {
      device = g.params[0].device();
      break;
    }
  lr_t_ = torch::full({}, lr, torch::TensorOptions().dtype(device.is_cpu() ? torch::kDouble : torch::kFloat).device(device));
  for (const auto& g : groups_) group_lr_t_.push_back(g.lr_ratio == 1.0 ? lr_t_ : torch::full({}, lr * g.lr_ratio, lr_t_.options()));
}

void Optimizer::set_lr(double lr) {
  lr_ = lr;
  lr_t_.fill_(lr);
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    if (groups_[gi].lr_ratio != 1.0) group_lr_t_[gi].fill_(lr * groups_[gi].lr_ratio);
}

void Optimizer::zero_grad() {
  // In place, not set to none: a captured step keeps writing into the same gradient tensors, and
  // the step allocates nothing once the first backward has created them. (Autograd and the fused
  // node's deferred flush then add into these zeros: 0 + g == g, the same values as a fresh grad.)
  std::vector<torch::Tensor> grads = this->grads();
  if (!grads.empty()) at::_foreach_zero_(grads);
}

io::PyValuePtr Optimizer::torch_state_dict(const std::function<io::PyValuePtr(size_t, size_t)>& param_state,
                                       const std::function<io::PyValuePtr(size_t)>& group_options) const {
  auto root = io::PyValue::new_dict();
  auto state = io::PyValue::new_dict();
  auto pgs = io::PyValue::new_list();
  int64_t base = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const size_t n = groups_[gi].params.size();
    auto indices = io::PyValue::new_list();
    for (size_t i = 0; i < n; ++i) {
      const int64_t index = base + static_cast<int64_t>(i);
      indices->items.push_back(io::PyValue::from_int(index));
      if (auto s = param_state(gi, i)) state->set(io::PyValue::from_int(index), s);
    }
    auto g = group_options(gi);
    g->set("params", indices);
    pgs->items.push_back(g);
    base += static_cast<int64_t>(n);
  }
  root->set("state", state);
  root->set("param_groups", pgs);
  return root;
}

std::vector<torch::Tensor> Optimizer::grads() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_)
    for (const auto& p : g.params)
      if (p.grad().defined()) out.push_back(p.grad());
  return out;
}

namespace {

using io::PyValue;
using io::PyValuePtr;

// The params of each group whose gradient exists, with their grads.
struct Live {
  std::vector<torch::Tensor> params, grads;
  std::vector<size_t> index;  // position within the group
};
Live live_params(const ParamGroup& g) {
  Live l;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const auto& p = g.params[i];
    if (!p.grad().defined()) continue;
    l.params.push_back(p);
    l.grads.push_back(p.grad());
    l.index.push_back(i);
  }
  return l;
}

void check_groups(const PyValue& sd, const std::vector<ParamGroup>& groups, const char* name) {
  auto pg = sd.get("param_groups");
  if (!pg || pg->kind != PyValue::Kind::List || pg->items.size() != groups.size())
    throw ModelError(std::string("optimizer state does not match: expected ") +
                     std::to_string(groups.size()) + " parameter groups for " + name);
  for (size_t g = 0; g < groups.size(); ++g) {
    auto params = pg->items[g]->get("params");
    if (!params || params->items.size() != groups[g].params.size())
      throw ModelError("optimizer state does not match: group " + std::to_string(g) +
                       " has a different number of parameters");
  }
}

torch::Tensor state_tensor(const PyValue& state, size_t idx, const char* key, const torch::Tensor& like) {
  for (const auto& [k, v] : state.dict) {
    if (!k->is_int() || k->as_int() != static_cast<int64_t>(idx)) continue;
    auto t = v->get(key);
    if (!t || !t->is_tensor()) return {};
    if (key[0] != 's' && t->tensor.sizes() != like.sizes())  // "step" is a scalar
      throw ModelError(std::string("optimizer state '") + key + "' of parameter " + std::to_string(idx) +
                       " has a different shape");
    return t->tensor;
  }
  return {};
}

class SGD final : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, const OptimizerOptions& o)
      : Optimizer(std::move(groups), o.lr), momentum_(o.momentum), current_(o.momentum), filled_(o.momentum), nesterov_(o.nesterov) {
    // A momentum that changes between updates (the warm-up) is device state, read by the update
    // as the learning rate is: ratio_ = current / momentum_ (see step()).
    if (momentum_ != 0.0 && o.warmup_momentum != o.momentum)
      ratio_t_ = torch::ones({}, lr_t_.options());
    // Momentum buffers exist from the start, zero: the first step is then the same kernel call
    // as every other (momentum * 0 + grad == grad, what torch.optim.SGD's first step stores).
    // has_state_ says which of them torch.optim would have (those that took part in a step).
    torch::NoGradGuard ng;
    for (const auto& g : groups_) {
      bufs_.emplace_back();
      has_state_.emplace_back(g.params.size(), false);
      if (momentum_ != 0.0)
        for (const auto& p : g.params) bufs_.back().push_back(torch::zeros_like(p, at::MemoryFormat::Preserve));
    }
  }

  void step(const std::optional<torch::Tensor>& found_inf) override {
    torch::NoGradGuard ng;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Live l = live_params(groups_[gi]);
      if (l.params.empty()) continue;
      const double wd = groups_[gi].weight_decay;
      if (momentum_ == 0.0) {
        at::_fused_sgd_(l.params, l.grads, {}, wd, 0.0, group_lr(gi), 0.0, nesterov_, false, false, std::nullopt,
                        found_inf);
        continue;
      }
      std::vector<torch::Tensor> bufs;
      bufs.reserve(l.index.size());
      for (size_t i : l.index) {
        bufs.push_back(bufs_[gi][i]);
        has_state_[gi][i] = true;
      }
      // The ramp's extra passes only while the momentum differs from the kernel's constant: after
      // warm-up an update is the plain kernel call (a graph captured during warm-up keeps them,
      // and stays right with r = 1).
      if (!ratio_t_.defined() || current_ == momentum_) {
        at::_fused_sgd_(l.params, l.grads, bufs, wd, momentum_, group_lr(gi), 0.0, nesterov_, false, false, std::nullopt,
                        found_inf);
        continue;
      }
      // Momentum m = r * M with the kernel's constant M: scaling the buffers by r first makes the
      // kernel's buffer update M * (r * buf) + g = m * buf + g. Nesterov's step then reads
      // g + M * buf where g + m * buf is meant: the surplus lr * (M - m) * buf is given back.
      // A skipped step (found_inf) leaves the buffers alone (r = 1, no correction).
      torch::Tensor r = ratio_t_;
      if (found_inf) r = torch::where(found_inf->gt(0), torch::ones_like(r), r);
      at::_foreach_mul_(bufs, r);
      at::_fused_sgd_(l.params, l.grads, bufs, wd, momentum_, group_lr(gi), 0.0, nesterov_, false, false, std::nullopt,
                      found_inf);
      if (nesterov_) {
        const torch::Tensor surplus = group_lr(gi) * momentum_ * (1.0 - r);
        at::_foreach_add_(l.params, at::_foreach_mul(bufs, surplus));
      }
    }
  }

  void set_momentum(double m) override {
    current_ = momentum_ == 0.0 ? 0.0 : m;
    // A fill is a device write: only when the momentum changed (every step of warm-up, none after).
    if (ratio_t_.defined() && current_ != filled_) {
      ratio_t_.fill_(current_ / momentum_);
      filled_ = current_;
    }
  }

  PyValuePtr state_dict() const override {
    return torch_state_dict(
        [&](size_t gi, size_t i) -> PyValuePtr {
          if (momentum_ == 0.0 || !has_state_[gi][i]) return nullptr;
          auto s = PyValue::new_dict();
          s->set("momentum_buffer", PyValue::from_tensor(bufs_[gi][i]));
          return s;
        },
        [&](size_t gi) {
          auto g = PyValue::new_dict();
          g->set("lr", PyValue::from_float(lr_ * groups_[gi].lr_ratio));
          g->set("momentum", PyValue::from_float(current_));
          g->set("dampening", PyValue::from_int(0));
          g->set("weight_decay", PyValue::from_float(groups_[gi].weight_decay));
          g->set("nesterov", PyValue::from_bool(nesterov_));
          g->set("maximize", PyValue::from_bool(false));
          g->set("foreach", PyValue::none());
          g->set("differentiable", PyValue::from_bool(false));
          g->set("fused", PyValue::from_bool(true));
          return g;
        });
  }

  void load_state_dict(const PyValue& sd) override {
    check_groups(sd, groups_, "SGD");
    auto state = sd.get("state");
    size_t base = 0;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
        const auto& p = groups_[gi].params[i];
        torch::Tensor t = state ? state_tensor(*state, base + i, "momentum_buffer", p) : torch::Tensor();
        has_state_[gi][i] = t.defined() && momentum_ != 0.0;
        if (momentum_ == 0.0) continue;
        torch::NoGradGuard ng;
        // Into the existing buffers: they stay the tensors a captured step writes.
        if (t.defined())
          bufs_[gi][i].copy_(t);
        else
          bufs_[gi][i].zero_();
      }
      base += groups_[gi].params.size();
    }
    if (auto pg = sd.get("param_groups"); pg && !pg->items.empty())
      if (auto lr = pg->items[0]->get("lr")) set_lr(lr->as_float("lr") / groups_[0].lr_ratio);
  }

  std::string name() const override { return "SGD"; }
  std::vector<torch::Tensor> state_tensors() const override {
    std::vector<torch::Tensor> out;
    for (const auto& g : bufs_) out.insert(out.end(), g.begin(), g.end());
    return out;
  }

 private:
  double momentum_;  // the kernel's constant, the momentum after warm-up
  double current_;   // the momentum of the next update
  torch::Tensor ratio_t_;  // current_ / momentum_ on the device; undefined when the momentum is constant
  double filled_;          // the momentum ratio_t_ holds
  bool nesterov_;
  std::vector<std::vector<torch::Tensor>> bufs_;  // empty when momentum is 0
  std::vector<std::vector<bool>> has_state_;
};

class Adam final : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, const OptimizerOptions& o, bool decoupled)
      : Optimizer(std::move(groups), o.lr), decoupled_(decoupled) {
    // All state exists from the start (zeros, as torch.optim creates it lazily), so every step
    // is the same kernel calls on the same tensors.
    torch::NoGradGuard ng;
    for (auto& g : groups_) {
      m_.emplace_back();
      v_.emplace_back();
      steps_.emplace_back();
      has_state_.emplace_back(g.params.size(), false);
      for (const auto& p : g.params) {
        m_.back().push_back(torch::zeros_like(p, at::MemoryFormat::Preserve));
        v_.back().push_back(torch::zeros_like(p, at::MemoryFormat::Preserve));
        steps_.back().push_back(torch::zeros({}, p.options().dtype(torch::kFloat)));
      }
    }
  }

  void step(const std::optional<torch::Tensor>& found_inf) override {
    torch::NoGradGuard ng;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Live l = live_params(groups_[gi]);
      if (l.params.empty()) continue;
      std::vector<torch::Tensor> m, v, s;
      for (size_t i : l.index) {
        m.push_back(m_[gi][i]);
        v.push_back(v_[gi][i]);
        s.push_back(steps_[gi][i]);
        has_state_[gi][i] = true;
      }
      double wd = groups_[gi].weight_decay;
      // The fused kernels read the step count after it was advanced (bias correction), as
      // torch.optim does; a step skipped for inf/NaN gradients gives the count back.
      at::_foreach_add_(s, 1.0);
      if (decoupled_)
        at::_fused_adamw_(l.params, l.grads, m, v, {}, s, group_lr(gi), kBeta1, kBeta2, wd, kEps, false, false,
                          std::nullopt, found_inf);
      else
        at::_fused_adam_(l.params, l.grads, m, v, {}, s, group_lr(gi), kBeta1, kBeta2, wd, kEps, false, false,
                         std::nullopt, found_inf);
      if (found_inf) at::_foreach_sub_(s, std::vector<torch::Tensor>(s.size(), *found_inf));
    }
  }

  PyValuePtr state_dict() const override {
    return torch_state_dict(
        [&](size_t gi, size_t i) -> PyValuePtr {
          if (!has_state_[gi][i]) return nullptr;
          auto s = PyValue::new_dict();
          s->set("step", PyValue::from_tensor(steps_[gi][i]));
          s->set("exp_avg", PyValue::from_tensor(m_[gi][i]));
          s->set("exp_avg_sq", PyValue::from_tensor(v_[gi][i]));
          return s;
        },
        [&](size_t gi) {
          auto g = PyValue::new_dict();
          g->set("lr", PyValue::from_float(lr_ * groups_[gi].lr_ratio));
          g->set("betas", PyValue::new_tuple({PyValue::from_float(kBeta1), PyValue::from_float(kBeta2)}));
          g->set("eps", PyValue::from_float(kEps));
          g->set("weight_decay", PyValue::from_float(groups_[gi].weight_decay));
          g->set("amsgrad", PyValue::from_bool(false));
          g->set("maximize", PyValue::from_bool(false));
          g->set("foreach", PyValue::none());
          g->set("capturable", PyValue::from_bool(false));
          g->set("differentiable", PyValue::from_bool(false));
          g->set("fused", PyValue::from_bool(true));
          g->set("decoupled_weight_decay", PyValue::from_bool(decoupled_));
          return g;
        });
  }

  void load_state_dict(const PyValue& sd) override {
    check_groups(sd, groups_, name().c_str());
    auto state = sd.get("state");
    size_t base = 0;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
        const auto& p = groups_[gi].params[i];
        torch::Tensor m, v, s;
        if (state) {
          m = state_tensor(*state, base + i, "exp_avg", p);
          v = state_tensor(*state, base + i, "exp_avg_sq", p);
          s = state_tensor(*state, base + i, "step", p);
        }
        // Into the existing tensors: they stay the ones a captured step writes.
        torch::NoGradGuard ng;
        has_state_[gi][i] = m.defined() && v.defined() && s.defined();
        if (has_state_[gi][i]) {
          m_[gi][i].copy_(m);
          v_[gi][i].copy_(v);
          steps_[gi][i].copy_(s.reshape({}));
        } else {
          m_[gi][i].zero_();
          v_[gi][i].zero_();
          steps_[gi][i].zero_();
        }
      }
      base += groups_[gi].params.size();
    }
    if (auto pg = sd.get("param_groups"); pg && !pg->items.empty())
      if (auto lr = pg->items[0]->get("lr")) set_lr(lr->as_float("lr") / groups_[0].lr_ratio);
  }

  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  std::vector<torch::Tensor> state_tensors() const override {
    std::vector<torch::Tensor> out;
    for (const auto* s : {&m_, &v_, &steps_})
      for (const auto& g : *s) out.insert(out.end(), g.begin(), g.end());
    return out;
  }

 private:
  static constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  bool decoupled_;
  std::vector<std::vector<torch::Tensor>> m_, v_, steps_;
  std::vector<std::vector<bool>> has_state_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerOptions& opt) {
  const std::string name = lower(opt.name);
  const double backbone_ratio = opt.lr_backbone > 0        ? opt.lr_backbone / opt.lr
                                : opt.backbone_lr_mult > 0 ? opt.backbone_lr_mult
                                                           : 1.0;
  auto groups = make_param_groups(model, opt.weight_decay, opt.rules, backbone_ratio);
  if (groups.empty())
    throw UsageError(
        "No trainable parameters remain after layer freezing; reduce the freeze value or choose a "
        "narrower selector.");
  if (name == "sgd") return std::make_unique<SGD>(std::move(groups), opt);
  if (name == "adam" || name == "adamw") {
    // As torch.optim: groups without an explicit decay take the constructor default, which is
    // 0 for Adam and 0.01 for AdamW (the reference inherits this quirk).
    if (name == "adamw")
      for (auto& g : groups)
        if (!g.decay_group && !g.decay_explicit) g.weight_decay = 0.01;
    return std::make_unique<Adam>(std::move(groups), opt, name == "adamw");
  }
  throw UsageError("Unknown optimizer: " + opt.name, "Use sgd, adam or adamw.", "config_range_error");
}

}  // namespace libreyolo::engine
