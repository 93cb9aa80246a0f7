// YOLOv9 training loss: the MIT-YOLO task-aligned assigner, CIoU
// box loss, distribution focal loss and BCE class loss, gains 7.5 / 1.5 / 0.5.
//
// Everything is computed densely on the device with fixed shapes, so a step that contains it
// can be captured in a CUDA graph: no .item(), no boolean-mask indexing, no nonzero(). Anchors
// that are not positives simply carry a zero weight in the box and DFL sums.
#pragma once
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "loss/loss.hpp"
#include "ops/dfl.hpp"

namespace libreyolo::loss {

// Complete IoU of box pairs (xyxy, coordinates along `dim`, other dims broadcast), EPS = 1e-7.
// The aspect-ratio weight alpha carries no gradient. Like everything here it computes in float32
// (half inputs are promoted), or in float64 for float64 inputs.
torch::Tensor ciou(const torch::Tensor& box1, const torch::Tensor& box2, int64_t dim = -1);

// CIoU of every ground truth against every prediction, without gradient.
// gt: [B, T, 4] xyxy; pred: [B, 4, A] xyxy (coordinates along dim 1). Returns [B, T, A].
torch::Tensor pairwise_ciou(const torch::Tensor& gt, const torch::Tensor& pred);

// Distribution focal loss per anchor, averaged over the four sides.
// logits: [B, 4, R, A] raw bin logits; target: [B, 4, A] distances in bins, in [0, R-1).
// Returns [B, A].
torch::Tensor dfl_per_anchor(const torch::Tensor& logits, const torch::Tensor& target);

// Anchor points for one set of level sizes, on one device. Order: level-major, then row-major.
struct AnchorGrid {
  torch::Device device{torch::kCPU};
  std::vector<std::array<int64_t, 2>> level_hw;  // per level (H, W)
  ops::AnchorPoints points;                      // centres, strides and DFL bins (ops/dfl.hpp)
  torch::Tensor xy;      // [2, A] anchor centres in input pixels (float32, = points.xy)
  torch::Tensor stride;  // [A] stride of each anchor's level (float32, = points.stride)
  torch::Tensor xy_grid;  // [2, A] centres in grid units of their level (gx + 0.5, gy + 0.5)
  // Per axis, all levels concatenated: column centres x [sum W] and row centres y [sum H],
  // each with its level's stride.
  torch::Tensor col_x, col_stride, row_y, row_stride;
};

// The assigner's result, one entry per anchor.
struct Assignment {
  torch::Tensor valid;     // [B, A] bool: the anchor is a positive
  torch::Tensor gt_index;  // [B, A] int64: its ground-truth row (0 where not valid)
  torch::Tensor score;     // [B, A] float32: soft class target (0 where not valid)
  torch::Tensor classes;   // [B, A] int64: class of the assigned ground truth
  torch::Tensor boxes;     // [B, 4, A] float32: assigned ground-truth box, xyxy input pixels
};

// The network's raw maps flattened over all anchors (float32, or float64 for float64 input).
struct Decoded {
  torch::Tensor box_logits;  // [B, 4, R, A] DFL bin logits, sides (l, t, r, b)
  torch::Tensor cls_logits;  // [B, nc, A]
  torch::Tensor boxes;       // [B, 4, A] decoded xyxy in input pixels (Vec2Box)
};

// One object per training thread: it caches anchor grids and is not synchronised.
class Yolo9Loss : public TrainingLoss {
 public:
  // aux_weight > 0: compute() also takes the auxiliary head's maps after the main ones
  // (Detector::forward_train with YOLOv9's PGI branch) and adds aux_weight times their loss.
  explicit Yolo9Loss(int nc, std::vector<int64_t> strides = {8, 16, 32}, int reg_max = 16, double aux_weight = 0.0);

  // box (CIoU), cls (BCE), dfl (distribution focal), each with its gain applied.
  const std::vector<std::string>& term_names() const override {
    static const std::vector<std::string> names = {"box", "cls", "dfl"};
    return names;
  }
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                     int64_t img_h, int64_t img_w) override;
  std::vector<std::shared_ptr<const void>> capture_keep_alive() const override {
    return {grids_.begin(), grids_.end()};
  }

  // The pieces of compute(), public for tests and benchmarks.
  Decoded decode(const std::vector<torch::Tensor>& raw, const AnchorGrid& grid) const;
  // The assigner's [B, T, A] metrics: CIoU clamped to [0, 1] and the alignment
  // sigmoid(logit of the ground truth's class)^kClsFactor * iou^kIouFactor. On a CUDA device in
  // float32 one kernel (kernels/assign.hpp; LIBREYOLO_ASSIGN_KERNEL=0: the composed ops).
  std::pair<torch::Tensor, torch::Tensor> pair_metrics(const torch::Tensor& gt_box, const torch::Tensor& boxes,
                                                       const torch::Tensor& cls_logits,
                                                       const torch::Tensor& gt_cls) const;
  // The assigner alone (BoxMatcher): cls_logits [B, nc, A], boxes [B, 4, A] decoded xyxy
  // pixels (both treated as constants), targets [B, T, 5] (class, x1, y1, x2, y2) in pixels,
  // rows with class < 0 are padding.
  Assignment assign(const torch::Tensor& cls_logits, const torch::Tensor& boxes,
                    const torch::Tensor& targets, const AnchorGrid& grid) const;

  // The weighted loss terms for a fixed assignment.
  LossOutput loss_terms(const Decoded& d, const Assignment& a, const AnchorGrid& grid) const;
  // The anchor grid for these level sizes on this device (built once, then cached).
  const AnchorGrid& anchor_grid(const std::vector<std::array<int64_t, 2>>& level_hw,
                                const torch::Device& device);

  int num_classes() const { return nc_; }
  double aux_weight() const { return aux_weight_; }
  int reg_max() const { return reg_max_; }

  static constexpr int kTopK = 10;
  static constexpr double kIouFactor = 6.0;
  static constexpr double kClsFactor = 0.5;
  static constexpr double kBoxGain = 7.5;
  static constexpr double kDflGain = 1.5;
  static constexpr double kClsGain = 0.5;

 private:
  // One head's loss (the main or the auxiliary one).
  LossOutput compute_head(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                          int64_t img_w);
  void check_inputs(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                    int64_t img_h, int64_t img_w) const;

  int nc_;
  std::vector<int64_t> strides_;
  int reg_max_;
  double aux_weight_;
  std::deque<std::shared_ptr<const AnchorGrid>> grids_;  // the most recent (level sizes, device) pairs seen
};

}  // namespace libreyolo::loss
