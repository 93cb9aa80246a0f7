#include "families/yolo9/loss.hpp"

#include "loss/normalizer.hpp"

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>
#include <libreyolo/errors.hpp>
#include <sstream>

#include "core/log.hpp"
#include "ops/dfl.hpp"

#ifdef LIBREYOLO_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "core/env.hpp"
#include "kernels/assign.hpp"
#endif

namespace libreyolo::loss {
namespace {

constexpr double kEps = 1e-7;                       // CIoU epsilon
constexpr double kNormEps = 1e-9;                   // soft-target normaliser epsilon
constexpr double kAtanScale = 4.0 / (M_PI * M_PI);  // CIoU aspect-ratio term
constexpr size_t kMaxCachedGrids = 8;

// Half-precision inputs are promoted to float32 (the reference computes the loss in float32);
// float64 stays float64 so finite-difference checks can run in double.
torch::ScalarType compute_dtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

}  // namespace

torch::Tensor ciou(const torch::Tensor& box1, const torch::Tensor& box2, int64_t dim) {
  if (box1.size(dim) != 4 || box2.size(dim) != 4)
    throw UsageError(strfmt("ciou: boxes need 4 coordinates along dim %lld, got %s and %s",
                            static_cast<long long>(dim), shape_of(box1).c_str(),
                            shape_of(box2).c_str()));
  const auto a = box1.to(compute_dtype(box1)).unbind(dim);
  const auto b = box2.to(compute_dtype(box2)).unbind(dim);
  const auto &ax1 = a[0], &ay1 = a[1], &ax2 = a[2], &ay2 = a[3];
  const auto &bx1 = b[0], &by1 = b[1], &bx2 = b[2], &by2 = b[3];

  const auto inter = (at::minimum(ax2, bx2) - at::maximum(ax1, bx1)).clamp_min(0) *
                     (at::minimum(ay2, by2) - at::maximum(ay1, by1)).clamp_min(0);
  const auto aw = ax2 - ax1, ah = ay2 - ay1, bw = bx2 - bx1, bh = by2 - by1;
  const auto iou = inter / (aw * ah + bw * bh - inter + kEps);
  const auto centre_dist =
      ((ax2 + ax1) / 2 - (bx2 + bx1) / 2).square() + ((ay2 + ay1) / 2 - (by2 + by1) / 2).square();
  const auto cw = at::maximum(ax2, bx2) - at::minimum(ax1, bx1);
  const auto ch = at::maximum(ay2, by2) - at::minimum(ay1, by1);
  const auto diou = iou - centre_dist / (cw.square() + ch.square() + kEps);
  const auto v = (at::atan(aw / (ah + kEps)) - at::atan(bw / (bh + kEps))).square() * kAtanScale;
  torch::Tensor alpha;
  {
    torch::NoGradGuard no_grad;  // the reference computes alpha without gradient
    alpha = v / (v - iou + 1 + kEps);
  }
  return diou - alpha * v;
}

torch::Tensor pairwise_ciou(const torch::Tensor& gt_in, const torch::Tensor& pred_in) {
  if (gt_in.dim() != 3 || gt_in.size(2) != 4 || pred_in.dim() != 3 || pred_in.size(1) != 4 ||
      gt_in.size(0) != pred_in.size(0))
    throw UsageError("pairwise_ciou: expected gt [B, T, 4] and pred [B, 4, A], got " +
                     shape_of(gt_in) + " and " + shape_of(pred_in));
  torch::NoGradGuard no_grad;
  const auto dtype = compute_dtype(pred_in);
  const auto gt = gt_in.detach().to(dtype);
  const auto pred = pred_in.detach().to(dtype);
  // Per-box terms on [B, T, 1] and [B, 1, A]; the [B, T, A] work below reuses four buffers.
  const auto g = [&](int64_t k) { return gt.select(2, k).unsqueeze(2); };
  const auto p = [&](int64_t k) { return pred.select(1, k).unsqueeze(1); };
  const auto gx1 = g(0), gy1 = g(1), gx2 = g(2), gy2 = g(3);
  const auto px1 = p(0), py1 = p(1), px2 = p(2), py2 = p(3);
  const auto gw = gx2 - gx1, gh = gy2 - gy1, pw = px2 - px1, ph = py2 - py1;
  const auto g_area = gw * gh, p_area = pw * ph;
  const auto g_cx = (gx2 + gx1) / 2, g_cy = (gy2 + gy1) / 2;
  const auto p_cx = (px2 + px1) / 2, p_cy = (py2 + py1) / 2;
  const auto g_atan = at::atan(gw / (gh + kEps)), p_atan = at::atan(pw / (ph + kEps));

  // The operation order follows the elementwise formula, so both give the same bits.
  auto iou = at::minimum(gx2, px2);
  auto s = at::maximum(gx1, px1);
  iou.sub_(s).clamp_min_(0);
  at::minimum_out(s, gy2, py2);
  auto u = at::maximum(gy1, py1);
  s.sub_(u).clamp_min_(0);
  iou.mul_(s);  // intersection
  at::add_out(s, g_area, p_area).sub_(iou).add_(kEps);
  iou.div_(s);  // IoU
  at::maximum_out(s, gx2, px2);
  at::minimum_out(u, gx1, px1);
  s.sub_(u).square_();
  auto v = at::maximum(gy2, py2);
  at::minimum_out(u, gy1, py1);
  v.sub_(u).square_();
  s.add_(v).add_(kEps);  // enclosing box diagonal squared
  at::sub_out(u, g_cx, p_cx).square_();
  at::sub_out(v, g_cy, p_cy).square_();
  u.add_(v).div_(s);                                          // centre distance term
  at::sub_out(u, iou, u);                                     // DIoU
  at::sub_out(s, g_atan, p_atan).square_().mul_(kAtanScale);  // aspect term v
  at::sub_out(v, s, iou).add_(1).add_(kEps);
  at::div_out(v, s, v);  // alpha
  u.sub_(v.mul_(s));
  return u;
}

torch::Tensor dfl_per_anchor(const torch::Tensor& logits, const torch::Tensor& target) {
  if (logits.dim() != 4 || logits.size(1) != 4 || target.dim() != 3 ||
      target.size(0) != logits.size(0) || target.size(1) != 4 || target.size(2) != logits.size(3))
    throw UsageError("dfl_per_anchor: expected logits [B, 4, R, A] and target [B, 4, A], got " +
                     shape_of(logits) + " and " + shape_of(target));
  const int64_t bins = logits.size(2);
  if (bins < 2) throw UsageError("dfl_per_anchor: need at least 2 bins");
  const auto logp = at::log_softmax(logits.to(compute_dtype(logits)), 2);
  const auto t = target.detach().to(logp.scalar_type()).clamp(0, bins - 1.01);
  const auto left = t.floor();
  const auto idx = left.to(torch::kLong).unsqueeze(2);
  const auto lp = logp.gather(2, at::cat({idx, idx + 1}, 2));  // [B, 4, 2, A]
  const auto ce = -(lp.select(2, 0) * (left + 1 - t) + lp.select(2, 1) * (t - left));
  return ce.mean(1);
}

Yolo9Loss::Yolo9Loss(int nc, std::vector<int64_t> strides, int reg_max, double aux_weight)
    : nc_(nc), strides_(std::move(strides)), reg_max_(reg_max), aux_weight_(aux_weight) {
  if (!(aux_weight_ >= 0)) throw UsageError(strfmt("Yolo9Loss: aux_weight must be >= 0, got %g", aux_weight_));
  if (nc_ < 1) throw UsageError(strfmt("Yolo9Loss: nc must be >= 1, got %d", nc_));
  if (reg_max_ < 2) throw UsageError(strfmt("Yolo9Loss: reg_max must be >= 2, got %d", reg_max_));
  if (strides_.empty()) throw UsageError("Yolo9Loss: no strides given");
  for (auto s : strides_)
    if (s < 1)
      throw UsageError(
          strfmt("Yolo9Loss: strides must be positive, got %lld", static_cast<long long>(s)));
}

const AnchorGrid& Yolo9Loss::anchor_grid(const std::vector<std::array<int64_t, 2>>& level_hw,
                                         const torch::Device& device) {
  for (const auto& g : grids_)
    if (g->device == device && g->level_hw == level_hw) return *g;
  if (level_hw.size() != strides_.size())
    throw UsageError(strfmt("Yolo9Loss: %zu levels given, the loss has %zu strides",
                            level_hw.size(), strides_.size()));
  // Built with device kernels only (no host-to-device copy), so it is safe during a capture.
  const auto fopt = torch::TensorOptions().dtype(torch::kFloat).device(device);
  AnchorGrid g;
  g.device = device;
  g.level_hw = level_hw;
  g.points = ops::make_anchor_points(level_hw, strides_, reg_max_, device);
  std::vector<torch::Tensor> col_x, col_s, row_y, row_s;
  for (size_t l = 0; l < level_hw.size(); ++l) {
    const int64_t s = strides_[l], h = level_hw[l][0], w = level_hw[l][1];
    col_x.push_back(ops::cell_centres(w, s, device));
    row_y.push_back(ops::cell_centres(h, s, device));
    col_s.push_back(torch::full({w}, static_cast<double>(s), fopt));
    row_s.push_back(torch::full({h}, static_cast<double>(s), fopt));
  }
  g.col_x = torch::cat(col_x);
  g.col_stride = torch::cat(col_s);
  g.row_y = torch::cat(row_y);
  g.row_stride = torch::cat(row_s);
  g.xy = g.points.xy;
  g.stride = g.points.stride;
  g.xy_grid = g.xy / g.stride;
  if (grids_.size() >= kMaxCachedGrids) grids_.pop_front();
  grids_.push_back(std::make_shared<const AnchorGrid>(std::move(g)));
  return *grids_.back();
}

void Yolo9Loss::check_inputs(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                             int64_t img_h, int64_t img_w) const {
  if (raw.size() != strides_.size())
    throw UsageError(strfmt("Yolo9Loss: expected %zu raw maps (one per stride)%s, got %zu", strides_.size(),
                            aux_weight_ > 0 ? strfmt(" or %zu (with the auxiliary head's)", 2 * strides_.size()).c_str()
                                            : "",
                            raw.size()));
  const int64_t channels = 4 * static_cast<int64_t>(reg_max_) + nc_;
  for (size_t l = 0; l < raw.size(); ++l) {
    const auto& r = raw[l];
    if (!r.defined() || r.dim() != 4 || r.size(1) != channels || r.size(0) != raw[0].size(0) ||
        r.size(2) < 1 || r.size(3) < 1)
      throw UsageError(strfmt("Yolo9Loss: raw map %zu must be [B, %lld, H, W], got %s", l,
                              static_cast<long long>(channels),
                              r.defined() ? shape_of(r).c_str() : "undefined"));
    if (!r.is_floating_point() || r.device() != raw[0].device())
      throw UsageError(strfmt("Yolo9Loss: raw map %zu must be floating point on %s", l,
                              raw[0].device().str().c_str()));
  }
  if (!targets.defined() || targets.dim() != 3 || targets.size(0) != raw[0].size(0) ||
      targets.size(2) != 5 || !targets.is_floating_point())
    throw UsageError(strfmt("Yolo9Loss: targets must be a float tensor [%lld, T, 5], got %s",
                            static_cast<long long>(raw[0].size(0)),
                            targets.defined() ? shape_of(targets).c_str() : "undefined"));
  if (img_h < 1 || img_w < 1)
    throw UsageError(strfmt("Yolo9Loss: bad image size %lldx%lld", static_cast<long long>(img_h),
                            static_cast<long long>(img_w)));
  // Class ids are checked only where that costs no device synchronisation; on the GPU the
  // assigner clamps them so a bad id cannot fault a kernel.
  if (targets.device().is_cpu() && targets.size(1) > 0 &&
      targets.select(2, 0).ge(nc_).any().item<bool>())
    throw DataError(strfmt("Yolo9Loss: a target class id is >= nc (%d)", nc_));
}

Decoded Yolo9Loss::decode(const std::vector<torch::Tensor>& raw, const AnchorGrid& grid) const {
  const int64_t B = raw[0].size(0), R = reg_max_;
  std::vector<torch::Tensor> flat;
  flat.reserve(raw.size());
  for (const auto& r : raw) flat.push_back(r.flatten(2));
  const auto x = at::cat(flat, 2).to(compute_dtype(raw[0]));  // [B, 4R + nc, A]
  const int64_t A = x.size(2);
  Decoded d;
  d.box_logits = x.narrow(1, 0, 4 * R).view({B, 4, R, A});
  d.cls_logits = x.narrow(1, 4 * R, nc_);
  d.boxes = ops::dfl_boxes(d.box_logits, grid.points);
  return d;
}

namespace {

#ifdef LIBREYOLO_CUDA_KERNELS
// On unless LIBREYOLO_ASSIGN_KERNEL turns it off (then the composed ops, for comparisons).
bool assign_kernel_enabled() {
  static const bool on = env_switch_on("LIBREYOLO_ASSIGN_KERNEL");
  return on;
}

// [B, 4, A] or [B, C, A] with anchors adjacent and rows A apart (any batch stride).
bool rows_of_anchors(const torch::Tensor& t) {
  return t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2);
}
#endif

}  // namespace

