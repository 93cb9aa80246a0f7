// YOLO detect post-processing for one image: candidates, mapping to the original image,
// class-aware NMS.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace libreyolo::ops {

// One image's detections, CPU tensors sorted by descending score.
struct Detections {
  torch::Tensor boxes;    // [K, 4] float32, xyxy in original-image pixels
  torch::Tensor scores;   // [K] float32
  torch::Tensor classes;  // [K] int64
};

// No detections (empty CPU tensors of the right shapes and dtypes).
Detections no_detections();

// The last steps of a per-image postprocess whose candidates are already in original-image
// pixels (boxes [M, 4] xyxy, scores [M], classes [M] int64; any device): candidates of width or
// height <= 0, or with a non-finite coordinate or score, dropped; class-aware NMS at `iou`; the
// best max_det by score, on the CPU.
Detections nms_detections(torch::Tensor boxes, torch::Tensor scores, torch::Tensor classes, double iou, int max_det);

// Thresholds of LibreYOLO's callers.
struct PostprocessThresholds {
  double conf;
  double iou;
  int max_det;
};
inline constexpr PostprocessThresholds kPredictThresholds{0.25, 0.45, 300};     // model.predict
inline constexpr PostprocessThresholds kValThresholds{0.001, 0.6, 300};         // model.val()
inline constexpr PostprocessThresholds kTrainValThresholds{0.001, 0.65, 300};  // val in training
// Candidates kept before NMS when there are more (LibreYOLO's cap; max_det if that is larger).
inline constexpr int64_t kMaxNmsCandidates = 30000;

// Where one image's input came from: the scales of its fit (ops::FitBox: input pixels per
// original pixel, per axis) and its original size.
struct ImageGeometry {
  double sx = 1.0, sy = 1.0;
  int orig_h = 0, orig_w = 0;
};

// pred: [4 + nc, A] (or [1, 4 + nc, A]) for one image, rows 0-3 xyxy boxes in fitted input
// pixels, rows 4.. sigmoid class scores; any floating dtype and device. Every (anchor, class)
// with score > conf (strict, compared in pred's dtype like PyTorch does) is a candidate, so one
// anchor may give several detections; candidates are enumerated class by class, which decides
// only the order of equal scores. Then: top max(max_det, 30000) candidates by score; boxes
// x divided by sx and y by sy (the fit's scales; the content starts at the input's top-left
// corner) and clipped to [0, orig_w] x
// [0, orig_h]; boxes with width or height <= 0, or a non-finite coordinate or score, dropped;
// class-aware NMS at `iou` in original-image coordinates; the best max_det kept.
// A CUDA pred goes through postprocess_yolo_batch (the GPU path below).
Detections postprocess_yolo(const torch::Tensor& pred, double conf, double iou, int max_det,
                            const ImageGeometry& geometry);

// postprocess_yolo for every image of pred [B, 4 + nc, A] (B = geometry.size()), the same
// detections image by image. A CUDA float32/float16/bfloat16 pred is post-processed on the GPU
// (kernels/detect_nms.hpp: candidates, sort, class-aware NMS) and its result rows copied to the
// host once, the only synchronisation; an image with more candidates than that kernel sorts, or
// any pred when LIBREYOLO_NMS_KERNEL=0 or of another dtype, has its candidates gathered on the
// device and copied to the host in one go for the host NMS. A CPU float32 pred takes
// postprocess_yolo's path image by image.
std::vector<Detections> postprocess_yolo_batch(const torch::Tensor& pred, double conf, double iou, int max_det,
                                               const std::vector<ImageGeometry>& geometry);

}  // namespace libreyolo::ops
