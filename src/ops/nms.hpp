// Greedy non-maximum suppression with torchvision.ops.nms / batched_nms semantics.
#pragma once
#include <torch/types.h>

namespace libreyolo::ops {

// boxes [N, 4] xyxy (float32/float64; other float types are computed in float32), scores [N].
// Visits boxes by descending score and keeps a box unless a kept box overlaps it with
// IoU > iou_threshold (strict). Returns the int64 indices of the kept boxes, by descending score,
// on the input's device. Equal scores keep input order (torchvision leaves that order unstated);
// NaN scores rank below every number. IoU is computed in the box dtype as torchvision does, so
// zero-area boxes (IoU 0/0) never suppress nor get suppressed.
torch::Tensor nms(const torch::Tensor& boxes, const torch::Tensor& scores, double iou_threshold);

// Class-aware NMS: boxes only suppress boxes of the same class (classes [N], integer).
// Same ordering and output as nms.
torch::Tensor batched_nms(const torch::Tensor& boxes, const torch::Tensor& scores,
                          const torch::Tensor& classes, double iou_threshold);

// The float32 threshold t such that `ovr > t` equals torchvision's `ovr > iou_threshold` for every
// float32 ovr (the threshold rounded down to float32). Shared with the GPU NMS (kernels/detect_nms).
float iou_threshold_float32(double iou_threshold);

}  // namespace libreyolo::ops