std::pair<torch::Tensor, torch::Tensor> Yolo9Loss::pair_metrics(const torch::Tensor& gt_box, const torch::Tensor& boxes,
                                                                const torch::Tensor& cls_logits,
                                                                const torch::Tensor& gt_cls) const {
  const int64_t B = boxes.size(0), A = boxes.size(2), T = gt_box.size(1);
#ifdef LIBREYOLO_CUDA_KERNELS
  static_assert(kClsFactor == 0.5 && kIouFactor == 6.0, "kernels/assign.cu computes score^0.5 * iou^6");
  if (assign_kernel_enabled() && boxes.is_cuda() && boxes.scalar_type() == torch::kFloat &&
      cls_logits.scalar_type() == torch::kFloat && rows_of_anchors(boxes) && rows_of_anchors(cls_logits)) {
    const auto gt = gt_box.contiguous();
    const auto cls = gt_cls.contiguous();
    auto iou = torch::empty({B, T, A}, boxes.options());
    auto align = torch::empty({B, T, A}, boxes.options());
    c10::cuda::CUDAGuard guard(boxes.device());
    kernels::AssignMetricsLaunch l;
    l.batch = B;
    l.boxes = T;
    l.anchors = A;
    l.pred_batch_stride = boxes.stride(0);
    l.cls_batch_stride = cls_logits.stride(0);
    l.eps = static_cast<float>(kEps);
    l.atan_scale = static_cast<float>(kAtanScale);
    l.stream = c10::cuda::getCurrentCUDAStream(boxes.device().index()).stream();
    kernels::assign_metrics(l, gt.data_ptr<float>(), boxes.data_ptr<float>(), cls_logits.data_ptr<float>(),
                            cls.data_ptr<int64_t>(), iou.data_ptr<float>(), align.data_ptr<float>());
    return {iou, align};
  }
#endif
  const auto iou = pairwise_ciou(gt_box, boxes).clamp_(0, 1);
  auto align = cls_logits.sigmoid().pow_(kClsFactor).gather(1, gt_cls.unsqueeze(2).expand({B, T, A}));
  align.mul_(iou.pow(kIouFactor));
  return {iou, align};
}

