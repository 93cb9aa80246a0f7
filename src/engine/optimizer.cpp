#include "engine/optimizer.hpp"

#include "models/detector.hpp"

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "core/strings.hpp"

namespace libreyolo::engine {

std::vector<ParamGroup> make_param_groups(torch::nn::Module& model, double weight_decay) {
  ParamGroup bn_weights, weights, biases;
  weights.weight_decay = weight_decay;
  weights.decay_group = true;
  auto visit = [&](const torch::nn::Module& mod) {
    auto own = mod.named_parameters(/*recurse=*/false);
    const bool is_bn = models::is_batchnorm(mod);
    if (auto* b = own.find("bias"); b && b->defined() && b->requires_grad()) biases.params.push_back(*b);
    if (auto* w = own.find("weight"); w && w->defined() && w->requires_grad())
      (is_bn ? bn_weights : weights).params.push_back(*w);
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

void Optimizer::zero_grad() {
  // Set to none (torch's default): the next backward then hands its gradient tensors over
  // instead of adding them into zeroed ones, one kernel and one dispatch fewer per parameter.
  for (auto& g : groups_)
    for (auto& p : g.params)
      if (p.grad().defined()) p.mutable_grad().reset();
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

PyValuePtr index_list(size_t start, size_t n) {
  auto l = PyValue::new_list();
  for (size_t i = 0; i < n; ++i) l->items.push_back(PyValue::from_int(static_cast<int64_t>(start + i)));
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
      : Optimizer(std::move(groups), o.lr), momentum_(o.momentum), nesterov_(o.nesterov) {
    for (const auto& g : groups_) bufs_.emplace_back(g.params.size());
  }

  void step(const std::optional<torch::Tensor>& found_inf) override {
    torch::NoGradGuard ng;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Live l = live_params(groups_[gi]);
      if (l.params.empty()) continue;
      const double wd = groups_[gi].weight_decay;
      if (momentum_ == 0.0) {
        at::_fused_sgd_(l.params, l.grads, {}, wd, 0.0, lr_, 0.0, nesterov_, false, false, std::nullopt,
                        found_inf);
        continue;
      }
      // Parameters whose momentum buffer exists, and those stepping for the first time (their
      // buffer starts as the gradient, as torch.optim.SGD does): one fused call for each set.
      Live seen, fresh;
      std::vector<torch::Tensor> seen_bufs, fresh_bufs;
      for (size_t k = 0; k < l.params.size(); ++k) {
        auto& b = bufs_[gi][l.index[k]];
        const bool is_new = !b.defined();
        // Zeros, not garbage: if an AMP-skipped step leaves it untouched, the next
        // step (momentum * 0 + grad) still starts the buffer at the gradient.
        if (is_new) b = torch::zeros_like(l.params[k], at::MemoryFormat::Preserve);
        Live& dst = is_new ? fresh : seen;
        dst.params.push_back(l.params[k]);
        dst.grads.push_back(l.grads[k]);
        (is_new ? fresh_bufs : seen_bufs).push_back(b);
      }
      if (!seen.params.empty())
        at::_fused_sgd_(seen.params, seen.grads, seen_bufs, wd, momentum_, lr_, 0.0, nesterov_, false,
                        false, std::nullopt, found_inf);
      if (!fresh.params.empty())
        at::_fused_sgd_(fresh.params, fresh.grads, fresh_bufs, wd, momentum_, lr_, 0.0, nesterov_, false,
                        true, std::nullopt, found_inf);
    }
  }

  PyValuePtr state_dict() const override {
    auto root = PyValue::new_dict();
    auto state = PyValue::new_dict();
    auto pgs = PyValue::new_list();
    size_t base = 0;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
        const auto& b = bufs_[gi][i];
        if (!b.defined()) continue;
        auto s = PyValue::new_dict();
        s->set("momentum_buffer", PyValue::from_tensor(b));
        state->set(PyValue::from_int(static_cast<int64_t>(base + i)), s);
      }
      auto g = PyValue::new_dict();
      g->set("lr", PyValue::from_float(lr_));
      g->set("momentum", PyValue::from_float(momentum_));
      g->set("dampening", PyValue::from_int(0));
      g->set("weight_decay", PyValue::from_float(groups_[gi].weight_decay));
      g->set("nesterov", PyValue::from_bool(nesterov_));
      g->set("maximize", PyValue::from_bool(false));
      g->set("foreach", PyValue::none());
      g->set("differentiable", PyValue::from_bool(false));
      g->set("fused", PyValue::from_bool(true));
      g->set("params", index_list(base, groups_[gi].params.size()));
      pgs->items.push_back(g);
      base += groups_[gi].params.size();
    }
    root->set("state", state);
    root->set("param_groups", pgs);
    return root;
  }

  void load_state_dict(const PyValue& sd) override {
    check_groups(sd, groups_, "SGD");
    auto state = sd.get("state");
    size_t base = 0;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
        const auto& p = groups_[gi].params[i];
        torch::Tensor t = state ? state_tensor(*state, base + i, "momentum_buffer", p) : torch::Tensor();
        bufs_[gi][i] = t.defined() ? t.to(p.device(), p.scalar_type()).clone() : torch::Tensor();
      }
      base += groups_[gi].params.size();
    }
    if (auto pg = sd.get("param_groups"); pg && !pg->items.empty())
      if (auto lr = pg->items[0]->get("lr")) lr_ = lr->as_float("lr");
  }

  std::string name() const override { return "SGD"; }

 private:
  double momentum_;
  bool nesterov_;
  std::vector<std::vector<torch::Tensor>> bufs_;
};

