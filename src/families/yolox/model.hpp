// YOLOX detect model (n/t/s/m/l/x) with LibreYOLO's (= Megvii YOLOX's) parameter names. Every
// submodule is registered under the name the reference gives it, so that the recursive
// parameter/buffer names equal its state_dict keys.
#pragma once
#include <torch/torch.h>

#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "layers/conv.hpp"
#include "layers/level_cache.hpp"
#include "models/detector.hpp"

namespace libreyolo::models::yolox {

using BaseConv = common::ConvBnAct;

// Per-size multipliers (LibreYOLOXModel.CONFIGS).
struct SizeConfig {
  const char* size;
  double depth, width;
  bool depthwise;
  int default_imgsz;  // the reference's inference size

  int64_t base_channels() const { return static_cast<int64_t>(64 * width); }  // c
  int64_t base_depth() const;                                               // d = max(round(3 depth), 1)
  int64_t neck_depth() const;                                               // dn = round(3 depth)
  int64_t head_width() const { return static_cast<int64_t>(256 * width); }
};

const std::vector<std::string>& size_names();  // {"n","t","s","m","l","x"}
// Throws UsageError for an unknown size.
const SizeConfig& size_config(const std::string& size);

// Depthwise 3x3 (groups = cin) then pointwise 1x1, both Conv+BN+SiLU: children "dconv", "pconv".
class DWConvImpl : public torch::nn::Module {
 public:
  DWConvImpl(int64_t cin, int64_t cout, int64_t k, int64_t s);
  torch::Tensor forward(const torch::Tensor& x) { return pconv->forward(dconv->forward(x)); }

  BaseConv dconv{nullptr}, pconv{nullptr};
};
TORCH_MODULE(DWConv);

// A slot that holds a BaseConv, or a DWConv for the depthwise (n) model, under one name.
struct AnyConv {
  BaseConv base{nullptr};
  DWConv dw{nullptr};
  torch::Tensor operator()(const torch::Tensor& x) { return base ? base->forward(x) : dw->forward(x); }
};
AnyConv register_conv(torch::nn::Module& parent, const std::string& name, int64_t cin, int64_t cout, int64_t k,
                      int64_t s, bool depthwise);

// conv2(conv1(x)) (+ x with a shortcut and equal widths).
class BottleneckImpl : public torch::nn::Module {
 public:
  BottleneckImpl(int64_t cin, int64_t cout, bool shortcut, double expansion, bool depthwise);
  torch::Tensor forward(const torch::Tensor& x);

  BaseConv conv1{nullptr};
  AnyConv conv2;
  bool add;
};
TORCH_MODULE(Bottleneck);

// conv3(cat[m(conv1(x)), conv2(x)]) with n bottlenecks of width cout/2.
class CSPLayerImpl : public torch::nn::Module {
 public:
  CSPLayerImpl(int64_t cin, int64_t cout, int64_t n, bool shortcut, bool depthwise);
  torch::Tensor forward(const torch::Tensor& x);

  BaseConv conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  std::vector<Bottleneck> m;  // registered as the Sequential "m"
};
TORCH_MODULE(CSPLayer);

// conv2(cat[y, maxpool5(y), maxpool9(y), maxpool13(y)]) with y = conv1(x), pools in parallel.
class SPPBottleneckImpl : public torch::nn::Module {
 public:
  SPPBottleneckImpl(int64_t cin, int64_t cout);
  torch::Tensor forward(const torch::Tensor& x);

  BaseConv conv1{nullptr}, conv2{nullptr};
};
TORCH_MODULE(SPPBottleneck);

// Space-to-depth (top-left, bottom-left, top-right, bottom-right) then a 3x3 BaseConv: "conv".
class FocusImpl : public torch::nn::Module {
 public:
  FocusImpl(int64_t cin, int64_t cout);
  torch::Tensor forward(const torch::Tensor& x);

  BaseConv conv{nullptr};
};
TORCH_MODULE(Focus);

// darkN: Sequential("0" downsampling conv, "1" SPP (dark5 only) or CSP, "2" CSP (dark5)).
class DarkStageImpl : public torch::nn::Module {
 public:
  DarkStageImpl(int64_t cin, int64_t cout, int64_t n, bool spp, bool depthwise);
  torch::Tensor forward(const torch::Tensor& x);

