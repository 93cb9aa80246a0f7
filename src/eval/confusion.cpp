#include "eval/confusion.hpp"

#include <algorithm>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "eval/coco_eval.hpp"

namespace libreyolo::eval {
namespace {

double iou_xyxy(const double* a, const double* b) {
  const double w = std::min(a[2], b[2]) - std::max(a[0], b[0]);
  const double h = std::min(a[3], b[3]) - std::max(a[1], b[1]);
  if (w <= 0 || h <= 0) return 0.0;
  const double inter = w * h;
  const double uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
  return uni > 0 ? inter / uni : 0.0;
}

}  // namespace

ConfusionMatrix::ConfusionMatrix(int num_classes, double conf, double iou)
    : nc_(num_classes), conf_(conf), iou_(iou) {
  if (num_classes <= 0 || num_classes > kMaxClasses)
    throw UsageError(strfmt("confusion matrix for %d classes: 1 to %d", num_classes, kMaxClasses));
  m_.assign(static_cast<size_t>(size()) * size(), 0);
}

void ConfusionMatrix::add_image(const torch::Tensor& gt_xyxy, const torch::Tensor& gt_classes,
                                const torch::Tensor& det_xyxy, const torch::Tensor& det_scores,
                                const torch::Tensor& det_classes) {
  const auto g = boxes_as_double(gt_xyxy, "ground-truth boxes");
  const auto gc = vector_as(gt_classes, g.size(0), torch::kLong, "ground-truth classes");
  const auto d = boxes_as_double(det_xyxy, "detection boxes");
  const auto ds = vector_as(det_scores, d.size(0), torch::kDouble, "detection scores");
  const auto dc = vector_as(det_classes, d.size(0), torch::kLong, "detection classes");
  const double* gp = g.data_ptr<double>();
  const double* dp = d.data_ptr<double>();
  const int64_t* gcp = gc.data_ptr<int64_t>();
  const int64_t* dcp = dc.data_ptr<int64_t>();
  const double* dsp = ds.data_ptr<double>();
  auto check = [&](int64_t c, const char* what) {
    if (c < 0 || c >= nc_)
      throw UsageError(strfmt("%s class %lld is outside 0..%d", what, static_cast<long long>(c), nc_ - 1));
    return static_cast<int>(c);
  };

  // Every class id is checked before anything is counted.
  for (int64_t i = 0; i < g.size(0); ++i) check(gcp[i], "ground-truth");
  for (int64_t j = 0; j < d.size(0); ++j) check(dcp[j], "detection");

  std::vector<int64_t> dets;  // detections above the confidence threshold
  for (int64_t j = 0; j < d.size(0); ++j)
    if (dsp[j] > conf_) dets.push_back(j);
  const int64_t G = g.size(0);

  struct Pair {
    int64_t g, d;
    double iou;
  };
  std::vector<Pair> pairs;
  for (int64_t i = 0; i < G; ++i)
    for (int64_t j : dets) {
      const double v = iou_xyxy(gp + 4 * i, dp + 4 * j);
      if (v > iou_) pairs.push_back({i, j, v});
    }
  // Best IoU first; one pair per detection, then one per ground truth.
  auto by_iou = [](const Pair& a, const Pair& b) { return a.iou > b.iou; };
  std::stable_sort(pairs.begin(), pairs.end(), by_iou);
  std::vector<Pair> kept;
  std::vector<uint8_t> det_used(d.size(0), 0), gt_used(G, 0);
  for (const Pair& p : pairs)
    if (!det_used[p.d]) det_used[p.d] = 1, kept.push_back(p);
  std::vector<int64_t> gt_match(G, -1);
  std::fill(det_used.begin(), det_used.end(), 0);
  for (const Pair& p : kept)
    if (!gt_used[p.g]) gt_used[p.g] = 1, gt_match[p.g] = p.d, det_used[p.d] = 1;

  const int bg = nc_;
  for (int64_t i = 0; i < G; ++i) {
    const int t = check(gcp[i], "ground-truth");
    const int p = gt_match[i] >= 0 ? check(dcp[gt_match[i]], "detection") : bg;
    ++m_[static_cast<size_t>(p) * size() + t];
  }
  for (int64_t j : dets)
    if (!det_used[j]) ++m_[static_cast<size_t>(check(dcp[j], "detection")) * size() + bg];
}

std::vector<double> normalize_columns(const std::vector<int64_t>& counts, int n) {
  std::vector<double> out(counts.size(), 0.0);
  for (int t = 0; t < n; ++t) {
    int64_t sum = 0;
    for (int p = 0; p < n; ++p) sum += counts[static_cast<size_t>(p) * n + t];
    if (sum == 0) continue;
    for (int p = 0; p < n; ++p)
      out[static_cast<size_t>(p) * n + t] = static_cast<double>(counts[static_cast<size_t>(p) * n + t]) / sum;
  }
  return out;
}

std::vector<double> ConfusionMatrix::normalized() const { return normalize_columns(m_, size()); }

}  // namespace libreyolo::eval