Assignment Yolo9Loss::assign(const torch::Tensor& cls_logits_in, const torch::Tensor& boxes_in,
                             const torch::Tensor& targets, const AnchorGrid& grid) const {
  torch::NoGradGuard no_grad;
  const auto dtype = compute_dtype(boxes_in);
  const auto cls_logits = cls_logits_in.detach().to(dtype);
  const auto boxes = boxes_in.detach().to(dtype);
  const int64_t B = boxes.size(0), A = boxes.size(2), T = targets.size(1);
  const int64_t k = std::min<int64_t>(kTopK, A);
  const auto lopt = torch::TensorOptions().dtype(torch::kLong).device(boxes.device());
  const auto fopt = torch::TensorOptions().dtype(dtype).device(boxes.device());

  const auto tg = targets.detach().to(boxes.device(), dtype);
  const auto padding = tg.select(2, 0).lt(0);
  const auto gt_cls = tg.select(2, 0).to(torch::kLong).clamp_(0, nc_ - 1);  // [B, T]
  // A zero box never matches: no anchor lies inside it and its CIoU clamps to 0.
  const auto gt_box = tg.narrow(2, 1, 4).masked_fill(padding.unsqueeze(2), 0);  // [B, T, 4]

  auto [iou, align] = pair_metrics(gt_box, boxes, cls_logits, gt_cls);  // [B, T, A] each

  // Fallback for a ground truth left without candidates: its best anchor anywhere.
  const auto best = align.max(2);
  const auto& best_align = std::get<0>(best);
  const auto& best_idx = std::get<1>(best);

  // Grid mask, applied in place: the anchor lies inside the box (edges included) and all four
  // distances are within reg_max - 1.01 strides. Per axis the test is separable, so it is built
  // on [B, T, columns] and [B, T, rows] of all levels and broadcast into each [B, T, H, W] slice.
  const double reach = reg_max_ - 1.01;
  const auto within = [&](const torch::Tensor& dist, const torch::Tensor& stride) {
    const auto n = dist / stride;
    return n.ge(0).logical_and_(n.le(reach));
  };
  const auto in_x = within(grid.col_x - gt_box.narrow(2, 0, 1), grid.col_stride)
                        .logical_and_(within(gt_box.narrow(2, 2, 1) - grid.col_x, grid.col_stride));
  const auto in_y = within(grid.row_y - gt_box.narrow(2, 1, 1), grid.row_stride)
                        .logical_and_(within(gt_box.narrow(2, 3, 1) - grid.row_y, grid.row_stride));
  int64_t offset = 0, col_at = 0, row_at = 0;
  for (const auto& hw : grid.level_hw) {
    const int64_t h = hw[0], w = hw[1];
    align.narrow(2, offset, h * w)
        .view({B, T, h, w})
        .mul_(in_y.narrow(2, row_at, h).unsqueeze(3))
        .mul_(in_x.narrow(2, col_at, w).unsqueeze(2));
    offset += h * w;
    row_at += h;
    col_at += w;
  }

  // Candidates: the top k in-grid anchors of each ground truth with a positive alignment.
  auto top = align.topk(k, 2);
  auto cand_align = std::get<0>(top);  // [B, T, k]
  auto cand_idx = std::get<1>(top);
  auto ok = cand_align.gt(0);
  const auto need = ok.any(2).logical_not_().logical_and_(best_align.gt(0));  // [B, T]
  auto idx0 = cand_idx.select(2, 0);
  idx0.copy_(at::where(need, best_idx, idx0));
  auto align0 = cand_align.select(2, 0);
  align0.copy_(at::where(need, best_align, align0));
  ok.select(2, 0).logical_or_(need);
  const auto cand_iou = iou.gather(2, cand_idx);

  // An anchor claimed by several ground truths keeps the one with the highest IoU (the first
  // such row on ties). Claims have IoU > 0, so 0 is a neutral start for the maximum.
  const auto flat_idx = cand_idx.reshape({B, T * k});
  const auto claim_iou = cand_iou.masked_fill(ok.logical_not(), 0).reshape({B, T * k});
  const auto best_iou = torch::zeros({B, A}, fopt).scatter_reduce_(1, flat_idx, claim_iou, "amax");
  const auto row = torch::arange(T, lopt).view({1, T, 1}).expand({B, T, k});
  const auto is_best = ok.logical_and(cand_iou.eq(best_iou.gather(1, flat_idx).view({B, T, k})));
  const auto winner =
      torch::full({B, A}, T, lopt)
          .scatter_reduce_(1, flat_idx, at::where(is_best, row, T).reshape({B, T * k}), "amin");
  const auto survive = ok.logical_and(row.eq(winner.gather(1, flat_idx).view({B, T, k})));

  // Soft class target of a surviving claim: align / (its row's max align + 1e-9) * max IoU.
  const auto s_align = cand_align.masked_fill(survive.logical_not(), 0);
  const auto s_iou = cand_iou.masked_fill(survive.logical_not(), 0);
  const auto norm = s_align / (s_align.amax(2, true) + kNormEps) * s_iou.amax(2, true);

  Assignment a;
  a.valid = winner.lt(T);
  a.gt_index = winner.masked_fill(a.valid.logical_not(), 0);
  // Each anchor has at most one surviving claim; the others contribute 0 to the maximum.
  a.score =
      torch::zeros({B, A}, fopt).scatter_reduce_(1, flat_idx, norm.reshape({B, T * k}), "amax");
  a.classes = gt_cls.gather(1, a.gt_index);
  a.boxes = gt_box.transpose(1, 2).gather(2, a.gt_index.unsqueeze(1).expand({B, 4, A}));
  return a;
}

