// YOLOv9 loss: hand-built cases against a plain float64 re-statement of the reference's loss
// written here with loops, gradient checks by finite differences, and fixture parity.
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <libreyolo/errors.hpp>
#include <numeric>
#include <vector>

#include "io/pickle.hpp"
#include "families/yolo9/loss.hpp"
#include "support.hpp"

namespace {

namespace ll = libreyolo::loss;
using torch::Tensor;
constexpr int kR = 16;
const std::vector<int64_t> kStrides = {8, 16, 32};

// ------------------------------------------------------------------ float64 reference

struct Box {
  double x1, y1, x2, y2;
};
double sq(double v) { return v * v; }
Box scaled(const Box& b, double f) { return {b.x1 / f, b.y1 / f, b.x2 / f, b.y2 / f}; }

// CIoU. alpha_fixed freezes the aspect weight; alpha_out reports the one used.
double ciou64(const Box& a, const Box& b, const double* alpha_fixed = nullptr,
              double* alpha_out = nullptr) {
  const double eps = 1e-7;
  const double iw = std::max(std::min(a.x2, b.x2) - std::max(a.x1, b.x1), 0.0);
  const double ih = std::max(std::min(a.y2, b.y2) - std::max(a.y1, b.y1), 0.0);
  const double inter = iw * ih;
  const double aw = a.x2 - a.x1, ah = a.y2 - a.y1, bw = b.x2 - b.x1, bh = b.y2 - b.y1;
  const double iou = inter / (aw * ah + bw * bh - inter + eps);
  const double cent =
      sq((a.x1 + a.x2) / 2 - (b.x1 + b.x2) / 2) + sq((a.y1 + a.y2) / 2 - (b.y1 + b.y2) / 2);
  const double cw = std::max(a.x2, b.x2) - std::min(a.x1, b.x1);
  const double ch = std::max(a.y2, b.y2) - std::min(a.y1, b.y1);
  const double diou = iou - cent / (cw * cw + ch * ch + eps);
  const double v =
      4.0 / (M_PI * M_PI) * sq(std::atan(aw / (ah + eps)) - std::atan(bw / (bh + eps)));
  const double alpha = alpha_fixed ? *alpha_fixed : v / (v - iou + 1 + eps);
  if (alpha_out) *alpha_out = alpha;
  return diou - alpha * v;
}

struct RefAnchor {
  double x, y, s;
  int level;
  int64_t row, col;
};

std::vector<RefAnchor> ref_anchors(const std::vector<Tensor>& raw) {
  std::vector<RefAnchor> out;
  for (size_t l = 0; l < raw.size(); ++l) {
    const int64_t s = kStrides[l];
    for (int64_t y = 0; y < raw[l].size(2); ++y)
      for (int64_t x = 0; x < raw[l].size(3); ++x)
        out.push_back({double(x * s + s / 2), double(y * s + s / 2), double(s), int(l), y, x});
  }
  return out;
}

struct RefPred {                                // one image
  std::vector<std::vector<double>> box_logits;  // [A][4 * R], side-major
  std::vector<std::vector<double>> cls_logits;  // [A][nc]
  std::vector<Box> boxes;                       // decoded, pixels
};

std::vector<double> log_softmax(const double* x, int n) {
  const double m = *std::max_element(x, x + n);
  double z = 0;
  for (int i = 0; i < n; ++i) z += std::exp(x[i] - m);
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) out[i] = x[i] - m - std::log(z);
  return out;
}

RefPred ref_decode(const std::vector<Tensor>& raw, int64_t b, const std::vector<RefAnchor>& anchors,
                   int nc) {
  RefPred p;
  std::vector<Tensor> r;
  for (const auto& t : raw) r.push_back(t.detach().to(torch::kDouble).contiguous());
  for (const auto& an : anchors) {
    auto acc = r[an.level].accessor<double, 4>();
    std::vector<double> bl(4 * kR), cl(nc);
    for (int c = 0; c < 4 * kR; ++c) bl[c] = acc[b][c][an.row][an.col];
    for (int c = 0; c < nc; ++c) cl[c] = acc[b][4 * kR + c][an.row][an.col];
    double d[4];
    for (int side = 0; side < 4; ++side) {
      const auto lp = log_softmax(bl.data() + side * kR, kR);
      d[side] = 0;
      for (int j = 0; j < kR; ++j) d[side] += std::exp(lp[j]) * j;
    }
    p.boxes.push_back(
        {an.x - d[0] * an.s, an.y - d[1] * an.s, an.x + d[2] * an.s, an.y + d[3] * an.s});
    p.box_logits.push_back(std::move(bl));
    p.cls_logits.push_back(std::move(cl));
  }
  return p;
}

struct RefGt {
  Box box;  // pixels
  int cls;
  int row;  // row in the targets tensor
};

std::vector<RefGt> ref_targets(const Tensor& targets, int64_t b, int64_t img_h, int64_t img_w) {
  const auto owned = targets.to(torch::kDouble).contiguous();
  auto t = owned.accessor<double, 3>();
  std::vector<RefGt> out;
  for (int64_t i = 0; i < targets.size(1); ++i) {
    if (t[b][i][0] < 0) continue;  // padding
    out.push_back({{t[b][i][1] * img_w, t[b][i][2] * img_h, t[b][i][3] * img_w, t[b][i][4] * img_h},
                   int(t[b][i][0]),
                   int(i)});
  }
  return out;
}

