#include "families/rtdetr/boxes.hpp"

#include "libreyolo/errors.hpp"

namespace libreyolo::models::rtdetr {

torch::Tensor cxcywh_to_xyxy(const torch::Tensor& b) {
  const auto cx = b.select(-1, 0), cy = b.select(-1, 1), w = b.select(-1, 2), h = b.select(-1, 3);
  return torch::stack({cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h}, -1);
}

torch::Tensor xyxy_to_cxcywh(const torch::Tensor& b) {
  const auto x1 = b.select(-1, 0), y1 = b.select(-1, 1), x2 = b.select(-1, 2), y2 = b.select(-1, 3);
  return torch::stack({(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1}, -1);
}

Overlap box_overlap(const torch::Tensor& a, const torch::Tensor& b) {
  auto area = [](const torch::Tensor& t) {
    return (t.select(-1, 2) - t.select(-1, 0)) * (t.select(-1, 3) - t.select(-1, 1));
  };
  const auto a_lo = a.narrow(-1, 0, 2), a_hi = a.narrow(-1, 2, 2);
  const auto b_lo = b.narrow(-1, 0, 2), b_hi = b.narrow(-1, 2, 2);
  const auto wh = (torch::min(a_hi, b_hi) - torch::max(a_lo, b_lo)).clamp_min(0);
  const auto inter = wh.select(-1, 0) * wh.select(-1, 1);
  const auto uni = area(a) + area(b) - inter;
  Overlap o;
  o.iou = inter / (uni + 1e-6);
  const auto hull_wh = (torch::max(a_hi, b_hi) - torch::min(a_lo, b_lo)).clamp_min(0);
  const auto hull = hull_wh.select(-1, 0) * hull_wh.select(-1, 1);
  o.giou = o.iou - (hull - uni) / (hull + 1e-6);
  return o;
}

std::vector<ImageTargets> split_targets(const torch::Tensor& targets) {
  if (targets.dim() != 3 || targets.size(2) != 5)
    throw UsageError("RT-DETR targets must be [B, T, 5] (class, x1, y1, x2, y2), got " + c10::str(targets.sizes()));
  const auto t = targets.detach().to(torch::kFloat);
  const int64_t b = t.size(0), n = t.size(1);
  const auto keep =
      (t.select(2, 0) >= 0) & (t.select(2, 3) > t.select(2, 1)) & (t.select(2, 4) > t.select(2, 2));  // [B, T]
  // The mask reaches the host once; the kept rows of every image are gathered in one operation
  // and each image's entry is a slice of them.
  const auto mask = keep.to(torch::kCPU).contiguous();
  const bool* k = mask.data_ptr<bool>();
  std::vector<int64_t> kept, counts(static_cast<size_t>(b), 0);
  for (int64_t i = 0; i < b * n; ++i)
    if (k[i]) {
      kept.push_back(i);
      ++counts[static_cast<size_t>(i / n)];
    }
  const auto rows = t.reshape({b * n, 5}).index_select(0, torch::tensor(kept, torch::kLong).to(t.device()));
  const auto xyxy = rows.narrow(1, 1, 4);
  const auto wh = xyxy.narrow(1, 2, 2) - xyxy.narrow(1, 0, 2);
  const auto labels = rows.select(1, 0).to(torch::kLong);
  const auto boxes = torch::cat({xyxy.narrow(1, 0, 2) + wh / 2, wh}, 1);
  std::vector<ImageTargets> out;
  int64_t start = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t c = counts[static_cast<size_t>(i)];
    out.push_back({labels.narrow(0, start, c), boxes.narrow(0, start, c)});
    start += c;
  }
  return out;
}

}  // namespace libreyolo::models::rtdetr
