#include "data/augment.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <libreyolo/errors.hpp>
#include <vector>

#include "core/log.hpp"
#include "data/stage_timer.hpp"
#include "ops/image_ops.hpp"

namespace libreyolo::data {
namespace {

constexpr uint8_t kPad = 114;

// ---- HSV ---------------------------------------------------------------------------------
// The forward conversion is OpenCV's 8-bit fixed-point one: S and H are scaled through
// reciprocal tables with 12 fraction bits and rounded by adding half before the shift.
constexpr int kHsvShift = 12;

struct HsvTables {
  int sdiv[256];  // round(255 * 2^12 / v)
  int hdiv[256];  // round(180 * 2^12 / (6 * diff))
};

const HsvTables& hsv_tables() {
  static const HsvTables t = [] {
    HsvTables x{};
    for (int i = 1; i < 256; ++i) {
      x.sdiv[i] = static_cast<int>(std::lround((255 << kHsvShift) / static_cast<double>(i)));
      x.hdiv[i] = static_cast<int>(std::lround((180 << kHsvShift) / (6.0 * i)));
    }
    return x;
  }();
  return t;
}

inline void pixel_to_hsv(int r, int g, int b, const HsvTables& t, int& h, int& s, int& v) {
  v = std::max(r, std::max(g, b));
  const int diff = v - std::min(r, std::min(g, b));
  s = (diff * t.sdiv[v] + (1 << (kHsvShift - 1))) >> kHsvShift;
  int hh;
  if (v == r)
    hh = g - b;
  else if (v == g)
    hh = b - r + 2 * diff;
  else
    hh = r - g + 4 * diff;
  // Arithmetic shift = floor division, also for the negative hues of the red sector.
  hh = (hh * t.hdiv[diff] + (1 << (kHsvShift - 1))) >> kHsvShift;
  h = hh < 0 ? hh + 180 : hh;
}

// Rounds to nearest, ties to even (what OpenCV's saturate_cast does), for 0 <= x < 2^22.
inline uint8_t round_u8(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float r = (x + kMagic) - kMagic;  // not folded: the build has no -ffast-math
  return static_cast<uint8_t>(std::min(255.0f, std::max(0.0f, r)));
}

// The inverse, in single precision like OpenCV's 8-bit path: sector of the hue wheel and the
// four levels v, v(1-s), v(1-s f), v(1-s(1-f)), each channel picking one of them. Per-hue
// sector and fraction come from a table; s = 0 needs no branch (all four levels equal v).
struct HueEntry {
  float frac;
  uint8_t pick[3];  // level index of r, g, b
};

const HueEntry* hue_table() {
  static const std::array<HueEntry, 180> table = [] {
    // Levels: 0 = v, 1 = v(1-s), 2 = v(1-s f), 3 = v(1-s(1-f)).
    constexpr uint8_t kPick[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3},
                                     {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};
    std::array<HueEntry, 180> t{};
    for (int h = 0; h < 180; ++h) {
      float hf = h * (6.0f / 180.0f);
      int sector = static_cast<int>(std::floor(hf));
      hf -= sector;
      if (sector < 0 || sector >= 6) sector = 0, hf = 0;
      t[h].frac = hf;
      for (int c = 0; c < 3; ++c) t[h].pick[c] = kPick[sector][c];
    }
    return t;
  }();
  return table.data();
}

inline void hsv_to_pixel(int h, int s, int v, const HueEntry* hues, uint8_t* rgb) {
  const float sf = s * (1.0f / 255.0f);
  const float vf = v * (1.0f / 255.0f);
  const HueEntry& e = hues[h];
  const float level[4] = {vf, vf * (1.0f - sf), vf * (1.0f - sf * e.frac),
                          vf * (1.0f - sf * (1.0f - e.frac))};
  rgb[0] = round_u8(level[e.pick[0]] * 255.0f);
  rgb[1] = round_u8(level[e.pick[1]] * 255.0f);
  rgb[2] = round_u8(level[e.pick[2]] * 255.0f);
}

// ---- output -------------------------------------------------------------------------------
inline float clip01(double x) { return static_cast<float>(std::min(1.0, std::max(0.0, x))); }

void write_targets(const std::vector<Box>& boxes, double ratio, int S, int max_labels, float* out) {
  const size_t k = std::min(boxes.size(), static_cast<size_t>(max_labels));
  for (size_t i = 0; i < k; ++i) {
    const Box& b = boxes[i];
    float* row = out + 5 * i;
    row[0] = static_cast<float>(b.cls);
    row[1] = clip01(b.x1 * ratio / S);
    row[2] = clip01(b.y1 * ratio / S);
    row[3] = clip01(b.x2 * ratio / S);
    row[4] = clip01(b.y2 * ratio / S);
  }
  for (size_t i = k; i < static_cast<size_t>(max_labels); ++i) {
    float* row = out + 5 * i;
    row[0] = -1.0f;
    row[1] = row[2] = row[3] = row[4] = 0.0f;
  }
}

void check_image(const torch::Tensor& img) {
  if (img.dim() != 3 || img.size(2) != 3 || img.scalar_type() != torch::kUInt8 || !img.is_contiguous())
    throw RuntimeError("augment: expected a contiguous [H, W, 3] uint8 image");
}

// Top-left letterbox of `img` onto the S x S output with optional HSV shift and horizontal
// flip. The reference augments first and resizes after; when the resize is the identity (the
// usual case: the image's longer side is already S) everything happens in one pass.
void letterbox_into(const torch::Tensor& img, int S, double ratio, const TransformParams* aug,
                    uint8_t* out) {
  check_image(img);
  const int h = static_cast<int>(img.size(0));
  const int w = static_cast<int>(img.size(1));
  const int nw = std::clamp(static_cast<int>(w * ratio), 1, S);
  const int nh = std::clamp(static_cast<int>(h * ratio), 1, S);
  const bool hsv = aug && aug->hsv;
  const bool flip = aug && aug->flip;
  const size_t out_stride = static_cast<size_t>(S) * 3;

  auto augment_row = [&](const uint8_t* src, uint8_t* dst, int width) {
    if (hsv)
      shift_hsv(src, dst, width, aug->gains, flip);
    else if (flip)
      for (int x = 0; x < width; ++x) std::memcpy(dst + 3 * x, src + 3 * (width - 1 - x), 3);
    else
      std::memcpy(dst, src, static_cast<size_t>(width) * 3);
  };

  if (nw == w && nh == h) {
    const uint8_t* src = img.data_ptr<uint8_t>();
    for (int y = 0; y < h; ++y) augment_row(src + static_cast<size_t>(y) * w * 3, out + y * out_stride, w);
  } else {
    torch::Tensor src = img;
    if (hsv || flip) {
      src = torch::empty_like(img);
      const uint8_t* s = img.data_ptr<uint8_t>();
      uint8_t* d = src.data_ptr<uint8_t>();
      for (int y = 0; y < h; ++y)
        augment_row(s + static_cast<size_t>(y) * w * 3, d + static_cast<size_t>(y) * w * 3, w);
    }
    const torch::Tensor resized = ops::resize_bilinear(src, nh, nw).contiguous();
    const uint8_t* r = resized.data_ptr<uint8_t>();
    for (int y = 0; y < nh; ++y)
      std::memcpy(out + y * out_stride, r + static_cast<size_t>(y) * nw * 3, static_cast<size_t>(nw) * 3);
  }
  if (nw < S)
    for (int y = 0; y < nh; ++y) std::memset(out + y * out_stride + nw * 3, kPad, (S - nw) * 3);
  if (nh < S) std::memset(out + nh * out_stride, kPad, (S - nh) * out_stride);
}

double letterbox_ratio(const torch::Tensor& img, int S) {
  return std::min(static_cast<double>(S) / img.size(0), static_cast<double>(S) / img.size(1));
}

}  // namespace

// ---- HSV ---------------------------------------------------------------------------------
void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv, int64_t n) {
  const HsvTables& t = hsv_tables();
  for (int64_t i = 0; i < n; ++i) {
    int h, s, v;
    pixel_to_hsv(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], t, h, s, v);
    hsv[3 * i] = static_cast<uint8_t>(h);
    hsv[3 * i + 1] = static_cast<uint8_t>(s);
    hsv[3 * i + 2] = static_cast<uint8_t>(v);
  }
}