class Adam final : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, const OptimizerOptions& o, bool decoupled)
      : Optimizer(std::move(groups), o.lr), decoupled_(decoupled) {
    for (auto& g : groups_) {
      m_.emplace_back(g.params.size());
      v_.emplace_back(g.params.size());
      steps_.emplace_back(g.params.size());
    }
  }

  void step(const std::optional<torch::Tensor>& found_inf) override {
    torch::NoGradGuard ng;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Live l = live_params(groups_[gi]);
      if (l.params.empty()) continue;
      std::vector<torch::Tensor> m, v, s;
      for (size_t k = 0; k < l.params.size(); ++k) {
        size_t i = l.index[k];
        if (!m_[gi][i].defined()) {
          m_[gi][i] = torch::zeros_like(l.params[k], at::MemoryFormat::Preserve);
          v_[gi][i] = torch::zeros_like(l.params[k], at::MemoryFormat::Preserve);
          steps_[gi][i] = torch::zeros({}, l.params[k].options().dtype(torch::kFloat));
        }
        m.push_back(m_[gi][i]);
        v.push_back(v_[gi][i]);
        s.push_back(steps_[gi][i]);
      }
      double wd = groups_[gi].weight_decay;
      // The fused kernels read the step count after it was advanced (bias correction), as
      // torch.optim does; a step skipped for inf/NaN gradients gives the count back.
      at::_foreach_add_(s, 1.0);
      if (decoupled_)
        at::_fused_adamw_(l.params, l.grads, m, v, {}, s, lr_, kBeta1, kBeta2, wd, kEps, false, false,
                          std::nullopt, found_inf);
      else
        at::_fused_adam_(l.params, l.grads, m, v, {}, s, lr_, kBeta1, kBeta2, wd, kEps, false, false,
                         std::nullopt, found_inf);
      if (found_inf) at::_foreach_sub_(s, std::vector<torch::Tensor>(s.size(), *found_inf));
    }
  }

  PyValuePtr state_dict() const override {
    auto root = PyValue::new_dict();
    auto state = PyValue::new_dict();
    auto pgs = PyValue::new_list();
    size_t base = 0;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
        if (!m_[gi][i].defined()) continue;
        auto s = PyValue::new_dict();
        s->set("step", PyValue::from_tensor(steps_[gi][i]));
        s->set("exp_avg", PyValue::from_tensor(m_[gi][i]));
        s->set("exp_avg_sq", PyValue::from_tensor(v_[gi][i]));
        state->set(PyValue::from_int(static_cast<int64_t>(base + i)), s);
      }
      auto g = PyValue::new_dict();
      g->set("lr", PyValue::from_float(lr_));
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
      g->set("params", index_list(base, groups_[gi].params.size()));
      pgs->items.push_back(g);
      base += groups_[gi].params.size();
    }
    root->set("state", state);
    root->set("param_groups", pgs);
    return root;
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
        if (m.defined() && v.defined() && s.defined()) {
          m_[gi][i] = m.to(p.device(), p.scalar_type()).clone();
          v_[gi][i] = v.to(p.device(), p.scalar_type()).clone();
          steps_[gi][i] = s.to(p.device(), torch::kFloat).reshape({}).clone();
        } else {
          m_[gi][i] = v_[gi][i] = steps_[gi][i] = torch::Tensor();
        }
      }
      base += groups_[gi].params.size();
    }
    if (auto pg = sd.get("param_groups"); pg && !pg->items.empty())
      if (auto lr = pg->items[0]->get("lr")) lr_ = lr->as_float("lr");
  }

  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }

 private:
  static constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  bool decoupled_;
  std::vector<std::vector<torch::Tensor>> m_, v_, steps_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerOptions& opt) {
  const std::string name = lower(opt.name);
  auto groups = make_param_groups(model, opt.weight_decay);
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
        if (!g.decay_group) g.weight_decay = 0.01;
    return std::make_unique<Adam>(std::move(groups), opt, name == "adamw");
  }
  throw UsageError("Unknown optimizer: " + opt.name, "Use sgd, adam or adamw.", "config_range_error");
}

}  // namespace libreyolo::engine
