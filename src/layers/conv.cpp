#include "layers/conv.hpp"

#include <ATen/autocast_mode.h>

#include "layers/conv_bn_act.hpp"

namespace libreyolo::models::common {

ConvBnActImpl::ConvBnActImpl(int64_t c1, int64_t c2, int64_t k, int64_t s, int64_t groups, bool act, double eps,
                             double momentum)
    : act_(act), pointwise_(k == 1 && s == 1 && groups == 1), stride_(s), padding_((k - 1) / 2), groups_(groups) {
  conv = register_module(
      "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(c1, c2, k)
                                    .stride(s)
                                    .padding((k - 1) / 2)
                                    .groups(groups)
                                    .bias(false)));
  bn = register_module("bn",
                       torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(c2).eps(eps).momentum(momentum)));
}

void ConvBnActImpl::train(bool on) {
  fold_epoch_.note_mode(is_training(), on);
  torch::nn::Module::train(on);
}

torch::Tensor run_folded(FoldedConv& fold, c10::ArrayRef<FoldSource> sources, const torch::Tensor& x,
                         const FoldedCall& call, const ConvOutput& o) {
  const torch::Tensor& w = sources[0].conv->weight;
  const auto dtype = fold_compute_dtype(x);
  const auto fmt = fold_memory_format(x, w);
  const int64_t dense = fused_dense_groups(x, call.groups, dtype, fmt);
  const auto& f = fold.get(sources, dtype, fmt, dense);
  ConvBiasActParams p;
  p.weight = &f.weight;
  p.bias = &f.bias;
  p.bias32 = &f.bias32;
  p.stride = call.stride;
  p.padding = call.padding;
  p.groups = dense ? 1 : call.groups;
  p.pointwise = p.groups == 1 && call.stride == 1 && f.weight.size(2) == 1 && f.weight.size(3) == 1;
  p.act = call.act;
  p.output = o;
  return conv_bias_act(x, p);
}

torch::Tensor ConvBnActImpl::forward(const torch::Tensor& x, const ConvOutput& o) {
  if (!bn->is_training() && takes_fold(x))
    return run_folded(fold_, {fold_source()}, x, {stride_, padding_, groups_, act_}, o);
  // A residual alone (training): added inside the block's node.
  if (o.residual && !o.into && bn->is_training()) return forward_unfolded(x, o.residual, true, act_);
  return finish_output(forward_unfolded(x), o);
}

namespace {

// y [+ addend], then SiLU when act, [+ addend]: the addend before the activation, or after it with
// after_act. In place on y (a BatchNorm output or a fused node's: neither backward reads it) and on
// SiLU's output; SiLU itself in place only when no graph is recorded (its backward needs its input).
torch::Tensor finish_sum(torch::Tensor y, const torch::Tensor* addend, bool after_act, bool act) {
  if (addend && !after_act) y.add_(*addend);
  if (act) y = torch::GradMode::is_enabled() ? torch::silu(y) : torch::silu_(y);
  if (addend && after_act) y.add_(*addend);
  return y;
}

}  // namespace

ConvBnActParams ConvBnActImpl::training_params(bool act) {
  fold_epoch_.note_statistics_written();  // the fused kernels write them through raw pointers
  ConvBnActParams p;
  p.weight = &conv->weight;
  p.weight_cast = weight_cast_;
  p.stride = stride_;
  p.padding = padding_;
  p.groups = groups_;
  p.pointwise = pointwise_;
  p.gamma = &bn->weight;
  p.beta = &bn->bias;
  p.running_mean = &bn->running_mean;
  p.running_var = &bn->running_var;
  p.momentum = bn->options.momentum().value();
  p.eps = bn->options.eps();
  p.act = act;
  return p;
}

torch::Tensor ConvBnActImpl::forward_sum_silu(const torch::Tensor& x, const torch::Tensor& addend) {
  TORCH_CHECK(!act_, "forward_sum_silu: the block's own activation must be off");
  return forward_unfolded(x, &addend, false, true);
}