void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb, int64_t n) {
  const HueEntry* hues = hue_table();
  for (int64_t i = 0; i < n; ++i) {
    if (hsv[3 * i] >= 180) throw UsageError("hsv_to_rgb: hue must be < 180");
    hsv_to_pixel(hsv[3 * i], hsv[3 * i + 1], hsv[3 * i + 2], hues, rgb + 3 * i);
  }
}

namespace {

__attribute__((always_inline)) inline int32_t bits(float x) {
  int32_t i;
  std::memcpy(&i, &x, sizeof i);
  return i;
}
__attribute__((always_inline)) inline float from_bits(int32_t i) {
  float x;
  std::memcpy(&x, &i, sizeof x);
  return x;
}

// The whole shift for one block of de-interleaved pixels, branch-free so that the compiler can
// vectorise it: the same integer forward conversion and single-precision inverse as
// pixel_to_hsv / hsv_to_pixel (the tests check that they agree exactly), with the shifts done
// arithmetically instead of through tables. AVX-512 and AVX2 clones (gathers for the two
// reciprocal tables) are picked at run time where the CPU has them.
// No trapping math: otherwise GCC sinks the int-to-float conversions into branches it then
// cannot turn back into selects. An AVX-512 clone (16 lanes; about a third less time per image
// where the CPU has it) with contraction off: AVX-512 brings FMA, and fused multiply-adds would
// change the last bit of some levels (FusedHsvShiftEqualsConvertShiftConvertBack catches that).
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("no-trapping-math", "fp-contract=off"))) void shift_hsv_block(
    int32_t* __restrict r, int32_t* __restrict g, int32_t* __restrict b, int m,
    const int32_t* __restrict sdiv, const int32_t* __restrict hdiv, int gh, int gs, int gv) {
  // Plain conditionals only: functions such as std::max are not inlined across the different
  // optimisation attributes.
  constexpr float kMagic = 12582912.0f;  // see round_u8
  for (int i = 0; i < m; ++i) {
    const int R = r[i], G = g[i], B = b[i];
    const int gb_max = G > B ? G : B, gb_min = G < B ? G : B;
    const int v = R > gb_max ? R : gb_max;
    const int diff = v - (R < gb_min ? R : gb_min);
    const int s = (diff * sdiv[v] + (1 << (kHsvShift - 1))) >> kHsvShift;
    int h = R - G + 4 * diff;
    h = v == G ? B - R + 2 * diff : h;
    h = v == R ? G - B : h;
    h = (h * hdiv[diff] + (1 << (kHsvShift - 1))) >> kHsvShift;
    h += h < 0 ? 180 : 0;

    int H = h + gh;  // gh in [0, 180)
    H -= H >= 180 ? 180 : 0;
    int S = s + gs, V = v + gv;
    S = S < 0 ? 0 : (S > 255 ? 255 : S);
    V = V < 0 ? 0 : (V > 255 ? 255 : V);

    const float sf = S * (1.0f / 255.0f);
    const float vf = V * (1.0f / 255.0f);
    const float hf = H * (6.0f / 180.0f);
    const int sec = static_cast<int>(hf);
    const float f = hf - sec;
    const float p = vf * (1.0f - sf);
    const float q = vf * (1.0f - sf * f);
    const float t = vf * (1.0f - sf * (1.0f - f));
    // Level of each channel per sector (r: v q p p t v, g: t v v q p p, b: p p t v v q) as
    // bit masks: plain selects get merged into one multi-way branch that blocks vectorising.
    const int32_t iv = bits(vf), ip = bits(p), iq = bits(q), it = bits(t);
    const int32_t m0 = -(sec == 0), m1 = -(sec == 1), m2 = -(sec == 2);
    const int32_t m3 = -(sec == 3), m4 = -(sec == 4), m5 = -(sec == 5);
    float out[3] = {from_bits(((m0 | m5) & iv) | (m1 & iq) | ((m2 | m3) & ip) | (m4 & it)),
                    from_bits(((m1 | m2) & iv) | (m3 & iq) | ((m4 | m5) & ip) | (m0 & it)),
                    from_bits(((m3 | m4) & iv) | (m5 & iq) | ((m0 | m1) & ip) | (m2 & it))};
    for (float& x : out) {
      x = (x * 255.0f + kMagic) - kMagic;  // round half to even, as round_u8
      x = x < 0.0f ? 0.0f : (x > 255.0f ? 255.0f : x);
    }
    r[i] = static_cast<int32_t>(out[0]);
    g[i] = static_cast<int32_t>(out[1]);
    b[i] = static_cast<int32_t>(out[2]);
  }
}

}  // namespace

