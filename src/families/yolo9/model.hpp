// YOLOv9 detect model (t/s/m/c), LibreYOLO-compatible parameter names.
#pragma once
#include <torch/torch.h>

#include <array>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "layers/branches.hpp"
#include "layers/concat.hpp"
#include "layers/level_cache.hpp"
#include "models/detector.hpp"
#include "families/yolo9/blocks.hpp"
#include "ops/dfl.hpp"

namespace libreyolo::models::yolo9 {

constexpr int64_t kRegMax = 16;

// Per-size widths (LibreYOLO's YOLO9_CONFIGS).
struct SizeConfig {
  const char* size;
  int64_t conv0, conv1;
  bool first_is_elan;  // ELAN (t/s) or RepNCSPELAN (m/c) as the first block
  int64_t first_out, first_part;
  bool adown;  // ADown (c) or AConv (t/s/m) downsampling
  std::array<std::array<int64_t, 3>, 3> stages;  // B3/B4/B5: {down_out, elan_out, part}
  int64_t spp_out;
  int64_t n;  // RepNCSP depth
  int64_t up1_out, up1_part, up2_out, up2_part;
  int64_t down1_out, elan_down1_out, elan_down1_part;
  int64_t down2_out, elan_down2_out, elan_down2_part;

  std::array<int64_t, 3> head_channels() const { return {up2_out, elan_down1_out, elan_down2_out}; }
};

const std::vector<std::string>& size_names();  // {"t","s","m","c"}
// Throws UsageError for an unknown size.
const SizeConfig& size_config(const std::string& size);
// Class-tower hidden width fixed at build time: max(ch0, min(nc, 100)).
int64_t class_hidden_width(const std::string& size, int nc);

// AConv or ADown, registered under one name.
struct Downsample {
  AConv aconv{nullptr};
  ADown adown{nullptr};
  torch::Tensor operator()(const torch::Tensor& x, const ConvOutput& o = {}) {
    return aconv ? aconv->forward(x, o) : adown->forward(x, o);
  }
};

// Where a level's output is to be written, asked just before it is computed: level (0: P3),
// the input of the block that produces it (its batch and spatial size are the output's) and the
// convolution that writes it (its result's dtype and memory format); null: a tensor of its own.
using Placement =
    std::function<const torch::Tensor*(int level, const torch::Tensor& input, const ConvImpl& producer)>;

class BackboneImpl : public torch::nn::Module {
 public:
  explicit BackboneImpl(const SizeConfig& cfg);
  // p3, p4, p5; each written where `place` says (inference: into the neck's concatenations).
  // b5, when given, receives the last stage's output before the SPP (the auxiliary neck's input).
  std::array<torch::Tensor, 3> forward(const torch::Tensor& x, const Placement& place = {},
                                       torch::Tensor* b5 = nullptr);

 private:
  Conv conv0_{nullptr}, conv1_{nullptr};
  ELAN elan1_plain_{nullptr};
  RepNCSPELAN elan1_rep_{nullptr};
  Downsample down2_, down3_, down4_;
  RepNCSPELAN elan2_{nullptr}, elan3_{nullptr}, elan4_{nullptr};
  SPPELAN spp_{nullptr};
};
TORCH_MODULE(Backbone);

class NeckImpl : public torch::nn::Module {
 public:
  explicit NeckImpl(const SizeConfig& cfg);

  // The neck's four concatenations assembled in place (common/concat.hpp): each of
  // cat[up(P5), P4], cat[up(N4), P3], cat[down1(O3), N4] and cat[down2(O4), P5] is allocated when
  // its second part is about to be produced, and that part (a backbone level, or N4) is written
  // straight into it; the first part is written into it by its own producer. No copies.
  class Concats {
   public:
    explicit Concats(const NeckImpl& neck) : neck_(neck) {}
    // The backbone's Placement: P3, P4 and P5 go into the concatenations that take them.
    const torch::Tensor* place(int level, const torch::Tensor& input, const ConvImpl& producer);

   private:
    friend class NeckImpl;
    const NeckImpl& neck_;
    std::optional<common::ChannelConcat> up1_, up2_, down1_, down2_;
  };

  // ready(i, o_i), when given, is called as each output is computed (P3 first), so that its
  // consumer can start on it while the rest of the neck runs. `cats`: the concatenations the
  // backbone's levels were placed in (Concats::place), null when they were not.
  std::array<torch::Tensor, 3> forward(const std::array<torch::Tensor, 3>& p,
                                       const std::function<void(int, const torch::Tensor&)>& ready = {},
                                       Concats* cats = nullptr);

 private:
  RepNCSPELAN elan_up1_{nullptr}, elan_up2_{nullptr}, elan_down1_{nullptr}, elan_down2_{nullptr};
  Downsample down1_, down2_;
};
TORCH_MODULE(Neck);

// The PGI auxiliary neck (training only): an SPPELAN of its own on the backbone's pre-SPP B5, then
// top-down with B4 and B3 as the main neck's first half. Outputs (A3, A4, A5) fit the head's widths.
class AuxNeckImpl : public torch::nn::Module {
 public:
  explicit AuxNeckImpl(const SizeConfig& cfg);
  std::array<torch::Tensor, 3> forward(const torch::Tensor& p3, const torch::Tensor& p4, const torch::Tensor& b5);

