#include "families/resnet/model.hpp"

#include <libreyolo/errors.hpp>

namespace libreyolo::models::resnet {

namespace nn = torch::nn;

namespace {

nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}

struct SizeRow {
  const char* name;
  Arch arch;
};

const std::vector<SizeRow>& size_table() {
  static const std::vector<SizeRow> rows = {
      {"18", {false, {2, 2, 2, 2}, 64}},
      {"34", {false, {3, 4, 6, 3}, 64}},
      {"50", {true, {3, 4, 6, 3}, 64}},
      {"101", {true, {3, 4, 23, 3}, 64}},
  };
  return rows;
}

}  // namespace

const std::vector<std::string>& size_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& r : size_table()) v.emplace_back(r.name);
    return v;
  }();
  return names;
}

Arch size_arch(const std::string& size) {
  for (const auto& r : size_table())
    if (size == r.name) return r.arch;
  throw UsageError("Unknown ResNet size '" + size + "' (sizes: 18, 34, 50, 101)");
}

std::string size_of(const Arch& a) {
  for (const auto& r : size_table())
    if (r.arch.bottleneck == a.bottleneck && r.arch.blocks == a.blocks && r.arch.width == a.width) return r.name;
  return "";
}

BlockImpl::BlockImpl(bool bottleneck, int64_t in, int64_t planes, int64_t stride) : bottleneck_(bottleneck) {
  const int64_t out = bottleneck ? planes * 4 : planes;
  if (bottleneck) {
    conv1 = register_module("conv1", conv(in, planes, 1, 1));
    bn1 = register_module("bn1", nn::BatchNorm2d(planes));
    conv2 = register_module("conv2", conv(planes, planes, 3, stride));
    bn2 = register_module("bn2", nn::BatchNorm2d(planes));
    conv3 = register_module("conv3", conv(planes, out, 1, 1));
    bn3 = register_module("bn3", nn::BatchNorm2d(out));
  } else {
    conv1 = register_module("conv1", conv(in, planes, 3, stride));
    bn1 = register_module("bn1", nn::BatchNorm2d(planes));
    conv2 = register_module("conv2", conv(planes, planes, 3, 1));
    bn2 = register_module("bn2", nn::BatchNorm2d(planes));
  }
  if (stride != 1 || in != out)
    downsample = register_module("downsample", nn::Sequential(conv(in, out, 1, stride), nn::BatchNorm2d(out)));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn1(conv1(x)));
  if (bottleneck_) {
    y = torch::relu(bn2(conv2(y)));
    y = bn3(conv3(y));
  } else {
    y = bn2(conv2(y));
  }
  return torch::relu(y + (downsample ? downsample->forward(x) : x));
}

ResNetModel::ResNetModel(const Arch& arch, int nc, std::string size_name)
    : Classifier("ResNet", nc, size_name.empty() ? size_of(arch) : std::move(size_name)), arch_(arch) {
  if (size_.empty()) size_ = arch.bottleneck ? "50" : "18";
  conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, arch.width, 7).stride(2).padding(3).bias(false)));
  bn1 = register_module("bn1", nn::BatchNorm2d(arch.width));
  int64_t in = arch.width;
  for (int k = 0; k < 4; ++k) {
    const int64_t planes = arch.width << k;
    nn::Sequential layer;
    for (int b = 0; b < arch.blocks[static_cast<size_t>(k)]; ++b) {
      layer->push_back(Block(arch.bottleneck, in, planes, b == 0 && k > 0 ? 2 : 1));
      in = arch.bottleneck ? planes * 4 : planes;
    }
    layers_[static_cast<size_t>(k)] = register_module("layer" + std::to_string(k + 1), layer);
  }
  num_features_ = in;
  register_head("fc", in);
}

torch::Tensor ResNetModel::features(const torch::Tensor& x) {
  auto y = torch::relu(bn1(conv1(x)));
  y = torch::max_pool2d(y, 3, 2, 1);
  for (auto& layer : layers_) y = layer->forward(y);
  return y;
}

torch::Tensor ResNetModel::logits(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != 3)
    throw UsageError("ResNet: expected an image batch [B, 3, H, W], got " + std::to_string(x.dim()) + " dims");
  return head(features(x).mean({2, 3}));
}

std::vector<std::string> ResNetModel::freeze_groups() const {
  return {"conv1.", "bn1.", "layer1.", "layer2.", "layer3.", "layer4."};
}

}  // namespace libreyolo::models::resnet
