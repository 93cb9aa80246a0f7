#include "plots/plots.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "data/dataset.hpp"
#include "eval/coco_eval.hpp"
#include "eval/confusion.hpp"
#include "ops/image_ops.hpp"
#include "plots/canvas.hpp"

namespace libreyolo::plots {
namespace {

std::string class_name(const std::vector<std::string>& names, int64_t id) {
  return id >= 0 && id < static_cast<int64_t>(names.size()) && !names[id].empty() ? names[id]
                                                                                 : std::to_string(id);
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) out.push_back(trim(cell));
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

double parse_cell(const std::string& s) {
  if (s.empty()) return NAN;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return end && *end == '\0' ? v : NAN;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

bool light(Rgb8 c) { return 0.299 * c.r + 0.587 * c.g + 0.114 * c.b > 150; }

}  // namespace

// ------------------------------------------------------------------ results.png

void plot_results_csv(const std::string& csv, const std::string& png) {
  std::ifstream f(csv);
  if (!f) throw DataError("cannot read " + csv + " to plot it");
  std::string line;
  if (!std::getline(f, line)) throw DataError(csv + " is empty: nothing to plot");
  const std::vector<std::string> header = split_csv_line(line);
  std::vector<std::vector<double>> cols(header.size());
  while (std::getline(f, line)) {
    if (trim(line).empty()) continue;
    const auto cells = split_csv_line(line);
    for (size_t i = 0; i < header.size(); ++i) cols[i].push_back(i < cells.size() ? parse_cell(cells[i]) : NAN);
  }
  const size_t rows = cols.empty() ? 0 : cols[0].size();
  if (rows == 0) throw DataError(csv + " has no epoch rows yet: nothing to plot");

  std::vector<double> x(rows);
  const auto ep = std::find(header.begin(), header.end(), "epoch");
  for (size_t r = 0; r < rows; ++r)
    x[r] = ep != header.end() && std::isfinite(cols[ep - header.begin()][r]) ? cols[ep - header.begin()][r]
                                                                           : static_cast<double>(r + 1);

  struct Panel {
    std::string title;
    std::vector<size_t> series;  // column indices
  };
  std::vector<Panel> panels;
  for (size_t i = 0; i < header.size(); ++i)
    if (starts_with(header[i], "train/")) panels.push_back({header[i], {i}});
  for (const char* m : {"metrics/precision", "metrics/recall", "metrics/mAP50", "metrics/mAP50-95",
                        "metrics/accuracy_top1", "metrics/accuracy_top5"}) {
    const auto it = std::find(header.begin(), header.end(), m);
    if (it != header.end()) panels.push_back({m, {static_cast<size_t>(it - header.begin())}});
  }
  Panel lr{"learning rate", {}};
  for (size_t i = 0; i < header.size(); ++i)
    if (starts_with(header[i], "lr/")) lr.series.push_back(i);
  if (!lr.series.empty()) panels.push_back(lr);
  if (panels.empty())
    throw DataError(csv + " has no train/..., metrics/... or lr/... column to plot");

  const int ncol = std::min<int>(5, static_cast<int>(panels.size()));
  const int nrow = (static_cast<int>(panels.size()) + ncol - 1) / ncol;
  const int pw = 440, ph = 360;
  Canvas c(ncol * pw, nrow * ph);
  const auto [xlo, xhi] = rows == 1 ? std::pair<double, double>{x[0] - 1, x[0] + 1} : data_range(x, 0.04);
  for (size_t p = 0; p < panels.size(); ++p) {
    const Panel& pan = panels[p];
    std::vector<double> all;
    for (size_t s : pan.series) all.insert(all.end(), cols[s].begin(), cols[s].end());
    const auto [ylo, yhi] = data_range(all, 0.08);
    AxesSpec spec;
    spec.title = pan.title;
    spec.xlabel = "epoch";
    spec.x0 = xlo, spec.x1 = xhi, spec.y0 = ylo, spec.y1 = yhi;
    const Axes a = draw_axes(c, static_cast<int>(p % ncol) * pw, static_cast<int>(p / ncol) * ph, pw, ph, spec);
    std::vector<std::pair<std::string, Rgb8>> legend;
    for (size_t si = 0; si < pan.series.size(); ++si) {
      const Rgb8 col = series_color(si);
      std::vector<std::pair<double, double>> pts;
      for (size_t r = 0; r < rows; ++r)
        if (std::isfinite(cols[pan.series[si]][r])) pts.emplace_back(a.px(x[r]), a.py(cols[pan.series[si]][r]));
      c.polyline(pts, col, 2.5);
      if (pts.size() <= 60)
        for (const auto& [px, py] : pts) c.disc(px, py, 3.5, col);
      legend.emplace_back(header[pan.series[si]], col);
      if (pan.series.size() == 1 && pts.size() >= 10) {
        // A Gaussian-smoothed copy (sigma 3 points, edges held), as Ultralytics draws.
        std::vector<std::pair<double, double>> sm(pts.size());
        for (size_t i = 0; i < pts.size(); ++i) {
          double sw = 0, sy = 0;
          for (int d = -9; d <= 9; ++d) {
            const size_t k = static_cast<size_t>(std::clamp<long>(static_cast<long>(i) + d, 0, static_cast<long>(pts.size()) - 1));
            const double w = std::exp(-d * d / 18.0);
            sw += w;
            sy += w * pts[k].second;
          }
          sm[i] = {pts[i].first, sy / sw};
        }
        c.polyline(sm, series_color(1), 2.0, 0.9);
        legend = {{"results", col}, {"smooth", series_color(1)}};
      }
    }
    if (legend.size() > 1) draw_legend(c, a.right - legend_width(legend) - 6, a.top + 6, legend);
  }
  c.save(png);
}

// ------------------------------------------------------------------ labels.jpg

void plot_labels(const torch::Tensor& labels, const std::vector<std::string>& names,
                 const std::string& jpg) {
  if (!labels.defined() || (labels.numel() > 0 && (labels.dim() != 2 || labels.size(1) != 5)))
    throw UsageError("plot_labels: labels must be [N, 5] rows (class, cx, cy, w, h)");
  const torch::Tensor l = labels.numel() ? labels.to(torch::kCPU, torch::kDouble).contiguous()
                                         : torch::empty({0, 5}, torch::kDouble);
  const int64_t n = l.size(0);
  const double* p = l.data_ptr<double>();
  int64_t nc = static_cast<int64_t>(names.size());
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(p[5 * i]) && p[5 * i] >= 0) nc = std::max<int64_t>(nc, static_cast<int64_t>(p[5 * i]) + 1);
  nc = std::max<int64_t>(nc, 1);
  if (nc > 100000) throw DataError(strfmt("plot_labels: class id %lld is implausible", static_cast<long long>(nc - 1)));
  std::vector<double> counts(nc, 0.0);
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(p[5 * i]) && p[5 * i] >= 0) counts[static_cast<int64_t>(p[5 * i])] += 1;