LossOutput Yolo9Loss::loss_terms(const Decoded& d, const Assignment& a,
                                 const AnchorGrid& grid) const {
  const int64_t B = d.boxes.size(0);
  const auto score = a.score.to(d.boxes.scalar_type());
  // N: the sum of the soft targets over the batch, at least 1 (under data parallelism: the mean
  // over the processes of that sum, loss/normalizer.hpp).
  const auto norm = loss_normalizer(score.sum());

  auto cls_target = torch::zeros(d.cls_logits.sizes(), d.cls_logits.options());
  cls_target.scatter_(1, a.classes.unsqueeze(1), score.unsqueeze(1));
  const auto l_cls =
      at::binary_cross_entropy_with_logits(d.cls_logits, cls_target, {}, {}, at::Reduction::Sum) /
      norm;

  // Box and DFL work in grid units of each anchor's level; non-positives have weight 0.
  const auto pred = d.boxes / grid.stride;
  const auto target = a.boxes.to(pred.scalar_type()) / grid.stride;
  const auto l_box = ((1 - ciou(pred, target, 1)) * score).sum() / norm;
  const auto dist =
      at::cat({grid.xy_grid - target.narrow(1, 0, 2), target.narrow(1, 2, 2) - grid.xy_grid}, 1);
  const auto l_dfl = (dfl_per_anchor(d.box_logits, dist) * score).sum() / norm;

  LossOutput out;
  const auto box = l_box * kBoxGain, dfl = l_dfl * kDflGain, cls = l_cls * kClsGain;
  out.total = box + dfl + cls;
  out.terms = at::stack({box, cls, dfl}).detach();
  out.names = &term_names();
  out.num_fg = a.valid.sum().to(torch::kFloat) / static_cast<double>(B);
  return out;
}

