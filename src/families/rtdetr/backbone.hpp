// PResNet-vd, RT-DETR's ResNet backbone: a three-conv stem, a 3x3/2 max pool, four stages of
// BasicBlocks (18/34) or BottleNecks (50/101); stages 1-3 (strides 8, 16, 32) are returned.
#pragma once
#include <torch/torch.h>

#include <array>
#include <vector>

#include "families/rtdetr/blocks.hpp"
#include "families/rtdetr/config.hpp"

namespace libreyolo::models::rtdetr {

// One residual block. Block 0 of a stage projects its shortcut ("short"): a 1x1 ConvNorm at
// stride 1, or (variant d, stride 2) a 2x2/2 average pool (ceil mode) then the 1x1 ConvNorm,
// registered as "short.conv". BasicBlock: relu(branch2b(branch2a(x)) + short(x)), the stride on
// branch2a. BottleNeck: branch2a 1x1, branch2b 3x3 with the stride, branch2c 1x1 to 4x width.
class ResBlockImpl : public torch::nn::Module {
 public:
  ResBlockImpl(int64_t cin, int64_t cout, int64_t stride, bool project, bool bottleneck, bool frozen);
  torch::Tensor forward(const torch::Tensor& x);

  ConvNorm branch2a{nullptr}, branch2b{nullptr}, branch2c{nullptr};
  ConvNorm short_conv{nullptr};  // the projection's ConvNorm (nullptr: identity shortcut)
  bool pool_short = false;       // average-pool before short_conv
};
TORCH_MODULE(ResBlock);

class PResNetImpl : public torch::nn::Module {
 public:
  explicit PResNetImpl(const Config& cfg);
  // Stage 1, 2, 3 outputs.
  std::array<torch::Tensor, 3> forward(const torch::Tensor& x);

  std::vector<ConvNorm> stem;                 // "conv1.conv1_1" .. "conv1.conv1_3", ReLU
  std::vector<std::vector<ResBlock>> stages;  // "res_layers.{i}.blocks.{j}"
};
TORCH_MODULE(PResNet);

}  // namespace libreyolo::models::rtdetr