struct RefAssign {
  std::vector<int> gt;         // per anchor: index into the RefGt list, -1 = negative
  std::vector<double> score;   // per anchor soft target
  int claims = 0;              // candidate (gt, anchor) pairs before de-duplication
  std::vector<bool> fallback;  // per gt: got its anchor from the ensure-one rule
};

RefAssign ref_assign(const RefPred& p, const std::vector<RefAnchor>& anchors,
                     const std::vector<RefGt>& gts) {
  const int A = int(anchors.size()), G = int(gts.size());
  std::vector<std::vector<double>> iou(G, std::vector<double>(A)), align = iou;
  std::vector<std::vector<int>> cand(G);
  RefAssign r;
  r.fallback.assign(G, false);
  for (int g = 0; g < G; ++g) {
    const Box& bx = gts[g].box;
    for (int a = 0; a < A; ++a) {
      const double c = std::clamp(ciou64(bx, p.boxes[a]), 0.0, 1.0);
      const double prob = 1.0 / (1.0 + std::exp(-p.cls_logits[a][gts[g].cls]));
      iou[g][a] = c;
      align[g][a] = std::pow(c, 6) * std::sqrt(prob);
      const auto& an = anchors[a];
      const double d[4] = {(an.x - bx.x1) / an.s, (an.y - bx.y1) / an.s, (bx.x2 - an.x) / an.s,
                           (bx.y2 - an.y) / an.s};
      bool in_grid = true;
      for (double v : d) in_grid = in_grid && v >= 0 && v <= kR - 1.01;
      if (in_grid && align[g][a] > 0) cand[g].push_back(a);
    }
    std::stable_sort(cand[g].begin(), cand[g].end(),
                     [&](int i, int j) { return align[g][i] > align[g][j]; });
    if (cand[g].size() > 10) cand[g].resize(10);
    if (cand[g].empty()) {
      const int best = int(std::max_element(align[g].begin(), align[g].end()) - align[g].begin());
      if (align[g][best] > 0) {
        cand[g].push_back(best);
        r.fallback[g] = true;
      }
    }
  }
  r.gt.assign(A, -1);
  std::vector<double> best_iou(A, -1);
  for (int g = 0; g < G; ++g)
    for (int a : cand[g]) {
      ++r.claims;
      if (iou[g][a] > best_iou[a]) {
        best_iou[a] = iou[g][a];
        r.gt[a] = g;
      }
    }
  std::vector<double> max_align(G, 0), max_iou(G, 0);
  for (int a = 0; a < A; ++a)
    if (r.gt[a] >= 0) {
      max_align[r.gt[a]] = std::max(max_align[r.gt[a]], align[r.gt[a]][a]);
      max_iou[r.gt[a]] = std::max(max_iou[r.gt[a]], iou[r.gt[a]][a]);
    }
  r.score.assign(A, 0);
  for (int a = 0; a < A; ++a)
    if (r.gt[a] >= 0) {
      const int g = r.gt[a];
      r.score[a] = align[g][a] / (max_align[g] + 1e-9) * max_iou[g];
    }
  return r;
}

struct RefTerms {
  double box = 0, dfl = 0, cls = 0, score_sum = 0;
  int positives = 0;
};

// Unnormalised, unweighted sums for one image. `alphas` (per anchor) freezes CIoU's alpha.
RefTerms ref_terms(const RefPred& p, const std::vector<RefAnchor>& anchors,
                   const std::vector<RefGt>& gts, const RefAssign& as, int nc,
                   const std::vector<double>* alphas = nullptr,
                   std::vector<double>* alphas_out = nullptr) {
  RefTerms t;
  if (alphas_out) alphas_out->assign(anchors.size(), 0);
  for (size_t a = 0; a < anchors.size(); ++a) {
    const bool valid = as.gt[a] >= 0;
    const double w = as.score[a];
    for (int c = 0; c < nc; ++c) {
      const double x = p.cls_logits[a][c];
      const double z = (valid && c == gts[as.gt[a]].cls) ? w : 0.0;
      t.cls += std::max(x, 0.0) - x * z + std::log1p(std::exp(-std::abs(x)));
    }
    if (!valid) continue;
    ++t.positives;
    t.score_sum += w;
    const auto& an = anchors[a];
    const Box pb = scaled(p.boxes[a], an.s), tb = scaled(gts[as.gt[a]].box, an.s);
    double alpha = 0;
    t.box += (1 - ciou64(pb, tb, alphas ? &(*alphas)[a] : nullptr, &alpha)) * w;
    if (alphas_out) (*alphas_out)[a] = alpha;
    const double dist[4] = {an.x / an.s - tb.x1, an.y / an.s - tb.y1, tb.x2 - an.x / an.s,
                            tb.y2 - an.y / an.s};
    double ce = 0;
    for (int side = 0; side < 4; ++side) {
      const double d = std::clamp(dist[side], 0.0, kR - 1.01);
      const auto lp = log_softmax(p.box_logits[a].data() + side * kR, kR);
      const int l = int(std::floor(d));
      ce += -(lp[l] * (l + 1 - d) + lp[l + 1] * (d - l));
    }
    t.dfl += ce / 4 * w;
  }
  return t;
}

struct RefLoss {
  double box = 0, dfl = 0, cls = 0, total = 0, num_fg = 0;
  std::vector<RefAssign> assign;  // per image
};

