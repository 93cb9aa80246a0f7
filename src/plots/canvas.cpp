#include "plots/canvas.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "io/image.hpp"

namespace libreyolo::plots {

Rgb8 series_color(size_t i) {
  static constexpr Rgb8 kTab10[10] = {{31, 119, 180}, {255, 127, 14},  {44, 160, 44},
                                      {214, 39, 40},  {148, 103, 189}, {140, 86, 75},
                                      {227, 119, 194}, {127, 127, 127}, {188, 189, 34},
                                      {23, 190, 207}};
  return kTab10[i % 10];
}

Canvas::Canvas(int width, int height, Rgb8 background) : w_(width), h_(height) {
  if (w_ <= 0 || h_ <= 0 || static_cast<int64_t>(w_) * h_ > (int64_t{1} << 26))
    throw UsageError(strfmt("plot canvas of %dx%d pixels", w_, h_));
  img_ = torch::empty({h_, w_, 3}, torch::kUInt8);
  px_ = img_.data_ptr<uint8_t>();
  for (int64_t i = 0; i < static_cast<int64_t>(w_) * h_; ++i) {
    px_[3 * i] = background.r;
    px_[3 * i + 1] = background.g;
    px_[3 * i + 2] = background.b;
  }
}

void Canvas::blend(int x, int y, Rgb8 c, double a) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_ || a <= 0) return;
  a = std::min(a, 1.0);
  uint8_t* p = px_ + (static_cast<int64_t>(y) * w_ + x) * 3;
  p[0] = static_cast<uint8_t>(std::lround(p[0] + (c.r - p[0]) * a));
  p[1] = static_cast<uint8_t>(std::lround(p[1] + (c.g - p[1]) * a));
  p[2] = static_cast<uint8_t>(std::lround(p[2] + (c.b - p[2]) * a));
}

void Canvas::fill(int x1, int y1, int x2, int y2, Rgb8 c, double alpha) {
  if (x1 > x2) std::swap(x1, x2);
  if (y1 > y2) std::swap(y1, y2);
  x1 = std::max(x1, 0), y1 = std::max(y1, 0);
  x2 = std::min(x2, w_ - 1), y2 = std::min(y2, h_ - 1);
  for (int y = y1; y <= y2; ++y)
    for (int x = x1; x <= x2; ++x) blend(x, y, c, alpha);
}

void Canvas::frame(int x1, int y1, int x2, int y2, Rgb8 c, int t) {
  fill(x1, y1, x2, y1 + t - 1, c);
  fill(x1, y2 - t + 1, x2, y2, c);
  fill(x1, y1, x1 + t - 1, y2, c);
  fill(x2 - t + 1, y1, x2, y2, c);
}

void Canvas::line(double x0, double y0, double x1, double y1, Rgb8 c, double width, double alpha) {
  if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1)) return;
  const double r = std::max(width, 0.5) / 2.0;
  // Coverage of a pixel centre by the capsule around the segment: its distance to the segment
  // against the half width, with a one-pixel soft edge.
  const int bx0 = static_cast<int>(std::floor(std::min(x0, x1) - r - 1));
  const int bx1 = static_cast<int>(std::ceil(std::max(x0, x1) + r + 1));
  const int by0 = static_cast<int>(std::floor(std::min(y0, y1) - r - 1));
  const int by1 = static_cast<int>(std::ceil(std::max(y0, y1) + r + 1));
  const double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
  for (int y = std::max(by0, 0); y <= std::min(by1, h_ - 1); ++y) {
    for (int x = std::max(bx0, 0); x <= std::min(bx1, w_ - 1); ++x) {
      const double cx = x + 0.5, cy = y + 0.5;
      double t = len2 > 0 ? ((cx - x0) * dx + (cy - y0) * dy) / len2 : 0.0;
      t = std::clamp(t, 0.0, 1.0);
      const double ex = x0 + t * dx - cx, ey = y0 + t * dy - cy;
      const double cover = std::clamp(r + 0.5 - std::sqrt(ex * ex + ey * ey), 0.0, 1.0);
      if (cover > 0) blend(x, y, c, cover * alpha);
    }
  }
}

void Canvas::polyline(const std::vector<std::pair<double, double>>& pts, Rgb8 c, double width,
                      double alpha) {
  if (pts.size() == 1) disc(pts[0].first, pts[0].second, width / 2.0, c, alpha);
  for (size_t i = 1; i < pts.size(); ++i)
    line(pts[i - 1].first, pts[i - 1].second, pts[i].first, pts[i].second, c, width, alpha);
}