LossOutput Yolo9Loss::compute(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                              int64_t img_h, int64_t img_w) {
  const size_t levels = strides_.size();
  if (aux_weight_ > 0 && raw.size() == 2 * levels) {
    // Main head, then the auxiliary one: each assigned on its own predictions; every term is
    // main + aux_weight * aux. Positives are the main head's.
    const std::vector<torch::Tensor> main(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(levels));
    const std::vector<torch::Tensor> aux(raw.begin() + static_cast<std::ptrdiff_t>(levels), raw.end());
    LossOutput out = compute_head(main, targets, img_h, img_w);
    const LossOutput a = compute_head(aux, targets, img_h, img_w);
    out.total = out.total + aux_weight_ * a.total;
    out.terms = out.terms + aux_weight_ * a.terms;
    return out;
  }
  return compute_head(raw, targets, img_h, img_w);
}

LossOutput Yolo9Loss::compute_head(const std::vector<torch::Tensor>& raw, const torch::Tensor& targets,
                                   int64_t img_h, int64_t img_w) {
  check_inputs(raw, targets, img_h, img_w);
  // Autocast must not lower any of this: the reference runs the loss in float32.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto device = raw[0].device();
  const int64_t B = raw[0].size(0), T = targets.size(1);
  std::vector<std::array<int64_t, 2>> level_hw;
  for (const auto& r : raw) level_hw.push_back({r.size(2), r.size(3)});
  const AnchorGrid& grid = anchor_grid(level_hw, device);
  const Decoded d = decode(raw, grid);

  // Targets to input pixels. With no rows at all, one padding row stands in (no positives).
  torch::Tensor px;
  if (T == 0) {
    px = torch::zeros({B, 1, 5}, d.boxes.options());
    px.select(2, 0).fill_(-1);
  } else {
    px = targets.detach().to(device, d.boxes.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    auto xyxy = px.narrow(2, 1, 4).view({B, T, 2, 2});
    xyxy.select(3, 0).mul_(static_cast<double>(img_w));
    xyxy.select(3, 1).mul_(static_cast<double>(img_h));
  }
  const Assignment a = assign(d.cls_logits, d.boxes, px, grid);
  return loss_terms(d, a, grid);
}

}  // namespace libreyolo::loss
