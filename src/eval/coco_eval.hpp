// COCO bounding-box evaluation with the numbers of pycocotools' COCOeval (iouType "bbox"),
// for ground truth without crowd annotations. This is the validation metric of the trainer.
#pragma once
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace libreyolo::eval {

// One ground-truth box, COCO style: top-left corner, width and height in original-image pixels.
// `area` decides the small / medium / large bucket (COCO uses the annotation's area field, not
// w*h).
struct GtBox {
  int64_t image_id;
  int category;
  double x, y, w, h;
  double area;
};

// One detection: top-left corner, width and height in original-image pixels, and its score.
struct DetBox {
  int64_t image_id;
  int category;
  double x, y, w, h;
  double score;
};

struct CocoStats {
  // COCOeval.stats: AP@[.5:.95], AP@.5, AP@.75, AP small/medium/large (maxDets 100),
  // AR@1, AR@10, AR@100, AR small/medium/large (maxDets 100). -1 where nothing is defined
  // (no ground truth in that area range).
  std::array<double, 12> stats{};

  // LibreYOLO's keys in its order. metrics/precision and metrics/recall are the means of
  // COCOeval's precision and recall arrays at area "all", maxDets 100, which makes them equal to
  // mAP50-95 and AR100.
  std::vector<std::pair<std::string, double>> metrics() const;
};

class CocoEvaluator {
 public:
  // Boxes are kept in the order given; within an (image, category) that order breaks ties the way
  // COCO annotation order does. Throws DataError on non-finite values or negative sizes.
  void add_ground_truth(const std::vector<GtBox>& boxes);
  void add_detections(const std::vector<DetBox>& boxes);

  // One validation image as the trainer has it, everything in original-image pixels:
  // gt_xyxy [N,4] with gt_classes [N]; det_xyxy [K,4] with det_scores [K] and det_classes [K]
  // (CPU tensors of any numeric dtype, classes converted to int64; N or K may be 0).
  // Ground truth is clipped to the image and dropped when the clipped box has no extent;
  // its area is the clipped box area. The image counts as seen even when it has neither.
  void add_image(int64_t image_id, int orig_h, int orig_w, const torch::Tensor& gt_xyxy,
                 const torch::Tensor& gt_classes, const torch::Tensor& det_xyxy,
                 const torch::Tensor& det_scores, const torch::Tensor& det_classes);

  // COCOeval over the given image ids (COCOeval's params.imgIds), or over every image seen by
  // any add_* call. Categories are those with ground truth: a category without it has no
  // defined AP in COCOeval anyway. With no detection at all every stat is 0 (LibreYOLO's rule).
  CocoStats evaluate(const std::optional<std::vector<int64_t>>& image_ids = std::nullopt) const;

  void clear();
  size_t num_ground_truth() const { return gts_.size(); }
  size_t num_detections() const { return dets_.size(); }

 private:
  std::vector<GtBox> gts_;
  std::vector<DetBox> dets_;
  std::vector<int64_t> images_;  // every image id seen, possibly repeated
};

}  // namespace libreyolo::eval