RefLoss ref_combine(const std::vector<RefTerms>& terms) {
  RefLoss r;
  double n = 0;
  for (const auto& t : terms) n += t.score_sum;
  n = std::max(n, 1.0);
  for (const auto& t : terms) {
    r.box += t.box;
    r.dfl += t.dfl;
    r.cls += t.cls;
    r.num_fg += t.positives;
  }
  r.box *= 7.5 / n;
  r.dfl *= 1.5 / n;
  r.cls *= 0.5 / n;
  r.total = r.box + r.dfl + r.cls;
  r.num_fg /= double(terms.size());
  return r;
}

RefLoss ref_loss(const std::vector<Tensor>& raw, const Tensor& targets, int64_t img_h,
                 int64_t img_w, int nc) {
  const auto anchors = ref_anchors(raw);
  std::vector<RefTerms> terms;
  std::vector<RefAssign> assigns;
  for (int64_t b = 0; b < raw[0].size(0); ++b) {
    const auto p = ref_decode(raw, b, anchors, nc);
    const auto gts = ref_targets(targets, b, img_h, img_w);
    assigns.push_back(ref_assign(p, anchors, gts));
    terms.push_back(ref_terms(p, anchors, gts, assigns.back(), nc));
  }
  RefLoss r = ref_combine(terms);
  r.assign = std::move(assigns);
  return r;
}

// ------------------------------------------------------------------ helpers

std::vector<Tensor> random_raw(int64_t B, int64_t img_h, int64_t img_w, int nc, uint64_t seed,
                               torch::ScalarType dtype = torch::kDouble, double scale = 2.0) {
  torch::manual_seed(seed);
  std::vector<Tensor> raw;
  for (int64_t s : kStrides)
    raw.push_back(
        torch::randn({B, 4 * kR + nc, img_h / s, img_w / s}, torch::kDouble).mul_(scale).to(dtype));
  return raw;
}

// Targets [B, T, 5], normalised; rows not given are padding (class -1, zero box).
Tensor make_targets(int64_t B, int64_t T,
                    const std::vector<std::vector<std::array<double, 5>>>& rows,
                    torch::ScalarType dtype = torch::kDouble) {
  auto t = torch::zeros({B, T, 5}, torch::kDouble);
  t.select(2, 0).fill_(-1);
  for (int64_t b = 0; b < B; ++b)
    for (size_t i = 0; i < rows[b].size(); ++i)
      for (int c = 0; c < 5; ++c) t[b][int64_t(i)][c] = rows[b][i][c];
  return t.to(dtype);
}

double val(const Tensor& t) { return t.to(torch::kDouble).item<double>(); }

void expect_matches_ref(const libreyolo::LossOutput& out, const RefLoss& ref, double rel) {
  EXPECT_NEAR(val(out.term("box")), ref.box, rel * std::max(1e-3, std::abs(ref.box)));
  EXPECT_NEAR(val(out.term("dfl")), ref.dfl, rel * std::max(1e-3, std::abs(ref.dfl)));
  EXPECT_NEAR(val(out.term("cls")), ref.cls, rel * std::abs(ref.cls));
  EXPECT_NEAR(val(out.total), ref.total, rel * std::abs(ref.total));
  EXPECT_DOUBLE_EQ(val(out.num_fg), ref.num_fg);
}

std::vector<std::array<int64_t, 2>> level_hw(const std::vector<Tensor>& raw) {
  std::vector<std::array<int64_t, 2>> hw;
  for (const auto& r : raw) hw.push_back({r.size(2), r.size(3)});
  return hw;
}

Tensor to_pixels(const Tensor& targets, int64_t img_h, int64_t img_w) {
  auto px = targets.clone();
  px.select(2, 1).mul_(img_w);
  px.select(2, 3).mul_(img_w);
  px.select(2, 2).mul_(img_h);
  px.select(2, 4).mul_(img_h);
  return px;
}

// Runs the implementation's assigner on raw maps.
ll::Assignment run_assign(ll::Yolo9Loss& loss, const std::vector<Tensor>& raw,
                          const Tensor& targets, int64_t img_h, int64_t img_w) {
  const auto& grid = loss.anchor_grid(level_hw(raw), raw[0].device());
  const auto d = loss.decode(raw, grid);
  return loss.assign(d.cls_logits, d.boxes, to_pixels(targets, img_h, img_w), grid);
}

void expect_same_assignment(const ll::Assignment& a, const std::vector<RefAssign>& ref,
                            const Tensor& targets, int64_t img_h, int64_t img_w) {
  for (size_t b = 0; b < ref.size(); ++b) {
    const auto gts = ref_targets(targets, int64_t(b), img_h, img_w);
    for (size_t i = 0; i < ref[b].gt.size(); ++i) {
      const bool valid = a.valid[b][i].item<bool>();
      ASSERT_EQ(valid, ref[b].gt[i] >= 0) << "image " << b << " anchor " << i;
      if (!valid) continue;
      EXPECT_EQ(a.gt_index[b][i].item<int64_t>(), gts[ref[b].gt[i]].row);
      EXPECT_EQ(a.classes[b][i].item<int64_t>(), gts[ref[b].gt[i]].cls);
      EXPECT_NEAR(val(a.score[b][i]), ref[b].score[i], 1e-12);
    }
  }
}

// ------------------------------------------------------------------ CIoU

std::vector<Box> random_boxes(int n, uint64_t seed) {
  torch::manual_seed(seed);
  auto xy = torch::rand({n, 2}, torch::kDouble) * 40;
  auto wh = torch::rand({n, 2}, torch::kDouble) * 30 + 0.5;
  std::vector<Box> out;
  for (int i = 0; i < n; ++i) {
    const double x = xy[i][0].item<double>(), y = xy[i][1].item<double>();
    out.push_back({x, y, x + wh[i][0].item<double>(), y + wh[i][1].item<double>()});
  }
  return out;
}

