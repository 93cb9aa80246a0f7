#include "io/sample_image.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"

namespace libreyolo::io {
namespace {

struct Rgb {
  uint8_t r, g, b;
};

class Canvas {
 public:
  Canvas(uint8_t* data, int h, int w) : d_(data), h_(h), w_(w) {}
  int height() const { return h_; }
  int width() const { return w_; }

  void set(int x, int y, Rgb c) {
    uint8_t* p = d_ + (static_cast<int64_t>(y) * w_ + x) * 3;
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  // Fractions of the width and height, so the scene scales with the image.
  void rect(double fx0, double fy0, double fx1, double fy1, Rgb c) {
    const int x0 = px(fx0, w_), x1 = px(fx1, w_), y0 = px(fy0, h_), y1 = px(fy1, h_);
    for (int y = std::max(y0, 0); y < std::min(y1, h_); ++y)
      for (int x = std::max(x0, 0); x < std::min(x1, w_); ++x) set(x, y, c);
  }
  // Centre in fractions, radius in fractions of the shorter side.
  void disc(double fcx, double fcy, double fr, Rgb c) {
    const double cx = fcx * w_, cy = fcy * h_, r = fr * std::min(h_, w_);
    for (int y = std::max(0, int(cy - r)); y <= std::min(h_ - 1, int(cy + r)); ++y)
      for (int x = std::max(0, int(cx - r)); x <= std::min(w_ - 1, int(cx + r)); ++x) {
        const double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
        if (dx * dx + dy * dy <= r * r) set(x, y, c);
      }
  }
  // Triangle with vertices in fractions; a pixel centre inside all three edges is painted.
  void triangle(double ax, double ay, double bx, double by, double cx, double cy, Rgb c) {
    ax *= w_, bx *= w_, cx *= w_, ay *= h_, by *= h_, cy *= h_;
    auto edge = [](double x0, double y0, double x1, double y1, double x, double y) {
      return (x1 - x0) * (y - y0) - (y1 - y0) * (x - x0);
    };
    const int xmin = std::max(0, int(std::min({ax, bx, cx})));
    const int xmax = std::min(w_ - 1, int(std::max({ax, bx, cx})));
    const int ymin = std::max(0, int(std::min({ay, by, cy})));
    const int ymax = std::min(h_ - 1, int(std::max({ay, by, cy})));
    for (int y = ymin; y <= ymax; ++y)
      for (int x = xmin; x <= xmax; ++x) {
        const double px = x + 0.5, py = y + 0.5;
        const double e0 = edge(ax, ay, bx, by, px, py), e1 = edge(bx, by, cx, cy, px, py),
                     e2 = edge(cx, cy, ax, ay, px, py);
        if ((e0 >= 0 && e1 >= 0 && e2 >= 0) || (e0 <= 0 && e1 <= 0 && e2 <= 0)) set(x, y, c);
      }
  }

 private:
  static int px(double f, int n) { return static_cast<int>(std::lround(f * n)); }
  uint8_t* d_;
  int h_, w_;
};

uint8_t lerp(uint8_t a, uint8_t b, double t) {
  return static_cast<uint8_t>(std::lround(a + (b - a) * t));
}

}  // namespace

torch::Tensor make_sample_image(int height, int width) {
  if (height < 8 || width < 8 || height > 8192 || width > 8192)
    throw UsageError(strfmt("make_sample_image: size %dx%d is out of range [8, 8192]", width, height));
  torch::Tensor img = torch::empty({height, width, 3}, torch::kUInt8);
  Canvas cv(img.data_ptr<uint8_t>(), height, width);

  const int horizon = static_cast<int>(std::lround(0.6 * height));
  const Rgb sky_top{110, 160, 230}, sky_low{200, 225, 250};
  const Rgb grass_high{95, 155, 70}, grass_low{50, 100, 40};
  for (int y = 0; y < height; ++y) {
    Rgb c;
    if (y < horizon) {
      const double t = double(y) / std::max(1, horizon - 1);
      c = {lerp(sky_top.r, sky_low.r, t), lerp(sky_top.g, sky_low.g, t), lerp(sky_top.b, sky_low.b, t)};
    } else {
      const double t = double(y - horizon) / std::max(1, height - horizon - 1);
      c = {lerp(grass_high.r, grass_low.r, t), lerp(grass_high.g, grass_low.g, t),
           lerp(grass_high.b, grass_low.b, t)};
    }
    for (int x = 0; x < width; ++x) cv.set(x, y, c);
  }

  cv.disc(0.82, 0.17, 0.07, {250, 215, 70});                                // sun
  cv.rect(0.12, 0.45, 0.34, 0.76, {190, 55, 45});                           // house
  cv.triangle(0.10, 0.45, 0.36, 0.45, 0.23, 0.31, {115, 70, 45});           // roof
  cv.rect(0.21, 0.60, 0.26, 0.76, {75, 45, 30});                            // door
  cv.rect(0.15, 0.52, 0.19, 0.58, {235, 235, 200});                         // window
  cv.rect(0.595, 0.52, 0.625, 0.80, {105, 70, 40});                         // trunk
  cv.disc(0.61, 0.45, 0.12, {35, 115, 50});                                 // canopy
  cv.disc(0.45, 0.84, 0.06, {40, 80, 205});                                 // ball
  cv.triangle(0.76, 0.93, 0.94, 0.93, 0.85, 0.68, {150, 60, 175});          // triangle

  // Mild texture from a pixel hash, so the image is not flat (and JPEG has detail to keep).
  uint8_t* p = img.data_ptr<uint8_t>();
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x, p += 3) {
      uint32_t h = static_cast<uint32_t>(x) * 374761393u + static_cast<uint32_t>(y) * 668265263u;
      h = (h ^ (h >> 13)) * 1274126177u;
      h ^= h >> 16;
      const int noise = static_cast<int>(h & 7u) - 4;  // -4..3
      for (int c = 0; c < 3; ++c) p[c] = static_cast<uint8_t>(std::clamp(p[c] + noise, 0, 255));
    }
  return img;
}

}  // namespace libreyolo::io
