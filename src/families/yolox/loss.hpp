// YOLOX training loss: SimOTA assignment (centre-region
// candidates, cost = class BCE + 3 (-log IoU) + 1e6 outside, dynamic k from the top-10 IoUs,
// conflicts to the cheapest GT), IoU loss 1 - IoU^2 (x5), objectness BCE over every anchor,
// IoU-aware class BCE over the positives and, after mosaic closes, L1 on the raw box outputs.
// All terms are divided by max(positives, 1).
//
// The assignment is computed densely over [B, GT rows, anchors] with fixed shapes (dynamic k is
// a rank mask over the 10 cheapest anchors, which bounds every k), so no host synchronisation
// and no data-dependent shapes: a step that contains it can be captured in a CUDA graph.
#pragma once
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "loss/loss.hpp"
#include "loss/simota.hpp"

namespace libreyolo::loss {

class YoloxLoss : public TrainingLoss {
 public:
  explicit YoloxLoss(int nc, std::vector<int64_t> strides = {8, 16, 32});

  // iou (already x5), obj, cls, l1 (0 while the L1 branch is off).
  const std::vector<std::string>& term_names() const override {
    static const std::vector<std::string> names = {"iou", "obj", "cls", "l1"};
    return names;
  }
  // raw: per level [B, 5 + nc, H, W] (raw reg, obj logit, class logits).
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                     int64_t img_w) override;

  // The pieces, public for tests. `outputs` [B, A, 5 + nc]: decoded cxcywh pixels, obj and class
  // logits (treated as constants); `gt` [B, T, 5] rows (class, cx, cy, w, h) in input pixels,
  // class < 0 = padding.
  SimOtaAssignment assign(const torch::Tensor& outputs, const torch::Tensor& gt, const torch::Tensor& cells,
                          const torch::Tensor& strides) const;
  // Flattened raw maps [B, A, 5 + nc] and the decoded copy (boxes cxcywh in pixels).
  torch::Tensor flatten(const std::vector<torch::Tensor>& raw) const;
  torch::Tensor decode(const torch::Tensor& flat, const torch::Tensor& cells, const torch::Tensor& strides) const;

  // Cell indices [A, 2] (gx, gy) and strides [A] for the maps' level sizes (cached per device).
  std::pair<torch::Tensor, torch::Tensor> grid(const std::vector<torch::Tensor>& raw);

  // The cached anchor grids, held by a captured step so that an eviction cannot free them.
  std::vector<std::shared_ptr<const void>> capture_keep_alive() const override {
    return {grids_.begin(), grids_.end()};
  }

  bool use_l1() const { return use_l1_; }
  void set_use_l1(bool on) { use_l1_ = on; }
  int num_classes() const { return nc_; }

  static constexpr double kRegWeight = 5.0;
  static constexpr double kCentreRadius = 1.5;
  static constexpr int kCandidateTopK = 10;

 private:
  int nc_;
  std::vector<int64_t> strides_;
  bool use_l1_ = false;
  struct Grid {
    std::vector<int64_t> hw;
    torch::Device device;
    torch::ScalarType dtype;
    torch::Tensor cells, strides;
  };
  std::deque<std::shared_ptr<const Grid>> grids_;
};

}  // namespace libreyolo::loss
