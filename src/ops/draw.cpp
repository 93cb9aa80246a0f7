#include "ops/draw.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <iterator>

#include <libreyolo/errors.hpp>

#include "core/log.hpp"
#include "ops/font.hpp"

namespace libreyolo::ops {
namespace {

constexpr int kGlyphW = 5, kGlyphH = 7;
constexpr int kAdvance = kGlyphW + 1;  // one blank column between glyphs

struct Glyph {
  char ch;
  uint8_t rows[kGlyphH];  // bit 4 is the leftmost pixel
};

// Designed for this project: lower case with short descenders folded into the 7 rows.
constexpr Glyph kFont[] = {
    {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}},
    {'b', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E}},
    {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}},
    {'d', {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F}},
    {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}},
    {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}},
    {'g', {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
    {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}},
    {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C}},
    {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}},
    {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}},
    {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
    {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}},
    {'p', {0x00, 0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10}},
    {'q', {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x01}},
    {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}},
    {'s', {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}},
    {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}},
    {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}},
    {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}},
    {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}},
    {'y', {0x00, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
    {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}},
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
    {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
    {'\'', {0x04, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00}},
    {'!', {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04}},
    {'?', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04}},
    {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
};

// Capitals and a few more signs, drawn only when the caller keeps case (chart text).
constexpr Glyph kFontCased[] = {
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
    {'D', {0x1E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1E}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}},
    {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}},
    {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
    {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}},
    {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}},
    {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}},
    {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}},
    {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'@', {0x0E, 0x11, 0x17, 0x15, 0x17, 0x10, 0x0E}},
    {'[', {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E}},
    {']', {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E}},
    {'<', {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02}},
    {'>', {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}},
    {'*', {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00}},
    {'#', {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A}},
    {'&', {0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D}},
    {'|', {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {';', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x04, 0x08}},
};

const uint8_t* glyph_rows_cased(char c) {
  static const std::array<const uint8_t*, 128> index = [] {
    std::array<const uint8_t*, 128> t{};
    for (const Glyph& g : kFontCased) t[static_cast<unsigned char>(g.ch)] = g.rows;
    return t;
  }();
  const unsigned char u = static_cast<unsigned char>(c);
  return u < 128 ? index[u] : nullptr;
}

const uint8_t* glyph_rows(char c) {
  static const std::array<const uint8_t*, 128> index = [] {
    std::array<const uint8_t*, 128> t{};
    for (const Glyph& g : kFont) t[static_cast<unsigned char>(g.ch)] = g.rows;
    return t;
  }();
  static const uint8_t kBlank[kGlyphH] = {0};
  if (c == ' ') return kBlank;
  const unsigned char u = static_cast<unsigned char>(std::tolower(static_cast<unsigned char>(c)));
  const uint8_t* rows = u < 128 ? index[u] : nullptr;
  return rows ? rows : index[static_cast<unsigned char>('?')];
}

// Well separated hues, bright enough for a 2-pixel line on photos.
constexpr Rgb8 kPalette[20] = {
    {255, 56, 56},   {255, 157, 151}, {255, 112, 31},  {255, 178, 29},  {207, 210, 49},
    {72, 249, 10},   {146, 204, 23},  {61, 219, 134},  {26, 147, 52},   {0, 212, 187},
    {44, 153, 168},  {0, 194, 255},   {52, 69, 147},   {100, 115, 255}, {0, 24, 236},
    {132, 56, 255},  {82, 0, 133},    {203, 56, 255},  {255, 149, 200}, {255, 55, 199}};

struct View {
  uint8_t* data;
  int h, w;
};

View view_of(const torch::Tensor& img) {
  if (!img.defined() || img.dim() != 3 || img.size(2) != 3 || img.scalar_type() != torch::kUInt8 ||
      !img.device().is_cpu() || !img.is_contiguous())
    throw UsageError("draw: expected a contiguous CPU uint8 image [H, W, 3]");
  return {img.data_ptr<uint8_t>(), static_cast<int>(img.size(0)), static_cast<int>(img.size(1))};
}

void fill(const View& v, int x1, int y1, int x2, int y2, Rgb8 c) {
  x1 = std::max(x1, 0), y1 = std::max(y1, 0);
  x2 = std::min(x2, v.w - 1), y2 = std::min(y2, v.h - 1);
  for (int y = y1; y <= y2; ++y) {
    uint8_t* p = v.data + (static_cast<int64_t>(y) * v.w + x1) * 3;
    for (int x = x1; x <= x2; ++x, p += 3) p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
}

void outline(const View& v, int x1, int y1, int x2, int y2, Rgb8 c, int t) {
  if (x2 < x1 || y2 < y1 || t < 1) return;
  fill(v, x1, y1, x2, std::min(y1 + t - 1, y2), c);  // top
  fill(v, x1, std::max(y2 - t + 1, y1), x2, y2, c);  // bottom
  fill(v, x1, y1, std::min(x1 + t - 1, x2), y2, c);  // left
  fill(v, std::max(x2 - t + 1, x1), y1, x2, y2, c);  // right
}

// Coverage blended over the image: p + (c - p) * a / 255, rounded.
void blend_mask(const View& v, int x, int y, const TextMask& m, Rgb8 c) {
  for (int r = 0; r < m.height; ++r) {
    const int py = y + r;
    if (py < 0 || py >= v.h) continue;
    for (int q = 0; q < m.width; ++q) {
      const int px = x + q;
      const int a = m.alpha[static_cast<size_t>(r) * m.width + q];
      if (a == 0 || px < 0 || px >= v.w) continue;
      uint8_t* p = v.data + (static_cast<int64_t>(py) * v.w + px) * 3;
      const uint8_t rgb[3] = {c.r, c.g, c.b};
      for (int k = 0; k < 3; ++k) p[k] = static_cast<uint8_t>(p[k] + ((rgb[k] - p[k]) * a + (rgb[k] >= p[k] ? 127 : -127)) / 255);
    }
  }
}

void bitmap_text(const View& v, int x, int y, const std::string& s, Rgb8 c, int scale, bool keep_case) {
  for (char ch : s) {
    const uint8_t* rows = keep_case ? glyph_rows_cased(ch) : nullptr;
    if (!rows) rows = glyph_rows(ch);
    for (int r = 0; r < kGlyphH; ++r)
      for (int col = 0; col < kGlyphW; ++col)
        if (rows[r] & (0x10 >> col))
          fill(v, x + col * scale, y + r * scale, x + col * scale + scale - 1,
               y + r * scale + scale - 1, c);
    x += kAdvance * scale;
  }
}

void text(const View& v, int x, int y, const std::string& s, Rgb8 c, int scale, bool keep_case = false) {
  if (auto m = truetype_mask(s, scale)) return blend_mask(v, x, y, *m, c);
  bitmap_text(v, x, y, s, c, scale, keep_case);
}

}  // namespace