  const int W = 1500, top_h = 560, bottom_h = 520;
  Canvas c(W, top_h + bottom_h);

  AxesSpec hs;
  hs.title = strfmt("instances per class (%lld boxes)", static_cast<long long>(n));
  hs.ylabel = "instances";
  hs.x0 = -0.5, hs.x1 = nc - 0.5, hs.y0 = 0;
  hs.y1 = std::max(1.0, *std::max_element(counts.begin(), counts.end()) * 1.08);
  if (nc <= 80)
    for (int64_t k = 0; k < nc; ++k) hs.xtick_names.push_back(class_name(names, k));
  else
    hs.xlabel = "class id";
  hs.scale = nc <= 40 ? 2 : 1;
  const Axes ha = draw_axes(c, 0, 0, W, top_h, hs);
  const double bar = 0.8 / 2;
  for (int64_t k = 0; k < nc; ++k) {
    if (counts[k] <= 0) continue;
    const int x1 = static_cast<int>(std::lround(ha.px(k - bar))), x2 = std::max(x1, static_cast<int>(std::lround(ha.px(k + bar))) - 1);
    c.fill(x1, static_cast<int>(std::lround(ha.py(counts[k]))), x2, ha.bottom, ops::class_color(k));
    if (nc <= 40) c.text((x1 + x2) / 2.0, ha.py(counts[k]) - 4, strfmt("%lld", static_cast<long long>(counts[k])), kBlack, 1, 0.5, 1);
  }