void shift_hsv(const uint8_t* src, uint8_t* dst, int64_t n, HsvGains g, bool reverse) {
  static const std::array<std::array<int32_t, 256>, 2> tables = [] {
    const HsvTables& t = hsv_tables();
    std::array<std::array<int32_t, 256>, 2> x{};
    std::copy(t.sdiv, t.sdiv + 256, x[0].begin());
    std::copy(t.hdiv, t.hdiv + 256, x[1].begin());
    return x;
  }();
  const int gh = ((g.h % 180) + 180) % 180;
  constexpr int kBlock = 128;
  int32_t r[kBlock], gr[kBlock], b[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kBlock, n - start));
    for (int i = 0; i < m; ++i) {
      const int64_t k = start + i;
      const uint8_t* p = src + 3 * (reverse ? n - 1 - k : k);
      r[i] = p[0];
      gr[i] = p[1];
      b[i] = p[2];
    }
    shift_hsv_block(r, gr, b, m, tables[0].data(), tables[1].data(), gh, g.s, g.v);
    uint8_t* d = dst + 3 * start;
    for (int i = 0; i < m; ++i) {
      d[3 * i] = static_cast<uint8_t>(r[i]);
      d[3 * i + 1] = static_cast<uint8_t>(gr[i]);
      d[3 * i + 2] = static_cast<uint8_t>(b[i]);
    }
  }
}

HsvGains draw_hsv_gains(Rng& rng, const AugmentOptions& opt) {
  double u[3];
  u[0] = rng.uniform(-1.0, 1.0) * opt.hgain;
  u[1] = rng.uniform(-1.0, 1.0) * opt.sgain;
  u[2] = rng.uniform(-1.0, 1.0) * opt.vgain;
  for (double& x : u) x *= static_cast<double>(rng.randint(0, 1));
  // static_cast truncates toward zero, like numpy's astype(int16).
  return {static_cast<int>(u[0]), static_cast<int>(u[1]), static_cast<int>(u[2])};
}

// ---- mosaic ------------------------------------------------------------------------------
MosaicParams draw_mosaic(Rng& rng, int S, int64_t n) {
  MosaicParams m;
  m.yc = static_cast<int>(rng.uniform(0.5 * S, 1.5 * S));
  m.xc = static_cast<int>(rng.uniform(0.5 * S, 1.5 * S));
  for (auto& o : m.others) o = rng.randint(0, n - 1);
  return m;
}