torch::Tensor ConvBnActImpl::forward_unfolded(const torch::Tensor& x, const torch::Tensor* addend, bool after_act,
                                              bool act) {
  if (bn->is_training()) {
    // Training with autograd: one fused node (layers/conv_bn_act.hpp).
    // The addend inside the node unless switched off (then added by finish_sum below).
    const bool inside = addend && fused_addend();
    ConvBnActParams p = training_params(act && (inside || !addend || after_act));
    p.addend = inside ? addend : nullptr;
    p.addend_after_act = after_act;
    if (conv_bn_act_applicable(x, p)) {
      torch::Tensor y = conv_bn_act_train(x, p);
      return inside ? y : finish_sum(y, addend, after_act, act && !p.act);
    }
  }
  torch::Tensor y;
  if (pointwise_ && conv1x1_gemm_applies(x)) {
    y = conv1x1_gemm(x, conv->weight);  // the host-cheap form of a 1x1 convolution
  } else {
    y = conv->forward(x);
  }
  y = torch::batch_norm(y, bn->weight, bn->bias, bn->running_mean, bn->running_var, bn->is_training(),
                        bn->options.momentum().value(), bn->options.eps(),
                        at::globalContext().userEnabledCuDNN());
  return finish_sum(y, addend, after_act, act);
}

BatchedLayerState::Scope::~Scope() {
  if (s_)
    for (auto* c : s_->convs_) c->set_weight_cast(nullptr);
}

void BatchedLayerState::reset() {
  bn_counters_.clear();
  convs_.clear();
  cast_src_.clear();
  cast_dst_.clear();
}

void BatchedLayerState::advance_bn_counters() {
  if (bn_counters_.empty())
    for (const auto& m : root_.modules(/*include_self=*/false))
      if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(m.get())) bn_counters_.emplace_back(m, bn->num_batches_tracked);
  std::vector<torch::Tensor> live;
  live.reserve(bn_counters_.size());
  for (const auto& [m, counter] : bn_counters_)
    if (m->is_training()) live.push_back(counter);
  if (!live.empty()) {
    torch::NoGradGuard ng;
    at::_foreach_add_(live, 1);
  }
}

BatchedLayerState::Scope BatchedLayerState::prepare_weight_casts(const torch::Tensor& x) {
  const auto dev = x.device().type();
  if (!fused_conv_training() || !at::autocast::is_autocast_enabled(dev)) return Scope(nullptr);
  const auto dtype = at::autocast::get_autocast_dtype(dev);
  if (convs_.empty()) {
    for (const auto& m : root_.modules(/*include_self=*/false))
      if (auto* c = dynamic_cast<ConvBnActImpl*>(m.get())) convs_.push_back(c);
  }
  bool stale = cast_src_.size() != convs_.size();
  for (size_t i = 0; !stale && i < convs_.size(); ++i) {
    const auto& w = convs_[i]->conv->weight;
    stale = !cast_src_[i].is_same(w) || cast_src_[i].data_ptr() != w.data_ptr() ||
            cast_dst_[i].scalar_type() != dtype || cast_dst_[i].device() != w.device() ||
            cast_dst_[i].strides() != w.strides();
  }
  if (stale) {
    cast_src_.clear();
    cast_dst_.clear();
    for (auto* c : convs_) {
      cast_src_.push_back(c->conv->weight);
      cast_dst_.push_back(at::empty_like(c->conv->weight, c->conv->weight.options().dtype(dtype)));
    }
  }
  if (convs_.empty() || cast_src_[0].device().type() != dev) return Scope(nullptr);
  {
    torch::NoGradGuard ng;
    at::_foreach_copy_(cast_dst_, cast_src_);
  }
  for (size_t i = 0; i < convs_.size(); ++i) convs_[i]->set_weight_cast(&cast_dst_[i]);
  return Scope(this);
}

}  // namespace libreyolo::models::common
