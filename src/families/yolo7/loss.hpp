// YOLOv7 training loss as LibreYOLO trains it: SimOTA over the anchor head's decoded boxes
// (candidates: predictions whose cell centre lies strictly inside a GT's square of +-1.5 strides;
// cost = class BCE of sqrt(sigmoid(cls) sigmoid(obj)) + 3 (-log IoU) + 1e6 outside the GT's own
// square; dynamic k from the 10 best candidate IoUs; a prediction taken by several GTs goes to the
// cheapest), IoU loss 1 - IoU^2 (x5), objectness BCE over every prediction and IoU-aware class
// BCE over the positives, all divided by max(positives, 1). The three anchors of a cell share its
// candidacy; they differ only in the decoded box.
//
// The assignment runs densely over [B, GT rows, predictions] with fixed shapes (dynamic k is a
// rank mask over the 10 cheapest candidates, which bounds every k): no host synchronisation and
// no data-dependent shapes.
#pragma once
#include <torch/torch.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "loss/loss.hpp"
#include "loss/simota.hpp"

namespace libreyolo::models::yolo7 {

// The SimOTA result (loss/simota.hpp).
using Assignment = loss::SimOtaAssignment;

class Yolo7Loss : public TrainingLoss {
 public:
  explicit Yolo7Loss(int nc);

  // iou (already x5), obj, cls.
  const std::vector<std::string>& term_names() const override {
    static const std::vector<std::string> names = {"iou", "obj", "cls"};
    return names;
  }
  // raw: per level [B, 3 (5 + nc), H, W], the detection layers' maps.
  LossOutput compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                     int64_t img_w) override;

  // The pieces, public for tests. Predictions [B, A, 5 + nc] in the decode's order (level,
  // anchor, row, column): boxes cxcywh in input pixels, then the objectness and class logits.
  torch::Tensor predictions(const std::vector<torch::Tensor>& raw);
  // `gt` [B, T, 5] rows (class, cx, cy, w, h) in input pixels, class < 0 for padding; cells
  // [A, 2] (gx, gy) and strides [A] of the predictions.
  Assignment assign(const torch::Tensor& predictions, const torch::Tensor& gt, const torch::Tensor& cells,
                    const torch::Tensor& strides) const;

  // The cached grids, held by a captured step so that an eviction cannot free them.
  std::vector<std::shared_ptr<const void>> capture_keep_alive() const override {
    return {grids_.begin(), grids_.end()};
  }

  static constexpr double kRegWeight = 5.0;
  static constexpr double kCentreRadius = 1.5;
  static constexpr int kCandidateTopK = 10;

 private:
  struct LossGrid {
    std::vector<int64_t> hw;
    torch::Device device;
    torch::ScalarType dtype;
    torch::Tensor cells, anchors, strides;  // [A, 2], [A, 2], [A]
  };
  std::shared_ptr<const LossGrid> grid(const std::vector<torch::Tensor>& raw);

  int nc_;
  std::deque<std::shared_ptr<const LossGrid>> grids_;
};

}  // namespace libreyolo::models::yolo7