void Canvas::disc(double cx, double cy, double radius, Rgb8 c, double alpha) {
  if (!std::isfinite(cx) || !std::isfinite(cy)) return;
  line(cx, cy, cx, cy, c, 2 * radius, alpha);
}

int text_w(const std::string& s, int scale) { return ops::text_width(s, scale); }
int text_h(int scale) { return ops::text_height(scale); }

std::string shorten(const std::string& s, size_t max_chars) {
  if (s.size() <= max_chars || max_chars < 2) return s;
  return s.substr(0, max_chars - 1) + ".";
}

void Canvas::text(double x, double y, const std::string& s, Rgb8 c, int scale, double ax,
                  double ay) {
  const int tx = static_cast<int>(std::lround(x - ax * text_w(s, scale)));
  const int ty = static_cast<int>(std::lround(y - ay * text_h(scale)));
  ops::draw_text(img_, tx, ty, s, c, scale, /*keep_case=*/true);
}

void Canvas::text_up(double x, double y, const std::string& s, Rgb8 c, int scale, double ax,
                     double ay) {
  const int tw = text_w(s, scale), th = text_h(scale);
  if (tw <= 0) return;
  // Draw into a mask, then copy it turned: mask (row r, col q) -> canvas (q', r') with the
  // reading direction going up.
  auto mask = torch::zeros({th, tw, 3}, torch::kUInt8);
  ops::draw_text(mask, 0, 0, s, kWhite, scale, true);
  const uint8_t* m = mask.data_ptr<uint8_t>();
  // Rotated box: width th, height tw. ax runs along the text (upwards), ay across it.
  const int left = static_cast<int>(std::lround(x - ay * th));
  const int bottom = static_cast<int>(std::lround(y + ax * tw));
  for (int r = 0; r < th; ++r)
    for (int q = 0; q < tw; ++q)
      if (const uint8_t a = m[(static_cast<int64_t>(r) * tw + q) * 3]) blend(left + r, bottom - 1 - q, c, a / 255.0);
}

void Canvas::save(const std::string& path) const {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  io::save_image(path, img_, 92);
}

// ------------------------------------------------------------------ axes

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double raw = (hi - lo) / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  std::vector<double> out;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
    const double v = k * step;
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return out;
}

std::string tick_label(double v, double step) {
  if (v == 0) return "0";
  if (step > 0 && (step < 1e-3 || std::abs(v) >= 1e6)) {
    std::string s = strfmt("%.1e", v);  // "2.5e-05" -> shorten "e-05" to "e-5"
    const auto e = s.find('e');
    std::string mant = s.substr(0, e), ex = s.substr(e + 1);
    if (mant.size() > 2 && mant.substr(mant.size() - 2) == ".0") mant.resize(mant.size() - 2);
    const bool neg = ex[0] == '-';
    ex = ex.substr(1);
    while (ex.size() > 1 && ex[0] == '0') ex = ex.substr(1);
    return mant + "e" + (neg ? "-" : "") + ex;
  }
  const int decimals = step > 0 ? std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9))) : 2;
  return strfmt("%.*f", decimals, v);
}

std::pair<double, double> data_range(const std::vector<double>& v, double pad) {
  double lo = INFINITY, hi = -INFINITY;
  for (double x : v)
    if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!(lo <= hi)) return {0.0, 1.0};
  if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {
    const double d = std::abs(hi) > 0 ? std::abs(hi) * 0.1 : 1.0;
    return {lo - d, hi + d};
  }
  const double span = hi - lo;
  return {lo - pad * span, hi + pad * span};
}

double Axes::px(double x) const {
  const double f = (x - spec.x0) / (spec.x1 - spec.x0);
  return left + f * (right + 1 - left);
}

double Axes::py(double y) const {
  const double f = (y - spec.y0) / (spec.y1 - spec.y0);
  return spec.y_down ? top + f * (bottom + 1 - top) : bottom + 1 - f * (bottom + 1 - top);
}

bool Axes::contains(double x, double y) const {
  const double ylo = std::min(spec.y0, spec.y1), yhi = std::max(spec.y0, spec.y1);
  return x >= std::min(spec.x0, spec.x1) && x <= std::max(spec.x0, spec.x1) && y >= ylo && y <= yhi;
}

