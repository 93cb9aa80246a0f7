#include "layers/fold.hpp"

#include <optional>

#include "core/env.hpp"
#include "layers/conv_bn_act.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <atomic>

namespace libreyolo::models::common {
namespace {

EnvFlag fold_flag{"LIBREYOLO_FOLD_BN"};

std::atomic<uint64_t> weights_generation{0};  // bumped by note_weights_changed()

// Makes ordinary (not inference) tensors with no autograd history and no autocast casts, whatever
// mode the caller is in: the folds are written in place later, possibly outside inference mode.
struct FoldGuard {
  c10::InferenceMode not_inference{false};
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
};

struct Computed {
  at::Tensor weight, bias;  // float64
};

std::atomic<uint64_t>& computations() {
  static std::atomic<uint64_t> n{0};
  return n;
}

// The source's norm as tensors (a BatchNorm2d module's, or the given ones); nullopt for a plain
// convolution. `training`: a module in training mode (its batch statistics would be used).
struct Norm {
  torch::Tensor weight, bias, mean, var;
  double eps;
  bool training;
};
std::optional<Norm> norm_of(const FoldSource& s) {
  if (s.bn) return Norm{s.bn->weight, s.bn->bias, s.bn->running_mean, s.bn->running_var, s.bn->options.eps(),
                        s.bn->is_training()};
  if (s.norm) {
    const auto get = [](const torch::Tensor* t) { return t ? *t : torch::Tensor(); };
    return Norm{get(s.norm->weight), get(s.norm->bias), get(s.norm->running_mean), get(s.norm->running_var),
                s.norm->eps, false};
  }
  return std::nullopt;
}

Computed compute(c10::ArrayRef<FoldSource> sources) {
  TORCH_CHECK(!sources.empty(), "BatchNorm folding: no source layers");
  computations().fetch_add(1, std::memory_order_relaxed);
  int64_t kh = 0, kw = 0;
  for (const auto& s : sources) {
    kh = std::max(kh, s.conv->weight.size(2));
    kw = std::max(kw, s.conv->weight.size(3));
  }
  Computed c;
  for (const auto& s : sources) {
    const at::Tensor w = s.conv->weight.to(at::kDouble);
    const auto bn = norm_of(s);
    if (!bn) {  // a plain convolution: its own weight and bias
      TORCH_CHECK(sources.size() == 1, "BatchNorm folding: a plain convolution is folded alone");
      c.weight = w;
      c.bias = s.conv->bias.defined() ? s.conv->bias.to(at::kDouble)
                                      : at::zeros({w.size(0)}, w.options());
      return c;
    }
    const at::Tensor mean = bn->mean.to(at::kDouble), var = bn->var.to(at::kDouble);
    const at::Tensor gamma = bn->weight.defined() ? bn->weight.to(at::kDouble) : at::ones_like(mean);
    const at::Tensor beta = bn->bias.defined() ? bn->bias.to(at::kDouble) : at::zeros_like(mean);
    const at::Tensor scale = gamma * (var + bn->eps).rsqrt();
    at::Tensor wf = w * scale.view({-1, 1, 1, 1});
    const at::Tensor bf = beta - mean * scale;
    const int64_t ph = (kh - w.size(2)) / 2, pw = (kw - w.size(3)) / 2;
    if (ph || pw || w.size(2) != kh || w.size(3) != kw)  // centred in the largest kernel
      wf = at::constant_pad_nd(wf, {pw, kw - w.size(3) - pw, ph, kh - w.size(2) - ph});
    c.weight = c.weight.defined() ? c.weight + wf : wf;
    c.bias = c.bias.defined() ? c.bias + bf : bf;
  }
  return c;
}

void push_tensor(std::vector<uint64_t>& out, const torch::Tensor& t) {
  if (!t.defined()) {
    out.insert(out.end(), {0, 0, 0});
    return;
  }
  out.push_back(reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl()));
  out.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()));
  // Inference tensors keep no version counter (and cannot be written outside inference mode).
  out.push_back(t.is_inference() ? 0 : static_cast<uint64_t>(t._version()));
}

}  // namespace

void set_fold_bn(bool on) { fold_flag.store(on); }
bool fold_bn() { return fold_flag.load(); }
void note_weights_changed() { weights_generation.fetch_add(1); }
uint64_t fold_computations() { return computations().load(); }

at::ScalarType fold_compute_dtype(const torch::Tensor& x) {
  const auto t = x.scalar_type();
  const auto dev = x.device().type();
  if ((t == at::kFloat || t == at::kHalf || t == at::kBFloat16) && at::autocast::is_autocast_enabled(dev))
    return at::autocast::get_autocast_dtype(dev);
  return t;
}

