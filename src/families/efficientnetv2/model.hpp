// EfficientNetV2-base (b0-b3) of LibreYOLO's classify family: a 3x3 stride-2 stem, six stages of
// ConvBnAct ("cn"), FusedMBConv ("er") and MBConv with squeeze-excite ("ir") blocks, SiLU, BatchNorm
// with eps 1e-3, TensorFlow "SAME" padding (a stride-2 convolution pads at run time, the extra
// pixel right and bottom), and a head of a 1x1 convolution, BatchNorm and SiLU, global pooling and
// a linear classifier. Module names are LibreYOLO's (timm's): conv_stem, bn1,
// blocks.<stage>.<block>.{conv,bn1 | conv_exp,bn1,conv_pwl,bn2 | conv_pw,bn1,conv_dw,bn2,
// se.conv_reduce,se.conv_expand,conv_pwl,bn3}, conv_head, bn2, classifier.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "models/classifier.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::efficientnetv2 {

struct BlockSpec {
  enum Kind { Cn, Er, Ir } kind = Cn;
  int64_t kernel = 3;
  int64_t stride = 1;
  int64_t mid = 0;  // er, ir: the expanded width
  int64_t se = 0;   // ir: the squeeze-excite's reduced width (0: none)
  int64_t out = 0;
  bool skip = false;  // the residual (also needs in == out and stride 1)
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
// The stride of a stage's first block (the later blocks have 1).
int64_t stage_stride(size_t stage);

class EfficientNetV2Model : public Classifier {
 public:
  EfficientNetV2Model(const Arch& arch, int nc, std::string size_name);
  torch::Tensor features(const torch::Tensor& x);
  torch::Tensor logits(const torch::Tensor& x) override;
  std::string family_name() const override { return "efficientnetv2"; }
  std::vector<std::string> freeze_groups() const override;
  const Arch& arch() const { return arch_; }

 private:
  Arch arch_;
  torch::nn::Conv2d conv_stem{nullptr}, conv_head{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  std::vector<torch::nn::Sequential> stages_;
};

Family make_family();

}  // namespace libreyolo::models::efficientnetv2