 private:
  SPPELAN spp_{nullptr};
  RepNCSPELAN elan_a4_{nullptr}, elan_a3_{nullptr};
};
TORCH_MODULE(AuxNeck);

// Sequential(Conv 3x3, Conv 3x3, Conv2d 1x1 with bias): children "0", "1", "2".
class TowerImpl : public torch::nn::Module, public common::Foldable {
 public:
  TowerImpl(int64_t c_in, int64_t hidden, int64_t c_out, int64_t groups);
  torch::Tensor forward(const torch::Tensor& x);
  // The same, written into `into` (a view shaped like the result). Without autograd the final
  // convolution runs from a cached weight in the compute dtype (common/fold.hpp, no BatchNorm) as
  // the folded blocks do: on CUDA one fused operation writing `into`.
  void forward_into(const torch::Tensor& x, const torch::Tensor& into);
  // Swaps the final 1x1 conv (same device/dtype as the old one).
  void replace_output(torch::nn::Conv2d out);
  bool refresh_folds() override { return out_fold_.refresh({out_source()}); }

  Conv c0{nullptr}, c1{nullptr};
  torch::nn::Conv2d out{nullptr};

 private:
  // A plain convolution: the fold follows its weight and bias alone (no running statistics, so no
  // mode epoch as ConvBnAct keeps).
  common::FoldSource out_source() const { return {out.get(), nullptr, nullptr}; }
  // The final 1x1 conv unfolded: over NHWC CUDA memory as a GEMM (conv1x1_bias_gemm), else Conv2d.
  torch::Tensor output(const torch::Tensor& h);
  common::FoldedConv out_fold_;
};
TORCH_MODULE(Tower);

// DDetect: per level a box tower (cv2) and a class tower (cv3).
class HeadImpl : public torch::nn::Module {
 public:
  HeadImpl(const std::array<int64_t, 3>& ch, int nc, int64_t hc);
  std::vector<torch::Tensor> forward(const std::array<torch::Tensor, 3>& feats);
  // Inference without autograd: level i's map [N, 4R + nc, H, W] assembled in place, its two
  // towers queued on side streams of `branches` (common/branches.hpp): valid once they join.
  torch::Tensor start_level(int i, const torch::Tensor& feat, common::Branches& branches);
  void reset_num_classes(int nc);

  std::vector<Tower> box, cls;
  int nc;
  int64_t hc;
  static constexpr std::array<int64_t, 3> kStrides{8, 16, 32};

 private:
  void init_class_bias(int level);
};
TORCH_MODULE(Head);

class Yolo9Model : public Detector {
 public:
  // hc = class-tower hidden width; by default the build-time rule for (size, nc).
  Yolo9Model(const std::string& size, int nc, std::optional<int64_t> hc = std::nullopt);

  std::vector<torch::Tensor> forward_raw(const torch::Tensor& x) override;
  // With the auxiliary branch in training mode: the main head's three maps, then the auxiliary
  // head's three.
  std::vector<torch::Tensor> forward_train(const torch::Tensor& x, const torch::Tensor& targets) override;
  // Adds the PGI auxiliary neck ("aux") and head ("aux_head", initialised as the main head) on the
  // model's device; weight 0 removes them.
  bool enable_aux(double weight) override;
  double aux_weight() const override { return aux_ ? aux_weight_ : 0.0; }
  torch::Tensor decode(const std::vector<torch::Tensor>& raw) override;

  std::string family_name() const override { return "yolo9"; }
  std::string size() const override { return size_; }
  int num_classes() const override { return head_->nc; }
  std::vector<int64_t> strides() const override {
    return {HeadImpl::kStrides.begin(), HeadImpl::kStrides.end()};
  }
  void reset_num_classes(int nc) override;
  std::vector<std::string> freeze_groups() const override;

  int64_t class_hidden() const { return head_->hc; }

 private:
  // The anchor points of the raw maps' level sizes on their device (cached).
  ops::AnchorPoints anchor_points(const std::vector<torch::Tensor>& raw);

  void check_input(const torch::Tensor& x) const;

  std::string size_;
  Backbone backbone_{nullptr};
  Neck neck_{nullptr};
  Head head_{nullptr};
  AuxNeck aux_{nullptr};  // training only, when enabled
  Head aux_head_{nullptr};
  double aux_weight_ = 0.0;
  common::BatchedLayerState layers_{*this};  // BN counters and weight casts, once per forward
  LevelCache<ops::AnchorPoints> grids_;
};

// The registry entry (src/families/registry.cpp lists it).
Family make_family();

}  // namespace libreyolo::models::yolo9
