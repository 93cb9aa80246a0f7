#include "loss/simota.hpp"

#include <algorithm>
#include <limits>

namespace libreyolo::loss {

std::array<torch::Tensor, 4> cxcywh_corners(const torch::Tensor& b) {
  const auto cx = b.select(-1, 0), cy = b.select(-1, 1);
  const auto hw = b.select(-1, 2) / 2, hh = b.select(-1, 3) / 2;
  return {cx - hw, cy - hh, cx + hw, cy + hh};
}

torch::Tensor simota_gt_rows(const torch::Tensor& targets, int64_t batch, int64_t img_h, int64_t img_w,
                             const torch::Tensor& like) {
  if (targets.size(1) == 0) {
    auto gt = torch::zeros({batch, 1, 5}, like.options());
    gt.select(2, 0).fill_(-1);
    return gt;
  }
  const auto t = targets.detach().to(like.device(), like.scalar_type());
  const auto x1 = t.select(2, 1) * static_cast<double>(img_w), y1 = t.select(2, 2) * static_cast<double>(img_h);
  const auto x2 = t.select(2, 3) * static_cast<double>(img_w), y2 = t.select(2, 4) * static_cast<double>(img_h);
  return torch::stack({t.select(2, 0), (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1}, 2);
}

torch::Tensor positive_iou_loss_sum(const torch::Tensor& pred_boxes, const torch::Tensor& gt_boxes,
                                    const torch::Tensor& fg) {
  const auto pred = torch::where(fg.unsqueeze(2), pred_boxes, gt_boxes);
  const auto pc = cxcywh_corners(pred), tc = cxcywh_corners(gt_boxes);
  const auto tlx = at::maximum(pc[0], tc[0]), tly = at::maximum(pc[1], tc[1]);
  const auto brx = at::minimum(pc[2], tc[2]), bry = at::minimum(pc[3], tc[3]);
  const auto en = (tlx < brx).logical_and(tly < bry).to(pred.scalar_type());
  const auto inter = (brx - tlx) * (bry - tly) * en;
  const auto area_p = pred.select(2, 2) * pred.select(2, 3);
  const auto area_t = gt_boxes.select(2, 2) * gt_boxes.select(2, 3);
  const auto iou = inter / (area_p + area_t - inter + 1e-16);
  return torch::where(fg, 1 - iou.square(), torch::zeros({}, iou.options())).sum();
}

SimOtaAssignment simota_assign(const torch::Tensor& predictions, const torch::Tensor& gt, const torch::Tensor& cells,
                               const torch::Tensor& strides, const SimOtaOptions& options) {
  torch::NoGradGuard no_grad;
  const auto outputs = predictions.detach();
  const int64_t A = outputs.size(1), nc = outputs.size(2) - 5;
  const double inf = std::numeric_limits<double>::infinity();
  const auto valid = gt.select(2, 0) >= 0;  // [B, T]
  const auto vmask = valid.unsqueeze(2);    // [B, T, 1]
  const auto g = gt.narrow(2, 1, 4);        // [B, T, 4] cxcywh
  const auto gcx = g.select(2, 0).unsqueeze(2), gcy = g.select(2, 1).unsqueeze(2);

  // Candidates: anchors whose centre lies strictly inside a GT's centre square of +-1.5 strides.
  const auto acx = ((cells.select(1, 0) + 0.5) * strides).view({1, 1, A});
  const auto acy = ((cells.select(1, 1) + 0.5) * strides).view({1, 1, A});
  const auto r = (strides * options.centre_radius).view({1, 1, A});
  const auto d = at::minimum(at::minimum(acx - (gcx - r), (gcx + r) - acx),
                             at::minimum(acy - (gcy - r), (gcy + r) - acy));
  const auto in_centre = (d > 0).logical_and_(vmask);  // [B, T, A]
  const auto cand = in_centre.any(1, /*keepdim=*/true);  // [B, 1, A]
  const auto pair_ok = cand.logical_and(vmask);          // [B, T, A]

  // IoU of every GT with every prediction (no epsilon, as the reference's assignment).
  const auto pb = outputs.narrow(2, 0, 4);
  const auto gc = cxcywh_corners(g.unsqueeze(2));   // each [B, T, 1]
  const auto pc = cxcywh_corners(pb.unsqueeze(1));  // each [B, 1, A]
  const auto tlx = at::maximum(gc[0], pc[0]), tly = at::maximum(gc[1], pc[1]);
  const auto brx = at::minimum(gc[2], pc[2]), bry = at::minimum(gc[3], pc[3]);
  const auto en = (tlx < brx).logical_and_(tly < bry);
  const auto inter = (brx - tlx) * (bry - tly) * en;
  const auto area_g = (g.select(2, 2) * g.select(2, 3)).unsqueeze(2);
  const auto area_p = (pb.select(2, 2) * pb.select(2, 3)).unsqueeze(1);
  const auto iou = inter / (area_g + area_p - inter);  // [B, T, A]

  // Dynamic k = max(1, int(sum of the 10 best candidate IoUs)).
  const int64_t n_top = std::min<int64_t>(options.candidate_topk, A);
  const auto iou_cand = torch::where(pair_ok, iou, torch::zeros({}, iou.options()));
  const auto dyn_k = std::get<0>(iou_cand.topk(n_top, 2)).sum(2).floor().clamp_min(1).to(torch::kLong);  // [B, T]

  // Cost: class BCE of sqrt(sigmoid(cls) sigmoid(obj)) against the one-hot GT class (logs clamped
  // at -100 as binary_cross_entropy does), + 3 (-log(IoU + 1e-8)), + 1e6 outside the GT's own
  // centre square. Sum over classes = all-negative sum, corrected at the GT's class.
  const auto p = (torch::sigmoid(outputs.narrow(2, 5, nc)) * torch::sigmoid(outputs.narrow(2, 4, 1))).sqrt_();
  const auto neg = -torch::log1p(-p).clamp_min_(-100);  // [B, A, nc]: cost of target 0
  const auto pos = -torch::log(p).clamp_min_(-100);     // cost of target 1
  const auto neg_sum = neg.sum(2).unsqueeze(1);         // [B, 1, A]
  const auto cls_idx = gt.select(2, 0).clamp(0, nc - 1).to(torch::kLong).unsqueeze(2).expand({-1, -1, A});
  const auto cls_cost = neg_sum - neg.transpose(1, 2).gather(1, cls_idx) + pos.transpose(1, 2).gather(1, cls_idx);
  const auto cost = cls_cost + 3.0 * (-torch::log(iou + 1e-8)) + 1e6 * in_centre.logical_not().to(iou.scalar_type());

  // Each GT takes its k cheapest candidates (k <= 10 always: it is at most the sum of 10 IoUs).
  const auto inf_t = torch::full({}, inf, cost.options());
  const auto cost_sel = torch::where(pair_ok, cost, inf_t);
  const auto [top_cost, top_idx] = cost_sel.topk(n_top, 2, /*largest=*/false);
  const auto rank = torch::arange(n_top, dyn_k.options()).view({1, 1, n_top});
  const auto take = (rank < dyn_k.unsqueeze(2)).logical_and_(top_cost < inf);
  auto matching = torch::zeros_like(cost).scatter_(2, top_idx, take.to(cost.scalar_type()));  // [B, T, A]
  const auto count = matching.sum(1);                                                       // [B, A]
  // An anchor taken by several GTs goes to the cheapest GT of the image.
  const auto cheapest = torch::where(vmask, cost, inf_t).argmin(1);
  const auto owner = matching.argmax(1);
  const auto fg = count > 0;
  const auto matched = torch::where(count > 1, cheapest, owner);
  SimOtaAssignment a;
  a.fg = fg;
  a.matched_gt = torch::where(fg, matched, torch::full({}, -1, matched.options()));
  a.pred_iou = iou.gather(1, matched.unsqueeze(1)).squeeze(1) * fg;
  a.dynamic_k = torch::where(valid, dyn_k, torch::full({}, -1, dyn_k.options()));
  return a;
}

torch::Tensor dynamic_k_match(const torch::Tensor& cost, const torch::Tensor& iou, const torch::Tensor& ok,
                              int64_t topk) {
  const int64_t B = cost.size(0), N = cost.size(1), T = cost.size(2);
  const int64_t k = std::min<int64_t>(topk, N);
  const auto iou_ok = torch::where(ok, iou, torch::zeros({}, iou.options()));
  const auto dyn_k = std::get<0>(iou_ok.topk(k, 1)).sum(1).to(torch::kInt).clamp_min(1);  // [B, T]
  const auto cheapest = std::get<1>(cost.topk(k, 1, /*largest=*/false, /*sorted=*/true));  // [B, k, T]
  const auto rank = torch::arange(k, torch::TensorOptions().dtype(torch::kInt).device(cost.device())).view({1, k, 1});
  auto match = torch::zeros({B, N, T}, torch::TensorOptions().dtype(torch::kBool).device(cost.device()));
  match.scatter_(1, cheapest, rank < dyn_k.unsqueeze(1));
  match = match & ok;
  const auto multi = match.sum(2, /*keepdim=*/true) > 1;
  const auto cheapest_row = cost.argmin(2, /*keepdim=*/true);  // [B, N, 1]
  const auto columns = torch::arange(T, cheapest_row.options()).view({1, 1, T});
  return torch::where(multi, columns == cheapest_row, match);
}

}  // namespace libreyolo::loss
