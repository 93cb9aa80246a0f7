// Box arithmetic of RT-DETR's matcher, denoising and criterion (normalised boxes, cxcywh in the
// model, xyxy inside the overlaps) and the batch's ground truth as one list per image.
#pragma once
#include <torch/torch.h>

#include <vector>

namespace libreyolo::models::rtdetr {

// [..., 4] cxcywh -> xyxy (cx -+ 0.5 w, cy -+ 0.5 h) and back ((x1 + x2) / 2, x2 - x1).
torch::Tensor cxcywh_to_xyxy(const torch::Tensor& b);
torch::Tensor xyxy_to_cxcywh(const torch::Tensor& b);

// IoU and GIoU of xyxy boxes [..., 4] that broadcast against each other (a[:, None] against
// b[None] for all pairs, equal shapes for elementwise): IoU = inter / (union + 1e-6),
// GIoU = IoU - (hull - union) / (hull + 1e-6), hull the smallest enclosing box's area.
struct Overlap {
  torch::Tensor iou, giou;
};
Overlap box_overlap(const torch::Tensor& a, const torch::Tensor& b);

// One image's ground truth: labels int64 [n] and cxcywh boxes float32 [n, 4], normalised.
struct ImageTargets {
  torch::Tensor labels, boxes;
  int64_t size() const { return labels.size(0); }
};

// The loader's [B, T, 5] rows (class, x1, y1, x2, y2), normalised, to one entry per image: rows
// with class >= 0 and a box of positive width and height, in their order, on the targets'
// device. Synchronises with the host once (the mask of kept rows).
std::vector<ImageTargets> split_targets(const torch::Tensor& targets);

}  // namespace libreyolo::models::rtdetr
