// SimOTA label assignment in fixed shapes (no host reads, no data-dependent shapes), shared by
// the families whose losses assign with it. Per image: the candidates are the predictions whose
// cell centre lies strictly inside some GT's centre square of +-radius strides; each GT takes its
// dynamic k = max(1, floor(sum of its 10 best candidate IoUs)) cheapest candidates under the cost
// class BCE(sqrt(sigmoid(cls) sigmoid(obj)), one-hot GT class) + 3 (-log(IoU + 1e-8)) + 1e6
// outside its own centre square; a prediction taken by several GTs goes to the cheapest GT.
#pragma once
#include <torch/torch.h>

#include <array>

namespace libreyolo::loss {

// The result per prediction (and the dynamic k per GT row).
struct SimOtaAssignment {
  torch::Tensor fg;          // [B, A] bool: the prediction is a positive
  torch::Tensor matched_gt;  // [B, A] int64: its GT row, -1 for background
  torch::Tensor pred_iou;    // [B, A]: IoU of its box with that GT (0 for background)
  torch::Tensor dynamic_k;   // [B, T] int64: k of each GT row, -1 for padding rows
};

struct SimOtaOptions {
  double centre_radius = 1.5;  // strides
  int candidate_topk = 10;     // IoUs summed for the dynamic k, and its upper bound
};

// predictions [B, A, 5 + nc]: cx, cy, w, h in input pixels, then objectness and class logits
// (detached inside); gt [B, T, 5] (class, cx, cy, w, h in pixels; class < 0: a padding row);
// cells [A, 2] (x, y grid cell of each prediction) and strides [A].
SimOtaAssignment simota_assign(const torch::Tensor& predictions, const torch::Tensor& gt, const torch::Tensor& cells,
                               const torch::Tensor& strides, const SimOtaOptions& options = {});

// The loader's targets [B, T, 5] (class, x1, y1, x2, y2 normalised; class < 0: padding) as the
// assignment's gt rows (class, cx, cy, w, h in input pixels) in `like`'s dtype and device; one
// padding row per image when T is 0.
torch::Tensor simota_gt_rows(const torch::Tensor& targets, int64_t batch, int64_t img_h, int64_t img_w,
                             const torch::Tensor& like);

// Sum over the positives `fg` [B, A] of 1 - IoU^2 between predicted and assigned boxes (cxcywh,
// [B, A, 4]); the other predictions see their target box (no loss, no gradient).
torch::Tensor positive_iou_loss_sum(const torch::Tensor& pred_boxes, const torch::Tensor& gt_boxes,
                                    const torch::Tensor& fg);

// The dynamic-k matching of assigners laid out per prediction ([B, N, T]: predictions x GT rows),
// in fixed shapes: each GT row's k = max(1, truncated sum of its `topk` best IoUs among the
// allowed pairs `ok`), then its k cheapest predictions under `cost` (a rank mask over the `topk`
// cheapest, which bounds every k); a prediction taken by several rows goes to its cheapest row
// (the argmin over all rows). `cost` must be +inf where `ok` is false. Returns the match [B, N, T]
// bool, at most one row per prediction.
torch::Tensor dynamic_k_match(const torch::Tensor& cost, const torch::Tensor& iou, const torch::Tensor& ok,
                              int64_t topk);

// The corners of cxcywh boxes (last dim 4): x1, y1, x2, y2.
std::array<torch::Tensor, 4> cxcywh_corners(const torch::Tensor& boxes);

}  // namespace libreyolo::loss
