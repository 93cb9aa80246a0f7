#include "families/rtdetr/blocks.hpp"

#include "layers/conv_bn_act.hpp"

#include <cmath>
#include <variant>
#include <limits>

namespace libreyolo::models::rtdetr {

torch::Tensor activate(const torch::Tensor& x, Act act) {
  switch (act) {
    case Act::ReLU:
      return torch::relu(x);
    case Act::SiLU:
      return torch::silu(x);
    case Act::None:
      break;
  }
  return x;
}

std::shared_ptr<torch::nn::Module> container() { return std::make_shared<torch::nn::Module>(); }

FrozenBatchNorm2dImpl::FrozenBatchNorm2dImpl(int64_t c, double eps_) : eps(eps_) {
  weight = register_buffer("weight", torch::ones({c}));
  bias = register_buffer("bias", torch::zeros({c}));
  running_mean = register_buffer("running_mean", torch::zeros({c}));
  running_var = register_buffer("running_var", torch::ones({c}));
}

torch::Tensor FrozenBatchNorm2dImpl::forward(const torch::Tensor& x) {
  const auto scale = weight * (running_var + eps).rsqrt();
  const auto shift = bias - running_mean * scale;
  return x * scale.reshape({1, -1, 1, 1}) + shift.reshape({1, -1, 1, 1});
}

ConvNormImpl::ConvNormImpl(int64_t cin, int64_t cout, int64_t k, int64_t s, Act act_, bool frozen, int64_t groups)
    : act(act_) {
  conv = register_module("conv", torch::nn::Conv2d(
                                     torch::nn::Conv2dOptions(cin, cout, k).stride(s).padding((k - 1) / 2).groups(groups).bias(false)));
  if (frozen) {
    frozen_norm = register_module("norm", FrozenBatchNorm2d(cout));
  } else {
    norm = register_module("norm", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(cout).eps(1e-5).momentum(0.1)));
  }
}

common::FoldSource NormFold::source(const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn,
                                    const FrozenBatchNorm2d& frozen) {
  common::FoldSource s;
  s.conv = conv.get();
  s.epoch = epoch_.get();
  if (bn) {
    s.bn = bn.get();
  } else {
    frozen_ = {&frozen->weight, &frozen->bias, &frozen->running_mean, &frozen->running_var, frozen->eps};
    s.norm = &frozen_;
  }
  return s;
}

torch::Tensor NormFold::forward(const torch::Tensor& x, const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn,
                                const FrozenBatchNorm2d& frozen, Act act, bool training) {
  if (auto y = folded(x, conv, bn, frozen, act); y.defined()) return y;
  if (training) note_statistics_written();
  // (The holders are const here, the modules they hold are not.)
  auto y = conv.ptr()->forward(x);
  return activate(bn ? bn.ptr()->forward(y) : frozen.ptr()->forward(y), act);
}

torch::Tensor NormFold::folded(const torch::Tensor& x, const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn,
                               const FrozenBatchNorm2d& frozen, Act act) {
  const common::FoldSource src = source(conv, bn, frozen);
  if (!common::fold_allowed(x, {src})) return {};
  const auto& o = conv->options;
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  if (!padding || (*padding)->at(0) != (*padding)->at(1) || o.stride()->at(0) != o.stride()->at(1) ||
      o.dilation()->at(0) != 1 || o.dilation()->at(1) != 1)
    return {};
  const auto& w = fold_.get({src}, common::fold_compute_dtype(x), common::fold_memory_format(x, conv->weight));
  ConvBiasActParams p;
  p.weight = &w.weight;
  p.bias = &w.bias;
  p.bias32 = &w.bias32;
  p.stride = o.stride()->at(0);
  p.padding = (*padding)->at(0);
  p.groups = o.groups();
  p.pointwise = o.kernel_size()->at(0) == 1 && o.kernel_size()->at(1) == 1 && p.stride == 1 && p.groups == 1;
  p.act = act == Act::SiLU;
  auto y = conv_bias_act(x, p);
  return act == Act::ReLU ? y.relu_() : y;
}

bool NormFold::refresh(const torch::nn::Conv2d& conv, const torch::nn::BatchNorm2d& bn, const FrozenBatchNorm2d& frozen) {
  return fold_.refresh({source(conv, bn, frozen)});
}

torch::Tensor ConvNormImpl::forward(const torch::Tensor& x) {
  return fold_.forward(x, conv, norm, frozen_norm, act, is_training());
}

void ConvNormImpl::train(bool on) {
  fold_.note_mode(is_training(), on);
  torch::nn::Module::train(on);
}

MlpImpl::MlpImpl(int64_t in, int64_t hidden, int64_t out, int n, bool silu_) : silu(silu_) {
  auto list = container();
  for (int i = 0; i < n; ++i) {
    const int64_t a = i == 0 ? in : hidden, b = i == n - 1 ? out : hidden;
    layers.emplace_back(a, b);
    list->register_module(std::to_string(i), layers.back());
  }
  register_module("layers", list);
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto y = x;
  for (size_t i = 0; i < layers.size(); ++i) {
    y = layers[i]->forward(y);
    if (i + 1 < layers.size()) y = silu ? torch::silu(y) : torch::relu(y);
  }
  return y;
}

MultiheadAttentionImpl::MultiheadAttentionImpl(int64_t embed_, int64_t heads_) : embed(embed_), heads(heads_) {
  TORCH_CHECK(embed % heads == 0, "attention width ", embed, " is not a multiple of the head count ", heads);
  in_proj_weight = register_parameter("in_proj_weight", torch::empty({3 * embed, embed}));
  in_proj_bias = register_parameter("in_proj_bias", torch::empty({3 * embed}));
  out_proj = register_module("out_proj", torch::nn::Linear(embed, embed));
  reset_parameters();
}

void MultiheadAttentionImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  torch::nn::init::xavier_uniform_(in_proj_weight);
  in_proj_bias.zero_();
  out_proj->bias.zero_();
}

torch::Tensor MultiheadAttentionImpl::forward(const torch::Tensor& query, const torch::Tensor& key,
                                              const torch::Tensor& value, const torch::Tensor& mask) {
  const int64_t b = query.size(0), lq = query.size(1), lk = key.size(1), d = embed / heads;
  const auto w = in_proj_weight.chunk(3, 0);
  const auto bias = in_proj_bias.chunk(3, 0);
  // [B, L, C] -> [B, heads, L, d]
  auto split = [&](const torch::Tensor& t, int64_t len) { return t.reshape({b, len, heads, d}).transpose(1, 2); };
  const auto q = split(torch::nn::functional::linear(query, w[0], bias[0]), lq);
  const auto k = split(torch::nn::functional::linear(key, w[1], bias[1]), lk);
  const auto v = split(torch::nn::functional::linear(value, w[2], bias[2]), lk);
  // PyTorch's order: the query scaled first, then the product.
  auto scores = torch::matmul(q * (1.0 / std::sqrt(static_cast<double>(d))), k.transpose(-2, -1));
  if (mask.defined()) scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  const auto out = torch::matmul(torch::softmax(scores, -1), v);  // [B, heads, Lq, d]
  return out_proj->forward(out.transpose(1, 2).reshape({b, lq, embed}));
}

torch::Tensor inverse_sigmoid(const torch::Tensor& x, double eps) {
  const auto c = x.clamp(0.0, 1.0);
  return torch::log(c.clamp_min(eps) / (1 - c).clamp_min(eps));
}

double bias_with_prior(double p) { return -std::log((1.0 - p) / p); }

}  // namespace libreyolo::models::rtdetr
