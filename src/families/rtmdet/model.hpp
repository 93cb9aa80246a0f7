// RTMDet detect model (sizes t, s, m, l, x) with LibreYOLO's parameter names: "backbone" (CSPNeXt:
// a three-convolution stem and four stages, the last with an SPP block), "neck" (a PAFPN of CSP
// layers) and "head" (separate class and box towers per level whose convolutions are shared by
// the three levels, each level with its own BatchNorms). Every width and depth is read from the
// Arch below, so a network of other widths of the same graph is built from weights alone.
#pragma once
#include <torch/torch.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "families/rtmdet/blocks.hpp"
#include "layers/level_cache.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::rtmdet {

constexpr std::array<int64_t, 3> kStrides{8, 16, 32};
// Convolutions per tower of the head.
constexpr int kStackedConvs = 2;

// The shape of a network: the stem's first and last widths, each stage's output width and
// CSPNeXt block count, the neck's CSP block count and the neck/head width, and whether the head's
// box distances go through exp (m, l, x) or not (t, s).
struct Arch {
  int64_t stem = 0;       // stem.0 and stem.1 output channels
  int64_t stem_out = 0;   // stem.2 output channels (stage 1's input)
  std::array<int64_t, 4> stage{};   // stage i output channels
  std::array<int64_t, 4> blocks{};  // CSPNeXt blocks in stage i
  int64_t neck_blocks = 0;          // CSPNeXt blocks in each neck CSP layer
  int64_t width = 0;                // neck output and head width
  bool exp_on_reg = false;
  bool operator==(const Arch& o) const;
};

const std::vector<std::string>& size_names();  // {"t", "s", "m", "l", "x"}
// A size's network (LibreYOLO's size table). Throws UsageError for an unknown size.
Arch size_arch(const std::string& size);
// The size whose stem starts with `stem` channels (12 t, 16 s, 24 m, 32 l, 40 x), if any.
std::optional<std::string> size_of_stem(int64_t stem);

// The head: per level l, "cls_convs.l.{0,1}" and "reg_convs.l.{0,1}" (3x3 Conv+BN+SiLU), whose
// convolutions for l = 1, 2 are level 0's modules (so the state dict names them three times, as
// LibreYOLO's does), then "rtm_cls.l" (1x1 to nc, bias) and "rtm_reg.l" (1x1 to 4, bias).
class HeadImpl : public torch::nn::Module {
 public:
  HeadImpl(int64_t width, int nc, bool exp_on_reg);
  // Level l's map [B, 4 + nc, H, W]: rows 0-3 the (l, t, r, b) distances in input pixels
  // (exp(reg) * stride with exp_on_reg, else reg * stride), then the class logits.
  torch::Tensor forward_level(const torch::Tensor& x, size_t level);
  void reset_num_classes(int nc);
  // LibreYOLO's initialisation of a fresh head: every convolution weight ~ N(0, 0.01), its biases
  // 0, BatchNorm weights 1 and biases 0, rtm_cls biases at the 0.01 prior (-ln 99).
  void init_weights();

  std::vector<std::vector<Conv>> cls_convs, reg_convs;  // [level][position]
  std::vector<torch::nn::Conv2d> rtm_cls, rtm_reg;      // [level]
  int64_t width;
  int nc;
  bool exp_on_reg;

 private:
  std::shared_ptr<torch::nn::Module> cls_list_;  // "rtm_cls"
};
TORCH_MODULE(Head);

class RTMDetModel : public Detector {
 public:
  RTMDetModel(const Arch& arch, int nc);

  // Per level (strides 8, 16, 32) [B, 4 + nc, H/s, W/s]: the head's pixel distances then class
  // logits (HeadImpl::forward_level), in train and eval mode alike.
  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override;
  // [B, 4 + nc, A], A = H/8 W/8 + H/16 W/16 + H/32 W/32, level-major then row-major: with the
  // prior at the cell's corner (x s, y s), x1 = px - l, y1 = py - t, x2 = px + r, y2 = py + b in
  // input pixels, then the sigmoid of every class logit.
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override;

  std::string family_name() const override { return "rtmdet"; }
  // The size whose table equals this network's; another shape takes the name of the size its
  // stem width says, else "t" (m with exp_on_reg).
  std::string size() const override;
  int num_classes() const override { return head_->nc; }
  std::vector<int64_t> strides() const override { return {kStrides.begin(), kStrides.end()}; }
  void reset_num_classes(int nc) override;
  std::vector<std::string> freeze_groups() const override { return {"backbone", "neck", "head"}; }

  const Arch& arch() const { return arch_; }
  HeadImpl& head() { return *head_; }

 private:
  void check_input(const torch::Tensor& x) const;
  std::vector<torch::Tensor> run(const torch::Tensor& x);

  Arch arch_;
  // backbone
  std::array<Conv, 3> stem_{Conv{nullptr}, Conv{nullptr}, Conv{nullptr}};
  std::array<Conv, 4> down_{Conv{nullptr}, Conv{nullptr}, Conv{nullptr}, Conv{nullptr}};  // "stage{i}.0"
  SPPBottleneck spp_{nullptr};                                                          // "stage4.1"
  std::array<CSPLayer, 4> stage_csp_{CSPLayer{nullptr}, CSPLayer{nullptr}, CSPLayer{nullptr}, CSPLayer{nullptr}};
  // neck
  std::array<Conv, 2> reduce_{Conv{nullptr}, Conv{nullptr}};
  std::array<CSPLayer, 2> top_down_{CSPLayer{nullptr}, CSPLayer{nullptr}};
  std::array<Conv, 2> downsample_{Conv{nullptr}, Conv{nullptr}};
  std::array<CSPLayer, 2> bottom_up_{CSPLayer{nullptr}, CSPLayer{nullptr}};
  std::array<Conv, 3> out_convs_{Conv{nullptr}, Conv{nullptr}, Conv{nullptr}};
  Head head_{nullptr};
  common::BatchedLayerState batched_{*this};
  LevelCache<torch::Tensor> priors_;  // [2, A] (x, y) of each prediction's corner, float32
};

// The registry entry (src/families/registry.cpp lists it).
Family make_family();

}  // namespace libreyolo::models::rtmdet
