#include "families/yolo7/loss.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <array>
#include <cmath>
#include <limits>

#include "core/log.hpp"
#include "families/yolo7/model.hpp"
#include "libreyolo/errors.hpp"
#include "loss/normalizer.hpp"

namespace libreyolo::models::yolo7 {

namespace {

constexpr size_t kMaxCachedGrids = 8;

torch::ScalarType compute_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// The corners of cxcywh boxes (last dim 4): x1, y1, x2, y2.
std::array<torch::Tensor, 4> corners(const torch::Tensor& b) {
  const auto cx = b.select(-1, 0), cy = b.select(-1, 1);
  const auto hw = b.select(-1, 2) / 2, hh = b.select(-1, 3) / 2;
  return {cx - hw, cy - hh, cx + hw, cy + hh};
}

}  // namespace

Yolo7Loss::Yolo7Loss(int nc) : nc_(nc) {
  if (nc < 1) throw UsageError(strfmt("Yolo7Loss: number of classes must be >= 1, got %d", nc));
}

std::shared_ptr<const Yolo7Loss::LossGrid> Yolo7Loss::grid(const std::vector<torch::Tensor>& raw) {
  std::vector<int64_t> hw;
  LevelSizes sizes;
  for (const auto& r : raw) {
    hw.push_back(r.size(2));
    hw.push_back(r.size(3));
    sizes.push_back({r.size(2), r.size(3)});
  }
  const auto device = raw[0].device();
  const auto dtype = compute_dtype(raw[0]);
  for (const auto& g : grids_)
    if (g->hw == hw && g->device == device && g->dtype == dtype) return g;
  const Grid g = make_grid(sizes, device);  // [2, A], [2, A], [1, A] float32
  auto entry = std::make_shared<const LossGrid>(LossGrid{hw, device, dtype, g.cells.t().contiguous().to(dtype),
                                                         g.anchors.t().contiguous().to(dtype),
                                                         g.strides.reshape({-1}).to(dtype)});
  if (grids_.size() >= kMaxCachedGrids) grids_.pop_front();
  grids_.push_back(entry);
  return entry;
}

torch::Tensor Yolo7Loss::predictions(const std::vector<torch::Tensor>& raw) {
  const int64_t channels = 5 + nc_, batch = raw[0].size(0);
  std::vector<torch::Tensor> flat;
  flat.reserve(raw.size());
  for (const auto& r : raw)  // [B, a (5 + nc), H, W] -> [B, a H W, 5 + nc]
    flat.push_back(
        r.reshape({batch, kAnchorsPerCell, channels, -1}).permute({0, 1, 3, 2}).reshape({batch, -1, channels}));
  const auto x = torch::cat(flat, 1).to(compute_dtype(raw[0]));
  const auto g = grid(raw);
  const auto s = g->strides.unsqueeze(-1);  // [A, 1]
  const auto sig = torch::sigmoid(x.narrow(2, 0, 4));
  const auto xy = (sig.narrow(2, 0, 2) * 2 - 0.5 + g->cells) * s;
  const auto wh = (sig.narrow(2, 2, 2) * 2).pow(2) * g->anchors;
  return torch::cat({xy, wh, x.narrow(2, 4, channels - 4)}, 2);
}

Assignment Yolo7Loss::assign(const torch::Tensor& predictions_in, const torch::Tensor& gt, const torch::Tensor& cells,
                             const torch::Tensor& strides) const {
  torch::NoGradGuard no_grad;
  const auto out = predictions_in.detach();
  const int64_t A = out.size(1), nc = out.size(2) - 5;
  const double inf = std::numeric_limits<double>::infinity();
  const auto valid = gt.select(2, 0) >= 0;  // [B, T]
  const auto vmask = valid.unsqueeze(2);    // [B, T, 1]
  const auto g = gt.narrow(2, 1, 4);        // [B, T, 4] cxcywh
  const auto gcx = g.select(2, 0).unsqueeze(2), gcy = g.select(2, 1).unsqueeze(2);

  // Candidates: cell centres strictly inside a GT's centre square of +-1.5 strides.
  const auto acx = ((cells.select(1, 0) + 0.5) * strides).view({1, 1, A});
  const auto acy = ((cells.select(1, 1) + 0.5) * strides).view({1, 1, A});
  const auto r = (strides * kCentreRadius).view({1, 1, A});
  const auto d = at::minimum(at::minimum(acx - (gcx - r), (gcx + r) - acx),
                             at::minimum(acy - (gcy - r), (gcy + r) - acy));
  const auto in_centre = (d > 0).logical_and_(vmask);   // [B, T, A]
  const auto cand = in_centre.any(1, /*keepdim=*/true);  // [B, 1, A]
  const auto pair_ok = cand.logical_and(vmask);          // [B, T, A]

  // IoU of every GT with every prediction (cxcywh, no epsilon).
  const auto pb = out.narrow(2, 0, 4);
  const auto gc = corners(g.unsqueeze(2));   // each [B, T, 1]
  const auto pc = corners(pb.unsqueeze(1));  // each [B, 1, A]
  const auto tlx = at::maximum(gc[0], pc[0]), tly = at::maximum(gc[1], pc[1]);
  const auto brx = at::minimum(gc[2], pc[2]), bry = at::minimum(gc[3], pc[3]);
  const auto en = (tlx < brx).logical_and_(tly < bry);
  const auto inter = (brx - tlx) * (bry - tly) * en;
  const auto area_g = (g.select(2, 2) * g.select(2, 3)).unsqueeze(2);
  const auto area_p = (pb.select(2, 2) * pb.select(2, 3)).unsqueeze(1);
  const auto iou = inter / (area_g + area_p - inter);  // [B, T, A]

  // Dynamic k = max(1, int(sum of the 10 best candidate IoUs)).
  const int64_t n_top = std::min<int64_t>(kCandidateTopK, A);
  const auto iou_cand = torch::where(pair_ok, iou, torch::zeros({}, iou.options()));
  const auto dyn_k = std::get<0>(iou_cand.topk(n_top, 2)).sum(2).floor().clamp_min(1).to(torch::kLong);  // [B, T]

  // Class cost against the one-hot GT class without a [B, T, A, nc] tensor: the all-negative sum
  // over classes, corrected at the GT's class (logs clamped at -100 as binary_cross_entropy does).
  const auto p = (torch::sigmoid(out.narrow(2, 5, nc)) * torch::sigmoid(out.narrow(2, 4, 1))).sqrt_();
  const auto neg = -torch::log1p(-p).clamp_min_(-100);  // [B, A, nc]: cost of target 0
  const auto pos = -torch::log(p).clamp_min_(-100);     // cost of target 1
  const auto neg_sum = neg.sum(2).unsqueeze(1);         // [B, 1, A]
  const auto cls_idx = gt.select(2, 0).clamp(0, nc - 1).to(torch::kLong).unsqueeze(2).expand({-1, -1, A});
  const auto cls_cost = neg_sum - neg.transpose(1, 2).gather(1, cls_idx) + pos.transpose(1, 2).gather(1, cls_idx);
  const auto cost = cls_cost + 3.0 * (-torch::log(iou + 1e-8)) + 1e6 * in_centre.logical_not().to(iou.scalar_type());

  // Each GT takes its k cheapest candidates (k <= 10: it is at most the sum of 10 IoUs).
  const auto inf_t = torch::full({}, inf, cost.options());
  const auto [top_cost, top_idx] = torch::where(pair_ok, cost, inf_t).topk(n_top, 2, /*largest=*/false);
  const auto rank = torch::arange(n_top, dyn_k.options()).view({1, 1, n_top});
  const auto take = (rank < dyn_k.unsqueeze(2)).logical_and_(top_cost < inf);
  const auto matching = torch::zeros_like(cost).scatter_(2, top_idx, take.to(cost.scalar_type()));  // [B, T, A]
  const auto count = matching.sum(1);                                                             // [B, A]
  // A prediction taken by several GTs goes to the cheapest GT of the image.
  const auto cheapest = torch::where(vmask, cost, inf_t).argmin(1);
  const auto fg = count > 0;
  const auto matched = torch::where(count > 1, cheapest, matching.argmax(1));
  Assignment a;
  a.fg = fg;
  a.matched_gt = torch::where(fg, matched, torch::full({}, -1, matched.options()));
  a.pred_iou = iou.gather(1, matched.unsqueeze(1)).squeeze(1) * fg;
  a.dynamic_k = torch::where(valid, dyn_k, torch::full({}, -1, dyn_k.options()));
  return a;
}

LossOutput Yolo7Loss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                              int64_t img_w) {
  if (raw.size() != kStrides.size())
    throw UsageError(strfmt("Yolo7Loss: expected %zu level maps, got %zu", kStrides.size(), raw.size()));
  for (const auto& r : raw)
    if (r.dim() != 4 || r.size(1) != kAnchorsPerCell * (5 + nc_) || r.size(0) != raw[0].size(0))
      throw UsageError(strfmt("Yolo7Loss: level maps must be [B, %lld, H, W], got ",
                              static_cast<long long>(kAnchorsPerCell * (5 + nc_))) +
                       c10::str(r.sizes()));
  if (targets.dim() != 3 || targets.size(2) != 5 || targets.size(0) != raw[0].size(0))
    throw UsageError("Yolo7Loss: targets must be [B, T, 5], got " + c10::str(targets.sizes()));
  // The loss runs in float32 whatever the forward's precision.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t B = raw[0].size(0), T = targets.size(1);
  const auto out = predictions(raw);  // [B, A, 5 + nc]
  const auto g = grid(raw);
  const auto dtype = out.scalar_type();

  // Targets to (class, cx, cy, w, h) in input pixels; one padding row when there are none.
  torch::Tensor gt;
  if (T == 0) {
    gt = torch::zeros({B, 1, 5}, out.options());
    gt.select(2, 0).fill_(-1);
  } else {
    const auto t = targets.detach().to(out.device(), dtype);
    const auto x1 = t.select(2, 1) * static_cast<double>(img_w), y1 = t.select(2, 2) * static_cast<double>(img_h);
    const auto x2 = t.select(2, 3) * static_cast<double>(img_w), y2 = t.select(2, 4) * static_cast<double>(img_h);
    gt = torch::stack({t.select(2, 0), (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1}, 2);
  }
  const Assignment a = assign(out, gt, g->cells, g->strides);

  const auto fg = a.fg, fg3 = fg.unsqueeze(2);
  const auto fgf = fg.to(dtype);
  const auto n = loss_normalizer(fgf.sum());  // positives, at least 1 (loss/normalizer.hpp)
  const auto gt_rows = gt.gather(1, a.matched_gt.clamp_min(0).unsqueeze(2).expand({-1, -1, 5}));  // [B, A, 5]
  const auto gt_box = gt_rows.narrow(2, 1, 4);
  const auto zero = torch::zeros({}, out.options());

  // IoU loss 1 - IoU^2 on the positives (background predictions see their target box: loss 0,
  // no gradient).
  const auto pred_box = torch::where(fg3, out.narrow(2, 0, 4), gt_box);
  const auto pcn = corners(pred_box), tcn = corners(gt_box);
  const auto tlx = at::maximum(pcn[0], tcn[0]), tly = at::maximum(pcn[1], tcn[1]);
  const auto brx = at::minimum(pcn[2], tcn[2]), bry = at::minimum(pcn[3], tcn[3]);
  const auto en = (tlx < brx).logical_and(tly < bry).to(dtype);
  const auto inter = (brx - tlx) * (bry - tly) * en;
  const auto area_p = pred_box.select(2, 2) * pred_box.select(2, 3);
  const auto area_t = gt_box.select(2, 2) * gt_box.select(2, 3);
  const auto iou = inter / (area_p + area_t - inter + 1e-16);
  const auto loss_iou = torch::where(fg, 1 - iou.square(), zero).sum() / n;

  // Objectness over every prediction.
  const auto loss_obj = torch::binary_cross_entropy_with_logits(out.select(2, 4), fgf, {}, {}, at::Reduction::Sum) / n;

  // Classes: one-hot x IoU on the positives (a comparison rather than one_hot, which checks its
  // input on the host).
  const auto classes = torch::arange(nc_, gt_rows.options()).view({1, 1, nc_});
  const auto cls_t = (gt_rows.select(2, 0).unsqueeze(2) == classes).to(dtype) * a.pred_iou.to(dtype).unsqueeze(2);
  const auto cls_bce =
      torch::binary_cross_entropy_with_logits(out.narrow(2, 5, nc_), cls_t, {}, {}, at::Reduction::None);
  const auto loss_cls = torch::where(fg3, cls_bce, zero).sum() / n;

  const auto iou_term = kRegWeight * loss_iou;
  LossOutput o;
  o.total = iou_term + loss_obj + loss_cls;
  o.terms = torch::stack({iou_term, loss_obj, loss_cls}).detach();
  o.num_fg = (fgf.sum() / static_cast<double>(B)).detach();
  o.names = &term_names();
  return o;
}

}  // namespace libreyolo::models::yolo7