at::MemoryFormat fold_memory_format(const torch::Tensor& x, const torch::Tensor& weight) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  return (x.dim() == 4 && x.suggest_memory_format() == cl) || weight.suggest_memory_format() == cl
             ? cl
             : at::MemoryFormat::Contiguous;
}

bool fold_allowed(const torch::Tensor& x, c10::ArrayRef<FoldSource> sources) {
  if (!fold_bn() || x.dim() != 4 || !at::isFloatingType(x.scalar_type())) return false;
  const bool grad = torch::GradMode::is_enabled();
  if (grad && x.requires_grad()) return false;
  for (const auto& s : sources) {
    const auto bn = norm_of(s);
    if (!bn) {  // a plain convolution
      if (grad && (s.conv->weight.requires_grad() || (s.conv->bias.defined() && s.conv->bias.requires_grad())))
        return false;
      continue;
    }
    if (bn->training || !bn->mean.defined() || !bn->var.defined()) return false;
    if (grad && (s.conv->weight.requires_grad() || (bn->weight.defined() && bn->weight.requires_grad()) ||
                 (bn->bias.defined() && bn->bias.requires_grad())))
      return false;
  }
  return true;
}

void FoldedConv::stamp_of(c10::ArrayRef<FoldSource> sources, std::vector<uint64_t>& s) {
  s.clear();
  s.push_back(weights_generation.load());
  for (const auto& src : sources) {
    push_tensor(s, src.conv->weight);
    const auto bn = norm_of(src);
    if (!bn) {
      push_tensor(s, src.conv->bias);
      s.push_back(src.epoch ? *src.epoch : 0);
      continue;
    }
    push_tensor(s, bn->weight);
    push_tensor(s, bn->bias);
    push_tensor(s, bn->mean);
    push_tensor(s, bn->var);
    s.push_back(src.epoch ? *src.epoch : 0);
  }
}

bool FoldedConv::refresh(c10::ArrayRef<FoldSource> sources) {
  stamp_of(sources, scratch_);  // a buffer kept between calls: no allocation on the common path
  if (scratch_ == stamp_) return true;
  stamp_.swap(scratch_);
  if (entries_.empty()) return true;
  FoldGuard guard;
  const Computed c = compute(sources);
  for (const auto& e : entries_) {
    const int64_t in = c.weight.size(1) * std::max<int64_t>(e.dense_groups, 1);
    if (e.t.weight.size(0) != c.weight.size(0) || e.t.weight.size(1) != in ||
        e.t.weight.sizes().slice(2) != c.weight.sizes().slice(2) || e.t.weight.device() != c.weight.device()) {
      entries_.clear();
      return false;
    }
  }
  for (auto& e : entries_) {  // same storage: what captured it reads the new values
    e.t.weight.copy_(e.dense_groups > 1 ? block_diagonal(c.weight, e.dense_groups) : c.weight);
    e.t.bias.copy_(c.bias);
    e.t.bias32.copy_(c.bias);
  }
  return true;
}

const FoldedConv::Weights& FoldedConv::get(c10::ArrayRef<FoldSource> sources, at::ScalarType dtype,
                                           at::MemoryFormat fmt, int64_t dense_groups) {
  refresh(sources);
  for (const auto& e : entries_)
    if (e.dtype == dtype && e.fmt == fmt && e.dense_groups == dense_groups) return e.t;
  FoldGuard guard;
  const Computed c = compute(sources);
  const at::Tensor w = dense_groups > 1 ? block_diagonal(c.weight, dense_groups) : c.weight;
  Entry e{dtype, fmt, dense_groups, {}};
  e.t.weight = at::empty(w.sizes(), w.options().dtype(dtype).memory_format(fmt)).copy_(w);
  e.t.bias = at::empty_like(c.bias, c.bias.options().dtype(dtype)).copy_(c.bias);
  e.t.bias32 = at::empty_like(c.bias, c.bias.options().dtype(at::kFloat)).copy_(c.bias);
  entries_.push_back(std::move(e));
  return entries_.back().t;
}

void FoldedConv::clear() {
  entries_.clear();
  stamp_.clear();
}

bool FoldedLayers::refresh(torch::nn::Module& root) {
  if (root_ != &root) {
    modules_.clear();
    layers_.clear();
    if (auto* f = dynamic_cast<Foldable*>(&root)) layers_.push_back(f);
    for (auto& m : root.modules(/*include_self=*/false)) {
      if (auto* f = dynamic_cast<Foldable*>(m.get())) {
        layers_.push_back(f);
        modules_.push_back(m);
      }
    }
    root_ = &root;
  }
  bool ok = true;
  for (auto* f : layers_) ok = f->refresh_folds() && ok;
  return ok;
}

}  // namespace libreyolo::models::common