namespace {

// Samples as mosaic tiles: pixels at imgsz scale (their own size), checked.
std::array<Tile, 4> tiles_of(const std::array<const Sample*, 4>& samples) {
  std::array<Tile, 4> t;
  for (size_t k = 0; k < 4; ++k) {
    const Sample& s = *samples[k];
    check_image(s.image);
    t[k] = {s.image, static_cast<int>(s.image.size(0)), static_cast<int>(s.image.size(1)), s.boxes};
  }
  return t;
}

// Where one tile lands on the 2S canvas: canvas rectangle [x1a, x2a) x [y1a, y2a) takes the
// tile's pixels from column x1b, row y1b on. `image` is the tile, shrunk to fit S if needed;
// w x h its size at canvas scale (image's own size unless the pixels are a reduced decode).
struct TilePlacement {
  torch::Tensor image;
  int w = 0, h = 0;
  double scale = 1.0;
  int x1a = 0, y1a = 0, x2a = 0, y2a = 0, x1b = 0, y1b = 0;
  bool copies = false;  // a non-empty rectangle whose tile part has the same size
};

// The four tiles around (xc, yc) on a 2S canvas: the reference's geometry. Boxes are shifted,
// not clipped. A tile larger than S is shrunk to fit: resized when its pixels are at canvas
// scale (resize_pixels), else only its canvas size changes.
std::array<TilePlacement, 4> plan_tiles(const std::array<const Tile*, 4>& tiles, int S, int xc, int yc,
                                        std::vector<Box>* boxes, bool resize_pixels) {
  const int S2 = 2 * S;
  if (xc < 0 || xc > S2 || yc < 0 || yc > S2) throw UsageError("mosaic centre outside the canvas");
  std::array<TilePlacement, 4> out;
  for (int k = 0; k < 4; ++k) {
    TilePlacement& t = out[static_cast<size_t>(k)];
    torch::Tensor img = tiles[k]->image;
    int h = tiles[k]->height, w = tiles[k]->width;
    if (h < 1 || w < 1) throw UsageError("mosaic tile of zero size");
    const double scale = std::min({1.0, static_cast<double>(S) / h, static_cast<double>(S) / w});
    if (scale < 1.0) {
      h = std::max(1, static_cast<int>(h * scale));
      w = std::max(1, static_cast<int>(w * scale));
      if (resize_pixels) img = ops::resize_bilinear(img, h, w).contiguous();
    }
    // Canvas rectangle (a) and the part of the tile (b) that lands there.
    int x1a, y1a, x2a, y2a, x1b, y1b, x2b, y2b;
    switch (k) {
      case 0:
        x1a = std::max(xc - w, 0), y1a = std::max(yc - h, 0), x2a = xc, y2a = yc;
        x1b = w - (x2a - x1a), y1b = h - (y2a - y1a), x2b = w, y2b = h;
        break;
      case 1:
        x1a = xc, y1a = std::max(yc - h, 0), x2a = std::min(xc + w, S2), y2a = yc;
        x1b = 0, y1b = h - (y2a - y1a), x2b = std::min(w, x2a - x1a), y2b = h;
        break;
      case 2:
        x1a = std::max(xc - w, 0), y1a = yc, x2a = xc, y2a = std::min(S2, yc + h);
        x1b = w - (x2a - x1a), y1b = 0, x2b = w, y2b = std::min(y2a - y1a, h);
        break;
      default:
        x1a = xc, y1a = yc, x2a = std::min(xc + w, S2), y2a = std::min(S2, yc + h);
        x1b = 0, y1b = 0, x2b = std::min(w, x2a - x1a), y2b = std::min(y2a - y1a, h);
        break;
    }
    t.image = img;
    t.w = w, t.h = h, t.scale = scale;
    t.x1a = x1a, t.y1a = y1a, t.x2a = x2a, t.y2a = y2a, t.x1b = x1b, t.y1b = y1b;
    const int rows = y2a - y1a, cols = x2a - x1a;
    t.copies = rows > 0 && cols > 0 && rows == y2b - y1b && cols == x2b - x1b;
    const double padw = x1a - x1b, padh = y1a - y1b;
    for (const Box& b : tiles[k]->boxes)
      boxes->push_back({b.x1 * scale + padw, b.y1 * scale + padh, b.x2 * scale + padw,
                        b.y2 * scale + padh, b.cls});
  }
  return out;
}

// Canvas row `cy` (2S pixels): the pad colour with the tiles' parts of that row copied in.
void compose_canvas_row(const std::array<TilePlacement, 4>& plan, int cy, int S2, uint8_t* row) {
  std::memset(row, kPad, static_cast<size_t>(S2) * 3);
  for (const TilePlacement& t : plan) {
    if (!t.copies || cy < t.y1a || cy >= t.y2a) continue;
    const uint8_t* src = t.image.data_ptr<uint8_t>() + (static_cast<size_t>(t.y1b + cy - t.y1a) * t.w + t.x1b) * 3;
    std::memcpy(row + static_cast<size_t>(t.x1a) * 3, src, static_cast<size_t>(t.x2a - t.x1a) * 3);
  }
}

// The whole 2S x 2S canvas of 114 with the tiles in place.
Sample place_tiles(const std::array<const Sample*, 4>& tiles, int S, int xc, int yc) {
  const int S2 = 2 * S;
  Sample out;
  const std::array<Tile, 4> t = tiles_of(tiles);
  const std::array<TilePlacement, 4> plan = plan_tiles({&t[0], &t[1], &t[2], &t[3]}, S, xc, yc, &out.boxes, true);
  // empty rather than torch::full: ATen's fill would start an OpenMP team from inside a loader
  // thread.
  out.image = torch::empty({S2, S2, 3}, torch::kUInt8);
  uint8_t* cv = out.image.data_ptr<uint8_t>();
  for (int y = 0; y < S2; ++y) compose_canvas_row(plan, y, S2, cv + static_cast<size_t>(y) * S2 * 3);
  return out;
}

// t[k] = (a[k] + a[k + 3] + b[k] + b[k + 3] + 2) >> 2 for k < m: the rounded mean of a 2 x 2
// block of RGB pixels starting at byte k (meaningful where k is a pixel's first 3 bytes).
__attribute__((target_clones("avx2", "default"))) void block_means(const uint8_t* __restrict a,
                                                                   const uint8_t* __restrict b,
                                                                   uint8_t* __restrict t, int m) {
  for (int k = 0; k < m; ++k) t[k] = static_cast<uint8_t>((a[k] + a[k + 3] + b[k] + b[k + 3] + 2) >> 2);
}

// Output row (n pixels) = canvas rows a and b (2n pixels each) reduced 2x2: each value is the
// rounded mean (sum + 2) >> 2, which is exactly what resize_bilinear computes at scale 1/2
// (both weights 1024 of 2048: (2^20 sum + 2^21) >> 22). The means are computed at every byte
// (contiguous, vectorised) into `t` (6n bytes), then every other pixel is kept.
void halve_rows(const uint8_t* a, const uint8_t* b, uint8_t* out, int n, uint8_t* t) {
  block_means(a, b, t, 6 * n - 3);
  int x = 0;
  for (; x + 3 <= n; x += 2) {  // two pixels per 8-byte store; its 2 extra bytes are rewritten next
    uint64_t u0, u1;
    std::memcpy(&u0, t + 6 * x, 8);
    std::memcpy(&u1, t + 6 * x + 6, 8);
    const uint64_t two = (u0 & 0xFFFFFFu) | ((u1 & 0xFFFFFFu) << 24);  // little-endian byte order
    std::memcpy(out + 3 * x, &two, 8);
  }
  for (; x < n; ++x) std::memcpy(out + 3 * x, t + 6 * x, 3);
}

}  // namespace

Sample mosaic_canvas(const std::array<const Sample*, 4>& tiles, int S, int xc, int yc) {
  StageScope timed(Stage::MosaicPlace);
  Sample out = place_tiles(tiles, S, xc, yc);
  const double S2 = 2.0 * S;
  for (Box& b : out.boxes) {
    b.x1 = std::clamp(b.x1, 0.0, S2);
    b.x2 = std::clamp(b.x2, 0.0, S2);
    b.y1 = std::clamp(b.y1, 0.0, S2);
    b.y2 = std::clamp(b.y2, 0.0, S2);
  }
  return out;
}