Axes draw_axes(Canvas& c, int x, int y, int w, int h, const AxesSpec& spec) {
  const int s = spec.scale, th = text_h(s), gap = 3 * s;
  const auto xt = nice_ticks(std::min(spec.x0, spec.x1), std::max(spec.x0, spec.x1));
  const auto yt = nice_ticks(std::min(spec.y0, spec.y1), std::max(spec.y0, spec.y1));
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 0, ystep = yt.size() > 1 ? yt[1] - yt[0] : 0;
  int ytick_w = 0;
  for (double v : yt) ytick_w = std::max(ytick_w, text_w(tick_label(v, ystep), s));
  int xtick_h = th;  // room below the axis for the x tick labels
  for (const auto& n : spec.xtick_names) xtick_h = std::max(xtick_h, text_w(shorten(n, 16), s));

  Axes a;
  a.spec = spec;
  a.top = y + gap + (spec.title.empty() ? th / 2 : th + gap);
  a.left = x + gap + (spec.ylabel.empty() ? 0 : th + gap) + ytick_w + gap + 2 * s;
  a.right = x + w - 1 - gap - text_w("00", s) / 2;  // room for the last x tick label
  a.bottom = y + h - 1 - gap - (spec.xlabel.empty() ? 0 : th + gap) - xtick_h - gap - 2 * s;
  if (a.right - a.left < 10 || a.bottom - a.top < 10)
    throw UsageError(strfmt("plot panel of %dx%d pixels is too small for its labels", w, h));

  if (!spec.title.empty())
    c.text((a.left + a.right) / 2.0, y + gap, shorten(spec.title, (a.right - a.left) / (6 * s)),
           kBlack, s, 0.5, 0);
  if (!spec.xlabel.empty())
    c.text((a.left + a.right) / 2.0, y + h - 1 - gap, spec.xlabel, kBlack, s, 0.5, 1);
  if (!spec.ylabel.empty()) c.text_up(x + gap, (a.top + a.bottom) / 2.0, spec.ylabel, kBlack, s, 0.5, 0);

  for (size_t i = 0; i < spec.xtick_names.size(); ++i) {
    const int px = static_cast<int>(std::lround(a.px(static_cast<double>(i))));
    c.fill(px, a.bottom + 1, px, a.bottom + 2 * s, kBlack);
    c.text_up(px, a.bottom + 2 * s + gap, shorten(spec.xtick_names[i], 16), kBlack, s, 1, 0.5);
  }
  for (double v : xt) {
    if (!spec.xtick_names.empty()) break;
    const int px = static_cast<int>(std::lround(a.px(v)));
    if (px < a.left || px > a.right + 1) continue;
    if (spec.grid) c.fill(px, a.top, px, a.bottom, kLightGrey);
    c.fill(px, a.bottom + 1, px, a.bottom + 2 * s, kBlack);
    c.text(px, a.bottom + 2 * s + gap, tick_label(v, xstep), kBlack, s, 0.5, 0);
  }
  for (double v : yt) {
    const int py = static_cast<int>(std::lround(a.py(v)));
    if (py < a.top || py > a.bottom + 1) continue;
    if (spec.grid) c.fill(a.left, py, a.right, py, kLightGrey);
    c.fill(a.left - 2 * s, py, a.left - 1, py, kBlack);
    c.text(a.left - 2 * s - gap, py, tick_label(v, ystep), kBlack, s, 1, 0.5);
  }
  c.frame(a.left - 1, a.top - 1, a.right + 1, a.bottom + 1, kBlack, 1);
  return a;
}

int legend_width(const std::vector<std::pair<std::string, Rgb8>>& entries, int scale) {
  int w = 0;
  for (const auto& e : entries) w = std::max(w, text_w(e.first, scale));
  return w + 14 * scale + 8 * scale;
}

void draw_legend(Canvas& c, int x, int y, const std::vector<std::pair<std::string, Rgb8>>& entries,
                 int scale) {
  if (entries.empty()) return;
  const int row = text_h(scale) + 4 * scale, pad = 3 * scale;
  const int w = legend_width(entries, scale), h = static_cast<int>(entries.size()) * row + 2 * pad;
  c.fill(x, y, x + w - 1, y + h - 1, kWhite, 0.85);
  c.frame(x, y, x + w - 1, y + h - 1, kLightGrey, 1);
  for (size_t i = 0; i < entries.size(); ++i) {
    const double cy = y + pad + i * row + row / 2.0;
    c.line(x + pad, cy, x + pad + 10 * scale, cy, entries[i].second, 1.5 * scale);
    c.text(x + pad + 13 * scale, cy, entries[i].first, kBlack, scale, 0, 0.5);
  }
}

}  // namespace libreyolo::plots
