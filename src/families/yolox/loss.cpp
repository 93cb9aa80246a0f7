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

SimOtaAssignment YoloxLoss::assign(const torch::Tensor& outputs, const torch::Tensor& gt, const torch::Tensor& cells,
                                   const torch::Tensor& strides) const {
  return simota_assign(outputs, gt, cells, strides, {kCentreRadius, kCandidateTopK});
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
  const int64_t B = raw[0].size(0);
  const auto [cells, strides] = grid(raw);
  const auto flat = flatten(raw);  // [B, A, 5 + nc]
  const auto out = decode(flat, cells, strides);
  const auto dtype = flat.scalar_type();

  // Targets to (class, cx, cy, w, h) in input pixels; one padding row when there are none.
  const auto gt = simota_gt_rows(targets, B, img_h, img_w, flat);
  const SimOtaAssignment a = assign(out, gt, cells, strides);

  const auto fg = a.fg;
  const auto fgf = fg.to(dtype);
  const auto n = loss_normalizer(fgf.sum());  // positives, at least 1 (loss/normalizer.hpp)
  const auto idx = a.matched_gt.clamp_min(0);  // [B, A]
  const auto gt_rows = gt.gather(1, idx.unsqueeze(2).expand({-1, -1, 5}));  // [B, A, 5]
  const auto gt_box = gt_rows.narrow(2, 1, 4);
  const auto zero = torch::zeros({}, flat.options());
  const auto fg3 = fg.unsqueeze(2);

  // IoU loss 1 - IoU^2 on the positives.
  const auto loss_iou = positive_iou_loss_sum(out.narrow(2, 0, 4), gt_box, fg) / n;

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