namespace {

// plan_tiles, timed as the mosaic's placement stage.
std::array<TilePlacement, 4> timed_plan(const std::array<const Tile*, 4>& tiles, int S, int xc, int yc,
                                        std::vector<Box>* placed, bool resize_pixels) {
  StageScope timed(Stage::MosaicPlace);
  return plan_tiles(tiles, S, xc, yc, placed, resize_pixels);
}

// mosaic4's boxes: clipped to the canvas, halved, kept when wider and taller than 2 pixels.
void halve_mosaic_boxes(const std::vector<Box>& boxes, int S2, std::vector<Box>* out) {
  for (const Box& b0 : boxes) {
    Box b = b0;
    b.x1 = std::clamp(b.x1, 0.0, static_cast<double>(S2)) * 0.5;
    b.x2 = std::clamp(b.x2, 0.0, static_cast<double>(S2)) * 0.5;
    b.y1 = std::clamp(b.y1, 0.0, static_cast<double>(S2)) * 0.5;
    b.y2 = std::clamp(b.y2, 0.0, static_cast<double>(S2)) * 0.5;
    if (b.x2 - b.x1 > 2.0 && b.y2 - b.y1 > 2.0) out->push_back(b);
  }
}

// Tiles whose pixels are at canvas scale: the canvas is never built: each output row is made
// from its two canvas rows, composed in a small buffer and halved (bit for bit the canvas +
// resize_bilinear of the reference geometry; tests/test_data_augment.cpp compares the two).
Sample mosaic_exact(const std::array<const Tile*, 4>& tiles, int S, int xc, int yc) {
  const int S2 = 2 * S;
  std::vector<Box> placed;
  const std::array<TilePlacement, 4> plan = timed_plan(tiles, S, xc, yc, &placed, true);
  Sample out;
  {
    StageScope timed(Stage::MosaicDownscale);
    out.image = torch::empty({S, S, 3}, torch::kUInt8);
    uint8_t* o = out.image.data_ptr<uint8_t>();
    std::vector<uint8_t> rows(static_cast<size_t>(S2) * 3 * 3);
    uint8_t* r0 = rows.data();
    uint8_t* r1 = r0 + static_cast<size_t>(S2) * 3;
    uint8_t* means = r1 + static_cast<size_t>(S2) * 3;
    for (int y = 0; y < S; ++y) {
      compose_canvas_row(plan, 2 * y, S2, r0);
      compose_canvas_row(plan, 2 * y + 1, S2, r1);
      halve_rows(r0, r1, o + static_cast<size_t>(y) * S * 3, S, means);
    }
  }
  halve_mosaic_boxes(placed, S2, &out.boxes);
  return out;
}

// Tiles from a reduced decode: each tile's pixels are sampled once, bilinearly, straight into
// the S x S output. Output pixel (X, Y) covers canvas pixels 2X..2X+1, 2Y..2Y+1 and belongs to
// the tile holding canvas pixel (2X + 1, 2Y + 1); it samples the tile's pixels at that block's
// centre. Same geometry and boxes as mosaic_exact; pixels differ by the interpolation (and
// along tile edges that fall on odd canvas coordinates, by which tile a block is given to).
Sample mosaic_sampled(const std::array<const Tile*, 4>& tiles, int S, int xc, int yc) {
  const int S2 = 2 * S;
  std::vector<Box> placed;
  const std::array<TilePlacement, 4> plan = timed_plan(tiles, S, xc, yc, &placed, false);
  Sample out;
  out.image = torch::empty({S, S, 3}, torch::kUInt8);
  uint8_t* o = out.image.data_ptr<uint8_t>();
  const int64_t stride = static_cast<int64_t>(S) * 3;
  {
    StageScope timed(Stage::MosaicDownscale);
    std::memset(o, kPad, static_cast<size_t>(S) * stride);
  }
  StageScope timed(Stage::Resize);
  for (const TilePlacement& t : plan) {
    if (!t.copies) continue;
    const int X0 = t.x1a / 2, X1 = t.x2a / 2, Y0 = t.y1a / 2, Y1 = t.y2a / 2;
    if (X1 <= X0 || Y1 <= Y0) continue;
    // Canvas position of the tile's pixel (0, 0), and pixels of `image` per canvas pixel.
    const int offx = t.x1a - t.x1b, offy = t.y1a - t.y1b;
    const double kx = static_cast<double>(t.image.size(1)) / t.w;
    const double ky = static_cast<double>(t.image.size(0)) / t.h;
    // Output column X = X0 + x reads image column (2X + 1 - offx) kx - 0.5 (pixel centres):
    // resample_bilinear_into's (x + 0.5) scale - 0.5 + shift with scale 2 kx.
    ops::resample_bilinear_into(t.image, o + static_cast<int64_t>(Y0) * stride + static_cast<int64_t>(X0) * 3,
                                Y1 - Y0, X1 - X0, stride, 2.0 * ky, (2.0 * Y0 - offy) * ky, 2.0 * kx,
                                (2.0 * X0 - offx) * kx);
  }
  halve_mosaic_boxes(placed, S2, &out.boxes);
  return out;
}

}  // namespace

Sample mosaic4(const std::array<const Sample*, 4>& tiles, int S, int xc, int yc) {
  const std::array<Tile, 4> t = tiles_of(tiles);
  return mosaic_exact({&t[0], &t[1], &t[2], &t[3]}, S, xc, yc);
}

Sample mosaic4(const std::array<const Tile*, 4>& tiles, int S, int xc, int yc) {
  bool exact = true;
  for (const Tile* t : tiles) {
    check_image(t->image);
    if (!t->image.is_contiguous()) throw UsageError("mosaic4: tile pixels must be contiguous");
    exact = exact && t->image.size(0) == t->height && t->image.size(1) == t->width;
  }
  return exact ? mosaic_exact(tiles, S, xc, yc) : mosaic_sampled(tiles, S, xc, yc);
}

// ---- YOLOX random affine and mixup ---------------------------------------------------------
AffineParams draw_affine(Rng& rng, const AugmentOptions& opt, int S) {
  const double deg2rad = M_PI / 180.0;
  const double angle = rng.uniform(-opt.degrees, opt.degrees) * deg2rad;
  const double scale = rng.uniform(opt.mosaic_scale_lo, opt.mosaic_scale_hi);
  const double shx = std::tan(rng.uniform(-opt.shear, opt.shear) * deg2rad);
  const double shy = std::tan(rng.uniform(-opt.shear, opt.shear) * deg2rad);
  const double tx = rng.uniform(-opt.translate, opt.translate) * S;
  const double ty = rng.uniform(-opt.translate, opt.translate) * S;
  // Rotation and scale about the origin, then the shear rows mixed in.
  const double a = scale * std::cos(angle), b = scale * std::sin(angle);
  AffineParams p;
  p.m = {a - shy * b, b + shy * a, tx, -b + shx * a, a + shx * b, ty};
  return p;
}