  // At most 200k points in the scatter plots (evenly spaced through the rows).
  const int64_t stride = std::max<int64_t>(1, n / 200000);
  const double alpha = std::clamp(400.0 / std::max<double>(1, static_cast<double>(n / stride)), 0.04, 0.8);
  const int pw = W / 3;
  AxesSpec cs;
  cs.title = "box centres";
  cs.xlabel = "x";
  cs.ylabel = "y";
  cs.y_down = true;
  const Axes ca = draw_axes(c, 0, top_h, pw, bottom_h, cs);
  AxesSpec ss;
  ss.title = "box sizes";
  ss.xlabel = "width";
  ss.ylabel = "height";
  const Axes sa = draw_axes(c, pw, top_h, pw, bottom_h, ss);
  for (int64_t i = 0; i < n; i += stride) {
    const double* r = p + 5 * i;
    const Rgb8 col = ops::class_color(static_cast<int64_t>(r[0]));
    if (ca.contains(r[1], r[2])) c.disc(ca.px(r[1]), ca.py(r[2]), 1.8, col, alpha);
    if (sa.contains(r[3], r[4])) c.disc(sa.px(r[3]), sa.py(r[4]), 1.8, col, alpha);
  }
  AxesSpec bs;
  const int64_t shown = std::min<int64_t>(n, 500);
  bs.title = strfmt("box shapes (%lld shown)", static_cast<long long>(shown));
  bs.xlabel = "width";
  bs.ylabel = "height";
  bs.x0 = -0.5, bs.x1 = 0.5, bs.y0 = -0.5, bs.y1 = 0.5;
  const Axes ba = draw_axes(c, 2 * pw, top_h, W - 2 * pw, bottom_h, bs);
  for (int64_t i = 0; i < shown; ++i) {
    const double* r = p + 5 * i;
    const double hw = std::min(r[3], 1.0) / 2, hh = std::min(r[4], 1.0) / 2;
    const Rgb8 col = ops::class_color(static_cast<int64_t>(r[0]));
    const double x1 = ba.px(-hw), x2 = ba.px(hw), y1 = ba.py(hh), y2 = ba.py(-hh);
    c.line(x1, y1, x2, y1, col, 1.2, 0.5);
    c.line(x1, y2, x2, y2, col, 1.2, 0.5);
    c.line(x1, y1, x1, y2, col, 1.2, 0.5);
    c.line(x2, y1, x2, y2, col, 1.2, 0.5);
  }
  c.save(jpg);
}

void plot_labels(const data::YoloDataset& dataset, const std::vector<std::string>& names,
                 const std::string& jpg) {
  std::vector<double> rows;
  for (int64_t i = 0; i < dataset.size(); ++i) {
    const auto [h0, w0] = dataset.original_hw(i);
    if (h0 <= 0 || w0 <= 0) continue;
    for (const data::Box& b : dataset.original_boxes(i)) {
      rows.insert(rows.end(), {b.cls, (b.x1 + b.x2) / 2 / w0, (b.y1 + b.y2) / 2 / h0, (b.x2 - b.x1) / w0,
                               (b.y2 - b.y1) / h0});
    }
  }
  const int64_t n = static_cast<int64_t>(rows.size() / 5);
  plot_labels(n ? torch::from_blob(rows.data(), {n, 5}, torch::kDouble).clone() : torch::empty({0, 5}), names,
              jpg);
}

// ------------------------------------------------------------------ train_batch*.jpg

