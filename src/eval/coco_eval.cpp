#include "eval/coco_eval.hpp"

#include <algorithm>
#include <cmath>
#include <libreyolo/errors.hpp>
#include <limits>

#include "core/log.hpp"

namespace libreyolo::eval {
namespace {

constexpr int kIous = 10;       // IoU thresholds .50:.05:.95
constexpr int kRecalls = 101;   // recall thresholds 0:.01:1
constexpr int kAreas = 4;       // all, small, medium, large
constexpr int kMaxDetCuts = 3;  // maxDets 1, 10, 100
constexpr int kMaxDets[kMaxDetCuts] = {1, 10, 100};
constexpr int kMaxDet = 100;
constexpr double kAreaLo[kAreas] = {0.0, 0.0, 32.0 * 32.0, 96.0 * 96.0};
constexpr double kAreaHi[kAreas] = {1e10, 32.0 * 32.0, 96.0 * 96.0, 1e10};

// COCOeval builds its thresholds with numpy.linspace (start + i*step, exact end point); the same
// arithmetic here keeps threshold comparisons identical bit for bit.
std::array<double, kIous> iou_thresholds() {
  std::array<double, kIous> t{};
  const double step = (0.95 - 0.5) / (kIous - 1);
  for (int i = 0; i < kIous; ++i) t[i] = i * step + 0.5;
  t[kIous - 1] = 0.95;
  return t;
}

std::array<double, kRecalls> recall_thresholds() {
  std::array<double, kRecalls> r{};
  const double step = 1.0 / (kRecalls - 1);
  for (int i = 0; i < kRecalls; ++i) r[i] = i * step;
  r[kRecalls - 1] = 1.0;
  return r;
}

// IoU of two xywh boxes with the operation order of COCO's mask API (right edge = x + w,
// union = (area_d + area_g) - intersection), so that IoUs sitting exactly on a threshold compare
// the same way.
inline double box_iou(const DetBox& d, const GtBox& g) {
  const double w = std::min(d.x + d.w, g.x + g.w) - std::max(d.x, g.x);
  if (w <= 0) return 0.0;
  const double h = std::min(d.y + d.h, g.y + g.h) - std::max(d.y, g.y);
  if (h <= 0) return 0.0;
  const double inter = w * h;
  const double uni = d.w * d.h + g.w * g.h - inter;
  return inter / uni;
}

bool finite_all(std::initializer_list<double> values) {
  for (double v : values)
    if (!std::isfinite(v)) return false;
  return true;
}

// Sorted unique copy.
std::vector<int64_t> sorted_unique(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

template <typename T>
int64_t index_in(const std::vector<T>& sorted, T value) {
  auto it = std::lower_bound(sorted.begin(), sorted.end(), value);
  if (it == sorted.end() || *it != value) return -1;
  return it - sorted.begin();
}

// Mean of the entries that are not -1 (COCOeval's "valid" entries); -1 when there are none.
template <typename Visit>
double mean_valid(Visit&& visit) {
  double sum = 0.0;
  int64_t n = 0;
  visit([&](double v) {
    if (v > -1.0) {
      sum += v;
      ++n;
    }
  });
  return n ? sum / static_cast<double>(n) : -1.0;
}

}  // namespace

std::vector<std::pair<std::string, double>> CocoStats::metrics() const {
  static const char* const kKeys[12] = {
      "metrics/mAP50-95",   "metrics/mAP50",     "metrics/mAP75",     "metrics/mAP_small",
      "metrics/mAP_medium", "metrics/mAP_large", "metrics/AR1",       "metrics/AR10",
      "metrics/AR100",      "metrics/AR_small",  "metrics/AR_medium", "metrics/AR_large"};
  std::vector<std::pair<std::string, double>> out;
  out.reserve(14);
  for (int i = 0; i < 12; ++i) out.emplace_back(kKeys[i], stats[i]);
  out.emplace_back("metrics/precision", precision);
  out.emplace_back("metrics/recall", recall);
  return out;
}

void CocoEvaluator::add_ground_truth(const std::vector<GtBox>& boxes) {
  for (const auto& b : boxes) {
    if (!finite_all({b.x, b.y, b.w, b.h, b.area}))
      throw DataError(strfmt("ground-truth box of image %lld has a non-finite value",
                             static_cast<long long>(b.image_id)));
    if (b.w < 0 || b.h < 0 || b.area < 0)
      throw DataError(strfmt("ground-truth box of image %lld has a negative size or area",
                             static_cast<long long>(b.image_id)));
  }
  gts_.insert(gts_.end(), boxes.begin(), boxes.end());
  for (const auto& b : boxes)
    if (images_.empty() || images_.back() != b.image_id) images_.push_back(b.image_id);
}

void CocoEvaluator::add_detections(const std::vector<DetBox>& boxes) {
  for (const auto& b : boxes) {
    if (!finite_all({b.x, b.y, b.w, b.h, b.score}))
      throw DataError(strfmt("detection of image %lld has a non-finite value",
                             static_cast<long long>(b.image_id)));
    if (b.w < 0 || b.h < 0)
      throw DataError(strfmt("detection of image %lld has a negative width or height",
                             static_cast<long long>(b.image_id)));
  }
  dets_.insert(dets_.end(), boxes.begin(), boxes.end());
  for (const auto& b : boxes)
    if (images_.empty() || images_.back() != b.image_id) images_.push_back(b.image_id);
}

// [n,4] boxes as a contiguous double tensor; n = 0 may also come as an empty tensor of any shape.
torch::Tensor boxes_as_double(const torch::Tensor& t, const char* what) {
  if (!t.defined() || t.numel() == 0) return torch::empty({0, 4}, torch::kDouble);
  if (t.dim() != 2 || t.size(1) != 4)
    throw UsageError(strfmt("%s must have shape [N,4], got %s", what, c10::str(t.sizes()).c_str()));
  return t.to(torch::kCPU, torch::kDouble).contiguous();
}

torch::Tensor vector_as(const torch::Tensor& t, int64_t n, torch::ScalarType type,
                        const char* what) {
  const int64_t got = t.defined() ? t.numel() : 0;
  if (got != n)
    throw UsageError(strfmt("%s has %lld values for %lld boxes", what, static_cast<long long>(got),
                            static_cast<long long>(n)));
  if (n == 0) return torch::empty({0}, type);
  return t.reshape({n}).to(torch::kCPU, type).contiguous();
}

void CocoEvaluator::add_image(int64_t image_id, int orig_h, int orig_w,
                              const torch::Tensor& gt_xyxy, const torch::Tensor& gt_classes,
                              const torch::Tensor& det_xyxy, const torch::Tensor& det_scores,
                              const torch::Tensor& det_classes) {
  if (orig_h <= 0 || orig_w <= 0)
    throw UsageError(
        strfmt("image %lld has size %dx%d", static_cast<long long>(image_id), orig_w, orig_h));
  const auto g = boxes_as_double(gt_xyxy, "ground-truth boxes");
  const auto gc = vector_as(gt_classes, g.size(0), torch::kLong, "ground-truth classes");
  const auto d = boxes_as_double(det_xyxy, "detection boxes");
  const auto ds = vector_as(det_scores, d.size(0), torch::kDouble, "detection scores");
  const auto dc = vector_as(det_classes, d.size(0), torch::kLong, "detection classes");

  std::vector<GtBox> gts;
  gts.reserve(g.size(0));
  const double* gp = g.data_ptr<double>();
  const int64_t* gcp = gc.data_ptr<int64_t>();
  const double w = orig_w, h = orig_h;
  for (int64_t i = 0; i < g.size(0); ++i) {
    const double* b = gp + 4 * i;
    if (!finite_all({b[0], b[1], b[2], b[3]}))
      throw DataError(strfmt("ground-truth box of image %lld has a non-finite value",
                             static_cast<long long>(image_id)));
    const double x1 = std::clamp(b[0], 0.0, w), x2 = std::clamp(b[2], 0.0, w);
    const double y1 = std::clamp(b[1], 0.0, h), y2 = std::clamp(b[3], 0.0, h);
    const double bw = x2 - x1, bh = y2 - y1;
    if (bw <= 0 || bh <= 0) continue;
    gts.push_back({image_id, static_cast<int>(gcp[i]), x1, y1, bw, bh, bw * bh});
  }

  std::vector<DetBox> dets;
  dets.reserve(d.size(0));
  const double* dp = d.data_ptr<double>();
  const double* dsp = ds.data_ptr<double>();
  const int64_t* dcp = dc.data_ptr<int64_t>();
  for (int64_t i = 0; i < d.size(0); ++i) {
    const double* b = dp + 4 * i;
    dets.push_back(
        {image_id, static_cast<int>(dcp[i]), b[0], b[1], b[2] - b[0], b[3] - b[1], dsp[i]});
  }

  add_ground_truth(gts);
  add_detections(dets);
  if (images_.empty() || images_.back() != image_id) images_.push_back(image_id);
}

void CocoEvaluator::clear() {
  gts_.clear();
  dets_.clear();
  images_.clear();
}

namespace {

// Ground truth and detections in scope, keyed by (image index, category index) = img * K + cat.
// The key order is COCOeval's image order (ascending ids); ties keep insertion order (annotation
// order).
struct GtRef {
  int64_t key;
  int32_t idx;
};
struct DetRef {
  int64_t key;
  double score;
  int32_t idx;
};
struct Scope {
  std::vector<int64_t> imgs;     // image ids, ascending
  std::vector<int64_t> cat_ids;  // categories with ground truth, ascending
  int64_t K = 0;
  std::vector<GtRef> gref;  // sorted by key, then insertion order
  std::vector<DetRef> dref;  // sorted by key, then score descending (stable)
  int64_t dets_in_scope = 0;  // including those of categories without ground truth
};

Scope collect_scope(const std::vector<GtBox>& gts, const std::vector<DetBox>& dets,
                    std::vector<int64_t> image_ids) {
  Scope s;
  s.imgs = sorted_unique(std::move(image_ids));
  std::vector<int64_t> gt_img(gts.size());
  for (size_t i = 0; i < gts.size(); ++i) {
    gt_img[i] = index_in(s.imgs, gts[i].image_id);
    if (gt_img[i] >= 0) s.cat_ids.push_back(gts[i].category);
  }
  s.cat_ids = sorted_unique(std::move(s.cat_ids));
  const int64_t K = s.K = static_cast<int64_t>(s.cat_ids.size());

  s.gref.reserve(gts.size());
  for (size_t i = 0; i < gts.size(); ++i) {
    if (gt_img[i] < 0) continue;
    const int64_t c = index_in(s.cat_ids, static_cast<int64_t>(gts[i].category));
    s.gref.push_back({gt_img[i] * K + c, static_cast<int32_t>(i)});
  }
  std::sort(s.gref.begin(), s.gref.end(), [](const GtRef& a, const GtRef& b) {
    return a.key != b.key ? a.key < b.key : a.idx < b.idx;
  });

  s.dref.reserve(dets.size());
  for (size_t i = 0; i < dets.size(); ++i) {
    const int64_t im = index_in(s.imgs, dets[i].image_id);
    if (im < 0) continue;
    ++s.dets_in_scope;
    // A category without ground truth has no defined AP or AR: its detections cannot count.
    const int64_t c = index_in(s.cat_ids, static_cast<int64_t>(dets[i].category));
    if (c < 0) continue;
    s.dref.push_back({im * K + c, dets[i].score, static_cast<int32_t>(i)});
  }
  // Within an (image, category): score descending, stable (COCOeval's mergesort on -score).
  std::sort(s.dref.begin(), s.dref.end(), [](const DetRef& a, const DetRef& b) {
    if (a.key != b.key) return a.key < b.key;
    if (a.score != b.score) return a.score > b.score;
    return a.idx < b.idx;
  });
  return s;
}

// Per kept detection (top 100 of its image and category): bit t of matched / ignored says
// whether it matched a ground truth / is ignored at IoU threshold t, one word per area range.
struct Kept {
  int32_t cat, img, rank;
  double score;
  uint16_t matched[kAreas];
  uint16_t ignored[kAreas];
};

struct Matches {
  std::vector<Kept> kept;     // per category, score descending (COCOeval's accumulate order)
  std::vector<int64_t> npig;  // ground truths inside each area range, [K * kAreas]
};

// COCOeval.evaluateImg over every (image, category) group and area range, at every IoU threshold.
Matches match_groups(const Scope& s, const std::vector<GtBox>& gts,
                     const std::vector<DetBox>& dets) {
  const auto iou_thr = iou_thresholds();
  const int64_t K = s.K;
  const auto& gref = s.gref;
  const auto& dref = s.dref;
  Matches out;
  auto& kept = out.kept;
  kept.reserve(dref.size());
  out.npig.assign(static_cast<size_t>(K) * kAreas, 0);

  // Scratch reused across (image, category) groups.
  std::vector<double> iou, det_area;
  std::vector<int32_t> gt_order;
  std::vector<uint8_t> gt_ignore;
  std::vector<uint8_t> gt_taken;

  size_t gi = 0, di = 0;
  while (gi < gref.size() || di < dref.size()) {
    const int64_t key = std::min(gi < gref.size() ? gref[gi].key : INT64_MAX,
                                 di < dref.size() ? dref[di].key : INT64_MAX);
    size_t g_end = gi, d_end = di;
    while (g_end < gref.size() && gref[g_end].key == key) ++g_end;
    while (d_end < dref.size() && dref[d_end].key == key) ++d_end;
    const int G = static_cast<int>(g_end - gi);
    const int D = static_cast<int>(std::min<size_t>(d_end - di, kMaxDet));
    const int32_t img = static_cast<int32_t>(key / K), cat = static_cast<int32_t>(key % K);

    iou.assign(static_cast<size_t>(D) * G, 0.0);
    det_area.resize(D);
    for (int d = 0; d < D; ++d) {
      const DetBox& db = dets[dref[di + d].idx];
      det_area[d] = db.w * db.h;  // COCO's area of a bbox result
      for (int g = 0; g < G; ++g) iou[d * G + g] = box_iou(db, gts[gref[gi + g].idx]);
    }

    for (int d = 0; d < D; ++d) kept.push_back({cat, img, d, dref[di + d].score, {}, {}});
    Kept* const group = kept.data() + (kept.size() - D);

    gt_ignore.resize(G);
    gt_taken.resize(G);
    for (int a = 0; a < kAreas; ++a) {
      // Ground truths outside the area range are "ignored" and tried last.
      gt_order.clear();
      for (int g = 0; g < G; ++g) {
        const double area = gts[gref[gi + g].idx].area;
        gt_ignore[g] = area < kAreaLo[a] || area > kAreaHi[a];
        if (!gt_ignore[g]) gt_order.push_back(g);
      }
      out.npig[cat * kAreas + a] += static_cast<int64_t>(gt_order.size());
      for (int g = 0; g < G; ++g)
        if (gt_ignore[g]) gt_order.push_back(g);

      for (int t = 0; t < kIous; ++t) {
        const uint16_t bit = static_cast<uint16_t>(1u << t);
        std::fill(gt_taken.begin(), gt_taken.end(), 0);
        for (int d = 0; d < D; ++d) {
          // Greedy: the best still-free ground truth at or above the threshold; among equal IoUs
          // the later one in order wins, and an ignored one never replaces a regular match.
          double best = std::min(iou_thr[t], 1.0 - 1e-10);
          int m = -1;
          const double* row = iou.data() + static_cast<size_t>(d) * G;
          for (int g : gt_order) {
            if (gt_taken[g]) continue;
            if (m >= 0 && !gt_ignore[m] && gt_ignore[g]) break;
            if (row[g] < best) continue;
            best = row[g];
            m = g;
          }
          Kept& k = group[d];
          if (m >= 0) {
            gt_taken[m] = 1;
            k.matched[a] |= bit;
            if (gt_ignore[m]) k.ignored[a] |= bit;
          } else if (det_area[d] < kAreaLo[a] || det_area[d] > kAreaHi[a]) {
            k.ignored[a] |= bit;  // unmatched and outside the range: neither TP nor FP
          }
        }
      }
    }
    gi = g_end;
    di = d_end;
  }

  // Accumulate per category: all its kept detections in one ranking, score descending; ties
  // in image order, then rank in the image (COCOeval's stable sort of the concatenation).
  std::sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) {
    if (a.cat != b.cat) return a.cat < b.cat;
    if (a.score != b.score) return a.score > b.score;
    if (a.img != b.img) return a.img < b.img;
    return a.rank < b.rank;
  });
  return out;
}

// COCOeval's precision[T,R,K,A,maxDets=100] and recall[T,K,A,M], -1 where undefined. Precision
// at maxDets 1 and 10 feeds no reported number and is not computed.
struct Accumulated {
  int64_t K = 0;
  std::vector<double> precision, recall;
  size_t P(int t, int r, int64_t k, int a) const {
    return ((static_cast<size_t>(a) * kIous + t) * kRecalls + r) * K + k;
  }
  size_t Rc(int t, int64_t k, int a, int m) const {
    return ((static_cast<size_t>(a) * kMaxDetCuts + m) * kIous + t) * K + k;
  }
};

// [begin, end) of each category's run in the sorted kept list.
std::vector<std::pair<size_t, size_t>> category_runs(const std::vector<Kept>& kept, int64_t K) {
  std::vector<std::pair<size_t, size_t>> runs(K);
  size_t begin = 0;
  for (int64_t k = 0; k < K; ++k) {
    size_t end = begin;
    while (end < kept.size() && kept[end].cat == k) ++end;
    runs[k] = {begin, end};
    begin = end;
  }
  return runs;
}

// COCOeval.accumulate.
Accumulated accumulate(const Matches& mt, int64_t K) {
  const auto rec_thr = recall_thresholds();
  Accumulated acc;
  acc.K = K;
  acc.precision.assign(static_cast<size_t>(kAreas) * kIous * kRecalls * K, -1.0);
  acc.recall.assign(static_cast<size_t>(kAreas) * kMaxDetCuts * kIous * K, -1.0);
  const auto& kept = mt.kept;

  constexpr double kEps = std::numeric_limits<double>::epsilon();  // numpy's spacing(1)
  std::vector<double> pr, rc;
  const auto runs = category_runs(kept, K);
  for (int64_t k = 0; k < K; ++k) {
    const auto [begin, end] = runs[k];
    for (int a = 0; a < kAreas; ++a) {
      const int64_t n_gt = mt.npig[k * kAreas + a];
      if (n_gt == 0) continue;
      const double n = static_cast<double>(n_gt);
      for (int t = 0; t < kIous; ++t) {
        const uint16_t bit = static_cast<uint16_t>(1u << t);
        pr.clear();
        rc.clear();
        double tp = 0, fp = 0;
        int64_t tp_cut[kMaxDetCuts] = {0, 0, 0};
        // Ignored detections leave the cumulative counts unchanged; dropping them changes
        // neither the interpolated precision nor the final recall.
        for (size_t j = begin; j < end; ++j) {
          const Kept& kd = kept[j];
          if (kd.ignored[a] & bit) continue;
          if (kd.matched[a] & bit) {
            tp += 1;
            for (int m = 0; m < kMaxDetCuts; ++m) tp_cut[m] += kd.rank < kMaxDets[m];
          } else {
            fp += 1;
          }
          rc.push_back(tp / n);
          pr.push_back(tp / (fp + tp + kEps));
        }
        for (int m = 0; m < kMaxDetCuts; ++m)
          acc.recall[acc.Rc(t, k, a, m)] = static_cast<double>(tp_cut[m]) / n;

        // Precision envelope (monotone from the right), then sampled at the first detection
        // reaching each recall threshold; thresholds never reached stay 0.
        for (size_t i = pr.size(); i-- > 1;) pr[i - 1] = std::max(pr[i - 1], pr[i]);
        size_t p = 0;
        for (int r = 0; r < kRecalls; ++r) {
          while (p < rc.size() && rc[p] < rec_thr[r]) ++p;
          acc.precision[acc.P(t, r, k, a)] = p < rc.size() ? pr[p] : 0.0;
        }
      }
    }
  }
  return acc;
}

// COCOeval.summarize: the 12 stats.
std::array<double, 12> summarize(const Accumulated& acc) {
  const int64_t K = acc.K;
  auto ap = [&](int a, int t_only) {
    return mean_valid([&](auto&& take) {
      for (int t = 0; t < kIous; ++t) {
        if (t_only >= 0 && t != t_only) continue;
        for (int r = 0; r < kRecalls; ++r)
          for (int64_t k = 0; k < K; ++k) take(acc.precision[acc.P(t, r, k, a)]);
      }
    });
  };
  auto ar = [&](int a, int m) {
    return mean_valid([&](auto&& take) {
      for (int t = 0; t < kIous; ++t)
        for (int64_t k = 0; k < K; ++k) take(acc.recall[acc.Rc(t, k, a, m)]);
    });
  };
  std::array<double, 12> s{};
  s[0] = ap(0, -1);
  s[1] = ap(0, 0);  // IoU .50
  s[2] = ap(0, 5);  // IoU .75
  s[3] = ap(1, -1);
  s[4] = ap(2, -1);
  s[5] = ap(3, -1);
  s[6] = ar(0, 0);
  s[7] = ar(0, 1);
  s[8] = ar(0, 2);
  s[9] = ar(1, 2);
  s[10] = ar(2, 2);
  s[11] = ar(3, 2);
  return s;
}

constexpr int kConfPoints = 1000;

// Table rows (images, instances, AP50, AP50-95 per category) and the curves for plots; then
// P and R at the confidence of the best mean F1. `mt` and `acc` are null when nothing was
// detected: every number is then 0.
void class_report(const Scope& s, const Matches* mt, const Accumulated* acc, CocoStats& out) {
  const int64_t K = s.K;
  out.images = static_cast<int64_t>(s.imgs.size());
  out.instances = static_cast<int64_t>(s.gref.size());
  out.classes.assign(K, ClassResult{});
  int64_t last_key = -1;
  for (const GtRef& g : s.gref) {
    ClassResult& c = out.classes[g.key % K];
    ++c.instances;
    if (g.key != last_key) ++c.images;  // gref is sorted by (image, category)
    last_key = g.key;
  }
  auto& cv = out.curves;
  cv.conf.resize(kConfPoints);
  for (int j = 0; j < kConfPoints; ++j) cv.conf[j] = static_cast<double>(j) / (kConfPoints - 1);
  const auto rec = recall_thresholds();
  cv.recall_thresholds.assign(rec.begin(), rec.end());
  cv.precision.assign(K, std::vector<double>(kConfPoints, 0.0));
  cv.recall.assign(K, std::vector<double>(kConfPoints, 0.0));
  cv.f1.assign(K, std::vector<double>(kConfPoints, 0.0));
  cv.pr.assign(K, std::vector<double>(kRecalls, 0.0));

  const auto runs = mt ? category_runs(mt->kept, K) : std::vector<std::pair<size_t, size_t>>();
  for (int64_t k = 0; k < K; ++k) {
    ClassResult& c = out.classes[k];
    c.category = static_cast<int>(s.cat_ids[k]);
    if (!mt) continue;
    double sum50 = 0, sum = 0;
    for (int r = 0; r < kRecalls; ++r) {
      cv.pr[k][r] = acc->precision[acc->P(0, r, k, 0)];
      for (int t = 0; t < kIous; ++t) {
        const double p = acc->precision[acc->P(t, r, k, 0)];
        sum += p;
        if (t == 0) sum50 += p;
      }
    }
    c.ap50 = sum50 / kRecalls;
    c.ap50_95 = sum / (kRecalls * kIous);

    // Step curves over confidence from the IoU .50 matches at area "all" (where nothing is
    // ignored): walk thresholds from high to low, taking in the detections they admit.
    const auto [begin, end] = runs[k];
    const double n_gt = static_cast<double>(std::max<int64_t>(c.instances, 1));
    size_t j = begin;
    double tp = 0, fp = 0;
    for (int x = kConfPoints - 1; x >= 0; --x) {
      for (; j < end && mt->kept[j].score >= cv.conf[x]; ++j) {
        if (mt->kept[j].ignored[0] & 1u) continue;
        if (mt->kept[j].matched[0] & 1u)
          tp += 1;
        else
          fp += 1;
      }
      const double p = tp + fp > 0 ? tp / (tp + fp) : 0.0, r = tp / n_gt;
      cv.precision[k][x] = p;
      cv.recall[k][x] = r;
      cv.f1[k][x] = p + r > 0 ? 2 * p * r / (p + r) : 0.0;
    }
  }
  if (K == 0 || !mt) return;

  // The confidence with the best mean F1; among equals the highest (the same detections are kept
  // there, and it is the threshold a user would set).
  int best = 0;
  double best_f1 = -1;
  for (int x = 0; x < kConfPoints; ++x) {
    double f = 0;
    for (int64_t k = 0; k < K; ++k) f += cv.f1[k][x];
    f /= static_cast<double>(K);
    if (f >= best_f1) best_f1 = f, best = x;
  }
  out.best_conf = cv.conf[best];
  out.best_f1 = best_f1;
  double sp = 0, sr = 0;
  for (int64_t k = 0; k < K; ++k) {
    out.classes[k].precision = cv.precision[k][best];
    out.classes[k].recall = cv.recall[k][best];
    sp += out.classes[k].precision;
    sr += out.classes[k].recall;
  }
  out.precision = sp / static_cast<double>(K);
  out.recall = sr / static_cast<double>(K);
}

}  // namespace

CocoStats CocoEvaluator::evaluate(const std::optional<std::vector<int64_t>>& image_ids) const {
  const Scope scope = collect_scope(gts_, dets_, image_ids ? *image_ids : images_);
  CocoStats result;
  if (scope.dets_in_scope == 0) {
    result.stats.fill(0.0);
    class_report(scope, nullptr, nullptr, result);
    return result;
  }
  const Matches matches = match_groups(scope, gts_, dets_);
  const Accumulated acc = accumulate(matches, scope.K);
  result.stats = summarize(acc);
  class_report(scope, &matches, &acc, result);
  return result;
}

}  // namespace libreyolo::eval
