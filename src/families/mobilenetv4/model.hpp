// MobileNetV4, the convolutional variants (s, m, l) of LibreYOLO's classify family: a 3x3 stride-2
// stem, five stages of ConvBnAct ("cn"), EdgeResidual ("er", a fused inverted bottleneck) and
// Universal Inverted Bottleneck ("uir": optional depthwise convolutions before and between the two
// pointwise ones) blocks, ReLU throughout, and a head of global pooling, a 1x1 convolution to 1280
// with BatchNorm and ReLU, and a linear classifier. Module names are LibreYOLO's (timm's):
// conv_stem, bn1, blocks.<stage>.<block>.{conv,bn1 | conv_exp,bn1,conv_pwl,bn2 |
// dw_start,pw_exp,dw_mid,pw_proj (each .conv, .bn)}, conv_head, norm_head, classifier.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/classifier.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::mobilenetv4 {

struct BlockSpec {
  enum Kind { Cn, Er, Uir } kind = Cn;
  int64_t kernel = 3;        // cn: its kernel; er: the expansion convolution's; uir: the middle depthwise (0: none)
  int64_t start_kernel = 0;  // uir: the starting depthwise kernel (0: none)
  int64_t stride = 1;
  int64_t mid = 0;           // er, uir: the expanded width
  int64_t out = 0;
};

struct Arch {
  int64_t stem = 32;
  std::vector<std::vector<BlockSpec>> stages;
  int64_t head = 1280;
};

const std::vector<std::string>& size_names();
Arch size_arch(const std::string& size);
int size_input(const std::string& size);
double size_crop_pct(const std::string& size);
// LibreYOLO's (timm's) channel rounding: to a multiple of 8, at least 8, bumped by 8 when below 90 %.
int64_t make_divisible(double v, int64_t divisor = 8);

class MobileNetV4Model : public Classifier {
 public:
  MobileNetV4Model(const Arch& arch, int nc, std::string size_name);
  torch::Tensor features(const torch::Tensor& x);
  torch::Tensor logits(const torch::Tensor& x) override;
  std::string family_name() const override { return "mobilenetv4"; }
  std::vector<std::string> freeze_groups() const override;
  const Arch& arch() const { return arch_; }

 private:
  Arch arch_;
  torch::nn::Conv2d conv_stem{nullptr}, conv_head{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, norm_head{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  std::vector<torch::nn::Sequential> stages_;
};

Family make_family();

}  // namespace libreyolo::models::mobilenetv4
