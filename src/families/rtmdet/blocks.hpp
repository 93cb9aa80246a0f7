// RTMDet building blocks (CSPNeXt): the depthwise-separable convolution, the CSPNeXt bottleneck,
// the squeeze-and-excite channel attention, the CSP layer and the parallel-pool SPP block. Every
// submodule is registered under LibreYOLO's name, so that the recursive parameter and buffer
// names equal its state-dict keys. BatchNorm everywhere with PyTorch's defaults (eps 1e-5,
// momentum 0.1), unlike the YOLO families' 1e-3 / 0.03.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "layers/conv.hpp"

namespace libreyolo::models::rtmdet {

constexpr double kBnEps = 1e-5;
constexpr double kBnMomentum = 0.1;

using Conv = common::ConvBnAct;

// Conv2d(bias=false, padding k/2) + BatchNorm2d(1e-5, 0.1) + SiLU.
Conv conv_bn_act(int64_t cin, int64_t cout, int64_t k, int64_t s = 1, int64_t groups = 1);

// "depthwise_conv" (k x k, one group per channel) then "pointwise_conv" (1x1 to cout), both with
// BatchNorm and SiLU.
class DepthwiseSeparableImpl : public torch::nn::Module {
 public:
  DepthwiseSeparableImpl(int64_t cin, int64_t cout, int64_t k);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor* residual = nullptr);

  Conv depthwise{nullptr}, pointwise{nullptr};
};
TORCH_MODULE(DepthwiseSeparable);

// conv2(conv1(x)) [+ x]: "conv1" a 3x3, "conv2" a 5x5 depthwise-separable one; the identity is
// added when asked and the widths agree.
class CSPNeXtBlockImpl : public torch::nn::Module {
 public:
  CSPNeXtBlockImpl(int64_t cin, int64_t cout, bool add_identity);
  torch::Tensor forward(const torch::Tensor& x);

  Conv conv1{nullptr};
  DepthwiseSeparable conv2{nullptr};
  bool add_identity;
};
TORCH_MODULE(CSPNeXtBlock);

// x * hardsigmoid(fc(mean over H, W of x)), "fc" a 1x1 convolution with bias.
class ChannelAttentionImpl : public torch::nn::Module {
 public:
  explicit ChannelAttentionImpl(int64_t channels);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d fc{nullptr};
};
TORCH_MODULE(ChannelAttention);

// Cross-stage-partial layer: mid = cout / 2; "main_conv" and "short_conv" 1x1 cin -> mid,
// "blocks" n CSPNeXt blocks (mid -> mid) on the main branch, cat[main, short], optionally
// "attention" on that concatenation, then "final_conv" 1x1 2 mid -> cout.
class CSPLayerImpl : public torch::nn::Module {
 public:
  CSPLayerImpl(int64_t cin, int64_t cout, int64_t n, bool add_identity, bool attention);
  torch::Tensor forward(const torch::Tensor& x);

  Conv main_conv{nullptr}, short_conv{nullptr}, final_conv{nullptr};
  std::vector<CSPNeXtBlock> blocks;
  ChannelAttention attention{nullptr};  // null without channel attention
};
TORCH_MODULE(CSPLayer);

// "conv1" 1x1 c -> c/2, max pools 5, 9 and 13 (stride 1, same size) each on conv1's output,
// "conv2" 1x1 on cat[y, p5, p9, p13] (2c) -> cout.
class SPPBottleneckImpl : public torch::nn::Module {
 public:
  SPPBottleneckImpl(int64_t cin, int64_t cout);
  torch::Tensor forward(const torch::Tensor& x);

  Conv conv1{nullptr}, conv2{nullptr};
};
TORCH_MODULE(SPPBottleneck);

}  // namespace libreyolo::models::rtmdet
