// PP-PicoDet detect model (sizes s, m, l) with LibreYOLO's parameter names: "backbone" (ESNet: a
// 3x3 stride-2 stem, a max pool and 13 ES blocks in stages of 3, 7 and 3), "neck" (CSP-PAN with
// a fourth, stride-64 level) and "head" (PicoHead: per level its own tower of depthwise-separable
// convolutions and one 1x1 convolution giving nc class logits and 4 x 8 box-distribution
// logits). Every width is read from the Arch below, so a network of other widths of the same graph
// is built from weights alone.
#pragma once
#include <torch/torch.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "families/picodet/blocks.hpp"
#include "layers/level_cache.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::picodet {

constexpr std::array<int64_t, 4> kStrides{8, 16, 32, 64};
constexpr int64_t kRegMax = 7;                   // distance bins 0..7 per side
constexpr int64_t kBoxChannels = 4 * (kRegMax + 1);  // side-major: channel 8 side + bin
constexpr int64_t kStemChannels = 24;
constexpr int kBlocks = 13;  // ES blocks; 0, 3 and 10 are the stride-2 ones

// The shape of a network: the three stage widths, each ES block's middle width (the width its
// squeeze-and-excite sees, twice the first pointwise convolution's output), the neck and head
// width and the depthwise-separable convolutions per head tower.
struct Arch {
  std::array<int64_t, 3> stage{};
  std::array<int64_t, kBlocks> mid{};
  int64_t width = 0;
  int64_t stacked_convs = 0;
  bool operator==(const Arch& o) const;
};

const std::vector<std::string>& size_names();  // {"s", "m", "l"}
// A size's network (LibreYOLO's size table). Throws UsageError for an unknown size.
Arch size_arch(const std::string& size);
// The size whose neck is `width` channels wide (96 s, 128 m, 160 l), if any.
std::optional<std::string> size_of_width(int64_t width);
// The input side a size is used at: 320 s, 416 m, 640 l.
int size_input(const std::string& size);
// Whether a stride-2 ES block sits at `block`.
bool is_downsample_block(int block);

class PicoDetModel : public Detector {
 public:
  PicoDetModel(const Arch& arch, int nc);

  // Per level (strides 8, 16, 32, 64) the head's map [B, nc + 32, H, W]: nc class logits, then the
  // box-distribution logits (channel nc + 8 side + bin, sides l, t, r, b), in train and eval mode
  // alike. Any input size: a level whose doubled top-down map does not fit the one below is
  // resized to it (nearest), as LibreYOLO does.
  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override;
  // [B, 4 + nc, A], level-major then row-major: with the prior at the cell's centre
  // ((x + 0.5) s, (y + 0.5) s) and each side's distance the expectation of its 8-bin softmax times
  // the stride, x1 = cx - l, y1 = cy - t, x2 = cx + r, y2 = cy + b in input pixels, then the
  // sigmoid of every class logit.
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override;

  std::string family_name() const override { return "picodet"; }
  // The size whose table equals this network's; another shape takes the name of the size its neck
  // width says, else "s".
  std::string size() const override;
  int num_classes() const override { return nc_; }
  std::vector<int64_t> strides() const override { return {kStrides.begin(), kStrides.end()}; }
  // A new class count replaces every level's gfl_cls, box outputs included (they are one
  // convolution), initialised as a fresh head's.
  void reset_num_classes(int nc) override;
  std::vector<std::string> freeze_groups() const override { return {"backbone", "neck", "head"}; }

  const Arch& arch() const { return arch_; }
  std::vector<torch::nn::Conv2d>& gfl_cls() { return gfl_cls_; }
  // LibreYOLO's initialisation: backbone and neck convolutions Kaiming-normal (fan out, ReLU
  // gain), the head's N(0, 0.01), biases 0, BatchNorms 1 and 0, and the class part of each
  // gfl_cls bias at the 0.01 prior (-ln 99).
  void init_weights();

 private:
  std::vector<torch::Tensor> neck_forward(const std::array<torch::Tensor, 3>& c);

  Arch arch_;
  int nc_;
  // backbone
  ConvBnHs stem_{nullptr};
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;  // ESBlockDS or ESBlock
  // neck
  std::array<ConvBnHs, 3> trans_{ConvBnHs{nullptr}, ConvBnHs{nullptr}, ConvBnHs{nullptr}};
  DepthwiseSeparable first_top_{nullptr}, second_top_{nullptr};
  std::array<CSPLayer, 2> top_down_{CSPLayer{nullptr}, CSPLayer{nullptr}};
  std::array<DepthwiseSeparable, 2> downsample_{DepthwiseSeparable{nullptr}, DepthwiseSeparable{nullptr}};
  std::array<CSPLayer, 2> bottom_up_{CSPLayer{nullptr}, CSPLayer{nullptr}};
  // head
  std::vector<std::vector<DepthwiseSeparable>> cls_convs_;  // [level][position]
  std::vector<torch::nn::Conv2d> gfl_cls_;                  // [level]
  std::shared_ptr<torch::nn::Module> gfl_cls_list_;
  LevelCache<torch::Tensor> priors_;  // [3, A] (cx, cy, stride) float32
};

// The registry entry (src/families/registry.cpp lists it).
Family make_family();

}  // namespace libreyolo::models::picodet