Tensor boxes_tensor(const std::vector<Box>& v, torch::ScalarType dtype) {
  auto t = torch::empty({int64_t(v.size()), 4}, torch::kDouble);
  for (size_t i = 0; i < v.size(); ++i) {
    t[int64_t(i)][0] = v[i].x1;
    t[int64_t(i)][1] = v[i].y1;
    t[int64_t(i)][2] = v[i].x2;
    t[int64_t(i)][3] = v[i].y2;
  }
  return t.to(dtype);
}

}  // namespace

TEST(Yolo9Loss, CiouMatchesFloat64Formula) {
  auto a = random_boxes(300, 1), b = random_boxes(300, 2);
  // Identical, nested, disjoint and degenerate pairs on top of the random ones.
  a.insert(a.end(), {{0, 0, 10, 10}, {0, 0, 10, 10}, {0, 0, 2, 2}, {5, 5, 5, 5}});
  b.insert(b.end(), {{0, 0, 10, 10}, {2, 2, 6, 8}, {50, 50, 60, 70}, {1, 1, 9, 3}});
  const auto got = ll::ciou(boxes_tensor(a, torch::kFloat), boxes_tensor(b, torch::kFloat));
  ASSERT_EQ(got.scalar_type(), torch::kFloat);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(got[int64_t(i)].item<double>() - ciou64(a[i], b[i])));
  EXPECT_LT(worst, 2e-6);
  EXPECT_NEAR(got[int64_t(a.size() - 4)].item<double>(), 1.0, 1e-6);  // identical boxes
  EXPECT_LT(got[int64_t(a.size() - 2)].item<double>(), 0.0);          // disjoint: negative

  // The same in float64, along dim 1 of a [1, 4, N] layout.
  const auto got64 = ll::ciou(boxes_tensor(a, torch::kDouble).t().unsqueeze(0),
                              boxes_tensor(b, torch::kDouble).t().unsqueeze(0), 1);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(got64[0][int64_t(i)].item<double>(), ciou64(a[i], b[i]), 1e-12);
}

TEST(Yolo9Loss, PairwiseCiouMatchesFloat64Formula) {
  const auto gt = random_boxes(2 * 5, 3), pred = random_boxes(2 * 40, 4);
  const auto g = boxes_tensor(gt, torch::kFloat).view({2, 5, 4});
  const auto p = boxes_tensor(pred, torch::kFloat).view({2, 40, 4}).transpose(1, 2);
  const auto got = ll::pairwise_ciou(g, p);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 5, 40}));
  const auto elementwise = ll::ciou(g.unsqueeze(2), p.transpose(1, 2).unsqueeze(1));
  double worst = 0;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 5; ++t)
      for (int a = 0; a < 40; ++a) {
        const double want = ciou64(gt[b * 5 + t], pred[b * 40 + a]);
        worst = std::max(worst, std::abs(got[b][t][a].item<double>() - want));
        // Same operation order as the elementwise version: the same bits.
        EXPECT_EQ(got[b][t][a].item<float>(), elementwise[b][t][a].item<float>());
      }
  EXPECT_LT(worst, 2e-6);
}

TEST(Yolo9Loss, CiouGradientTreatsAlphaAsConstant) {
  const auto a = random_boxes(20, 5), b = random_boxes(20, 6);
  auto pa = boxes_tensor(a, torch::kDouble).requires_grad_(true);
  const auto pb = boxes_tensor(b, torch::kDouble);
  ll::ciou(pa, pb).sum().backward();
  const auto grad = pa.grad();
  const double h = 1e-6;
  double worst_frozen = 0, worst_free = 0;
  for (int i = 0; i < 20; ++i) {
    double alpha = 0;
    ciou64(a[i], b[i], nullptr, &alpha);
    for (int c = 0; c < 4; ++c) {
      Box lo = a[i], hi = a[i];
      (&lo.x1)[c] -= h;
      (&hi.x1)[c] += h;
      const double frozen = (ciou64(hi, b[i], &alpha) - ciou64(lo, b[i], &alpha)) / (2 * h);
      const double free = (ciou64(hi, b[i]) - ciou64(lo, b[i])) / (2 * h);
      const double g = grad[i][c].item<double>();
      worst_frozen = std::max(worst_frozen, std::abs(g - frozen));
      worst_free = std::max(worst_free, std::abs(g - free));
    }
  }
  EXPECT_LT(worst_frozen, 1e-7);
  EXPECT_GT(worst_free, 1e-5);  // a differentiated alpha would show up here
}

// ------------------------------------------------------------------ DFL

TEST(Yolo9Loss, DflIntegerFractionalAndClampedTargets) {
  torch::manual_seed(7);
  const auto logits = torch::randn({1, 4, kR, 3}, torch::kDouble);
  // Anchor 0: integer targets; anchor 1: fractional; anchor 2: beyond both ends (clamped).
  const double targets[3][4] = {{0, 3, 7, 14}, {0.25, 3.5, 7.75, 14.5}, {-2, 20, 14.99, 15}};
  auto t = torch::empty({1, 4, 3}, torch::kDouble);
  for (int a = 0; a < 3; ++a)
    for (int s = 0; s < 4; ++s) t[0][s][a] = targets[a][s];
  const auto got = ll::dfl_per_anchor(logits, t);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{1, 3}));
  for (int a = 0; a < 3; ++a) {
    double want = 0;
    for (int s = 0; s < 4; ++s) {
      auto col = logits[0][s].select(1, a).contiguous();
      const auto lp = log_softmax(col.data_ptr<double>(), kR);
      const double d = std::clamp(targets[a][s], 0.0, kR - 1.01);
      const int l = int(std::floor(d));
      want += -(lp[l] * (l + 1 - d) + lp[l + 1] * (d - l)) / 4;
    }
    EXPECT_NEAR(got[0][a].item<double>(), want, 1e-12) << "anchor " << a;
  }
}