Sample warp_affine(const Sample& in, const AffineParams& p, int S) {
  check_image(in.image);
  const torch::Tensor src_t = in.image.contiguous();
  const uint8_t* src = src_t.data_ptr<uint8_t>();
  const int h = static_cast<int>(src_t.size(0)), w = static_cast<int>(src_t.size(1));
  const auto& m = p.m;
  const double det = m[0] * m[4] - m[1] * m[3];
  if (!(std::abs(det) > 1e-12)) throw UsageError("warp_affine: singular matrix");
  // Inverse: source = R (dst - t).
  const double r00 = m[4] / det, r01 = -m[1] / det, r10 = -m[3] / det, r11 = m[0] / det;
  Sample out;
  out.image = torch::empty({S, S, 3}, torch::kUInt8);
  uint8_t* dst = out.image.data_ptr<uint8_t>();
  const auto pixel = [&](int x, int y, int c) -> float {
    return (x < 0 || y < 0 || x >= w || y >= h) ? static_cast<float>(kPad)
                                                : static_cast<float>(src[(static_cast<size_t>(y) * w + x) * 3 + c]);
  };
  for (int y = 0; y < S; ++y) {
    const double dy = y - m[5];
    for (int x = 0; x < S; ++x) {
      const double dx = x - m[2];
      const double sx = r00 * dx + r01 * dy, sy = r10 * dx + r11 * dy;
      uint8_t* d = dst + (static_cast<size_t>(y) * S + x) * 3;
      if (!(sx > -1 && sy > -1 && sx < w && sy < h)) {
        d[0] = d[1] = d[2] = kPad;
        continue;
      }
      const int x0 = static_cast<int>(std::floor(sx)), y0 = static_cast<int>(std::floor(sy));
      const float fx = static_cast<float>(sx - x0), fy = static_cast<float>(sy - y0);
      for (int c = 0; c < 3; ++c) {
        const float top = pixel(x0, y0, c) * (1 - fx) + pixel(x0 + 1, y0, c) * fx;
        const float bottom = pixel(x0, y0 + 1, c) * (1 - fx) + pixel(x0 + 1, y0 + 1, c) * fx;
        d[c] = round_u8(top * (1 - fy) + bottom * fy);
      }
    }
  }
  const double Sd = S;
  for (const Box& b : in.boxes) {
    const double xs[4] = {b.x1, b.x2, b.x1, b.x2}, ys[4] = {b.y1, b.y1, b.y2, b.y2};
    double x1 = INFINITY, y1 = INFINITY, x2 = -INFINITY, y2 = -INFINITY;
    for (int k = 0; k < 4; ++k) {
      const double X = m[0] * xs[k] + m[1] * ys[k] + m[2], Y = m[3] * xs[k] + m[4] * ys[k] + m[5];
      x1 = std::min(x1, X), x2 = std::max(x2, X), y1 = std::min(y1, Y), y2 = std::max(y2, Y);
    }
    out.boxes.push_back({std::clamp(x1, 0.0, Sd), std::clamp(y1, 0.0, Sd), std::clamp(x2, 0.0, Sd),
                         std::clamp(y2, 0.0, Sd), b.cls});
  }
  return out;
}

void mixup_yolox(Sample& base, const Sample& partner, double jit, bool flip, int off_x, int off_y, int S) {
  StageScope timed(Stage::Mixup);
  check_image(base.image);
  check_image(partner.image);
  if (base.image.size(0) != S || base.image.size(1) != S) throw UsageError("mixup_yolox: base must be S x S");
  // Partner letterboxed top-left into S x S, then the whole canvas resized by the jitter.
  const int ph = static_cast<int>(partner.image.size(0)), pw = static_cast<int>(partner.image.size(1));
  const double r = std::min(static_cast<double>(S) / ph, static_cast<double>(S) / pw);
  const int rw = std::max(1, static_cast<int>(pw * r)), rh = std::max(1, static_cast<int>(ph * r));
  torch::Tensor boxed = torch::empty({S, S, 3}, torch::kUInt8);
  std::memset(boxed.data_ptr<uint8_t>(), kPad, static_cast<size_t>(S) * S * 3);
  {
    const torch::Tensor resized = ops::resize_bilinear(partner.image, rh, rw).contiguous();
    for (int y = 0; y < rh; ++y)
      std::memcpy(boxed.data_ptr<uint8_t>() + static_cast<size_t>(y) * S * 3,
                  resized.data_ptr<uint8_t>() + static_cast<size_t>(y) * rw * 3, static_cast<size_t>(rw) * 3);
  }
  const int jw = std::max(1, static_cast<int>(S * jit)), jh = jw;
  const torch::Tensor jittered = ops::resize_bilinear(boxed, jh, jw).contiguous();
  const uint8_t* jp = jittered.data_ptr<uint8_t>();
  // Zero canvas of max(jS, S), the jittered image top-left (mirrored when flip), S x S cropped.
  uint8_t* bp = base.image.data_ptr<uint8_t>();
  for (int y = 0; y < S; ++y) {
    for (int x = 0; x < S; ++x) {
      const int cy = y + off_y, cx = x + off_x;
      uint8_t* d = bp + (static_cast<size_t>(y) * S + x) * 3;
      for (int c = 0; c < 3; ++c) {
        int v = 0;
        if (cy < jh && cx < jw) v = jp[(static_cast<size_t>(cy) * jw + (flip ? jw - 1 - cx : cx)) * 3 + c];
        d[c] = static_cast<uint8_t>(0.5f * d[c] + 0.5f * static_cast<float>(v));  // truncated, as astype(uint8)
      }
    }
  }
  const double k = r * jit, Sd = S;
  for (const Box& b : partner.boxes) {
    double x1 = std::clamp(b.x1 * k, 0.0, static_cast<double>(jw)), x2 = std::clamp(b.x2 * k, 0.0, static_cast<double>(jw));
    const double y1 = std::clamp(b.y1 * k, 0.0, static_cast<double>(jh)), y2 = std::clamp(b.y2 * k, 0.0, static_cast<double>(jh));
    if (flip) {
      const double f1 = jw - x2, f2 = jw - x1;
      x1 = f1, x2 = f2;
    }
    base.boxes.push_back({std::clamp(x1 - off_x, 0.0, Sd), std::clamp(y1 - off_y, 0.0, Sd),
                          std::clamp(x2 - off_x, 0.0, Sd), std::clamp(y2 - off_y, 0.0, Sd), b.cls});
  }
}

// ---- per-sample transform ----------------------------------------------------------------
TransformParams draw_transform(Rng& rng, const AugmentOptions& opt) {
  TransformParams p;
  p.hsv = rng.uniform() < opt.hsv_prob;
  p.gains = draw_hsv_gains(rng, opt);
  p.flip = rng.uniform() < opt.flip_prob;
  return p;
}

namespace {

// apply_transform's box path for an image of h x w: whether the image is augmented and the
// boxes written (in the image's pixels; scaled by `ratio` when written).
struct TransformOutcome {
  bool augment = false;
  double ratio = 1.0;
  std::vector<Box> boxes;
};

TransformOutcome transform_boxes(const std::vector<Box>& boxes, int h, int w, const TransformParams& p, int S) {
  TransformOutcome out;
  out.ratio = std::min(static_cast<double>(S) / h, static_cast<double>(S) / w);
  if (boxes.empty()) return out;
  out.boxes.reserve(boxes.size());
  for (const Box& b0 : boxes) {
    Box b = b0;
    if (p.flip) {
      b.x1 = w - b0.x2;
      b.x2 = w - b0.x1;
    }
    // The filter is measured after letterbox scaling and before clipping.
    if ((b.x2 - b.x1) * out.ratio > 1.0 && (b.y2 - b.y1) * out.ratio > 1.0) out.boxes.push_back(b);
  }
  if (out.boxes.empty()) {
    // Nothing survived: the reference falls back to the un-augmented image and all its boxes.
    out.boxes = boxes;
    return out;
  }
  out.augment = true;
  return out;
}

}  // namespace

