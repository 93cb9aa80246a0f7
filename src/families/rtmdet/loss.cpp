#include "families/rtmdet/loss.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <limits>

#include "core/log.hpp"
#include "libreyolo/errors.hpp"
#include "loss/normalizer.hpp"
#include "loss/simota.hpp"
#include "loss/targets.hpp"

namespace libreyolo::models::rtmdet {

namespace {

constexpr std::array<int64_t, 3> kStrides = {8, 16, 32};

// BCE with logits against y, times |y - sigmoid(x)|^2 (the quality focal weighting, beta 2).
torch::Tensor focal_bce(const torch::Tensor& x, const torch::Tensor& y) {
  return torch::binary_cross_entropy_with_logits(x, y, {}, {}, at::Reduction::None) *
         (y - torch::sigmoid(x)).abs().pow(2);
}

}  // namespace

RtmdetLoss::RtmdetLoss(int nc) : nc_(nc) {
  if (nc < 1) throw UsageError(strfmt("RtmdetLoss: number of classes must be >= 1, got %d", nc));
}

RtmdetLoss::Flat RtmdetLoss::flatten(const std::vector<torch::Tensor>& raw) const {
  const int64_t batch = raw[0].size(0);
  std::vector<torch::Tensor> logits, dist, priors;
  for (size_t l = 0; l < raw.size(); ++l) {
    const auto& r = raw[l];
    const int64_t h = r.size(2), w = r.size(3);
    const auto x = r.to(torch::kFloat).permute({0, 2, 3, 1}).reshape({batch, h * w, 4 + nc_});
    dist.push_back(x.narrow(2, 0, 4));
    logits.push_back(x.narrow(2, 4, nc_));
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(r.device());
    const double s = static_cast<double>(kStrides[l]);
    const auto yx = torch::meshgrid({torch::arange(h, f32) * s, torch::arange(w, f32) * s}, "ij");
    priors.push_back(torch::stack({yx[1].reshape({-1}), yx[0].reshape({-1}), torch::full({h * w}, s, f32)}, 1));
  }
  Flat f;
  f.logits = torch::cat(logits, 1);
  f.priors = torch::cat(priors, 0);
  const auto d = torch::cat(dist, 1);
  const auto px = f.priors.select(1, 0), py = f.priors.select(1, 1);
  f.boxes = torch::stack({px - d.select(2, 0), py - d.select(2, 1), px + d.select(2, 2), py + d.select(2, 3)}, 2);
  return f;
}

DslAssignment RtmdetLoss::assign(const torch::Tensor& boxes_in, const torch::Tensor& logits_in,
                                 const torch::Tensor& priors, const torch::Tensor& gt) const {
  torch::NoGradGuard no_grad;
  const auto boxes = boxes_in.detach(), logits = logits_in.detach();
  const int64_t B = boxes.size(0), N = boxes.size(1), T = gt.size(1);
  const auto inf = std::numeric_limits<double>::infinity();
  // Ground truth [B, 1, T] against priors [1, N, 1].
  const auto g = [&](int64_t c) { return gt.select(2, c).unsqueeze(1); };
  const auto gx1 = g(1), gy1 = g(2), gx2 = g(3), gy2 = g(4);
  const auto valid = (g(0) >= 0) & (gx2 > gx1) & (gy2 > gy1);  // [B, 1, T]
  const auto px = priors.select(1, 0).view({1, N, 1}), py = priors.select(1, 1).view({1, N, 1});
  const auto stride = priors.select(1, 2).view({1, N, 1});
  const auto inside =
      torch::min(torch::min(px - gx1, py - gy1), torch::min(gx2 - px, gy2 - py)) > 0;  // [B, N, T]
  const auto cand = (inside & valid).any(2, /*keepdim=*/true);                        // [B, N, 1]
  const auto ok = cand & valid;                                                         // [B, N, T]

  // IoU of each decoded box with each ground-truth box (areas as given, union at least 1e-7).
  const auto b = [&](int64_t c) { return boxes.select(2, c).unsqueeze(2); };  // [B, N, 1]
  const auto iw = (torch::min(b(2), gx2) - torch::max(b(0), gx1)).clamp_min(0);
  const auto ih = (torch::min(b(3), gy2) - torch::max(b(1), gy1)).clamp_min(0);
  const auto inter = iw * ih;
  const auto union_ = (b(2) - b(0)) * (b(3) - b(1)) + (gx2 - gx1) * (gy2 - gy1) - inter;
  const auto iou = inter / union_.clamp_min(kEps);  // [B, N, T]

  // Soft centre prior: distance from the prior to the box centre, in strides.
  const auto dx = px - (gx1 + gx2) / 2, dy = py - (gy1 + gy2) / 2;
  const auto centre = torch::pow(10.0, (dx.pow(2) + dy.pow(2)).sqrt() / stride - kCentreRadius);
  // Soft class cost: the sum over classes of focal_bce(x, 0), with the box's class term replaced
  // by focal_bce(x, IoU).
  const auto cls = gt.select(2, 0).clamp(0, nc_ - 1).to(torch::kLong).unsqueeze(1).expand({B, N, T});
  const auto x = logits.gather(2, cls);  // [B, N, T] the logit of each box's class
  const auto all_zero = focal_bce(logits, torch::zeros_like(logits)).sum(2, /*keepdim=*/true);
  const auto cls_cost = all_zero - focal_bce(x, torch::zeros_like(x)) + focal_bce(x, iou);
  auto cost = cls_cost - torch::log(iou + kEps) * kIouWeight + centre;
  cost = torch::where(ok, cost, torch::full({}, inf, cost.options()));

  // Each box's dynamic k cheapest candidates; a prior several boxes took goes to its cheapest box.
  const auto match = loss::dynamic_k_match(cost, iou, ok, kTopK);

  DslAssignment a;
  a.fg = match.any(2);
  a.gt_index = match.to(torch::kInt).argmax(2);
  a.metrics = (match.to(iou.scalar_type()) * iou).sum(2);
  const auto rows = gt.gather(1, a.gt_index.unsqueeze(2).expand({B, N, 5}));  // [B, N, 5]
  a.labels = torch::where(a.fg, rows.select(2, 0).to(torch::kLong), torch::full({}, static_cast<int64_t>(nc_),
                                                                              torch::TensorOptions().dtype(torch::kLong).device(cost.device())));
  a.boxes = torch::where(a.fg.unsqueeze(2), rows.narrow(2, 1, 4), torch::zeros({}, rows.options()));
  return a;
}

LossOutput RtmdetLoss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                               int64_t img_w) {
  if (raw.size() != kStrides.size())
    throw UsageError(strfmt("RtmdetLoss: expected %zu level maps, got %zu", kStrides.size(), raw.size()));
  for (const auto& r : raw)
    if (r.dim() != 4 || r.size(1) != 4 + nc_ || r.size(0) != raw[0].size(0))
      throw UsageError(strfmt("RtmdetLoss: level maps must be [B, %d, H, W], got ", 4 + nc_) + c10::str(r.sizes()));
  if (targets.dim() != 3 || targets.size(2) != 5 || targets.size(0) != raw[0].size(0))
    throw UsageError("RtmdetLoss: targets must be [B, T, 5], got " + c10::str(targets.sizes()));
  // The loss runs in float32 whatever the forward's precision.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t B = raw[0].size(0);
  const Flat f = flatten(raw);
  // The targets in input pixels; one padding row when there are none.
  const torch::Tensor gt = loss::xyxy_pixel_rows(targets, B, img_h, img_w, f.boxes.device());
  const DslAssignment a = assign(f.boxes, f.logits, f.priors, gt);

  const auto avg = loss_normalizer(a.metrics.sum());  // at least 1 (loss/normalizer.hpp)
  // Quality focal loss over every prior and class: the target is the IoU at the assigned class.
  const auto classes = torch::arange(nc_, a.labels.options()).view({1, 1, nc_});
  const auto soft = (a.labels.unsqueeze(2) == classes).to(torch::kFloat) * a.metrics.unsqueeze(2);
  const auto loss_cls = focal_bce(f.logits, soft).sum() / avg;
  // GIoU of the positives' decoded boxes with their boxes, weighted by the metric.
  const auto p = [&](int64_t c) { return f.boxes.select(2, c); };
  const auto t = [&](int64_t c) { return a.boxes.select(2, c); };
  const auto iw = (torch::min(p(2), t(2)) - torch::max(p(0), t(0))).clamp_min(0);
  const auto ih = (torch::min(p(3), t(3)) - torch::max(p(1), t(1))).clamp_min(0);
  const auto inter = iw * ih;
  const auto area_p = (p(2) - p(0)).clamp_min(0) * (p(3) - p(1)).clamp_min(0);
  const auto area_t = (t(2) - t(0)).clamp_min(0) * (t(3) - t(1)).clamp_min(0);
  const auto union_ = area_p + area_t - inter;
  const auto ew = (torch::max(p(2), t(2)) - torch::min(p(0), t(0))).clamp_min(0);
  const auto eh = (torch::max(p(3), t(3)) - torch::min(p(1), t(1))).clamp_min(0);
  const auto enclose = ew * eh;
  const auto giou = inter / union_.clamp_min(kEps) - (enclose - union_) / enclose.clamp_min(kEps);
  const auto per_prior = torch::where(a.fg, (1 - giou) * a.metrics, torch::zeros({}, giou.options()));
  const auto loss_bbox = kBboxWeight * (per_prior.sum() / avg);

  LossOutput o;
  o.total = loss_cls + loss_bbox;
  o.terms = torch::stack({loss_cls, loss_bbox}).detach();
  o.num_fg = (a.fg.sum().to(torch::kFloat) / static_cast<double>(B)).detach();
  o.names = &term_names();
  return o;
}

}  // namespace libreyolo::models::rtmdet