TEST(Yolo9Loss, DflGradientMatchesFiniteDifferences) {
  torch::manual_seed(8);
  auto logits = torch::randn({1, 4, kR, 2}, torch::kDouble).requires_grad_(true);
  const auto t = torch::rand({1, 4, 2}, torch::kDouble) * 14;
  const auto w = torch::tensor({0.3, 1.7}, torch::kDouble);
  (ll::dfl_per_anchor(logits, t)[0] * w).sum().backward();
  // Every central difference at once: image 2i is element i moved up by h, 2i + 1 down.
  const int64_t n = logits.numel();
  const double h = 1e-6;
  auto x = logits.detach().reshape({1, -1}).repeat({2 * n, 1});
  const auto eye = torch::eye(n, torch::kDouble) * h;
  x.view({n, 2, n}).select(1, 0).add_(eye);
  x.view({n, 2, n}).select(1, 1).sub_(eye);
  const auto f = (ll::dfl_per_anchor(x.view({2 * n, 4, kR, 2}), t.expand({2 * n, 4, 2})) * w)
                     .sum(1)
                     .view({n, 2});
  const auto fd = (f.select(1, 0) - f.select(1, 1)) / (2 * h);
  const double worst = (fd - logits.grad().reshape(-1)).abs().max().item<double>();
  EXPECT_GT(logits.grad().abs().max().item<double>(), 1e-2);
  EXPECT_LT(worst, 1e-8);
}

// ------------------------------------------------------------------ anchors and decoding

TEST(Yolo9Loss, AnchorGridOrderAt640) {
  ll::Yolo9Loss loss(80);
  const auto& g = loss.anchor_grid({{80, 80}, {40, 40}, {20, 20}}, torch::kCPU);
  ASSERT_EQ(g.xy.sizes(), (std::vector<int64_t>{2, 8400}));
  auto at = [&](int64_t i) {
    return std::make_pair(g.xy[0][i].item<float>(), g.xy[1][i].item<float>());
  };
  EXPECT_EQ(at(0), std::make_pair(4.0f, 4.0f));
  EXPECT_EQ(at(1), std::make_pair(12.0f, 4.0f));
  EXPECT_EQ(at(80), std::make_pair(4.0f, 12.0f));
  EXPECT_EQ(at(6400), std::make_pair(8.0f, 8.0f));
  EXPECT_EQ(at(8000), std::make_pair(16.0f, 16.0f));
  EXPECT_EQ(g.stride[6399].item<float>(), 8.0f);
  EXPECT_EQ(g.stride[6400].item<float>(), 16.0f);
  EXPECT_EQ(g.stride[8399].item<float>(), 32.0f);
  EXPECT_EQ(g.xy_grid[0][8001].item<float>(), 1.5f);
  // Cached: the same object comes back.
  EXPECT_EQ(&loss.anchor_grid({{80, 80}, {40, 40}, {20, 20}}, torch::kCPU), &g);
}

TEST(Yolo9Loss, DecodeMatchesFloat64Formula) {
  const int nc = 3;
  const auto raw = random_raw(2, 64, 96, nc, 11);
  ll::Yolo9Loss loss(nc);
  const auto& grid = loss.anchor_grid(level_hw(raw), torch::kCPU);
  const auto d = loss.decode(raw, grid);
  const auto anchors = ref_anchors(raw);
  ASSERT_EQ(d.boxes.sizes(), (std::vector<int64_t>{2, 4, int64_t(anchors.size())}));
  for (int64_t b = 0; b < 2; ++b) {
    const auto p = ref_decode(raw, b, anchors, nc);
    for (size_t a = 0; a < anchors.size(); ++a) {
      const Box& want = p.boxes[a];
      EXPECT_NEAR(d.boxes[b][0][int64_t(a)].item<double>(), want.x1, 1e-10);
      EXPECT_NEAR(d.boxes[b][1][int64_t(a)].item<double>(), want.y1, 1e-10);
      EXPECT_NEAR(d.boxes[b][2][int64_t(a)].item<double>(), want.x2, 1e-10);
      EXPECT_NEAR(d.boxes[b][3][int64_t(a)].item<double>(), want.y2, 1e-10);
      EXPECT_EQ(d.cls_logits[b][2][int64_t(a)].item<double>(), p.cls_logits[a][2]);
    }
  }
}

// ------------------------------------------------------------------ assigner and loss