void apply_transform(const Sample& in, const TransformParams& p, int S, int max_labels,
                     uint8_t* image_out, float* targets_out) {
  StageScope timed(Stage::Transform);
  check_image(in.image);
  const TransformOutcome t =
      transform_boxes(in.boxes, static_cast<int>(in.image.size(0)), static_cast<int>(in.image.size(1)), p, S);
  letterbox_into(in.image, S, t.ratio, t.augment ? &p : nullptr, image_out);
  write_targets(t.boxes, t.ratio, S, max_labels, targets_out);
}

// ---- plans ---------------------------------------------------------------------------------
bool plannable(const AugmentOptions& opt, std::string* why) {
  if (opt.style != AugmentStyle::Yolo9) {
    if (why) *why = "the YOLOX recipe (random affine and its mixup)";
    return false;
  }
  if (opt.mixup_prob > 0) {
    if (why) *why = strfmt("mixup (mixup=%g)", opt.mixup_prob);
    return false;
  }
  return true;
}

namespace {

// A picture of h x w at imgsz scale letterboxed top-left: one tile covering nw x nh output
// pixels (the picture itself when its longer side is S; otherwise resized once more, which the
// CPU does in two steps: then the pixels agree within interpolation only).
SampleDraw letterbox_plan(int64_t index, int h, int w, double ratio, int S) {
  const int nw = std::clamp(static_cast<int>(w * ratio), 1, S);
  const int nh = std::clamp(static_cast<int>(h * ratio), 1, S);
  SampleDraw d;
  d.factor = 1;
  d.num_tiles = 1;
  d.tiles[0] = {index, nw, nh, 0, 0, 0, 0, nw, nh};
  d.content_w = nw;
  d.content_h = nh;
  return d;
}

}  // namespace

SampleDraw plan_train_sample(const YoloDataset& ds, int64_t index, bool mosaic, const AugmentOptions& opt,
                             Rng& rng, float* targets_out) {
  std::string why;
  if (!plannable(opt, &why)) throw UsageError("plan_train_sample: " + why + " has no plan");
  const int S = opt.imgsz;
  if (mosaic && rng.uniform() < opt.mosaic_prob) {
    const MosaicParams mp = draw_mosaic(rng, S, ds.size());
    const std::array<int64_t, 4> idx = {ds.readable_from(index), ds.readable_from(mp.others[0]),
                                        ds.readable_from(mp.others[1]), ds.readable_from(mp.others[2])};
    const std::array<Tile, 4> t = {ds.tile_geometry(idx[0]), ds.tile_geometry(idx[1]), ds.tile_geometry(idx[2]),
                                   ds.tile_geometry(idx[3])};
    std::vector<Box> placed, boxes;
    const std::array<TilePlacement, 4> placement =
        plan_tiles({&t[0], &t[1], &t[2], &t[3]}, S, mp.xc, mp.yc, &placed, false);
    halve_mosaic_boxes(placed, 2 * S, &boxes);
    SampleDraw d;
    d.factor = 2;
    for (size_t k = 0; k < 4; ++k) {
      const TilePlacement& p = placement[k];
      if (!p.copies) continue;
      d.tiles[static_cast<size_t>(d.num_tiles++)] = {idx[k], p.w, p.h, p.x1a - p.x1b, p.y1a - p.y1b,
                                                     p.x1a, p.y1a, p.x2a, p.y2a};
    }
    d.content_w = d.content_h = S;
    const TransformParams tp = draw_transform(rng, opt);
    const TransformOutcome out = transform_boxes(boxes, S, S, tp, S);
    d.hsv = out.augment && tp.hsv;
    d.flip = out.augment && tp.flip;
    d.gains = tp.gains;
    write_targets(out.boxes, out.ratio, S, opt.max_labels, targets_out);
    return d;
  }
  const int64_t i = ds.readable_from(index);
  const Tile t = ds.tile_geometry(i);
  const TransformParams tp = draw_transform(rng, opt);
  const TransformOutcome out = transform_boxes(t.boxes, t.height, t.width, tp, S);
  SampleDraw d = letterbox_plan(i, t.height, t.width, out.ratio, S);
  d.hsv = out.augment && tp.hsv;
  d.flip = out.augment && tp.flip;
  d.gains = tp.gains;
  write_targets(out.boxes, out.ratio, S, opt.max_labels, targets_out);
  return d;
}

SampleDraw plan_val_sample(const YoloDataset& ds, int64_t index, int max_labels, float* targets_out) {
  const int S = ds.imgsz();
  const int64_t i = ds.readable_from(index);
  const Tile t = ds.tile_geometry(i);
  const double ratio = std::min(static_cast<double>(S) / t.height, static_cast<double>(S) / t.width);
  write_targets(t.boxes, ratio, S, max_labels, targets_out);
  return letterbox_plan(i, t.height, t.width, ratio, S);
}

