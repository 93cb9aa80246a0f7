// PicoDet training loss as LibreYOLO 1.6.0 trains it: SimOTA over the cell-centre priors, then
// the varifocal loss over every prior and class, and GIoU (x2) and distribution focal (x0.25)
// terms over the positives, weighted by each positive's best class score.
//
// Assignment, per image and ground-truth box g: candidates are the priors whose centre lies
// strictly inside some box or strictly inside the square of half-side 2.5 strides around some box's
// centre; cost = sum over classes of BCE(clamp(sigmoid, 1e-7, 1 - 1e-7), one-hot of g's class)
// + 6 (-ln(IoU + 1e-8)) + 1e5 where the prior is not both inside g and inside g's centre square;
// g takes its k = max(1, trunc(sum of its 10 best candidate IoUs)) cheapest candidates; a prior
// taken by several boxes goes to the box of lowest cost.
// Loss: varifocal (alpha 0.75, gamma 2) against the IoU of the positive's decoded box with its box
// at its class, over max(positives, 1); GIoU and DFL weighted by the detached best class score w,
// over max(sum of w, 1e-6) (DFL also over the 4 sides).
//
// Everything runs densely over [B, priors, GT rows] in fixed shapes and float32: padding rows and
// non-candidates carry an infinite cost, the dynamic k is a rank mask over the 10 cheapest
// candidates (which bounds every k), the class cost needs no [.., classes] tensor per box (its
// one-hot target is non-zero at one class only), and the normalisers stay on the device. No host
// synchronisation, no data-dependent shape.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "loss/loss.hpp"

namespace libreyolo::models::picodet {

// Per prior: positive or not, its ground-truth row, class (-1 for background) and box (zeros for
// background).
struct SimOtaAssignment {
  torch::Tensor fg;        // [B, N] bool
  torch::Tensor gt_index;  // [B, N] int64 (0 for background)
  torch::Tensor labels;    // [B, N] int64
  torch::Tensor boxes;     // [B, N, 4] float32, xyxy input pixels
};

class PicodetLoss : public TrainingLoss {
 public:
  explicit PicodetLoss(int nc);

  // cls (varifocal), bbox (GIoU, already x2), dfl (already x0.25).
  const std::vector<std::string>& term_names() const override {
    static const std::vector<std::string> names = {"cls", "bbox", "dfl"};
    return names;
  }
  // raw: per level (strides 8, 16, 32, 64) [B, nc + 32, H, W], class logits then box logits.
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                     int64_t img_w) override;

  // The pieces, public for tests.
  struct Flat {
    torch::Tensor logits;      // [B, N, nc]
    torch::Tensor box_logits;  // [B, N, 4, 8]
    torch::Tensor boxes;       // [B, N, 4] decoded xyxy in input pixels
    torch::Tensor priors;      // [N, 3] cx, cy (the cell's centre), stride
  };
  Flat flatten(const std::vector<torch::Tensor>& raw) const;
  // boxes, logits as in Flat (not differentiated); gt [B, T, 5] (class, x1, y1, x2, y2) in input
  // pixels, a row counting only when class >= 0 and it has a positive width and height.
  SimOtaAssignment assign(const torch::Tensor& boxes, const torch::Tensor& logits, const torch::Tensor& priors,
                          const torch::Tensor& gt) const;

  static constexpr int kTopK = 10;
  static constexpr double kCentreRadius = 2.5;
  static constexpr double kIouWeight = 6.0;
  static constexpr double kOutsidePenalty = 1e5;
  static constexpr double kBboxWeight = 2.0;
  static constexpr double kDflWeight = 0.25;
  static constexpr double kAlpha = 0.75;

 private:
  int nc_;
};

}  // namespace libreyolo::models::picodet
