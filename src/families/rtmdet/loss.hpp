// RTMDet training loss as LibreYOLO trains it: the dynamic soft label assigner (candidates: the
// priors, at cell corners, strictly inside some ground-truth box; cost = soft class cost (BCE
// against the IoU-scaled one-hot label, times its squared gap to the score, summed over classes)
// + 3 (-ln(IoU + 1e-7)) + 10^(centre distance in strides - 3); each box takes its dynamic
// k = max(1, trunc(sum of the 13 best candidate IoUs)) cheapest candidates; a prior taken by
// several boxes goes to its cheapest box), then quality focal loss (beta 2) over every prior and
// class against the assigned IoU, and the metric-weighted GIoU loss (x2) over the positives, both
// divided by max(sum of the assigned IoUs, 1). Everything in float32.
//
// The assignment runs densely over [B, priors, GT rows] in fixed shapes: padding rows and
// non-candidates carry an infinite cost, the dynamic k is a rank mask over the 13 cheapest
// candidates (which bounds every k), and the soft class cost needs no [.., classes] tensor per
// box (its label is non-zero at one class only). No host synchronisation, no data-dependent shape.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "loss/loss.hpp"

namespace libreyolo::models::rtmdet {

// Per prior: positive or not, its ground-truth row, class (nc for background), IoU (the
// assignment metric, 0 for background) and box (zeros for background).
struct DslAssignment {
  torch::Tensor fg;        // [B, N] bool
  torch::Tensor gt_index;  // [B, N] int64 (0 for background)
  torch::Tensor labels;    // [B, N] int64
  torch::Tensor metrics;   // [B, N] float32
  torch::Tensor boxes;     // [B, N, 4] float32, xyxy input pixels
};

class RtmdetLoss : public TrainingLoss {
 public:
  explicit RtmdetLoss(int nc);

  // cls (quality focal), bbox (GIoU, already x2).
  const std::vector<std::string>& term_names() const override {
    static const std::vector<std::string> names = {"cls", "bbox"};
    return names;
  }
  // raw: per level (strides 8, 16, 32) [B, 4 + nc, H, W], the head's pixel distances (left,
  // top, right, bottom) then class logits.
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                     int64_t img_w) override;

  // The pieces, public for tests.
  struct Flat {
    torch::Tensor logits;  // [B, N, nc]
    torch::Tensor boxes;   // [B, N, 4] decoded xyxy in input pixels
    torch::Tensor priors;  // [N, 3] x, y (the cell's corner), stride
  };
  Flat flatten(const std::vector<torch::Tensor>& raw) const;
  // boxes, logits as in Flat (not differentiated); gt [B, T, 5] (class, x1, y1, x2, y2) in input
  // pixels, a row counting only when class >= 0 and it has a positive width and height.
  DslAssignment assign(const torch::Tensor& boxes, const torch::Tensor& logits, const torch::Tensor& priors,
                       const torch::Tensor& gt) const;

  static constexpr int kTopK = 13;
  static constexpr double kCentreRadius = 3.0;
  static constexpr double kIouWeight = 3.0;
  static constexpr double kBboxWeight = 2.0;
  static constexpr double kEps = 1e-7;

 private:
  int nc_;
};

}  // namespace libreyolo::models::rtmdet