void render_sample(const SampleDraw& d, const std::array<const torch::Tensor*, 4>& sources, int S, uint8_t* out) {
  if (d.factor < 1 || d.num_tiles < 0 || d.num_tiles > 4) throw UsageError("render_sample: bad plan");
  for (int k = 0; k < d.num_tiles; ++k) {
    if (!sources[static_cast<size_t>(k)]) throw UsageError("render_sample: a tile has no source image");
    check_image(*sources[static_cast<size_t>(k)]);
  }
  const int F = d.factor;
  std::vector<uint8_t> row(static_cast<size_t>(S) * 3);
  for (int Y = 0; Y < S; ++Y) {
    for (int X = 0; X < S; ++X) {
      uint8_t* o = row.data() + 3 * X;
      if (X >= d.content_w || Y >= d.content_h) {
        o[0] = o[1] = o[2] = kPad;
        continue;
      }
      const int Xs = d.flip ? d.content_w - 1 - X : X;
      int sum[3] = {0, 0, 0};
      for (int dy = 0; dy < F; ++dy)
        for (int dx = 0; dx < F; ++dx) {
          const int cx = Xs * F + dx, cy = Y * F + dy;
          int v[3] = {kPad, kPad, kPad};
          for (int k = 0; k < d.num_tiles; ++k) {
            const TileDraw& t = d.tiles[static_cast<size_t>(k)];
            if (cx < t.x1 || cx >= t.x2 || cy < t.y1 || cy >= t.y2) continue;
            const torch::Tensor& src = *sources[static_cast<size_t>(k)];
            const int sh = static_cast<int>(src.size(0)), sw = static_cast<int>(src.size(1));
            // resize_bilinear from the source to the tile's size, at this canvas pixel.
            const ops::BilinearTap tx = ops::bilinear_tap(sw, static_cast<double>(sw) / t.tile_w, 0.0, cx - t.offset_x);
            const ops::BilinearTap ty = ops::bilinear_tap(sh, static_cast<double>(sh) / t.tile_h, 0.0, cy - t.offset_y);
            const uint8_t* p = src.data_ptr<uint8_t>();
            const uint8_t* r0 = p + static_cast<int64_t>(ty.i0) * sw * 3;
            const uint8_t* r1 = p + static_cast<int64_t>(ty.i1) * sw * 3;
            for (int c = 0; c < 3; ++c) {
              const int top = r0[3 * tx.i0 + c] * (2048 - tx.w1) + r0[3 * tx.i1 + c] * tx.w1;
              const int bottom = r1[3 * tx.i0 + c] * (2048 - tx.w1) + r1[3 * tx.i1 + c] * tx.w1;
              v[c] = (top * (2048 - ty.w1) + bottom * ty.w1 + (1 << 21)) >> 22;
            }
            break;
          }
          for (int c = 0; c < 3; ++c) sum[c] += v[c];
        }
      const int n = F * F;
      for (int c = 0; c < 3; ++c) o[c] = static_cast<uint8_t>((sum[c] + n / 2) / n);
    }
    const int w = std::min(d.content_w, S);
    if (d.hsv && Y < d.content_h && w > 0) shift_hsv(row.data(), row.data(), w, d.gains);
    std::memcpy(out + static_cast<size_t>(Y) * S * 3, row.data(), row.size());
  }
}

// ---- whole samples -----------------------------------------------------------------------
void make_train_sample(const YoloDataset& ds, int64_t index, bool mosaic, const AugmentOptions& opt,
                       Rng& rng, uint8_t* image_out, float* targets_out) {
  const int S = opt.imgsz;
  if (opt.style == AugmentStyle::Yolox && mosaic && rng.uniform() < opt.mosaic_prob) {
    const MosaicParams mp = draw_mosaic(rng, S, ds.size());
    const Sample t0 = ds.load_resized(index);
    const Sample t1 = ds.load_resized(mp.others[0]);
    const Sample t2 = ds.load_resized(mp.others[1]);
    const Sample t3 = ds.load_resized(mp.others[2]);
    Sample m = warp_affine(mosaic_canvas({&t0, &t1, &t2, &t3}, S, mp.xc, mp.yc), draw_affine(rng, opt, S), S);
    if (opt.mixup_prob > 0 && !m.boxes.empty() && rng.uniform() < opt.mixup_prob) {
      const double jit = rng.uniform(opt.mixup_scale_lo, opt.mixup_scale_hi);
      const bool flip = rng.uniform() > 0.5;
      // A partner with labels (up to 20 draws, else no mixup).
      Sample partner;
      for (int tries = 0; tries < 20 && partner.boxes.empty(); ++tries) partner = ds.load_resized(rng.randint(0, ds.size() - 1));
      if (!partner.boxes.empty()) {
        const int extra = std::max(1, static_cast<int>(S * jit)) - S;
        const int off_y = extra > 0 ? static_cast<int>(rng.randint(0, extra - 1)) : 0;
        const int off_x = extra > 0 ? static_cast<int>(rng.randint(0, extra - 1)) : 0;
        mixup_yolox(m, partner, jit, flip, off_x, off_y, S);
      }
    }
    apply_transform(m, draw_transform(rng, opt), S, opt.max_labels, image_out, targets_out);
    return;
  }
  if (mosaic && rng.uniform() < opt.mosaic_prob) {
    const MosaicParams mp = draw_mosaic(rng, S, ds.size());
    const Tile t0 = ds.load_mosaic_tile(index, 0);
    const Tile t1 = ds.load_mosaic_tile(mp.others[0], 1);
    const Tile t2 = ds.load_mosaic_tile(mp.others[1], 2);
    const Tile t3 = ds.load_mosaic_tile(mp.others[2], 3);
    const Sample m = mosaic4({&t0, &t1, &t2, &t3}, S, mp.xc, mp.yc);
    apply_transform(m, draw_transform(rng, opt), S, opt.max_labels, image_out, targets_out);
    if (opt.mixup_prob > 0 && rng.uniform() < opt.mixup_prob) {
      const Sample other = ds.load_resized(rng.randint(0, ds.size() - 1));
      const size_t npix = static_cast<size_t>(S) * S * 3;
      std::vector<uint8_t> img2(npix);
      std::vector<float> unused_targets(static_cast<size_t>(opt.max_labels) * 5);
      apply_transform(other, draw_transform(rng, opt), S, opt.max_labels, img2.data(),
                      unused_targets.data());
      const float lam = static_cast<float>(rng.beta(32.0, 32.0));
      StageScope timed(Stage::Mixup);
      for (size_t i = 0; i < npix; ++i)
        image_out[i] = round_u8(lam * image_out[i] + (1.0f - lam) * img2[i]);
    }
    return;
  }
  const Sample s = ds.load_resized(index);
  apply_transform(s, draw_transform(rng, opt), S, opt.max_labels, image_out, targets_out);
}

void make_val_sample(const YoloDataset& ds, int64_t index, int max_labels, uint8_t* image_out,
                     float* targets_out) {
  const int S = ds.imgsz();
  const Sample s = ds.load_resized(index);
  StageScope timed(Stage::Transform);
  const double ratio = letterbox_ratio(s.image, S);
  letterbox_into(s.image, S, ratio, nullptr, image_out);
  write_targets(s.boxes, ratio, S, max_labels, targets_out);
}

}  // namespace libreyolo::data
