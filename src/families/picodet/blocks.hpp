// PicoDet building blocks (ESNet, CSP-PAN, the PicoHead towers). Every submodule is registered
// under LibreYOLO's name, so that the recursive parameter and buffer names equal its state-dict
// keys. BatchNorm with PyTorch's defaults (eps 1e-5, momentum 0.1); the activations are
// Hardswish, the squeeze-and-excite gate a ReLU and a hard sigmoid clipped to [0, 6] (not [0, 1]:
// PicoDet's configuration, whose weights expect it).
#pragma once
#include <torch/torch.h>

#include <vector>

namespace libreyolo::models::picodet {

constexpr double kBnEps = 1e-5;
constexpr double kBnMomentum = 0.1;

// "conv" Conv2d(bias=false, padding k/2) + "bn" BatchNorm2d, then Hardswish when `act`.
class ConvBnHsImpl : public torch::nn::Module {
 public:
  ConvBnHsImpl(int64_t cin, int64_t cout, int64_t k, int64_t s = 1, int64_t groups = 1, bool act = true);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  bool act;
};
TORCH_MODULE(ConvBnHs);

// "depthwise_conv" (k x k, stride s, one group per channel) then "pointwise_conv" (1x1 to
// cout), both with BatchNorm and Hardswish.
class DepthwiseSeparableImpl : public torch::nn::Module {
 public:
  DepthwiseSeparableImpl(int64_t cin, int64_t cout, int64_t k, int64_t s = 1);
  torch::Tensor forward(const torch::Tensor& x);

  ConvBnHs depthwise{nullptr}, pointwise{nullptr};
};
TORCH_MODULE(DepthwiseSeparable);

// clamp((x + 3) / 6, 0, 6): the squeeze-and-excite gate.
torch::Tensor hard_sigmoid6(const torch::Tensor& x);

// x * hard_sigmoid6(conv2(relu(conv1(mean over H, W of x)))): "conv1" 1x1 c -> c/4 and "conv2"
// 1x1 c/4 -> c, both with bias.
class SqueezeExciteImpl : public torch::nn::Module {
 public:
  explicit SqueezeExciteImpl(int64_t channels);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
};
TORCH_MODULE(SqueezeExcite);

// Channel shuffle of two groups: channel g * (C/2) + i goes to 2 i + g.
torch::Tensor channel_shuffle2(const torch::Tensor& x);

// ESNet's stride-1 block on cin = cout channels: the input's halves (x1, x2); x2 through
// "conv_pw" (1x1 cin/2 -> mid/2, Hardswish), "conv_dw" (3x3 depthwise, no activation), "se" on
// cat[pw, dw] (mid channels), "conv_linear" (1x1 mid -> cout/2, Hardswish); out = shuffle(cat[x1, that]).
class ESBlockImpl : public torch::nn::Module {
 public:
  ESBlockImpl(int64_t cin, int64_t mid, int64_t cout);
  torch::Tensor forward(const torch::Tensor& x);

  ConvBnHs conv_pw{nullptr}, conv_dw{nullptr}, conv_linear{nullptr};
  SqueezeExcite se{nullptr};
};
TORCH_MODULE(ESBlock);

// ESNet's stride-2 block: branch 1 "conv_dw_1" (3x3 s2 depthwise, no activation) then
// "conv_linear_1" (1x1 cin -> cout/2); branch 2 "conv_pw_2" (1x1 cin -> mid/2), "conv_dw_2" (3x3 s2
// depthwise, no activation), "se" (mid/2), "conv_linear_2" (1x1 mid/2 -> cout/2); on cat[b1, b2]
// "conv_dw_mv1" (3x3 depthwise) and "conv_pw_mv1" (1x1), Hardswish where not said otherwise.
class ESBlockDSImpl : public torch::nn::Module {
 public:
  ESBlockDSImpl(int64_t cin, int64_t mid, int64_t cout);
  torch::Tensor forward(const torch::Tensor& x);

  ConvBnHs conv_dw_1{nullptr}, conv_linear_1{nullptr}, conv_pw_2{nullptr}, conv_dw_2{nullptr},
      conv_linear_2{nullptr}, conv_dw_mv1{nullptr}, conv_pw_mv1{nullptr};
  SqueezeExcite se{nullptr};
};
TORCH_MODULE(ESBlockDS);

// CSP-PAN's cross-stage-partial layer: mid = cout / 2; "main_conv" and "short_conv" 1x1
// cin -> mid; "blocks" n bottlenecks on the main branch, each "conv1" 1x1 mid -> mid then "conv2" a
// 5x5 depthwise-separable convolution (no identity); "final_conv" 1x1 on cat[main, short].
class CSPLayerImpl : public torch::nn::Module {
 public:
  CSPLayerImpl(int64_t cin, int64_t cout, int64_t n);
  torch::Tensor forward(const torch::Tensor& x);

  ConvBnHs main_conv{nullptr}, short_conv{nullptr}, final_conv{nullptr};
  std::vector<std::pair<ConvBnHs, DepthwiseSeparable>> blocks;  // (conv1, conv2)
};
TORCH_MODULE(CSPLayer);

}  // namespace libreyolo::models::picodet