void plot_train_batch(const torch::Tensor& images, const torch::Tensor& targets,
                      const std::vector<std::string>& names, const std::string& jpg) {
  if (!images.defined() || images.dim() != 4 || images.size(3) != 3 || images.scalar_type() != torch::kUInt8 ||
      images.size(0) == 0)
    throw UsageError("plot_train_batch: images must be a non-empty uint8 [B, H, W, 3] tensor");
  if (!targets.defined() || targets.dim() != 3 || targets.size(0) != images.size(0) || targets.size(2) != 5)
    throw UsageError(strfmt("plot_train_batch: targets must be [B=%lld, T, 5] rows (class, x1, y1, x2, y2)",
                            static_cast<long long>(images.size(0))));
  const torch::Tensor imgs = images.to(torch::kCPU).contiguous();
  const torch::Tensor tg = targets.to(torch::kCPU, torch::kFloat).contiguous();
  const int n = static_cast<int>(std::min<int64_t>(images.size(0), 16));
  const int ns = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n))));
  const int H = static_cast<int>(imgs.size(1)), Wd = static_cast<int>(imgs.size(2));
  const double scale = std::min(1.0, 1920.0 / (ns * std::max(H, Wd)));
  const int th = std::max(1, static_cast<int>(std::lround(H * scale)));
  const int tw = std::max(1, static_cast<int>(std::lround(Wd * scale)));
  const int nrow = (n + ns - 1) / ns;
  Canvas c(ns * tw, nrow * th);
  const int fs = std::min(th, tw) >= 320 ? 2 : 1;
  const int thick = std::max(1, static_cast<int>(std::lround(2 * std::max(scale, 0.5))));
  const int64_t T = tg.size(1);
  const float* t = tg.data_ptr<float>();
  for (int i = 0; i < n; ++i) {
    const int ox = (i % ns) * tw, oy = (i / ns) * th;
    torch::Tensor tile = imgs[i];
    if (th != H || tw != Wd) tile = ops::resize_bilinear(tile, th, tw);
    c.image().narrow(0, oy, th).narrow(1, ox, tw).copy_(tile);
    for (int64_t j = 0; j < T; ++j) {
      const float* r = t + (static_cast<int64_t>(i) * T + j) * 5;
      if (!(r[0] >= 0) || !std::isfinite(r[1] + r[2] + r[3] + r[4])) continue;
      const int64_t cls = static_cast<int64_t>(r[0]);
      const Rgb8 col = ops::class_color(cls);
      const int x1 = ox + static_cast<int>(std::lround(r[1] * tw)), y1 = oy + static_cast<int>(std::lround(r[2] * th));
      const int x2 = ox + static_cast<int>(std::lround(r[3] * tw)) - 1, y2 = oy + static_cast<int>(std::lround(r[4] * th)) - 1;
      if (x2 < x1 || y2 < y1) continue;
      c.frame(std::max(x1, ox), std::max(y1, oy), std::min(x2, ox + tw - 1), std::min(y2, oy + th - 1), col, thick);
      const std::string name = class_name(names, cls);
      const int lw = text_w(name, fs) + 2 * fs, lh = text_h(fs) + 2 * fs;
      const int lx = std::clamp(x1, ox, std::max(ox, ox + tw - lw));
      const int ly = y1 - lh >= oy ? y1 - lh : std::max(y1, oy);
      c.fill(lx, ly, lx + lw - 1, ly + lh - 1, col);
      c.text(lx + fs, ly + fs, name, light(col) ? kBlack : kWhite, fs);
    }
  }
  // White lines between the tiles.
  for (int i = 1; i < ns; ++i) c.fill(i * tw - 1, 0, i * tw, c.height() - 1, kWhite);
  for (int i = 1; i < nrow; ++i) c.fill(0, i * th - 1, c.width() - 1, i * th, kWhite);
  c.save(jpg);
}

// ------------------------------------------------------------------ confusion_matrix.png

namespace {

// matplotlib's "Blues", light to dark.
Rgb8 blues(double v) {
  static constexpr Rgb8 kStops[9] = {{247, 251, 255}, {222, 235, 247}, {198, 219, 239},
                                     {158, 202, 225}, {107, 174, 214}, {66, 146, 198},
                                     {33, 113, 181},  {8, 81, 156},    {8, 48, 107}};
  v = std::clamp(std::isfinite(v) ? v : 0.0, 0.0, 1.0) * 8;
  const int i = std::min(static_cast<int>(v), 7);
  const double f = v - i;
  auto mix = [&](uint8_t a, uint8_t b) { return static_cast<uint8_t>(std::lround(a + (b - a) * f)); };
  return {mix(kStops[i].r, kStops[i + 1].r), mix(kStops[i].g, kStops[i + 1].g), mix(kStops[i].b, kStops[i + 1].b)};
}

}  // namespace

