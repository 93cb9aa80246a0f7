// The task-aligned assigner's per-pair metrics in one kernel: for every (image b, ground truth t,
// anchor a) the CIoU of the ground-truth box and the predicted box clamped to [0, 1], and the
// alignment sigmoid(class logit of t's class at a)^0.5 * iou^6. The composed ATen form
// (the loss's pairwise_ciou, sigmoid over every class, gathers, powers) takes about 30
// passes over [B, T, A] float tensors (107 MB each at batch 32, 100 box slots, 640 px). Float32
// only; plain pointers, the family's loss is the torch side.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace libreyolo::kernels {

struct AssignMetricsLaunch {
  int64_t batch = 0, boxes = 0, anchors = 0;
  // Elements between consecutive images of pred and of cls_logits (their rows within an image are
  // `anchors` apart, their anchors adjacent): views into a larger decoded tensor need no copy.
  int64_t pred_batch_stride = 0, cls_batch_stride = 0;
  float eps = 1e-7f;         // CIoU's epsilon
  float atan_scale = 0.f;    // 4 / pi^2
  cudaStream_t stream = nullptr;
};

// gt: [B, T, 4] xyxy, contiguous; pred: [B, 4, A] xyxy and cls_logits: [B, C, A], strided as the
// launch says; gt_cls: [B, T] int64 in [0, C), contiguous; iou, align: [B, T, A] outputs,
// contiguous. Float32 (gt_cls int64).
void assign_metrics(const AssignMetricsLaunch& l, const float* gt, const float* pred, const float* cls_logits,
                    const int64_t* gt_cls, float* iou, float* align);

}  // namespace libreyolo::kernels
