// Drawing detections onto images: box outlines and "name 0.87" labels.
#pragma once
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/postprocess.hpp"

namespace libreyolo::ops {

struct Rgb8 {
  uint8_t r = 0, g = 0, b = 0;
};

// A fixed colour per class id (a 20-colour palette, repeating).
Rgb8 class_color(int64_t cls);

// All drawing is in place on a contiguous CPU uint8 [H, W, 3] RGB image (UsageError otherwise)
// and clipped at the borders. Coordinates are pixels; x2/y2 are inclusive.

// Outline of `thickness` pixels, drawn inward from the rectangle's edges.
void draw_rect(const torch::Tensor& img, int x1, int y1, int x2, int y2, Rgb8 color,
               int thickness = 2);
void fill_rect(const torch::Tensor& img, int x1, int y1, int x2, int y2, Rgb8 color);

// UTF-8 text, top-left of its line box at (x, y), anti-aliased from the system's TrueType sans
// font (ops/font.hpp) at about 7 * scale pixels per capital. Without one, the built-in 5x7 font
// (a-z, 0-9, space and . , : - _ % ( ) / ' ! ? +; upper case drawn as lower case, anything else
// as '?'), each font pixel a scale x scale block; with keep_case, capitals have glyphs of their
// own and = @ [ ] < > * # & | ; are drawn too (chart text). text_width / text_height measure
// what draw_text draws.
void draw_text(const torch::Tensor& img, int x, int y, const std::string& text, Rgb8 color,
               int scale = 1, bool keep_case = false);
int text_width(const std::string& text, int scale = 1);
int text_height(int scale = 1);

// The built-in bitmap font alone (what draw_text falls back to).
void draw_bitmap_text(const torch::Tensor& img, int x, int y, const std::string& text, Rgb8 color, int scale = 1,
                      bool keep_case = false);
int bitmap_text_width(const std::string& text, int scale = 1);
int bitmap_text_height(int scale = 1);

// One outline per detection in its class colour, and a filled tag with "name 0.87" above the
// box (inside it when there is no room above). names[c] labels class c; ids outside names are
// written as numbers. The font scale follows the image size.
void draw_detections(const torch::Tensor& img, const Detections& det,
                     const std::vector<std::string>& names, int thickness = 2);

}  // namespace libreyolo::ops