namespace {

// A normalised matrix v [n x n] (predicted row, true column) with `labels` on both axes.
void plot_normalized_matrix(const std::vector<double>& v, const std::vector<std::string>& labels,
                            const std::string& png) {
  const int n = static_cast<int>(labels.size());
  const int cell = std::clamp(900 / n, 4, 64);
  const bool show_names = cell >= 9;
  const int s = cell >= 16 ? 2 : 1, gap = 3 * s;
  int name_room = 0;
  for (const auto& l : labels) name_room = std::max(name_room, text_w(l, s));
  if (!show_names) name_room = 0;
  const int title_h = text_h(2) + 12;
  const int left = 10 + text_h(2) + 10 + name_room + gap + 2;
  const int top = title_h + 10;
  const int grid = n * cell;
  const int bar_x = left + grid + 24, bar_w = 24;
  const int W = bar_x + bar_w + 8 + text_w("0.0", 2) + 16;
  const int H = top + grid + gap + name_room + 10 + text_h(2) + 12;
  Canvas c(W, H);
  c.text(left + grid / 2.0, 8, "Confusion Matrix Normalized", kBlack, 2, 0.5, 0);
  c.text(left + grid / 2.0, H - 10, "True", kBlack, 2, 0.5, 1);
  c.text_up(10, top + grid / 2.0, "Predicted", kBlack, 2, 0.5, 0);

  const bool values = cell >= 28;
  for (int p = 0; p < n; ++p)
    for (int t = 0; t < n; ++t) {
      const double x = v[static_cast<size_t>(p) * n + t];
      const int x1 = left + t * cell, y1 = top + p * cell;
      c.fill(x1, y1, x1 + cell - 1, y1 + cell - 1, blues(x));
      if (values && x >= 0.005)
        c.text(x1 + cell / 2.0, y1 + cell / 2.0, strfmt("%.2f", x), x > 0.5 ? kWhite : kBlack, cell >= 44 ? 2 : 1,
               0.5, 0.5);
    }
  c.frame(left - 1, top - 1, left + grid, top + grid, kGrey, 1);
  if (show_names)
    for (int k = 0; k < n; ++k) {
      const double mid = k * cell + cell / 2.0;
      c.text(left - gap, top + mid, labels[k], kBlack, s, 1, 0.5);
      c.text_up(left + mid, top + grid + gap, labels[k], kBlack, s, 1, 0.5);
    }
  // Colour bar 0..1.
  for (int y = 0; y < grid; ++y) c.fill(bar_x, top + y, bar_x + bar_w - 1, top + y, blues(1.0 - (y + 0.5) / grid));
  c.frame(bar_x - 1, top - 1, bar_x + bar_w, top + grid, kGrey, 1);
  for (int i = 0; i <= 5; ++i) {
    const double y = top + grid - i * grid / 5.0;
    c.fill(bar_x + bar_w, static_cast<int>(y), bar_x + bar_w + 4, static_cast<int>(y), kBlack);
    c.text(bar_x + bar_w + 8, y, strfmt("%.1f", i / 5.0), kBlack, 2, 0, 0.5);
  }
  c.save(png);
}

}  // namespace

void plot_confusion_matrix(const eval::ConfusionMatrix& cm, const std::vector<std::string>& names,
                           const std::string& png) {
  std::vector<std::string> labels;
  for (int k = 0; k <= cm.num_classes(); ++k)
    labels.push_back(shorten(k < cm.num_classes() ? class_name(names, k) : "background", 16));
  plot_normalized_matrix(cm.normalized(), labels, png);
}

void plot_confusion_matrix(const std::vector<int64_t>& counts, const std::vector<std::string>& names,
                           const std::string& png) {
  const int nc = static_cast<int>(names.size());
  if (counts.size() != static_cast<size_t>(nc) * nc)
    throw std::invalid_argument("plot_confusion_matrix: counts must be [nc x nc] for the nc names");
  std::vector<std::string> labels;
  for (int k = 0; k < nc; ++k) labels.push_back(shorten(class_name(names, k), 16));
  plot_normalized_matrix(eval::normalize_columns(counts, nc), labels, png);
}

// ------------------------------------------------------------------ PR / F1 / P / R curves

namespace {

constexpr int kCurvePanel = 720;
constexpr size_t kMaxLegendClasses = 20;

// Canvas with a square chart and, when there are entries, the legend to its right.
Canvas curve_canvas(const std::vector<std::pair<std::string, Rgb8>>& legend) {
  return Canvas(kCurvePanel + (legend.empty() ? 0 : legend_width(legend) + 20), kCurvePanel - 40);
}

std::vector<double> mean_over_classes(const std::vector<std::vector<double>>& ys, size_t len) {
  std::vector<double> m(len, 0.0);
  for (const auto& y : ys)
    for (size_t i = 0; i < len && i < y.size(); ++i) m[i] += y[i];
  for (double& x : m) x /= std::max<size_t>(ys.size(), 1);
  return m;
}

void draw_curves(Canvas& c, const Axes& a, const std::vector<double>& xs,
                 const std::vector<std::vector<double>>& ys, const std::vector<double>& mean) {
  const bool few = ys.size() <= kMaxLegendClasses;
  for (size_t k = 0; k < ys.size(); ++k) {
    std::vector<std::pair<double, double>> pts;
    for (size_t i = 0; i < xs.size() && i < ys[k].size(); ++i) pts.emplace_back(a.px(xs[i]), a.py(ys[k][i]));
    c.polyline(pts, few ? series_color(k + 1) : kGrey, few ? 1.6 : 1.0, few ? 0.9 : 0.45);
  }
  if (ys.empty()) return;
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < xs.size(); ++i) pts.emplace_back(a.px(xs[i]), a.py(mean[i]));
  c.polyline(pts, kBlue, 4.0);
}

}  // namespace

