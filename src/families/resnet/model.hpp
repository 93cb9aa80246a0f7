// ResNet (v1.5: a bottleneck's stride on its 3x3 convolution; the plain 7x7 stem), LibreYOLO's
// classify family of sizes 18, 34, 50 and 101. Module names are LibreYOLO's (and timm's):
// conv1/bn1, layer1..layer4 of blocks "<i>" with conv1..conv3/bn1..bn3 and downsample.{0,1}, fc.
#pragma once
#include <torch/torch.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "models/classifier.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::resnet {

struct Arch {
  bool bottleneck = false;            // Bottleneck (expansion 4) or BasicBlock (expansion 1)
  std::array<int, 4> blocks{2, 2, 2, 2};
  int64_t width = 64;                 // the stem's channels and layer1's planes (layer k: width * 2^(k-1))
};

const std::vector<std::string>& size_names();
// The architecture of a size name (UsageError when unknown).
Arch size_arch(const std::string& size);

// One residual block: BasicBlock (conv1 3x3 stride s, conv2 3x3) or Bottleneck (conv1 1x1, conv2
// 3x3 stride s, conv3 1x1 to 4x planes); ReLU after each BatchNorm but the last, then after the sum.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(bool bottleneck, int64_t in, int64_t planes, int64_t stride);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  bool bottleneck_;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(Block);

class ResNetModel : public Classifier {
 public:
  ResNetModel(const Arch& arch, int nc, std::string size_name = "");

  torch::Tensor features(const torch::Tensor& x);  // [B, C, H/32, W/32]
  torch::Tensor logits(const torch::Tensor& x) override;

  std::string family_name() const override { return "resnet"; }
  std::vector<std::string> freeze_groups() const override;
  const Arch& arch() const { return arch_; }
  int64_t num_features() const { return num_features_; }

 private:
  Arch arch_;
  int64_t num_features_;
  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  std::array<torch::nn::Sequential, 4> layers_;
};

// The size whose architecture equals `a` (block kind, counts and width 64), or "".
std::string size_of(const Arch& a);

}  // namespace libreyolo::models::resnet

namespace libreyolo::models::resnet {
Family make_family();
}  // namespace libreyolo::models::resnet
