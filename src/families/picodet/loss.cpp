#include "families/picodet/loss.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <limits>

#include "core/log.hpp"
#include "families/picodet/model.hpp"
#include "libreyolo/errors.hpp"
#include "loss/normalizer.hpp"
#include "loss/simota.hpp"
#include "loss/targets.hpp"

namespace libreyolo::models::picodet {

namespace {

// inter / (union + 1e-16) of boxes a and b (broadcast, xyxy on the last dimension split into
// coordinates), the areas clamped at 0 when `clamp_areas`.
struct Pair {
  torch::Tensor inter, uni;
};
Pair overlap(const std::array<torch::Tensor, 4>& a, const std::array<torch::Tensor, 4>& b, bool clamp_areas) {
  const auto iw = (torch::min(a[2], b[2]) - torch::max(a[0], b[0])).clamp_min(0);
  const auto ih = (torch::min(a[3], b[3]) - torch::max(a[1], b[1])).clamp_min(0);
  const auto inter = iw * ih;
  auto wa = a[2] - a[0], ha = a[3] - a[1], wb = b[2] - b[0], hb = b[3] - b[1];
  if (clamp_areas) wa = wa.clamp_min(0), ha = ha.clamp_min(0), wb = wb.clamp_min(0), hb = hb.clamp_min(0);
  return {inter, wa * ha + wb * hb - inter};
}

std::array<torch::Tensor, 4> coords(const torch::Tensor& t, int64_t dim, bool keep_last = false) {
  std::array<torch::Tensor, 4> c;
  for (int64_t i = 0; i < 4; ++i) c[static_cast<size_t>(i)] = keep_last ? t.select(dim, i).unsqueeze(-1) : t.select(dim, i);
  return c;
}

}  // namespace

PicodetLoss::PicodetLoss(int nc) : nc_(nc) {
  if (nc < 1) throw UsageError(strfmt("PicodetLoss: number of classes must be >= 1, got %d", nc));
}

PicodetLoss::Flat PicodetLoss::flatten(const std::vector<torch::Tensor>& raw) const {
  const int64_t batch = raw[0].size(0), channels = nc_ + kBoxChannels;
  std::vector<torch::Tensor> maps, priors;
  for (size_t l = 0; l < raw.size(); ++l) {
    const auto& r = raw[l];
    const int64_t h = r.size(2), w = r.size(3);
    maps.push_back(r.to(torch::kFloat).permute({0, 2, 3, 1}).reshape({batch, h * w, channels}));
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(r.device());
    const double s = static_cast<double>(kStrides[l]);
    const auto yx = torch::meshgrid({(torch::arange(h, f32) + 0.5) * s, (torch::arange(w, f32) + 0.5) * s}, "ij");
    priors.push_back(torch::stack({yx[1].reshape({-1}), yx[0].reshape({-1}), torch::full({h * w}, s, f32)}, 1));
  }
  const auto x = torch::cat(maps, 1);
  Flat f;
  f.logits = x.narrow(2, 0, nc_);
  f.box_logits = x.narrow(2, nc_, kBoxChannels).reshape({batch, -1, 4, kRegMax + 1});
  f.priors = torch::cat(priors, 0);
  const auto bins = torch::arange(kRegMax + 1, x.options());
  const auto dist = (torch::softmax(f.box_logits, 3) * bins).sum(3) * f.priors.select(1, 2).view({1, -1, 1});
  const auto cx = f.priors.select(1, 0), cy = f.priors.select(1, 1);
  f.boxes = torch::stack({cx - dist.select(2, 0), cy - dist.select(2, 1), cx + dist.select(2, 2), cy + dist.select(2, 3)}, 2);
  return f;
}

SimOtaAssignment PicodetLoss::assign(const torch::Tensor& boxes_in, const torch::Tensor& logits_in,
                                     const torch::Tensor& priors, const torch::Tensor& gt) const {
  torch::NoGradGuard no_grad;
  const auto boxes = boxes_in.detach(), logits = logits_in.detach();
  const int64_t B = boxes.size(0), N = boxes.size(1), T = gt.size(1);
  const auto inf = std::numeric_limits<double>::infinity();
  // Ground truth [B, 1, T] against priors [1, N, 1].
  const auto g = [&](int64_t c) { return gt.select(2, c).unsqueeze(1); };
  const std::array<torch::Tensor, 4> gb{g(1), g(2), g(3), g(4)};
  const auto valid = (g(0) >= 0) & (gb[2] > gb[0]) & (gb[3] > gb[1]);  // [B, 1, T]
  const auto px = priors.select(1, 0).view({1, N, 1}), py = priors.select(1, 1).view({1, N, 1});
  const auto r = priors.select(1, 2).view({1, N, 1}) * kCentreRadius;
  const auto in_box = torch::min(torch::min(px - gb[0], py - gb[1]), torch::min(gb[2] - px, gb[3] - py)) > 0;
  const auto gcx = (gb[0] + gb[2]) * 0.5, gcy = (gb[1] + gb[3]) * 0.5;
  const auto in_ctr = torch::min(torch::min(px - (gcx - r), py - (gcy - r)), torch::min((gcx + r) - px, (gcy + r) - py)) > 0;
  const auto cand = ((in_box | in_ctr) & valid).any(2, /*keepdim=*/true);  // [B, N, 1]
  const auto ok = cand & valid;                                             // [B, N, T]

  // IoU of each decoded box with each box (areas as given, union + 1e-16).
  const auto o = overlap(coords(boxes, 2, true), gb, /*clamp_areas=*/false);
  const auto iou = o.inter / (o.uni + 1e-16);  // [B, N, T]
  // Class cost: sum over classes of -ln(1 - p), the box's class term replaced by -ln(p).
  const auto p = torch::sigmoid(logits).clamp(1e-7, 1 - 1e-7);
  const auto neg = -torch::log1p(-p);  // [B, N, nc]
  const auto cls = gt.select(2, 0).clamp(0, nc_ - 1).to(torch::kLong).unsqueeze(1).expand({B, N, T});
  const auto p_cls = p.gather(2, cls);  // [B, N, T]
  const auto cls_cost = neg.sum(2, /*keepdim=*/true) - neg.gather(2, cls) - torch::log(p_cls);
  auto cost = cls_cost + torch::log(iou + 1e-8) * -kIouWeight;
  cost = cost + torch::where(in_box & in_ctr, torch::zeros({}, cost.options()), torch::full({}, kOutsidePenalty, cost.options()));
  cost = torch::where(ok, cost, torch::full({}, inf, cost.options()));

  // Each box's dynamic k cheapest candidates; a prior several boxes took goes to its cheapest box.
  const auto match = loss::dynamic_k_match(cost, iou, ok, kTopK);

  SimOtaAssignment a;
  a.fg = match.any(2);
  a.gt_index = match.to(torch::kInt).argmax(2);
  const auto rows = gt.gather(1, a.gt_index.unsqueeze(2).expand({B, N, 5}));  // [B, N, 5]
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(cost.device());
  a.labels = torch::where(a.fg, rows.select(2, 0).to(torch::kLong), torch::full({}, int64_t{-1}, long_opts));
  a.boxes = torch::where(a.fg.unsqueeze(2), rows.narrow(2, 1, 4), torch::zeros({}, rows.options()));
  return a;
}

LossOutput PicodetLoss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets, int64_t img_h,
                                int64_t img_w) {
  if (raw.size() != kStrides.size())
    throw UsageError(strfmt("PicodetLoss: expected %zu level maps, got %zu", kStrides.size(), raw.size()));
  for (const auto& r : raw)
    if (r.dim() != 4 || r.size(1) != nc_ + kBoxChannels || r.size(0) != raw[0].size(0))
      throw UsageError(strfmt("PicodetLoss: level maps must be [B, %lld, H, W], got ",
                              static_cast<long long>(nc_ + kBoxChannels)) +
                       c10::str(r.sizes()));
  if (targets.dim() != 3 || targets.size(2) != 5 || targets.size(0) != raw[0].size(0))
    throw UsageError("PicodetLoss: targets must be [B, T, 5], got " + c10::str(targets.sizes()));
  // The loss runs in float32 whatever the forward's precision.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t B = raw[0].size(0);
  const Flat f = flatten(raw);
  // The targets in input pixels; one padding row when there are none.
  const torch::Tensor gt = loss::xyxy_pixel_rows(targets, B, img_h, img_w, f.boxes.device());
  const SimOtaAssignment a = assign(f.boxes, f.logits, f.priors, gt);
  const auto fgf = a.fg.to(torch::kFloat);
  const auto zero = torch::zeros({}, f.boxes.options());

  // IoU of each positive's decoded box with its box (clamped areas), the varifocal target.
  const auto pb = coords(f.boxes, 2), tb = coords(a.boxes, 2);
  const auto ov = overlap(pb, tb, /*clamp_areas=*/true);
  const auto iou = ov.inter / (ov.uni + 1e-16);  // [B, N]
  const auto classes = torch::arange(nc_, a.labels.options()).view({1, 1, nc_});
  const auto target = ((a.labels.unsqueeze(2) == classes).to(torch::kFloat) * iou.detach().clamp_min(1e-6).unsqueeze(2));
  const auto sig = torch::sigmoid(f.logits);
  const auto focal = torch::where(target > 0, target, kAlpha * (sig - target).abs().pow(2));
  const auto vfl = torch::binary_cross_entropy_with_logits(f.logits, target, {}, {}, at::Reduction::None) * focal;
  const auto loss_cls = vfl.sum() / loss_normalizer(fgf.sum());

  // Positives' weights: the detached best class score.
  const auto w = torch::where(a.fg, std::get<0>(sig.detach().max(2)), zero);  // [B, N]
  const auto w_sum = loss_normalizer(w.sum(), 1e-6);
  // 1 - GIoU (clamped widths, 1e-16 in the IoU and the enclosing term).
  const auto ew = (torch::max(pb[2], tb[2]) - torch::min(pb[0], tb[0])).clamp_min(0);
  const auto eh = (torch::max(pb[3], tb[3]) - torch::min(pb[1], tb[1])).clamp_min(0);
  const auto enclose = ew * eh;
  const auto giou = iou - (enclose - ov.uni) / (enclose + 1e-16);
  const auto loss_bbox = kBboxWeight * (torch::where(a.fg, w * (1 - giou), zero).sum() / w_sum);

  // DFL: each side's distance in strides, clamped to [0, 7 - 0.1], between its two bins.
  const auto s = f.priors.select(1, 2).view({1, -1});
  const auto cx = f.priors.select(1, 0).view({1, -1}) / s, cy = f.priors.select(1, 1).view({1, -1}) / s;
  const auto d = torch::stack({cx - tb[0] / s, cy - tb[1] / s, tb[2] / s - cx, tb[3] / s - cy}, 2)
                     .clamp(0, static_cast<double>(kRegMax) - 0.1);  // [B, N, 4]
  const auto left = d.to(torch::kLong);
  const auto right = (left + 1).clamp_max(kRegMax);
  const auto logp = torch::log_softmax(f.box_logits, 3);  // [B, N, 4, 8]
  const auto ce_left = -logp.gather(3, left.unsqueeze(3)).squeeze(3);
  const auto ce_right = -logp.gather(3, right.unsqueeze(3)).squeeze(3);
  const auto leftf = left.to(torch::kFloat);
  const auto dfl = (ce_left * (leftf + 1 - d) + ce_right * (d - leftf)) * kDflWeight;  // [B, N, 4]
  const auto loss_dfl = torch::where(a.fg, w * dfl.sum(2), zero).sum() / (w_sum * 4.0);

  LossOutput out;
  out.total = loss_cls + loss_bbox + loss_dfl;
  out.terms = torch::stack({loss_cls, loss_bbox, loss_dfl}).detach();
  out.num_fg = (fgf.sum() / static_cast<double>(B)).detach();
  out.names = &term_names();
  return out;
}

}  // namespace libreyolo::models::picodet