TEST(Yolo9Loss, SingleGtOnTheAnchorGrid) {
  // 64x64 input. Box (12, 12)-(28, 20) px has its edges on P3 anchor centres: edges count as
  // inside, so the grid holds P3 x in {12, 20, 28} times y in {12, 20}, and P5 (16, 16).
  const int nc = 3;
  auto raw = random_raw(1, 64, 64, nc, 21, torch::kDouble, 0.3);
  // Predict small boxes (about one stride per side) so every in-grid anchor aligns.
  for (auto& r : raw)
    r.narrow(1, 0, 4 * kR).view({1, 4, kR, r.size(2), r.size(3)}).select(2, 1).add_(6);
  const auto targets = make_targets(1, 4, {{{1, 12 / 64., 12 / 64., 28 / 64., 20 / 64.}}});
  const auto ref = ref_loss(raw, targets, 64, 64, nc);
  std::vector<int> want_grid = {1 * 8 + 1, 1 * 8 + 2, 1 * 8 + 3,  2 * 8 + 1,
                                2 * 8 + 2, 2 * 8 + 3, 64 + 16 + 0};
  std::vector<int> ref_pos;
  for (size_t a = 0; a < ref.assign[0].gt.size(); ++a)
    if (ref.assign[0].gt[a] >= 0) ref_pos.push_back(int(a));
  ASSERT_EQ(ref_pos, want_grid) << "the hand-built case is not what it claims to be";

  ll::Yolo9Loss loss(nc);
  const auto out = loss.compute(raw, targets, 64, 64);
  expect_matches_ref(out, ref, 1e-9);
  EXPECT_EQ(val(out.num_fg), 7.0);
  expect_same_assignment(run_assign(loss, raw, targets, 64, 64), ref.assign, targets, 64, 64);
}

TEST(Yolo9Loss, RandomBatchMatchesFloat64Reference) {
  const int nc = 5;
  const auto raw = random_raw(2, 64, 96, nc, 31);
  const auto targets = make_targets(2, 100,
                                    {{{0, 0.10, 0.20, 0.45, 0.70},
                                      {3, 0.50, 0.05, 0.95, 0.60},
                                      {4, 0.30, 0.30, 0.38, 0.42},
                                      {1, 0.00, 0.50, 1.00, 1.00}},
                                     {{2, 0.20, 0.10, 0.80, 0.90}}});
  const auto ref = ref_loss(raw, targets, 64, 96, nc);
  ll::Yolo9Loss loss(nc);
  const auto out = loss.compute(raw, targets, 64, 96);
  expect_matches_ref(out, ref, 1e-9);
  EXPECT_GT(ref.num_fg, 5);
  expect_same_assignment(run_assign(loss, raw, targets, 64, 96), ref.assign, targets, 64, 96);
}

TEST(Yolo9Loss, OverlappingGtsAreDeduplicatedByIou) {
  const int nc = 2;
  const auto raw = random_raw(1, 64, 64, nc, 41);
  // Three nearly identical boxes: most candidates are claimed more than once.
  const auto targets = make_targets(
      1, 3,
      {{{0, 0.20, 0.20, 0.70, 0.75}, {1, 0.22, 0.18, 0.72, 0.74}, {0, 0.19, 0.21, 0.69, 0.77}}});
  const auto ref = ref_loss(raw, targets, 64, 64, nc);
  int unique = 0;
  for (int g : ref.assign[0].gt) unique += g >= 0;
  ASSERT_GT(ref.assign[0].claims, unique) << "no anchor was claimed twice";
  ll::Yolo9Loss loss(nc);
  expect_matches_ref(loss.compute(raw, targets, 64, 64), ref, 1e-9);
  expect_same_assignment(run_assign(loss, raw, targets, 64, 64), ref.assign, targets, 64, 64);
}

TEST(Yolo9Loss, GtWithoutGridAnchorTakesItsBestAnchor) {
  // Box (9, 9)-(11.5, 11.5) px contains no anchor centre of any level. The P3 anchor at
  // (12, 12) predicts about (9, 9)-(12.5, 12.5), so it is the best aligned anchor.
  const int nc = 2;
  auto raw = random_raw(1, 64, 64, nc, 51, torch::kDouble, 0.1);
  for (auto& r : raw) r.narrow(1, 0, 4 * kR).fill_(0);        // large uniform boxes elsewhere
  auto cell = raw[0].select(0, 0).select(1, 1).select(1, 1);  // P3 row 1, col 1: [C]
  cell.narrow(0, 0, 4 * kR).fill_(-30);
  const double lt_bins[4] = {0.375, 0.375, 0.0625, 0.0625};  // l, t, r, b in strides
  for (int s = 0; s < 4; ++s) {
    cell[s * kR + 0] = 0.0;
    cell[s * kR + 1] = std::log(lt_bins[s] / (1 - lt_bins[s]));
  }
  const auto targets = make_targets(1, 2, {{{1, 9 / 64., 9 / 64., 11.5 / 64., 11.5 / 64.}}});
  const auto ref = ref_loss(raw, targets, 64, 64, nc);
  ASSERT_TRUE(ref.assign[0].fallback[0]);
  ll::Yolo9Loss loss(nc);
  const auto a = run_assign(loss, raw, targets, 64, 64);
  EXPECT_EQ(a.valid.sum().item<int64_t>(), 1);
  EXPECT_TRUE(a.valid[0][9].item<bool>());  // P3 anchor (12, 12)
  expect_same_assignment(a, ref.assign, targets, 64, 64);
  expect_matches_ref(loss.compute(raw, targets, 64, 64), ref, 1e-9);
}

