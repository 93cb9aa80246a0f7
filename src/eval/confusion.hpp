// Detection confusion matrix as Ultralytics builds it: nc classes plus "background", detections
// above a confidence matched to ground truth of any class by IoU.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace libreyolo::eval {

// A square matrix of counts [n x n] (predicted row, true column; row-major) with each true column
// divided by its sum (a column without entries stays 0).
std::vector<double> normalize_columns(const std::vector<int64_t>& counts, int n);

class ConfusionMatrix {
 public:
  // Defaults are Ultralytics': detections with score > 0.25, pairs with IoU > 0.45.
  // The matrix holds (nc + 1)^2 counts and is drawn one cell per pair: classes up to kMaxClasses.
  // More: UsageError (the validator then draws no matrix).
  static constexpr int kMaxClasses = 1000;
  explicit ConfusionMatrix(int num_classes, double conf = 0.25, double iou = 0.45);

  // One image, boxes x1,y1,x2,y2 in any common pixel space: gt_xyxy [N,4] with gt_classes [N],
  // det_xyxy [K,4] with det_scores [K] and det_classes [K] (CPU tensors, N or K may be 0).
  // Pairs above the IoU threshold, best first, keep one per detection and then one per ground
  // truth (Ultralytics' order). A matched ground truth counts at (its detection's class, its
  // class); an unmatched one at (background, its class); an unmatched detection at (its class,
  // background). Class ids outside [0, nc): UsageError.
  void add_image(const torch::Tensor& gt_xyxy, const torch::Tensor& gt_classes,
                 const torch::Tensor& det_xyxy, const torch::Tensor& det_scores,
                 const torch::Tensor& det_classes);

  int num_classes() const { return nc_; }
  int size() const { return nc_ + 1; }  // index nc is background
  // Counts at (predicted row, true column).
  int64_t count(int predicted, int truth) const { return m_[static_cast<size_t>(predicted) * size() + truth]; }
  // Each true column divided by its sum (a column without entries stays 0), row-major.
  std::vector<double> normalized() const;

 private:
  int nc_;
  double conf_, iou_;
  std::vector<int64_t> m_;
};

}  // namespace libreyolo::eval
