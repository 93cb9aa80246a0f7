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

// One category with ground truth, as a row of the validation table.
struct ClassResult {
  int category = 0;
  int64_t images = 0;     // images holding at least one of its ground-truth boxes
  int64_t instances = 0;  // its ground-truth boxes
  double precision = 0, recall = 0;  // at the confidence of the best mean F1 (see CocoStats)
  double ap50 = 0, ap50_95 = 0;      // COCOeval's per-category AP (area all, maxDets 100)
};

// Curves of every category in CocoStats::classes order, for plots.
struct EvalCurves {
  // Confidence thresholds 0, 1/999, ..., 1 (numpy.linspace(0, 1, 1000)). At threshold x a
  // category's precision and recall count its detections with score >= x, matched at IoU .50
  // (COCO's matching, maxDets 100); precision is 0 where no detection is left.
  std::vector<double> conf;
  std::vector<std::vector<double>> precision, recall, f1;  // [class][conf]
  // COCO's recall thresholds 0:.01:1 and the interpolated precision there at IoU .50: the curve
  // whose mean is the category's AP50.
  std::vector<double> recall_thresholds;
  std::vector<std::vector<double>> pr;  // [class][101]
};

struct CocoStats {
  // COCOeval.stats: AP@[.5:.95], AP@.5, AP@.75, AP small/medium/large (maxDets 100),
  // AR@1, AR@10, AR@100, AR small/medium/large (maxDets 100). -1 where nothing is defined
  // (no ground truth in that area range).
  std::array<double, 12> stats{};

  // Precision and recall as Ultralytics and the reference's results.csv columns mean them:
  // per category, P and R over confidence (EvalCurves); the confidence maximising the mean F1
  // over categories is `best_conf` (the highest among equals), and these are the means of P and R
  // over categories there. All 0 when nothing was detected.
  double precision = 0, recall = 0, best_conf = 0;
  double best_f1 = 0;  // mean F1 at best_conf

  int64_t images = 0;     // images evaluated
  int64_t instances = 0;  // ground-truth boxes in them
  std::vector<ClassResult> classes;  // categories with ground truth, ascending id
  EvalCurves curves;

  // LibreYOLO's keys in its order: the 12 stats, then metrics/precision and metrics/recall
  // (the values above).
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

// Input checks shared by the evaluators: [n,4] boxes as a contiguous CPU double tensor (n = 0 may
// come as an empty tensor of any shape), and n values as a contiguous CPU tensor of `type`.
// Throw UsageError naming `what`.
torch::Tensor boxes_as_double(const torch::Tensor& t, const char* what);
torch::Tensor vector_as(const torch::Tensor& t, int64_t n, torch::ScalarType type, const char* what);

}  // namespace libreyolo::eval