TEST(Yolo9Loss, ReachLimitExcludesFarAnchors) {
  // A 256x256 box over a 256x256 input: every P3 anchor lies inside it, but none is within
  // 14.99 strides of all four edges, so none may be a candidate even though P3 predicts the
  // same large boxes with far higher class scores than P4/P5.
  const int nc = 1;
  auto raw = random_raw(1, 256, 256, nc, 61, torch::kDouble, 0.2);
  raw[0].narrow(1, 0, 4 * kR).view({1, 4, kR, 32, 32}).select(2, 15).add_(12);  // ~15 strides
  raw[1].narrow(1, 0, 4 * kR).view({1, 4, kR, 16, 16}).select(2, 8).add_(12);   // ~8 strides
  raw[0].narrow(1, 4 * kR, 1).fill_(8);
  raw[1].narrow(1, 4 * kR, 1).fill_(-4);
  raw[2].narrow(1, 4 * kR, 1).fill_(-4);
  const auto targets = make_targets(1, 1, {{{0, 0, 0, 1, 1}}});
  const auto ref = ref_loss(raw, targets, 256, 256, nc);
  ll::Yolo9Loss loss(nc);
  const auto a = run_assign(loss, raw, targets, 256, 256);
  EXPECT_EQ(a.valid.sum().item<int64_t>(), 10);
  EXPECT_EQ(a.valid.narrow(1, 0, 32 * 32).sum().item<int64_t>(), 0);
  expect_same_assignment(a, ref.assign, targets, 256, 256);
  expect_matches_ref(loss.compute(raw, targets, 256, 256), ref, 1e-9);
}

TEST(Yolo9Loss, NoGroundTruthGivesZeroBoxAndDflStillConnected) {
  const int nc = 4;
  auto raw = random_raw(2, 64, 64, nc, 71, torch::kFloat);
  for (auto& r : raw) r.requires_grad_(true);
  ll::Yolo9Loss loss(nc);
  const auto out = loss.compute(raw, make_targets(2, 100, {{}, {}}, torch::kFloat), 64, 64);
  EXPECT_EQ(val(out.term("box")), 0.0);
  EXPECT_EQ(val(out.term("dfl")), 0.0);
  EXPECT_EQ(val(out.num_fg), 0.0);
  // With N = 1 the class term is 0.5 * sum(softplus(logit)) over every anchor and class.
  double want = 0;
  for (const auto& r : raw)
    want +=
        torch::softplus(r.detach().narrow(1, 4 * kR, nc).to(torch::kDouble)).sum().item<double>();
  EXPECT_NEAR(val(out.term("cls")), 0.5 * want, 1e-5 * want);
  EXPECT_NEAR(val(out.total), 0.5 * want, 1e-5 * want);
  ASSERT_TRUE(out.total.requires_grad());
  EXPECT_FALSE(out.term("box").requires_grad());
  out.total.backward();
  for (const auto& r : raw) {
    ASSERT_TRUE(r.grad().defined());
    EXPECT_EQ(r.grad().narrow(1, 0, 4 * kR).abs().max().item<float>(), 0.0f);
    const auto want_cls = 0.5 * torch::sigmoid(r.detach().narrow(1, 4 * kR, nc));
    EXPECT_LT((r.grad().narrow(1, 4 * kR, nc) - want_cls).abs().max().item<float>(), 1e-6);
  }
  // T = 0 behaves like all padding.
  const auto empty = loss.compute(raw, torch::zeros({2, 0, 5}), 64, 64);
  EXPECT_EQ(val(empty.total), val(out.total));
}

TEST(Yolo9Loss, PaddingRowsAreIgnoredForAnyRowCount) {
  const int nc = 3;
  const auto raw = random_raw(2, 64, 64, nc, 81, torch::kFloat);
  const std::vector<std::vector<std::array<double, 5>>> rows = {
      {{0, 0.1, 0.1, 0.5, 0.6}, {2, 0.4, 0.3, 0.9, 0.8}}, {{1, 0.2, 0.2, 0.7, 0.9}}};
  ll::Yolo9Loss loss(nc);
  const auto few = loss.compute(raw, make_targets(2, 2, rows, torch::kFloat), 64, 64);
  auto padded = make_targets(2, 100, rows, torch::kFloat);
  padded[1][50] =
      torch::tensor({-1.0f, 0.3f, 0.3f, 0.6f, 0.6f});  // padding with a real-looking box
  const auto many = loss.compute(raw, padded, 64, 64);
  for (auto [x, y] : {std::make_pair(few.total, many.total), std::make_pair(few.term("box"), many.term("box")),
                      std::make_pair(few.term("dfl"), many.term("dfl")), std::make_pair(few.term("cls"), many.term("cls")),
                      std::make_pair(few.num_fg, many.num_fg)})
    EXPECT_NEAR(val(x), val(y), 1e-6 * std::abs(val(y)));
  EXPECT_GT(val(few.term("box")), 0.0);
}