void plot_pr_curve(const eval::CocoStats& stats, const std::vector<std::string>& names,
                   const std::string& png) {
  const auto& cv = stats.curves;
  const size_t K = cv.pr.size();
  const std::vector<double> mean = mean_over_classes(cv.pr, cv.recall_thresholds.size());
  std::vector<std::pair<std::string, Rgb8>> legend;
  if (K <= kMaxLegendClasses)
    for (size_t k = 0; k < K; ++k)
      legend.emplace_back(strfmt("%s %.3f", shorten(class_name(names, stats.classes[k].category), 16).c_str(),
                                 stats.classes[k].ap50),
                          series_color(k + 1));
  legend.emplace_back(K ? strfmt("all classes %.3f mAP50", stats.stats[1]) : "no class has labels", kBlue);
  Canvas c = curve_canvas(legend);
  AxesSpec spec;
  spec.title = "Precision-Recall curve (IoU 0.50)";
  spec.xlabel = "Recall";
  spec.ylabel = "Precision";
  spec.y1 = 1.02;
  spec.x1 = 1.0;
  const Axes a = draw_axes(c, 0, 0, kCurvePanel, c.height(), spec);
  draw_curves(c, a, cv.recall_thresholds, cv.pr, mean);
  draw_legend(c, kCurvePanel, a.top, legend);
  c.save(png);
}

void plot_conf_curve(const eval::CocoStats& stats, const std::vector<std::string>& names, Curve which,
                     const std::string& png) {
  const auto& cv = stats.curves;
  const auto& ys = which == Curve::F1 ? cv.f1 : which == Curve::Precision ? cv.precision : cv.recall;
  const char* what = which == Curve::F1 ? "F1" : which == Curve::Precision ? "Precision" : "Recall";
  const size_t K = ys.size();
  const std::vector<double> mean = mean_over_classes(ys, cv.conf.size());
  size_t best = 0;
  for (size_t i = 0; i < mean.size(); ++i)
    if (mean[i] >= mean[best]) best = i;  // the highest confidence among equals
  std::vector<std::pair<std::string, Rgb8>> legend;
  if (K <= kMaxLegendClasses)
    for (size_t k = 0; k < K; ++k)
      legend.emplace_back(shorten(class_name(names, stats.classes[k].category), 16), series_color(k + 1));
  legend.emplace_back(K && !mean.empty() ? strfmt("all classes %.2f at %.3f", mean[best], cv.conf[best])
                                         : "no class has labels",
                      kBlue);
  Canvas c = curve_canvas(legend);
  AxesSpec spec;
  spec.title = strfmt("%s-Confidence curve (IoU 0.50)", what);
  spec.xlabel = "Confidence";
  spec.ylabel = what;
  spec.y1 = 1.02;
  const Axes a = draw_axes(c, 0, 0, kCurvePanel, c.height(), spec);
  draw_curves(c, a, cv.conf, ys, mean);
  draw_legend(c, kCurvePanel, a.top, legend);
  c.save(png);
}

std::vector<std::string> plot_validation(const eval::CocoStats& stats, const eval::ConfusionMatrix* cm,
                                         const std::vector<std::string>& names, const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  auto path = [&](const char* f) {
    out.push_back((fs::path(dir) / f).string());
    return out.back();
  };
  if (cm) plot_confusion_matrix(*cm, names, path("confusion_matrix.png"));
  plot_pr_curve(stats, names, path("PR_curve.png"));
  plot_conf_curve(stats, names, Curve::F1, path("F1_curve.png"));
  plot_conf_curve(stats, names, Curve::Precision, path("P_curve.png"));
  plot_conf_curve(stats, names, Curve::Recall, path("R_curve.png"));
  return out;
}

}  // namespace libreyolo::plots
