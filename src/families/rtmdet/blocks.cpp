#include "families/rtmdet/blocks.hpp"

#include <string>

namespace libreyolo::models::rtmdet {

Conv conv_bn_act(int64_t cin, int64_t cout, int64_t k, int64_t s, int64_t groups) {
  return Conv(cin, cout, k, s, groups, /*act=*/true, kBnEps, kBnMomentum);
}

DepthwiseSeparableImpl::DepthwiseSeparableImpl(int64_t cin, int64_t cout, int64_t k) {
  depthwise = register_module("depthwise_conv", conv_bn_act(cin, cin, k, 1, cin));
  pointwise = register_module("pointwise_conv", conv_bn_act(cin, cout, 1));
}

torch::Tensor DepthwiseSeparableImpl::forward(const torch::Tensor& x, const torch::Tensor* residual) {
  ConvOutput o;
  o.residual = residual;
  return pointwise->forward(depthwise->forward(x), o);
}

CSPNeXtBlockImpl::CSPNeXtBlockImpl(int64_t cin, int64_t cout, bool add)
    : add_identity(add && cin == cout) {
  conv1 = register_module("conv1", conv_bn_act(cin, cout, 3));
  conv2 = register_module("conv2", DepthwiseSeparable(cout, cout, 5));
}

torch::Tensor CSPNeXtBlockImpl::forward(const torch::Tensor& x) {
  return conv2->forward(conv1->forward(x), add_identity ? &x : nullptr);
}

ChannelAttentionImpl::ChannelAttentionImpl(int64_t channels) {
  fc = register_module("fc", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 1).bias(true)));
}

torch::Tensor ChannelAttentionImpl::forward(const torch::Tensor& x) {
  const auto pooled = x.mean({2, 3}, /*keepdim=*/true);
  return x * torch::hardsigmoid(fc->forward(pooled));
}

CSPLayerImpl::CSPLayerImpl(int64_t cin, int64_t cout, int64_t n, bool add_identity, bool with_attention) {
  const int64_t mid = cout / 2;
  main_conv = register_module("main_conv", conv_bn_act(cin, mid, 1));
  short_conv = register_module("short_conv", conv_bn_act(cin, mid, 1));
  final_conv = register_module("final_conv", conv_bn_act(2 * mid, cout, 1));
  auto list = std::make_shared<torch::nn::Module>();
  for (int64_t j = 0; j < n; ++j)
    blocks.push_back(list->register_module(std::to_string(j), CSPNeXtBlock(mid, mid, add_identity)));
  register_module("blocks", list);
  if (with_attention) attention = register_module("attention", ChannelAttention(2 * mid));
}

torch::Tensor CSPLayerImpl::forward(const torch::Tensor& x) {
  const auto shortcut = short_conv->forward(x);
  auto y = main_conv->forward(x);
  for (auto& b : blocks) y = b->forward(y);
  auto cat = torch::cat({y, shortcut}, 1);
  if (attention) cat = attention->forward(cat);
  return final_conv->forward(cat);
}

SPPBottleneckImpl::SPPBottleneckImpl(int64_t cin, int64_t cout) {
  const int64_t mid = cin / 2;
  conv1 = register_module("conv1", conv_bn_act(cin, mid, 1));
  conv2 = register_module("conv2", conv_bn_act(4 * mid, cout, 1));
}

torch::Tensor SPPBottleneckImpl::forward(const torch::Tensor& x) {
  const auto y = conv1->forward(x);
  std::vector<torch::Tensor> parts{y};
  for (int64_t k : {5, 9, 13}) parts.push_back(torch::max_pool2d(y, {k, k}, {1, 1}, {k / 2, k / 2}));
  return conv2->forward(torch::cat(parts, 1));
}

}  // namespace libreyolo::models::rtmdet
