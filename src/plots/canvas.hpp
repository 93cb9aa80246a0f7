// A small raster canvas for the plots: anti-aliased lines and dots with alpha, rectangles, text
// (ops/draw: a TrueType font, else the bitmap font), and chart axes with "nice" ticks. Internal to
// src/plots; the images are written with io::save_image.
#pragma once
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

#include "ops/draw.hpp"

namespace libreyolo::plots {

using ops::Rgb8;

constexpr Rgb8 kWhite{255, 255, 255};
constexpr Rgb8 kBlack{0, 0, 0};
constexpr Rgb8 kGrey{128, 128, 128};
constexpr Rgb8 kLightGrey{225, 225, 225};
constexpr Rgb8 kBlue{31, 119, 180};

// matplotlib's "tab10" colours, for several series in one chart.
Rgb8 series_color(size_t i);

class Canvas {
 public:
  Canvas(int width, int height, Rgb8 background = kWhite);
  int width() const { return w_; }
  int height() const { return h_; }
  const torch::Tensor& image() const { return img_; }

  // Everything is clipped at the borders. Pixel (x, y) covers [x, x+1) x [y, y+1).
  void blend(int x, int y, Rgb8 c, double alpha);
  void fill(int x1, int y1, int x2, int y2, Rgb8 c, double alpha = 1.0);  // inclusive corners
  void frame(int x1, int y1, int x2, int y2, Rgb8 c, int thickness = 1);
  // Anti-aliased segment of the given width (pixels), with round ends.
  void line(double x0, double y0, double x1, double y1, Rgb8 c, double width = 1.5,
            double alpha = 1.0);
  void polyline(const std::vector<std::pair<double, double>>& pts, Rgb8 c, double width = 1.5,
                double alpha = 1.0);
  void disc(double cx, double cy, double radius, Rgb8 c, double alpha = 1.0);

  // Text (ops::draw_text, case kept). (x, y) is the anchor; ax / ay place it: 0 = left / top
  // edge at the anchor, 0.5 = centred, 1 = right / bottom edge at the anchor.
  void text(double x, double y, const std::string& s, Rgb8 c, int scale = 2, double ax = 0,
            double ay = 0);
  // The same turned 90 degrees counter-clockwise (reads upwards), anchored alike on its own
  // rotated box (ax along the reading direction).
  void text_up(double x, double y, const std::string& s, Rgb8 c, int scale = 2, double ax = 0.5,
               double ay = 0.5);

  // PNG or JPEG by extension; creates the parent directory.
  void save(const std::string& path) const;

 private:
  int w_, h_;
  torch::Tensor img_;
  uint8_t* px_;
};

int text_w(const std::string& s, int scale = 2);
int text_h(int scale = 2);
// Cuts a label to at most max_chars, marking the cut with a trailing "."
std::string shorten(const std::string& s, size_t max_chars);

struct AxesSpec {
  std::string title, xlabel, ylabel;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // data range shown
  bool y_down = false;                    // y grows downwards (image coordinates)
  bool grid = true;
  int scale = 2;  // font scale of every text of the axes
  // When set: x ticks at 0, 1, ..., n-1 labelled with these names, written upwards (cut to 16
  // characters), instead of numbers.
  std::vector<std::string> xtick_names;
};

// A chart's plot area in pixels and the mapping from data coordinates to it.
struct Axes {
  int left = 0, top = 0, right = 0, bottom = 0;  // inclusive pixel rectangle of the plot area
  AxesSpec spec;
  double px(double x) const;
  double py(double y) const;
  bool contains(double x, double y) const;  // data point inside the shown range
};

// Lays out a chart in the panel (x, y, w, h) of the canvas: title on top, y label turned on the
// left, tick labels, x label below; draws the frame, ticks and grid; returns the plot area.
Axes draw_axes(Canvas& c, int x, int y, int w, int h, const AxesSpec& spec);

// Ticks at 1, 2 or 5 times a power of ten covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);
// A tick value printed with the decimals the step needs ("0.25", "300", "2e-05").
std::string tick_label(double v, double step);
// [min, max] of the finite values, widened by `pad` of the span on both sides (a flat series
// gets a span of its own); {0, 1} when there is none.
std::pair<double, double> data_range(const std::vector<double>& v, double pad = 0.05);

// A legend box with a short line of each colour, top-left corner at (x, y).
void draw_legend(Canvas& c, int x, int y, const std::vector<std::pair<std::string, Rgb8>>& entries,
                 int scale = 2);
int legend_width(const std::vector<std::pair<std::string, Rgb8>>& entries, int scale = 2);

}  // namespace libreyolo::plots