TEST(Yolo9Loss, GradientMatchesFiniteDifferencesForFixedAssignment) {
  // Tiny double input: 32x32 (21 anchors), 2 classes, 2 boxes. The assignment (and with it the
  // soft targets and N) is held fixed, as are CIoU's alphas, which carry no gradient.
  const int nc = 2;
  auto raw = random_raw(1, 32, 32, nc, 91, torch::kDouble, 1.0);
  const auto targets = make_targets(1, 2, {{{0, 0.1, 0.15, 0.6, 0.7}, {1, 0.5, 0.4, 0.95, 0.9}}});
  ll::Yolo9Loss loss(nc);
  const auto& grid = loss.anchor_grid(level_hw(raw), torch::kCPU);
  for (auto& r : raw) r.requires_grad_(true);
  const auto d = loss.decode(raw, grid);
  const auto a = loss.assign(d.cls_logits, d.boxes, to_pixels(targets, 32, 32), grid);
  loss.loss_terms(d, a, grid).total.backward();

  const auto anchors = ref_anchors(raw);
  const auto gts = ref_targets(targets, 0, 32, 32);
  const auto ref_as = ref_assign(ref_decode(raw, 0, anchors, nc), anchors, gts);
  ASSERT_GE(std::count_if(ref_as.gt.begin(), ref_as.gt.end(), [](int g) { return g >= 0; }), 2);
  expect_same_assignment(a, {ref_as}, targets, 32, 32);
  std::vector<double> alphas;
  ref_terms(ref_decode(raw, 0, anchors, nc), anchors, gts, ref_as, nc, nullptr, &alphas);
  const auto total_at = [&](const std::vector<Tensor>& x) {
    return ref_combine(
               {ref_terms(ref_decode(x, 0, anchors, nc), anchors, gts, ref_as, nc, &alphas)})
        .total;
  };
  std::vector<Tensor> x;
  for (const auto& r : raw) x.push_back(r.detach().clone());
  const double h = 1e-6;
  double worst = 0, largest = 0;
  for (size_t l = 0; l < x.size(); ++l) {
    auto flat = x[l].view(-1);
    const auto grad = raw[l].grad().contiguous().view(-1);
    for (int64_t i = 0; i < flat.numel(); ++i) {
      const double x0 = flat[i].item<double>();
      flat[i] = x0 + h;
      const double up = total_at(x);
      flat[i] = x0 - h;
      const double down = total_at(x);
      flat[i] = x0;
      const double g = grad[i].item<double>();
      worst = std::max(worst, std::abs((up - down) / (2 * h) - g));
      largest = std::max(largest, std::abs(g));
    }
  }
  EXPECT_GT(largest, 1e-2);
  EXPECT_LT(worst, 1e-7);
}

TEST(Yolo9Loss, RejectsBadInput) {
  ll::Yolo9Loss loss(3);
  const auto raw = random_raw(1, 64, 64, 3, 1, torch::kFloat);
  const auto targets = make_targets(1, 2, {{{0, 0.1, 0.1, 0.5, 0.5}}}, torch::kFloat);
  EXPECT_THROW(ll::Yolo9Loss(0), libreyolo::UsageError);
  EXPECT_THROW(loss.compute({raw[0], raw[1]}, targets, 64, 64), libreyolo::UsageError);
  EXPECT_THROW(loss.compute(random_raw(1, 64, 64, 4, 1, torch::kFloat), targets, 64, 64),
               libreyolo::UsageError);
  EXPECT_THROW(loss.compute(raw, targets.narrow(2, 0, 4), 64, 64), libreyolo::UsageError);
  EXPECT_THROW(loss.compute(raw, torch::zeros({2, 2, 5}), 64, 64), libreyolo::UsageError);
  EXPECT_THROW(loss.compute(raw, targets, 0, 64), libreyolo::UsageError);
  auto bad_class = targets.clone();
  bad_class[0][0][0] = 3.0f;
  EXPECT_THROW(loss.compute(raw, bad_class, 64, 64), libreyolo::DataError);
}

TEST(Yolo9Loss, Bf16InputsUnderAutocastComputeInFloat32) {
  const int nc = 3;
  const auto raw = random_raw(2, 64, 64, nc, 101, torch::kBFloat16);
  std::vector<Tensor> upcast;
  for (const auto& r : raw) upcast.push_back(r.to(torch::kFloat));
  const auto targets =
      make_targets(2, 3, {{{0, 0.1, 0.1, 0.5, 0.6}}, {{2, 0.3, 0.2, 0.9, 0.7}}}, torch::kFloat);
  ll::Yolo9Loss loss(nc);
  const auto want = loss.compute(upcast, targets, 64, 64);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  const auto got = loss.compute(raw, targets, 64, 64);
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(got.total.scalar_type(), torch::kFloat);
  EXPECT_NEAR(val(got.total), val(want.total), 1e-6 * val(want.total));
  EXPECT_NEAR(val(got.term("box")), val(want.term("box")), 1e-6 * val(want.term("box")));
  EXPECT_EQ(val(got.num_fg), val(want.num_fg));
}

TEST(Yolo9Loss, FixtureParity) {
  LY_REQUIRE_FIXTURES(dir);
  const auto expect = libreyolo::io::load_torch_file(dir + "/yolo9t_nc80_s320_expect.pt");
  std::vector<Tensor> raw;
  for (int l = 0; l < 3; ++l) raw.push_back(expect->get("train_raw_" + std::to_string(l))->tensor);
  ll::Yolo9Loss loss(80);
  const auto out = loss.compute(raw, expect->get("targets")->tensor, 320, 320);
  for (auto [name, got] :
       {std::make_pair("total_loss", out.total), std::make_pair("box_loss", out.term("box")),
        std::make_pair("dfl_loss", out.term("dfl")), std::make_pair("cls_loss", out.term("cls"))}) {
    const double want = expect->get(std::string("loss_") + name)->tensor.item<double>();
    EXPECT_NEAR(val(got), want, 1e-4 * std::abs(want)) << name;
    EXPECT_EQ(got.dim(), 0) << name;
  }
  // The sum of the four weighted terms is the total, as in the reference's dict.
  EXPECT_NEAR(val(out.term("box")) + val(out.term("dfl")) + val(out.term("cls")), val(out.total), 1e-6 * val(out.total));
}