  AnyConv down;
  SPPBottleneck spp{nullptr};
  CSPLayer csp{nullptr};
};
TORCH_MODULE(DarkStage);

class CSPDarknetImpl : public torch::nn::Module {
 public:
  explicit CSPDarknetImpl(const SizeConfig& cfg);
  // dark3, dark4, dark5 outputs (strides 8, 16, 32).
  std::array<torch::Tensor, 3> forward(const torch::Tensor& x);

  Focus stem{nullptr};
  DarkStage dark2{nullptr}, dark3{nullptr}, dark4{nullptr}, dark5{nullptr};
};
TORCH_MODULE(CSPDarknet);

// YOLOPAFPN: the backbone as "backbone", then the neck's layers directly.
class PAFPNImpl : public torch::nn::Module {
 public:
  explicit PAFPNImpl(const SizeConfig& cfg);
  std::array<torch::Tensor, 3> forward(const torch::Tensor& x);

  CSPDarknet backbone{nullptr};
  BaseConv lateral_conv0{nullptr}, reduce_conv1{nullptr};
  CSPLayer C3_p4{nullptr}, C3_p3{nullptr}, C3_n3{nullptr}, C3_n4{nullptr};
  AnyConv bu_conv2, bu_conv1;
};
TORCH_MODULE(PAFPN);

// Sequential of two 3x3 convs: children "0", "1".
class ConvPairImpl : public torch::nn::Module {
 public:
  ConvPairImpl(int64_t c, bool depthwise);
  torch::Tensor forward(const torch::Tensor& x) { return c1(c0(x)); }

  AnyConv c0, c1;
};
TORCH_MODULE(ConvPair);

// Decoupled head. Per level: stem 1x1, a class tower and a box tower of two 3x3 convs each, then
// 1x1 predictions: reg (4) and obj (1) on the box tower, cls (nc) on the class tower.
class HeadImpl : public torch::nn::Module {
 public:
  HeadImpl(const std::array<int64_t, 3>& in_ch, int64_t width, int nc, bool depthwise);
  // Per level [B, 5 + nc, H, W]: raw (tx, ty, tw, th), obj logit, class logits.
  std::vector<torch::Tensor> forward(const std::array<torch::Tensor, 3>& feats);
  void reset_num_classes(int nc);
  // Class and objectness biases at the prior -log((1 - p) / p) (the reference trainer's
  // initialize_biases(0.01) for a fresh run).
  void init_biases(double prior = 0.01);

  std::vector<ConvPair> cls_convs, reg_convs;
  std::vector<torch::nn::Conv2d> cls_preds, reg_preds, obj_preds;
  std::vector<BaseConv> stems;
  std::shared_ptr<torch::nn::Module> cls_pred_container;  // "cls_preds": children 0, 1, 2
  int nc;
  int64_t width;
};
TORCH_MODULE(Head);

class YoloxModel : public Detector {
 public:
  YoloxModel(const std::string& size, int nc);

  // Per level [B, 5 + nc, H/s, W/s]: raw reg, obj logit, class logits, in train and eval mode
  // alike (the reference's train_raw maps; its eval maps are these with sigmoid on obj/cls).
  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override;
  // [B, 4 + nc, A]: xyxy input pixels from cx = (tx + gx) s, w = exp(tw) s (no 0.5 offset),
  // then score = sigmoid(obj) * sigmoid(cls) per class.
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override;

  std::string family_name() const override { return "yolox"; }
  std::string size() const override { return size_; }
  int num_classes() const override { return head_->nc; }
  std::vector<int64_t> strides() const override { return {8, 16, 32}; }
  void reset_num_classes(int nc) override;
  std::vector<std::string> freeze_groups() const override { return {"backbone", "head"}; }

  HeadImpl& head() { return *head_; }

 private:
  // Cell indices (gx, gy) [2, A] and strides [A] for the maps' level sizes (cached per device).
  std::pair<torch::Tensor, torch::Tensor> grid(const std::vector<torch::Tensor>& raw);

  std::string size_;
  PAFPN backbone_{nullptr};
  Head head_{nullptr};
  common::BatchedLayerState layers_{*this};
  LevelCache<std::pair<torch::Tensor, torch::Tensor>> grids_;
};

// Cell indices and strides of the anchors of levels with these sizes and strides, level-major,
// row-major inside a level: cells [2, A] (gx, gy) float32, strides [A] float32.
std::pair<torch::Tensor, torch::Tensor> make_grid(const std::vector<std::array<int64_t, 2>>& level_hw,
                                                  const std::vector<int64_t>& strides, const torch::Device& device);

// The registry entry (src/families/registry.cpp lists it).
Family make_family();

}  // namespace libreyolo::models::yolox
