#include "families/picodet/blocks.hpp"

#include <string>

namespace libreyolo::models::picodet {

namespace {

torch::nn::Conv2d biased_1x1(int64_t cin, int64_t cout) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, 1).bias(true));
}

}  // namespace

ConvBnHsImpl::ConvBnHsImpl(int64_t cin, int64_t cout, int64_t k, int64_t s, int64_t groups, bool a) : act(a) {
  conv = register_module(
      "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, cout, k).stride(s).padding(k / 2).groups(groups).bias(false)));
  bn = register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(cout).eps(kBnEps).momentum(kBnMomentum)));
}

torch::Tensor ConvBnHsImpl::forward(const torch::Tensor& x) {
  auto y = bn->forward(conv->forward(x));
  return act ? torch::hardswish(y) : y;
}

DepthwiseSeparableImpl::DepthwiseSeparableImpl(int64_t cin, int64_t cout, int64_t k, int64_t s) {
  depthwise = register_module("depthwise_conv", ConvBnHs(cin, cin, k, s, cin));
  pointwise = register_module("pointwise_conv", ConvBnHs(cin, cout, 1));
}

torch::Tensor DepthwiseSeparableImpl::forward(const torch::Tensor& x) {
  return pointwise->forward(depthwise->forward(x));
}

torch::Tensor hard_sigmoid6(const torch::Tensor& x) { return ((x + 3.0) / 6.0).clamp(0.0, 6.0); }

SqueezeExciteImpl::SqueezeExciteImpl(int64_t channels) {
  conv1 = register_module("conv1", biased_1x1(channels, channels / 4));
  conv2 = register_module("conv2", biased_1x1(channels / 4, channels));
}

torch::Tensor SqueezeExciteImpl::forward(const torch::Tensor& x) {
  const auto pooled = x.mean({2, 3}, /*keepdim=*/true);
  return x * hard_sigmoid6(conv2->forward(torch::relu(conv1->forward(pooled))));
}

torch::Tensor channel_shuffle2(const torch::Tensor& x) {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  return x.view({b, 2, c / 2, h, w}).transpose(1, 2).contiguous().view({b, c, h, w});
}

ESBlockImpl::ESBlockImpl(int64_t cin, int64_t mid, int64_t cout) {
  conv_pw = register_module("conv_pw", ConvBnHs(cin / 2, mid / 2, 1));
  conv_dw = register_module("conv_dw", ConvBnHs(mid / 2, mid / 2, 3, 1, mid / 2, /*act=*/false));
  se = register_module("se", SqueezeExcite(mid));
  conv_linear = register_module("conv_linear", ConvBnHs(mid, cout / 2, 1));
}

torch::Tensor ESBlockImpl::forward(const torch::Tensor& x) {
  const int64_t half = x.size(1) / 2;
  const auto x1 = x.narrow(1, 0, half), x2 = x.narrow(1, half, x.size(1) - half);
  const auto pw = conv_pw->forward(x2);
  const auto y = conv_linear->forward(se->forward(torch::cat({pw, conv_dw->forward(pw)}, 1)));
  return channel_shuffle2(torch::cat({x1, y}, 1));
}

ESBlockDSImpl::ESBlockDSImpl(int64_t cin, int64_t mid, int64_t cout) {
  conv_dw_1 = register_module("conv_dw_1", ConvBnHs(cin, cin, 3, 2, cin, /*act=*/false));
  conv_linear_1 = register_module("conv_linear_1", ConvBnHs(cin, cout / 2, 1));
  conv_pw_2 = register_module("conv_pw_2", ConvBnHs(cin, mid / 2, 1));
  conv_dw_2 = register_module("conv_dw_2", ConvBnHs(mid / 2, mid / 2, 3, 2, mid / 2, /*act=*/false));
  se = register_module("se", SqueezeExcite(mid / 2));
  conv_linear_2 = register_module("conv_linear_2", ConvBnHs(mid / 2, cout / 2, 1));
  conv_dw_mv1 = register_module("conv_dw_mv1", ConvBnHs(cout, cout, 3, 1, cout));
  conv_pw_mv1 = register_module("conv_pw_mv1", ConvBnHs(cout, cout, 1));
}

torch::Tensor ESBlockDSImpl::forward(const torch::Tensor& x) {
  const auto b1 = conv_linear_1->forward(conv_dw_1->forward(x));
  const auto b2 = conv_linear_2->forward(se->forward(conv_dw_2->forward(conv_pw_2->forward(x))));
  return conv_pw_mv1->forward(conv_dw_mv1->forward(torch::cat({b1, b2}, 1)));
}

CSPLayerImpl::CSPLayerImpl(int64_t cin, int64_t cout, int64_t n) {
  const int64_t mid = cout / 2;
  main_conv = register_module("main_conv", ConvBnHs(cin, mid, 1));
  short_conv = register_module("short_conv", ConvBnHs(cin, mid, 1));
  final_conv = register_module("final_conv", ConvBnHs(2 * mid, cout, 1));
  auto list = std::make_shared<torch::nn::Module>();
  for (int64_t j = 0; j < n; ++j) {
    auto block = list->register_module(std::to_string(j), std::make_shared<torch::nn::Module>());
    auto c1 = block->register_module("conv1", ConvBnHs(mid, mid, 1));
    auto c2 = block->register_module("conv2", DepthwiseSeparable(mid, mid, 5));
    blocks.emplace_back(c1, c2);
  }
  register_module("blocks", list);
}

torch::Tensor CSPLayerImpl::forward(const torch::Tensor& x) {
  auto y = main_conv->forward(x);
  for (auto& [c1, c2] : blocks) y = c2->forward(c1->forward(y));
  return final_conv->forward(torch::cat({y, short_conv->forward(x)}, 1));
}

}  // namespace libreyolo::models::picodet