Rgb8 class_color(int64_t cls) {
  const int64_t n = static_cast<int64_t>(std::size(kPalette));
  return kPalette[((cls % n) + n) % n];
}

void draw_rect(const torch::Tensor& img, int x1, int y1, int x2, int y2, Rgb8 color,
               int thickness) {
  outline(view_of(img), x1, y1, x2, y2, color, thickness);
}

void fill_rect(const torch::Tensor& img, int x1, int y1, int x2, int y2, Rgb8 color) {
  fill(view_of(img), x1, y1, x2, y2, color);
}

void draw_text(const torch::Tensor& img, int x, int y, const std::string& s, Rgb8 color,
               int scale, bool keep_case) {
  text(view_of(img), x, y, s, color, std::max(scale, 1), keep_case);
}

int text_width(const std::string& s, int scale) {
  if (s.empty()) return 0;
  if (auto e = truetype_extent(s, scale)) return e->first;
  return bitmap_text_width(s, scale);
}

int text_height(int scale) {
  if (auto e = truetype_extent("", scale)) return e->second;
  return bitmap_text_height(scale);
}

void draw_bitmap_text(const torch::Tensor& img, int x, int y, const std::string& s, Rgb8 color, int scale,
                      bool keep_case) {
  bitmap_text(view_of(img), x, y, s, color, std::max(scale, 1), keep_case);
}

int bitmap_text_width(const std::string& s, int scale) {
  return s.empty() ? 0 : (static_cast<int>(s.size()) * kAdvance - 1) * std::max(scale, 1);
}

int bitmap_text_height(int scale) { return kGlyphH * std::max(scale, 1); }

void draw_detections(const torch::Tensor& img, const Detections& det,
                     const std::vector<std::string>& names, int thickness) {
  const View v = view_of(img);
  const int64_t n = det.boxes.defined() ? det.boxes.size(0) : 0;
  if (n == 0) return;
  const torch::Tensor boxes = det.boxes.to(torch::kCPU, torch::kFloat32).contiguous();
  const torch::Tensor scores = det.scores.to(torch::kCPU, torch::kFloat32).contiguous();
  const torch::Tensor classes = det.classes.to(torch::kCPU, torch::kInt64).contiguous();
  if (boxes.dim() != 2 || boxes.size(1) != 4 || scores.numel() != n || classes.numel() != n)
    throw UsageError("draw_detections: boxes [K, 4], scores [K] and classes [K] must agree");
  const float* b = boxes.data_ptr<float>();
  const float* s = scores.data_ptr<float>();
  const int64_t* c = classes.data_ptr<int64_t>();
  // 7-pixel glyphs are readable up to about 400 px; grow with the image beyond that.
  const int scale = std::max(1, (std::min(v.h, v.w) + 160) / 320);
  const int pad = scale;
  // Lowest score first, so the best detections end up on top.
  for (int64_t i = n - 1; i >= 0; --i) {
    const float* q = b + 4 * i;
    if (!std::isfinite(q[0]) || !std::isfinite(q[1]) || !std::isfinite(q[2]) || !std::isfinite(q[3]))
      continue;
    const int x1 = static_cast<int>(std::lround(q[0])), y1 = static_cast<int>(std::lround(q[1]));
    const int x2 = static_cast<int>(std::lround(q[2])) - 1, y2 = static_cast<int>(std::lround(q[3])) - 1;
    const Rgb8 color = class_color(c[i]);
    outline(v, x1, y1, x2, y2, color, thickness);

    const std::string name =
        c[i] >= 0 && c[i] < static_cast<int64_t>(names.size()) ? names[c[i]] : std::to_string(c[i]);
    const std::string label = strfmt("%s %.2f", name.c_str(), static_cast<double>(s[i]));
    const int tw = text_width(label, scale) + 2 * pad, th = text_height(scale) + 2 * pad;
    // Tag above the box, or inside its top edge when the box touches the image top; kept
    // inside the image horizontally when it fits.
    int tx = std::max(0, std::min(x1, v.w - tw));
    int ty = y1 - th >= 0 ? y1 - th : std::max(y1, 0);
    fill(v, tx, ty, tx + tw - 1, ty + th - 1, color);
    const bool light = 0.299 * color.r + 0.587 * color.g + 0.114 * color.b > 150;
    text(v, tx + pad, ty + pad, label, light ? Rgb8{0, 0, 0} : Rgb8{255, 255, 255}, scale);
  }
}

}  // namespace libreyolo::ops
