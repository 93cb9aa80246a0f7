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

Assignment Yolo7Loss::assign(const torch::Tensor& predictions, const torch::Tensor& gt, const torch::Tensor& cells,
                             const torch::Tensor& strides) const {
  return loss::simota_assign(predictions, gt, cells, strides, {kCentreRadius, kCandidateTopK});
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
  const int64_t B = raw[0].size(0);
  const auto out = predictions(raw);  // [B, A, 5 + nc]
  const auto g = grid(raw);
  const auto dtype = out.scalar_type();

  // Targets to (class, cx, cy, w, h) in input pixels; one padding row when there are none.
  const auto gt = loss::simota_gt_rows(targets, B, img_h, img_w, out);
  const Assignment a = assign(out, gt, g->cells, g->strides);

  const auto fg = a.fg, fg3 = fg.unsqueeze(2);
  const auto fgf = fg.to(dtype);
  const auto n = loss_normalizer(fgf.sum());  // positives, at least 1 (loss/normalizer.hpp)
  const auto gt_rows = gt.gather(1, a.matched_gt.clamp_min(0).unsqueeze(2).expand({-1, -1, 5}));  // [B, A, 5]
  const auto gt_box = gt_rows.narrow(2, 1, 4);
  const auto zero = torch::zeros({}, out.options());

  // IoU loss 1 - IoU^2 on the positives.
  const auto loss_iou = loss::positive_iou_loss_sum(out.narrow(2, 0, 4), gt_box, fg) / n;

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
