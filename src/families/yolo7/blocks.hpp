// YOLOv7 building blocks beyond the shared Conv+BN+SiLU: the SPP block of the neck, the
// re-parameterisable 3x3 + 1x1 convolution before the head, and the head's implicit-knowledge
// detection layers. Every submodule is registered under LibreYOLO's name, so that the recursive
// parameter and buffer names equal its state-dict keys.
#pragma once
#include <torch/torch.h>

#include <array>
#include <vector>

#include "layers/conv.hpp"

namespace libreyolo::models::yolo7 {

// Conv2d(bias=false) + BatchNorm2d(eps 1e-3, momentum 0.03) + optional SiLU.
using ConvImpl = common::ConvBnActImpl;
using Conv = common::ConvBnAct;

// Anchors per cell and level.
constexpr int64_t kAnchorsPerCell = 3;

// The neck's SPP block: y = pre_conv (1x1, 3x3, 1x1 to `hidden`), then max pools of 5, 9 and 13
// applied one after the other (each on the previous pool's output, stride 1, same size),
// post_conv (1x1, 3x3) on cat[y, p5, p9, p13], short_conv (1x1) on the block's input, and
// merge_conv (1x1 to cout) on cat[post, short]. hidden = cout.
class SPPCSPConvImpl : public torch::nn::Module {
 public:
  SPPCSPConvImpl(int64_t cin, int64_t cout);
  torch::Tensor forward(const torch::Tensor& x);

  std::array<Conv, 3> pre{Conv{nullptr}, Conv{nullptr}, Conv{nullptr}};  // "pre_conv.{0,1,2}"
  Conv short_conv{nullptr};
  std::array<Conv, 2> post{Conv{nullptr}, Conv{nullptr}};  // "post_conv.{0,1}"
  Conv merge_conv{nullptr};
};
TORCH_MODULE(SPPCSPConv);

// SiLU(BN(Conv3x3(x)) + BN(Conv1x1(x))): "conv1" the 3x3 branch, "conv2" the 1x1 one, both
// without activation. Folded for inference into one 3x3 convolution (the 1x1 kernel is its
// centre tap).
class RepConvImpl : public torch::nn::Module, public common::Foldable {
 public:
  RepConvImpl(int64_t cin, int64_t cout);
  torch::Tensor forward(const torch::Tensor& x);
  bool refresh_folds() override { return fold_.refresh(fold_sources()); }

  Conv conv1{nullptr}, conv2{nullptr};

 private:
  std::array<common::FoldSource, 2> fold_sources() const { return {conv1->fold_source(), conv2->fold_source()}; }
  common::FoldedConv fold_;
};
TORCH_MODULE(RepConv);

// One learned per-channel tensor [1, C, 1, 1] registered as "implicit": added to the head's input
// (zeros at start) or multiplied into its output (ones at start).
class ImplicitImpl : public torch::nn::Module {
 public:
  ImplicitImpl(int64_t channels, double init);
  torch::Tensor implicit;
};
TORCH_MODULE(Implicit);

// One level's detection layer: implicit_m * head_conv(x + implicit_a), head_conv a 1x1 convolution
// with bias to kAnchorsPerCell * (5 + nc) channels, anchor-major: channel a * (5 + nc) + j with
// j = 0..3 the box offsets, 4 the objectness, 5.. the classes.
class IDetectionImpl : public torch::nn::Module {
 public:
  IDetectionImpl(int64_t cin, int nc);
  torch::Tensor forward(const torch::Tensor& x);
  // A new head_conv and implicit_m for nc classes (implicit_a kept), on the old ones' device and
  // dtype, with the objectness and class biases at the prior.
  void reset_num_classes(int nc);
  // Objectness and class biases of every anchor at -log((1 - p) / p); the box biases kept.
  void init_biases(double prior);

  torch::nn::Conv2d head_conv{nullptr};
  Implicit implicit_a{nullptr}, implicit_m{nullptr};
  int64_t cin;
  int nc;
};
TORCH_MODULE(IDetection);

// The three levels' detection layers: "heads.{0,1,2}".
class MultiheadDetectionImpl : public torch::nn::Module {
 public:
  MultiheadDetectionImpl(const std::array<int64_t, 3>& cin, int nc);

  std::vector<IDetection> heads;
};
TORCH_MODULE(MultiheadDetection);

}  // namespace libreyolo::models::yolo7
