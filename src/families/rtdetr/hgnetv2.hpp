// HGNetv2, the backbone of RT-DETR's l and x sizes: a stem of two strided 3x3 convolutions around
// a branch pair (2x2 convolutions | a 2x2 max pool), then four stages of HG blocks, each block a
// chain of convolutions whose outputs are concatenated with its input and squeezed back by two
// 1x1 convolutions. Stages 1-3 (strides 8, 16, 32) are returned. Built from an HgNetSpec, so
// that a narrow network of the same kinds of parts exists for tests.
#pragma once
#include <torch/torch.h>

#include <array>
#include <vector>

#include "families/rtdetr/blocks.hpp"
#include "families/rtdetr/config.hpp"

namespace libreyolo::models::rtdetr {

// Conv2d (bias=false, `groups`) + BatchNorm2d (FrozenBatchNorm2d when `frozen`) + ReLU when
// `relu`: children "conv" and "bn". Padding (k-1)/2; with `pad_after` instead one zero row and
// column after the input (right and bottom) and none in the convolution, which then sits at
// "conv.1" (the padding being the parameterless "conv.0").
class HgConvImpl : public torch::nn::Module, public common::Foldable {
 public:
  HgConvImpl(int64_t cin, int64_t cout, int64_t k, int64_t s, bool relu, bool frozen, int64_t groups = 1,
             bool pad_after = false, bool lab = false);
  torch::Tensor forward(const torch::Tensor& x);
  void train(bool on = true) override;
  bool refresh_folds() override { return fold_.refresh(conv, bn, frozen_bn); }
  bool has_fold() const { return fold_.has_fold(); }

  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  FrozenBatchNorm2d frozen_bn{nullptr};
  // With `lab` and `relu`: y * scale + bias after the ReLU (child "lab", scale 1 and bias 0 at first).
  torch::Tensor lab_scale, lab_bias;
  bool relu, pad_after;

 private:
  NormFold fold_;  // the convolution and its norm as one for inference
};
TORCH_MODULE(HgConv);

// The stem: stem1 3x3/2 (3 -> mid), then stem2a 2x2 (mid -> mid/2) and stem2b 2x2 (-> mid), both
// padded after, beside a 2x2/1 max pool of stem1's output padded after with zeros; the pool's
// output and stem2b's are concatenated (pool first) into stem3 3x3/2 (2 mid -> mid) and stem4
// 1x1 (-> out). All with ReLU.
class HgStemImpl : public torch::nn::Module {
 public:
  HgStemImpl(int64_t mid, int64_t out, bool frozen, bool lab = false, bool pad_outside = false);
  torch::Tensor forward(const torch::Tensor& x);

  HgConv stem1{nullptr}, stem2a{nullptr}, stem2b{nullptr}, stem3{nullptr}, stem4{nullptr};
  bool pad_outside;
};
TORCH_MODULE(HgStem);

// A light layer: conv1 1x1 without activation, then conv2 a depthwise k x k with ReLU.
class HgLightConvImpl : public torch::nn::Module {
 public:
  HgLightConvImpl(int64_t cin, int64_t cout, int64_t k, bool frozen, bool lab = false);
  torch::Tensor forward(const torch::Tensor& x);

  HgConv conv1{nullptr}, conv2{nullptr};
};
TORCH_MODULE(HgLightConv);

// An HG block: `layers` convolutions in a chain ("layers.{i}": k x k with ReLU, or light), the
// input and every layer's output concatenated, aggregation_squeeze_conv 1x1 to out/2 and
// aggregation_excitation_conv 1x1 to out (both ReLU), plus the input when `residual`.
class HgBlockImpl : public torch::nn::Module {
 public:
  HgBlockImpl(int64_t cin, const HgStageSpec& stage, bool residual, bool frozen, bool lab = false,
              bool dfine_names = false);
  torch::Tensor forward(const torch::Tensor& x);

  std::vector<HgConv> plain;        // the layers of a plain block
  std::vector<HgLightConv> light;   // the layers of a light block
  HgConv squeeze{nullptr}, excitation{nullptr};
  bool residual;
};
TORCH_MODULE(HgBlock);

// A stage: "downsample" (a depthwise 3x3/2 convolution without activation) when the spec says
// so, then "blocks.{j}", block 0 from the stage's input width, the others residual.
class HgStageImpl : public torch::nn::Module {
 public:
  HgStageImpl(int64_t cin, const HgStageSpec& stage, bool frozen, bool lab = false, bool dfine_names = false);
  torch::Tensor forward(const torch::Tensor& x);

  HgConv downsample{nullptr};
  std::vector<HgBlock> blocks;
};
TORCH_MODULE(HgStage);

class HGNetv2Impl : public torch::nn::Module {
 public:
  HGNetv2Impl(const HgNetSpec& spec, bool frozen_norm);
  // Stage 1, 2, 3 outputs.
  std::array<torch::Tensor, 3> forward(const torch::Tensor& x);
  // The outputs of stages `from`..3.
  std::vector<torch::Tensor> forward_from(const torch::Tensor& x, int from);
  // Convolution weights Kaiming-normal (fan in, ReLU gain), BatchNorm weight 1 and bias 0.
  void reset_parameters();

  HgStem stem{nullptr};           // "stem"
  std::vector<HgStage> stages;    // "stages.{i}"
};
TORCH_MODULE(HGNetv2);

}  // namespace libreyolo::models::rtdetr
