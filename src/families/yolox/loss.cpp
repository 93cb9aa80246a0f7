#include "families/yolox/loss.hpp"

#include "loss/normalizer.hpp"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>
#include <libreyolo/errors.hpp>
#include <limits>

#include "core/log.hpp"

namespace libreyolo::loss {
namespace {

constexpr size_t kMaxCachedGrids = 8;

torch::ScalarType compute_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// The four corners of cxcywh boxes (last dim 4) -> (x1, y1, x2, y2) tensors.
std::array<torch::Tensor, 4> corners(const torch::Tensor& b) {
  const auto cx = b.select(-1, 0), cy = b.select(-1, 1);
  const auto hw = b.select(-1, 2) / 2, hh = b.select(-1, 3) / 2;
  return {cx - hw, cy - hh, cx + hw, cy + hh};
}

}  // namespace

YoloxLoss::YoloxLoss(int nc, std::vector<int64_t> strides) : nc_(nc), strides_(std::move(strides)) {
  if (nc < 1) throw UsageError(strfmt("YoloxLoss: number of classes must be >= 1, got %d", nc));
  if (strides_.empty()) throw UsageError("YoloxLoss: no strides");
}

std::pair<torch::Tensor, torch::Tensor> YoloxLoss::grid(const std::vector<torch::Tensor>& raw) {
  std::vector<int64_t> hw;
  for (const auto& r : raw) {
    hw.push_back(r.size(2));
    hw.push_back(r.size(3));
  }
  const auto device = raw[0].device();
  const auto dtype = compute_dtype(raw[0]);
  for (const auto& g : grids_)
    if (g->hw == hw && g->device == device && g->dtype == dtype) return {g->cells, g->strides};
  const auto opt = torch::TensorOptions().dtype(dtype);
  std::vector<torch::Tensor> cells, st;
  for (size_t i = 0; i < raw.size(); ++i) {
    const int64_t h = hw[2 * i], w = hw[2 * i + 1];
    auto gy = torch::arange(h, opt).view({h, 1}).expand({h, w}).reshape({-1, 1});
    auto gx = torch::arange(w, opt).view({1, w}).expand({h, w}).reshape({-1, 1});
    cells.push_back(torch::cat({gx, gy}, 1));
    st.push_back(torch::full({h * w}, static_cast<double>(strides_[i]), opt));
  }
  auto g = std::make_shared<const Grid>(Grid{hw, device, dtype, torch::cat(cells, 0).to(device), torch::cat(st).to(device)});
  if (grids_.size() >= kMaxCachedGrids) grids_.pop_front();
  grids_.push_back(g);
  return {g->cells, g->strides};
}

torch::Tensor YoloxLoss::flatten(const std::vector<torch::Tensor>& raw) const {
  std::vector<torch::Tensor> flat;
  flat.reserve(raw.size());
  for (const auto& r : raw) flat.push_back(r.flatten(2).transpose(1, 2));
  return torch::cat(flat, 1).to(compute_dtype(raw[0]));
}

torch::Tensor YoloxLoss::decode(const torch::Tensor& flat, const torch::Tensor& cells,
                                const torch::Tensor& strides) const {
  const auto s = strides.unsqueeze(-1);
  const auto xy = (flat.narrow(2, 0, 2) + cells) * s;
  const auto wh = torch::exp(flat.narrow(2, 2, 2)) * s;
  return torch::cat({xy, wh, flat.narrow(2, 4, flat.size(2) - 4)}, 2);
}

SimOtaAssignment YoloxLoss::assign(const torch::Tensor& outputs_in, const torch::Tensor& gt, const torch::Tensor& cells,
                                   const torch::Tensor& strides) const {
  torch::NoGradGuard no_grad;
  const auto outputs = outputs_in.detach();
  const int64_t A = outputs.size(1), nc = outputs.size(2) - 5;
  const double inf = std::numeric_limits<double>::infinity();
  const auto valid = gt.select(2, 0) >= 0;  // [B, T]
  const auto vmask = valid.unsqueeze(2);    // [B, T, 1]
  const auto g = gt.narrow(2, 1, 4);        // [B, T, 4] cxcywh
  const auto gcx = g.select(2, 0).unsqueeze(2), gcy = g.select(2, 1).unsqueeze(2);

  // Candidates: anchors whose centre lies strictly inside a GT's centre square of +-1.5 strides.
  const auto acx = ((cells.select(1, 0) + 0.5) * strides).view({1, 1, A});
  const auto acy = ((cells.select(1, 1) + 0.5) * strides).view({1, 1, A});
  const auto r = (strides * kCentreRadius).view({1, 1, A});
  const auto d = at::minimum(at::minimum(acx - (gcx - r), (gcx + r) - acx),
                             at::minimum(acy - (gcy - r), (gcy + r) - acy));
  const auto in_centre = (d > 0).logical_and_(vmask);  // [B, T, A]
  const auto cand = in_centre.any(1, /*keepdim=*/true);  // [B, 1, A]
  const auto pair_ok = cand.logical_and(vmask);          // [B, T, A]

  // IoU of every GT with every prediction (no epsilon, as the reference's assignment).
  const auto pb = outputs.narrow(2, 0, 4);
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

LossOutput YoloxLoss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                              int64_t img_w) {
  if (raw.size() != strides_.size())
    throw UsageError(strfmt("YoloxLoss: expected %zu level maps, got %zu", strides_.size(), raw.size()));
  for (const auto& r : raw)
    if (r.dim() != 4 || r.size(1) != 5 + nc_ || r.size(0) != raw[0].size(0))
      throw UsageError(strfmt("YoloxLoss: level maps must be [B, %d, H, W], got ", 5 + nc_) + c10::str(r.sizes()));
  if (targets.dim() != 3 || targets.size(2) != 5 || targets.size(0) != raw[0].size(0))
    throw UsageError("YoloxLoss: targets must be [B, T, 5], got " + c10::str(targets.sizes()));
  // The reference runs the loss in float32 whatever the forward's precision.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t B = raw[0].size(0), T = targets.size(1);
  const auto [cells, strides] = grid(raw);
  const auto flat = flatten(raw);  // [B, A, 5 + nc]
  const auto out = decode(flat, cells, strides);
  const auto dtype = flat.scalar_type();

  // Targets to (class, cx, cy, w, h) in input pixels; one padding row when there are none.
  torch::Tensor gt;
  if (T == 0) {
    gt = torch::zeros({B, 1, 5}, flat.options());
    gt.select(2, 0).fill_(-1);
  } else {
    const auto t = targets.detach().to(flat.device(), dtype);
    const auto x1 = t.select(2, 1) * static_cast<double>(img_w), y1 = t.select(2, 2) * static_cast<double>(img_h);
    const auto x2 = t.select(2, 3) * static_cast<double>(img_w), y2 = t.select(2, 4) * static_cast<double>(img_h);
    gt = torch::stack({t.select(2, 0), (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1}, 2);
  }
  const SimOtaAssignment a = assign(out, gt, cells, strides);

  const auto fg = a.fg;
  const auto fgf = fg.to(dtype);
  const auto n = loss_normalizer(fgf.sum());  // positives, at least 1 (loss/normalizer.hpp)
  const auto idx = a.matched_gt.clamp_min(0);  // [B, A]
  const auto gt_rows = gt.gather(1, idx.unsqueeze(2).expand({-1, -1, 5}));  // [B, A, 5]
  const auto gt_box = gt_rows.narrow(2, 1, 4);
  const auto zero = torch::zeros({}, flat.options());
  const auto fg3 = fg.unsqueeze(2);

  // IoU loss 1 - IoU^2 on the positives (background anchors see their target box: loss 0, and
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

  // Objectness over every anchor.
  const auto loss_obj =
      torch::binary_cross_entropy_with_logits(out.select(2, 4), fgf, {}, {}, at::Reduction::Sum) / n;

  // Class: one-hot x IoU on the positives.
  // (A comparison rather than one_hot, which validates its input on the host on some devices.)
  const auto classes = torch::arange(nc_, gt_rows.options()).view({1, 1, nc_});
  const auto cls_t = (gt_rows.select(2, 0).unsqueeze(2) == classes).to(dtype) * a.pred_iou.to(dtype).unsqueeze(2);
  const auto cls_bce = torch::binary_cross_entropy_with_logits(out.narrow(2, 5, nc_), cls_t, {}, {},
                                                               at::Reduction::None);
  const auto loss_cls = torch::where(fg3, cls_bce, zero).sum() / n;

  torch::Tensor loss_l1 = torch::zeros({}, flat.options());
  if (use_l1_) {
    const auto s = strides.view({1, -1, 1});
    const auto l1_t = torch::cat({gt_box.narrow(2, 0, 2) / s - cells.unsqueeze(0),
                                  torch::log(gt_box.narrow(2, 2, 2) / s + 1e-8)},
                                 2);
    loss_l1 = torch::where(fg3, (flat.narrow(2, 0, 4) - l1_t).abs(), zero).sum() / n;
  }
  const auto iou_term = kRegWeight * loss_iou;
  LossOutput o;
  o.total = iou_term + loss_obj + loss_cls + loss_l1;
  o.terms = torch::stack({iou_term, loss_obj, loss_cls, loss_l1}).detach();
  o.num_fg = (fgf.sum() / static_cast<double>(B)).detach();
  o.names = &term_names();
  return o;
}

}  // namespace libreyolo::loss
